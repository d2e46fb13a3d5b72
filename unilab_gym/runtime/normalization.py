"""Observation (and reward) normalization under ``AsyncRunner``: SB3's ``VecNormalize``, split in two.

The learner's model keeps its ``VecNormalize`` (``model.get_vec_normalize_env()``), which is never
stepped: it is the single source of truth for the statistics, the one ``VecNormalize.save``
writes and ``unilab-gym play`` / :func:`unilab_gym.evaluation.evaluate_gait` load.

- **Learner -> collectors.** The statistics a collector normalizes with (``obs_rms.mean``,
  ``obs_rms.var``, ``ret_rms.var``; float64) travel with the policy weights, in the same
  published vector, so they carry the same version number: a collector acting with weights of
  version ``v`` normalizes with the statistics of version ``v``. :func:`pack_statistics` /
  :meth:`CollectorNormalizer.load` encode and decode them bit for bit (float64 stored as pairs
  of float32 words).
- **Collectors -> learner.** Each collector accumulates the moments (count, mean, variance) of
  the raw observations it steps (and, with ``norm_reward``, of its envs' discounted returns, as
  ``VecNormalize._update_reward`` does) and hands them over as :class:`Moments`; the learner
  merges them into its ``VecNormalize`` with ``RunningMeanStd.update_from_moments``, the parallel
  mean/variance merge of Chan, Golub and LeVeque (1979), "Updating formulae and a pairwise
  algorithm for computing sample variances". Counts add up to the observations stepped, and the
  merged mean and variance equal a single-stream computation over the same data up to rounding.

What a collector computes is what ``VecNormalize.step_wait`` computes (SB3 2.x): observations
``clip((obs - mean) / sqrt(var + epsilon), -clip_obs, clip_obs)`` as float32, terminal
observations likewise, and with ``norm_reward`` rewards ``clip(r / sqrt(ret_var + epsilon),
-clip_reward, clip_reward)`` after the return update, returns reset to 0 where an episode ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class NormalizationSpec:
    """The fixed settings of a ``VecNormalize`` that collectors need (picklable).

    ``obs_dim``: length of the (flat) observation; the other fields are ``VecNormalize``'s own.
    """

    obs_dim: int
    norm_obs: bool
    norm_reward: bool
    clip_obs: float
    clip_reward: float
    epsilon: float
    gamma: float

    @classmethod
    def of(cls, vec_normalize: Any) -> NormalizationSpec:
        """The spec of an SB3 ``VecNormalize``.

        Raises:
            ValueError: the observation space is not a flat ``Box`` (dict observations are not supported).
        """
        from gymnasium import spaces

        space = vec_normalize.observation_space
        if not isinstance(space, spaces.Box) or len(space.shape) != 1:
            raise ValueError(
                f"AsyncRunner supports VecNormalize on flat Box observations, got {space}; "
                "flatten the observations (gymnasium.wrappers.FlattenObservation) or train without VecNormalize"
            )
        return cls(
            obs_dim=int(space.shape[0]),
            norm_obs=bool(vec_normalize.norm_obs),
            norm_reward=bool(vec_normalize.norm_reward),
            clip_obs=float(vec_normalize.clip_obs),
            clip_reward=float(vec_normalize.clip_reward),
            epsilon=float(vec_normalize.epsilon),
            gamma=float(vec_normalize.gamma),
        )

    @property
    def size(self) -> int:
        """float32 words of the packed statistics (2 per float64: obs mean, obs var, return var)."""
        return 2 * (2 * self.obs_dim + 1)


def pack_statistics(vec_normalize: Any, out: np.ndarray) -> None:
    """Write ``obs_rms.mean``, ``obs_rms.var``, ``ret_rms.var`` (float64) into ``out`` ((size,) float32) bit for bit."""
    words = out.view(np.float64)
    n = vec_normalize.obs_rms.mean.size
    words[:n] = vec_normalize.obs_rms.mean
    words[n : 2 * n] = vec_normalize.obs_rms.var
    words[2 * n] = float(np.asarray(vec_normalize.ret_rms.var).reshape(-1)[0])


@dataclass
class Moments:
    """Count, mean and (population) variance of a batch of vectors, as SB3's ``RunningMeanStd`` keeps them.

    ``mean`` and ``var`` are float64 arrays of the vectors' shape (``()`` for returns); ``count``
    is the number of vectors (a float, as in SB3).
    """

    count: float
    mean: np.ndarray
    var: np.ndarray

    def merge_into(self, running_mean_std: Any) -> None:
        """Merge into an SB3 ``RunningMeanStd`` (the parallel update of Chan et al.); nothing if empty."""
        if self.count > 0:
            running_mean_std.update_from_moments(self.mean, self.var, self.count)


class _Accumulator:
    """Moments of the batches seen since the last :meth:`take` (an SB3 ``RunningMeanStd`` that starts empty)."""

    def __init__(self, shape: tuple[int, ...]):
        from stable_baselines3.common.running_mean_std import RunningMeanStd

        self._shape = shape
        self._new = lambda: RunningMeanStd(epsilon=0.0, shape=shape)
        self._rms = self._new()

    def update(self, batch: np.ndarray) -> None:
        self._rms.update(batch)

    def take(self) -> Moments:
        rms, self._rms = self._rms, self._new()
        return Moments(float(rms.count), np.asarray(rms.mean, np.float64), np.asarray(rms.var, np.float64))


class CollectorNormalizer:
    """Collector side: normalize with the learner's statistics, accumulate raw moments for the learner.

    Args:
        spec: the learner's :class:`NormalizationSpec`.
        num_envs: envs of the collector's vector env (for the running discounted returns).
    """

    def __init__(self, spec: NormalizationSpec, num_envs: int):
        self.spec = spec
        self._mean = np.zeros(spec.obs_dim)
        self._var = np.ones(spec.obs_dim)
        self._ret_var = 1.0
        self._returns = np.zeros(num_envs)
        self._obs = _Accumulator((spec.obs_dim,))
        self._ret = _Accumulator(())

    def load(self, packed: np.ndarray) -> None:
        """Take the statistics published with the weights (the tail written by :func:`pack_statistics`)."""
        words = packed.view(np.float64)
        n = self.spec.obs_dim
        self._mean = words[:n].copy()
        self._var = words[n : 2 * n].copy()
        self._ret_var = float(words[2 * n])

    def observe(self, obs: np.ndarray) -> None:
        """Count raw observations (n, obs_dim) into the moments for the learner (as ``obs_rms.update``)."""
        if self.spec.norm_obs:
            self._obs.update(np.asarray(obs, np.float64))

    def normalize_obs(self, obs: np.ndarray) -> np.ndarray:
        """(n, obs_dim) -> normalized float32 observations (unchanged but float32 if ``norm_obs`` is off)."""
        if not self.spec.norm_obs:
            return np.asarray(obs, np.float32)
        clip = self.spec.clip_obs
        scaled = (obs - self._mean) / np.sqrt(self._var + self.spec.epsilon)
        return np.clip(scaled, -clip, clip).astype(np.float32)

    def normalize_reward(self, reward: np.ndarray, dones: np.ndarray) -> np.ndarray:
        """Update the running discounted returns with raw ``reward`` (n,) and return the normalized rewards (float64).

        ``dones`` (n,) bool resets those envs' returns afterwards, as ``VecNormalize.step_wait`` does.
        Unchanged rewards if ``norm_reward`` is off.
        """
        if not self.spec.norm_reward:
            return reward
        self._returns = self._returns * self.spec.gamma + reward
        self._ret.update(self._returns)
        clip = self.spec.clip_reward
        out = np.clip(reward / np.sqrt(self._ret_var + self.spec.epsilon), -clip, clip)
        self._returns[dones] = 0.0
        return out

    def take_moments(self) -> tuple[Moments, Moments]:
        """The (observation, return) moments since the last call, for the learner to merge."""
        return self._obs.take(), self._ret.take()


def merge_moments(vec_normalize: Any, obs: Moments, returns: Moments) -> None:
    """Learner side: merge a collector's moments into the model's ``VecNormalize`` (``obs_rms``, ``ret_rms``)."""
    obs.merge_into(vec_normalize.obs_rms)
    returns.merge_into(vec_normalize.ret_rms)
