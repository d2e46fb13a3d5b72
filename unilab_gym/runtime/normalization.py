"""Observation (and reward) normalization under ``AsyncRunner``, collector side: SB3's ``VecNormalize``, split in two.

The learner's model keeps its ``VecNormalize`` (``model.get_vec_normalize_env()``), which is never
stepped: it is the single source of truth for the statistics, the one ``VecNormalize.save``
writes and ``unilab-gym play`` / :func:`unilab_gym.evaluation.evaluate_gait` load.

- **Learner -> collectors.** The statistics a collector normalizes with (``obs_rms.mean``,
  ``obs_rms.var``, ``ret_rms.var``; float64) travel with the policy weights, in the same
  published vector, so they carry the same version number: a collector acting with weights of
  version ``v`` normalizes with the statistics of version ``v``. :func:`unilab_gym.sb3.normalization.pack_statistics` /
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
from typing import Protocol

import numpy as np


class RunningMoments(Protocol):
    """What :meth:`Moments.merge_into` needs of a running estimate: SB3's ``RunningMeanStd`` has it."""

    def update_from_moments(self, batch_mean: np.ndarray, batch_var: np.ndarray, batch_count: float) -> None:
        """Merge a batch's mean, (population) variance and count into the estimate."""
        ...


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

    @property
    def size(self) -> int:
        """float32 words of the packed statistics (2 per float64: obs mean, obs var, return var)."""
        return 2 * (2 * self.obs_dim + 1)


@dataclass
class Moments:
    """Count, mean and (population) variance of a batch of vectors, as SB3's ``RunningMeanStd`` keeps them.

    ``mean`` and ``var`` are float64 arrays of the vectors' shape (``()`` for returns); ``count``
    is the number of vectors (a float, as in SB3).
    """

    count: float
    mean: np.ndarray
    var: np.ndarray

    def merge_into(self, running_mean_std: RunningMoments) -> None:
        """Merge into an SB3 ``RunningMeanStd`` (the parallel update of Chan et al.); nothing if empty."""
        if self.count > 0:
            running_mean_std.update_from_moments(self.mean, self.var, self.count)


class _Accumulator:
    """Moments of the batches seen since the last :meth:`take`: SB3's ``RunningMeanStd(epsilon=0.0)``, in numpy.

    The same operations in the same order as ``RunningMeanStd.update`` / ``update_from_moments``
    (SB3 2.x, ``stable_baselines3/common/running_mean_std.py``; the parallel algorithm of Chan,
    Golub and LeVeque 1979), so the moments are bit for bit SB3's; written here so the transport
    (``runtime/``) does not import a framework.
    """

    def __init__(self, shape: tuple[int, ...]):
        self._shape = shape
        self._reset()

    def _reset(self) -> None:
        self._mean = np.zeros(self._shape, np.float64)
        self._var = np.ones(self._shape, np.float64)
        self._count = 0.0

    def update(self, batch: np.ndarray) -> None:
        """Count a batch (B, *shape) in."""
        batch_mean = np.mean(batch, axis=0)
        batch_var = np.var(batch, axis=0)
        batch_count = batch.shape[0]
        delta = batch_mean - self._mean
        tot_count = self._count + batch_count
        new_mean = self._mean + delta * batch_count / tot_count
        m_a = self._var * self._count
        m_b = batch_var * batch_count
        m_2 = m_a + m_b + np.square(delta) * self._count * batch_count / (self._count + batch_count)
        self._var = m_2 / (self._count + batch_count)
        self._mean = new_mean
        self._count = batch_count + self._count

    def take(self) -> Moments:
        """The moments since the last call (count 0, mean 0, variance 1 if none), and start again."""
        out = Moments(float(self._count), np.asarray(self._mean, np.float64), np.asarray(self._var, np.float64))
        self._reset()
        return out


class CollectorNormalizer:
    """Collector side: normalize with the learner's statistics, accumulate raw moments for the learner.

    Args:
        spec: the learner's :class:`NormalizationSpec`.
        num_envs: envs of the collector's vector env (for the running discounted returns).
    """

    def __init__(self, spec: NormalizationSpec, num_envs: int):
        """Start from identity statistics and empty accumulators (arguments: see the class docstring)."""
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
