"""Gymnasium registration of ``UniLab/Quadruped-v0``.

``gym.make(ID)`` gives a :class:`~unilab_gym.envs.QuadrupedEnv`; ``gym.make(ID, num_envs=N)``
and ``gym.make_vec(ID, num_envs=N)`` give a :class:`~unilab_gym.vector_env.UniLabVectorEnv`.
The spec has no ``max_episode_steps`` (the env truncates by itself), no env checker and no
order enforcing, so that ``gym.make`` returns the vector env unwrapped (a wrapper would
hide the vector API). Pass ``max_episode_steps`` to the env itself (``make_vec`` does).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

QUADRUPED_ID = "UniLab/Quadruped-v0"


def make_quadruped(num_envs: int | None = None, **kwargs: Any) -> gym.Env:
    """The entry point of ``UniLab/Quadruped-v0``, for both ``gym.make`` and ``gym.make_vec``.

    Args:
        num_envs: ``None`` (``gym.make(ID)``): a single :class:`~unilab_gym.envs.QuadrupedEnv`. A number
            (``gym.make(ID, num_envs=N)``, or ``gym.make_vec(ID, num_envs=N)`` which always passes it):
            a :class:`~unilab_gym.vector_env.UniLabVectorEnv` of that many envs.
        **kwargs: the other arguments of that class.

    Raises:
        ValueError: an invalid argument, naming it.
        TypeError: an unknown argument (the message lists the valid ones).
    """
    if num_envs is None:
        from unilab_gym.envs import QuadrupedEnv

        return QuadrupedEnv(**kwargs)
    from unilab_gym.vector_env import UniLabVectorEnv

    return UniLabVectorEnv(num_envs, **kwargs)


def register_envs() -> None:
    """Register the ids (idempotent)."""
    if QUADRUPED_ID in gym.registry:
        return
    gym.register(
        id=QUADRUPED_ID,
        entry_point="unilab_gym.registration:make_quadruped",
        vector_entry_point="unilab_gym.registration:make_quadruped",
        disable_env_checker=True,
        order_enforce=False,
    )
