"""Learner side of ``VecNormalize`` under ``AsyncRunner``: read the model's ``VecNormalize``, publish and merge.

The collector side (:class:`~unilab_gym.runtime.normalization.CollectorNormalizer`, the packed
format, :class:`~unilab_gym.runtime.normalization.Moments`) is framework-free and lives in
:mod:`unilab_gym.runtime.normalization`, whose docstring describes the whole split.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from unilab_gym.runtime.normalization import Moments, NormalizationSpec

__all__ = ["merge_moments", "normalization_spec", "pack_statistics"]


def normalization_spec(vec_normalize: Any) -> NormalizationSpec:
    """The :class:`~unilab_gym.runtime.normalization.NormalizationSpec` of an SB3 ``VecNormalize``.

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
    return NormalizationSpec(
        obs_dim=int(space.shape[0]),
        norm_obs=bool(vec_normalize.norm_obs),
        norm_reward=bool(vec_normalize.norm_reward),
        clip_obs=float(vec_normalize.clip_obs),
        clip_reward=float(vec_normalize.clip_reward),
        epsilon=float(vec_normalize.epsilon),
        gamma=float(vec_normalize.gamma),
    )


def pack_statistics(vec_normalize: Any, out: np.ndarray) -> None:
    """Write ``obs_rms.mean``, ``obs_rms.var``, ``ret_rms.var`` (float64) into ``out`` ((size,) float32) bit for bit.

    ``CollectorNormalizer.load`` decodes them (float64 values stored as pairs of float32 words).
    """
    words = out.view(np.float64)
    n = vec_normalize.obs_rms.mean.size
    words[:n] = vec_normalize.obs_rms.mean
    words[n : 2 * n] = vec_normalize.obs_rms.var
    words[2 * n] = float(np.asarray(vec_normalize.ret_rms.var).reshape(-1)[0])


def merge_moments(vec_normalize: Any, obs: Moments, returns: Moments) -> None:
    """Merge a collector's moments into the model's ``VecNormalize`` (``obs_rms``, ``ret_rms``; Chan et al.)."""
    obs.merge_into(vec_normalize.obs_rms)
    returns.merge_into(vec_normalize.ret_rms)
