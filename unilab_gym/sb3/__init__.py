"""Stable-Baselines3 wing: everything that imports ``stable_baselines3`` lives in this folder.

- :mod:`unilab_gym.sb3.vec_env`: :class:`SB3VecEnv` and :func:`make_sb3_env` (an SB3 ``VecEnv``
  over one batched :class:`~unilab_gym.vector_env.UniLabVectorEnv`), :class:`EnvMetricsCallback`;
- :mod:`unilab_gym.sb3.replay_buffer`: :class:`SharedReplayBuffer` (an SB3 ``ReplayBuffer`` in shared memory);
- :mod:`unilab_gym.sb3.policies`: asymmetric actor-critic policies over dict observations;
- :mod:`unilab_gym.sb3.runner`: :class:`AsyncRunner` (stock SB3 learners fed by collectors),
  with the learner loops in :mod:`unilab_gym.sb3.loops`, configured by :mod:`unilab_gym.sb3.config`
  (:class:`CollectorConfig`, :class:`ControlConfig`, :class:`MetricsConfig`);
- :mod:`unilab_gym.sb3.control`: live control (hyperparameters, snapshots, rollback, HTTP);
- :mod:`unilab_gym.sb3.zoo`: rl-zoo3 hyperparameter YAMLs.

Names are imported on first access (PEP 562), so ``import unilab_gym.sb3`` alone does not import
SB3 or torch; importing one of them does.
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> module that defines it
_LAZY = {
    "AsyncRunner": "unilab_gym.sb3.runner",
    "CollectorConfig": "unilab_gym.sb3.config",
    "ControlConfig": "unilab_gym.sb3.config",
    "MetricsConfig": "unilab_gym.sb3.config",
    "SharedReplayBuffer": "unilab_gym.sb3.replay_buffer",
    "SB3VecEnv": "unilab_gym.sb3.vec_env",
    "make_sb3_env": "unilab_gym.sb3.vec_env",
    "EnvMetricsCallback": "unilab_gym.sb3.vec_env",
    "AsymmetricActorCriticPolicy": "unilab_gym.sb3.policies",
    "AsymmetricSACPolicy": "unilab_gym.sb3.policies",
    "KeyExtractor": "unilab_gym.sb3.policies",
    "ControlCallback": "unilab_gym.sb3.control",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    """Import ``name`` from its module on first access (PEP 562)."""
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'unilab_gym.sb3' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
