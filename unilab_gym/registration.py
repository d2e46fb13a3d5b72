"""Gymnasium registration of ``UniLab/Quadruped-v0``.

``gym.make(ID)`` gives a :class:`~unilab_gym.envs.QuadrupedEnv`; ``gym.make(ID, num_envs=N)``
and ``gym.make_vec(ID, num_envs=N)`` give a :class:`~unilab_gym.vector_env.UniLabVectorEnv`.
The spec has no ``max_episode_steps`` (the env truncates by itself), no env checker and no
order enforcing, so that ``gym.make`` returns the vector env unwrapped (a wrapper would
hide the vector API). Pass ``max_episode_steps`` to the env itself (``make_vec`` does).

``gym.make(ID, num_envs=N, max_episode_steps=k)`` raises ``ValueError``: ``gym.make`` keeps
``max_episode_steps`` for a single-env ``TimeLimit`` it would wrap around the vector env (which then
returns one scalar ``truncated`` for all envs), and never passes it to the entry point. Use
``gym.make_vec(ID, num_envs=N, max_episode_steps=k)``, which gives it to the env (per-env truncation).
``gym.make(ID, max_episode_steps=k)`` (one env) is Gymnasium's usual ``TimeLimit`` around a ``QuadrupedEnv``.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import gymnasium as gym
from gymnasium.envs import registration as gym_registration

if TYPE_CHECKING:
    from unilab_gym.vector_env import UniLabVectorEnv

from unilab_gym.env_ids import (  # noqa: F401  (re-exported: the ids and the class lookup live there)
    PANDA_PICK_ID,
    PANDA_REACH_ID,
    QUADROTOR_ID,
    QUADRUPED_ID,
    QUADRUPED_ROUGH_ID,
    VECTOR_ENV_TYPES,
    env_id_of,
)


def make_quadruped(num_envs: int | None = None, **kwargs: Any) -> gym.Env:
    """The entry point of ``UniLab/Quadruped-v0``, for both ``gym.make`` and ``gym.make_vec``.

    Args:
        num_envs: ``None`` (``gym.make(ID)``): a single :class:`~unilab_gym.envs.QuadrupedEnv`. A number
            (``gym.make(ID, num_envs=N)``, or ``gym.make_vec(ID, num_envs=N)`` which always passes it):
            a :class:`~unilab_gym.vector_env.UniLabVectorEnv` of that many envs.
        **kwargs: the other arguments of that class.

    Raises:
        ValueError: an invalid argument, naming it; or ``gym.make(ID, num_envs=N, max_episode_steps=k)``,
            whose ``TimeLimit`` would not be a vector env (the message points to ``gym.make_vec``). Nothing
            is built then.
        TypeError: an unknown argument (the message lists the valid ones).
    """
    if num_envs is None:
        from unilab_gym.envs import QuadrupedEnv

        return QuadrupedEnv(**kwargs)
    limit = _gym_make_time_limit(sys._getframe(1))
    if limit is not None:
        raise ValueError(
            f"gym.make({QUADRUPED_ID!r}, num_envs={num_envs!r}, max_episode_steps={limit!r}) would wrap the vector "
            "env in a single-env TimeLimit (gym.make keeps max_episode_steps for it); give the limit to the env "
            f"instead: gym.make_vec({QUADRUPED_ID!r}, num_envs={num_envs!r}, max_episode_steps={limit!r}) "
            f"or UniLabVectorEnv({num_envs!r}, max_episode_steps={limit!r}), which truncate each env at its own step"
        )
    from unilab_gym.vector_env import UniLabVectorEnv

    return UniLabVectorEnv(num_envs, **kwargs)


def _make_task_env(env_id: str, single: Any, vector: Any, num_envs: int | None, caller: Any,
                   kwargs: dict[str, Any]) -> gym.Env:  # fmt: skip
    """The ``single`` env class's env (``num_envs=None``) or the ``vector`` env class's of ``env_id``.

    ``caller`` is the entry point's caller (``gym.make``), whose ``max_episode_steps`` would wrap a vector env in a
    single-env ``TimeLimit`` (refused, see :func:`make_quadruped`).
    """
    if num_envs is None:
        return single(**kwargs)
    limit = _gym_make_time_limit(caller)
    if limit is not None:
        raise ValueError(
            f"gym.make({env_id!r}, num_envs={num_envs!r}, max_episode_steps={limit!r}) would wrap the vector "
            "env in a single-env TimeLimit; give the limit to the env instead: "
            f"gym.make_vec({env_id!r}, num_envs={num_envs!r}, max_episode_steps={limit!r})"
        )
    return vector(num_envs, **kwargs)


def make_quadrotor(num_envs: int | None = None, **kwargs: Any) -> gym.Env:
    """The entry point of ``UniLab/Quadrotor-v0``, for ``gym.make`` and ``gym.make_vec``.

    A :class:`~unilab_gym.envs_quadrotor.QuadrotorEnv` (``num_envs=None``) or a
    :class:`~unilab_gym.envs_quadrotor.QuadrotorVectorEnv` of ``num_envs`` envs (see :func:`make_quadruped` for
    the arguments and errors).
    """
    from unilab_gym.envs_quadrotor import QuadrotorEnv, QuadrotorVectorEnv

    return _make_task_env(QUADROTOR_ID, QuadrotorEnv, QuadrotorVectorEnv, num_envs, sys._getframe(1), kwargs)


def make_panda_reach(num_envs: int | None = None, **kwargs: Any) -> gym.Env:
    """The entry point of ``UniLab/PandaReach-v0``, for ``gym.make`` and ``gym.make_vec``.

    A :class:`~unilab_gym.envs_panda.PandaReachEnv` (``num_envs=None``) or a
    :class:`~unilab_gym.envs_panda.PandaReachVectorEnv` of ``num_envs`` envs (see :func:`make_quadruped` for the
    arguments and errors).
    """
    from unilab_gym.envs_panda import PandaReachEnv, PandaReachVectorEnv

    return _make_task_env(PANDA_REACH_ID, PandaReachEnv, PandaReachVectorEnv, num_envs, sys._getframe(1), kwargs)


def make_panda_pick(num_envs: int | None = None, **kwargs: Any) -> gym.Env:
    """The entry point of ``UniLab/PandaPick-v0``, for ``gym.make`` and ``gym.make_vec``.

    A :class:`~unilab_gym.envs_panda.PandaPickEnv` or a :class:`~unilab_gym.envs_panda.PandaPickVectorEnv` (as
    :func:`make_panda_reach`).
    """
    from unilab_gym.envs_panda import PandaPickEnv, PandaPickVectorEnv

    return _make_task_env(PANDA_PICK_ID, PandaPickEnv, PandaPickVectorEnv, num_envs, sys._getframe(1), kwargs)


def make_quadruped_rough(num_envs: int | None = None, **kwargs: Any) -> gym.Env:
    """The entry point of ``UniLab/QuadrupedRough-v0``, for ``gym.make`` and ``gym.make_vec``.

    A :class:`~unilab_gym.envs_rough.QuadrupedRoughEnv` (``num_envs=None``) or a
    :class:`~unilab_gym.envs_rough.QuadrupedRoughVectorEnv` of ``num_envs`` envs (see :func:`make_quadruped` for
    the arguments and errors).
    """
    from unilab_gym.envs_rough import QuadrupedRoughEnv, QuadrupedRoughVectorEnv

    caller = sys._getframe(1)
    return _make_task_env(QUADRUPED_ROUGH_ID, QuadrupedRoughEnv, QuadrupedRoughVectorEnv, num_envs, caller, kwargs)


def vector_env_type(env_id: Any) -> type[UniLabVectorEnv]:
    """The vector env class of ``env_id``.

    From :data:`VECTOR_ENV_TYPES`, or a class registered in this process as the id's ``vector_entry_point`` (the
    class, or its ``"module:class"`` name). Nothing named in ``env_id`` itself is imported (a trace file is data:
    ``"module:Id"`` strings are refused, not imported).

    Raises:
        ValueError: ``env_id`` is not a string, is not registered, or its vector entry point is not a
            :class:`~unilab_gym.vector_env.UniLabVectorEnv` class (the message names ``env_id``).
    """
    import importlib

    from unilab_gym.vector_env import UniLabVectorEnv  # at call time: vector_env imports this module

    if not isinstance(env_id, str):
        raise ValueError(f"env_id must be a registered gymnasium id (a str), got {env_id!r}")
    target: Any
    if env_id in VECTOR_ENV_TYPES:
        module, _, name = VECTOR_ENV_TYPES[env_id].partition(":")
        target = getattr(importlib.import_module(module), name)
    elif env_id in gym.registry:
        target = gym.registry[env_id].vector_entry_point
        if isinstance(target, str):
            target = gym_registration.load_env_creator(target)
    else:
        raise ValueError(
            f"env_id {env_id!r} is not registered in this process (registered UniLab ids: "
            f"{sorted(i for i in gym.registry if i.startswith('UniLab/'))}); import the module that registers it first"
        )
    if not (isinstance(target, type) and issubclass(target, UniLabVectorEnv)):
        raise ValueError(
            f"env_id {env_id!r}: its vector entry point {target!r} is not a UniLabVectorEnv class, so its episodes "
            "cannot be replayed from a trace"
        )
    return target


def _gym_make_time_limit(caller: Any) -> Any:
    """The ``max_episode_steps`` of the ``TimeLimit`` that ``gym.make`` will wrap around the env, or ``None``.

    Not ``None`` only if ``caller`` (the frame calling the entry point) is ``gym.make`` and it will wrap one.

    ``gym.make`` takes ``max_episode_steps`` as its own argument and never passes it to the entry point, so
    its frame is the only place it can be read before the wrapper is applied.
    """
    if caller is None or caller.f_code is not gym_registration.make.__code__:
        return None
    limit = caller.f_locals.get("max_episode_steps")
    if limit is None:
        spec = caller.f_locals.get("env_spec")
        limit = getattr(spec, "max_episode_steps", None)
    return None if limit is None or limit == -1 else limit


def register_envs() -> None:
    """Register the ids (idempotent).

    Each entry point serves ``gym.make`` and ``gym.make_vec``, returned as is (no env checker, no order enforcing,
    so that ``gym.make(id, num_envs=N)`` returns the vector env).
    """
    for env_id, entry in (
        (QUADRUPED_ID, "make_quadruped"),
        (QUADRUPED_ROUGH_ID, "make_quadruped_rough"),
        (PANDA_REACH_ID, "make_panda_reach"),
        (PANDA_PICK_ID, "make_panda_pick"),
        (QUADROTOR_ID, "make_quadrotor"),
    ):
        if env_id not in gym.registry:
            gym.register(
                id=env_id,
                entry_point=f"unilab_gym.registration:{entry}",
                vector_entry_point=f"unilab_gym.registration:{entry}",
                disable_env_checker=True,
                order_enforce=False,
            )
