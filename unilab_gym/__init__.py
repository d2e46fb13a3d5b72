"""unilab-gym: natively vectorized robot RL environments for Stable-Baselines3 and Tianshou.

Natively vectorized robot RL environments, a shared-memory replay buffer and an async collector
runtime for Stable-Baselines3 and Tianshou.

``import unilab_gym`` registers ``UniLab/Quadruped-v0`` with Gymnasium and stays light
(numpy, gymnasium, pybullet). Names that need torch / SB3 (``SharedReplayBuffer``,
``AsyncRunner``) are imported on first access.
"""

from __future__ import annotations

import importlib
from typing import Any

from unilab_gym.envs import QuadrupedEnv
from unilab_gym.registration import register_envs
from unilab_gym.vector_env import UniLabVectorEnv

__version__ = "0.1.0"

# name -> module that defines it; loaded on first attribute access (PEP 562)
_LAZY = {
    "SharedReplayBuffer": "unilab_gym.sb3.replay_buffer",
    "AsyncRunner": "unilab_gym.sb3.runner",
    "CollectorConfig": "unilab_gym.sb3.config",
    "ControlConfig": "unilab_gym.sb3.config",
    "MetricsConfig": "unilab_gym.sb3.config",
    "CollectorError": "unilab_gym.runtime.errors",
}

__all__ = ["UniLabVectorEnv", "QuadrupedEnv", "__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'unilab_gym' has no attribute {name!r}")


register_envs()
