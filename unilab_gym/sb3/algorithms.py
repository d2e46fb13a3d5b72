"""The one table of SB3 algorithm names: what ``unilab-gym play / export --algo`` accept and live control reads.

Names are the lower-case class names (``"sac"``, ``"td3"``, ``"ddpg"``, ``"ppo"``, ``"a2c"``), the
spelling rl-zoo3 uses for ``--algo``; :mod:`unilab_gym.sb3.zoo` ships hyperparameter files for a
subset of them (``zoo.ALGOS``).
"""

from __future__ import annotations

from typing import Any

from stable_baselines3 import A2C, DDPG, PPO, SAC, TD3
from stable_baselines3.common.base_class import BaseAlgorithm

__all__ = ["ALGORITHMS", "algorithm_name"]

#: algorithm name -> SB3 class, for every algorithm ``AsyncRunner`` drives and the tools load.
ALGORITHMS: dict[str, type[BaseAlgorithm]] = {cls.__name__.lower(): cls for cls in (SAC, PPO, TD3, DDPG, A2C)}


def algorithm_name(model: Any) -> str | None:
    """The name of ``model``'s algorithm: its class or its nearest base class in :data:`ALGORITHMS`.

    A subclass of ``SAC`` is ``"sac"``; ``DDPG`` (a ``TD3`` subclass) is ``"ddpg"``. ``None`` for
    anything else.
    """
    for cls in type(model).__mro__:
        if ALGORITHMS.get(cls.__name__.lower()) is cls:
            return cls.__name__.lower()
    return None
