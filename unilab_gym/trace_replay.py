"""Replaying one episode of a parameter trace: :func:`replay_env` builds the recorded task's env at its start.

Its own module because it looks the env class up in the registry (:func:`unilab_gym.registration.vector_env_type`),
which imports every env module; :mod:`unilab_gym.vector_env` re-exports the name.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from unilab_gym.randomization import PARAMETER_NAMES
from unilab_gym.registration import QUADRUPED_ID, vector_env_type
from unilab_gym.vector_env import UniLabVectorEnv

__all__ = ["replay_env"]


def replay_env(
    env_config: dict[str, Any], record: dict[str, Any], *, env_id: str | None = None, **env_kwargs: Any
) -> tuple[UniLabVectorEnv, np.ndarray, dict[str, Any]]:
    """A fresh 1-env vector env of the recorded task, at the start of ``record``'s episode.

    Args:
        env_config: the trace's header (:func:`~unilab_gym.trace.read_jsonl`; its ``"env_id"`` picks the env
            class, its ``"env"`` is the configuration), or the env's ``task_config`` alone (a header's ``"env"``:
            then ``env_id`` picks the class).
        record: a trace record: its physics ``parameters`` are fixed (as ``domain_randomization``), the task's own
            episode parameters are drawn again from the episode seed (plus the task's
            :meth:`~unilab_gym.tasks.base.Task.replay_kwargs`, e.g. a rough-terrain level), and the env is reset
            with ``options={"episode_seed": record["episode_seed"]}``.
        env_id: the registered id of the env that wrote the trace (:func:`~unilab_gym.registration.vector_env_type`
            gives its class). Default: the header's ``"env_id"``; ``"UniLab/Quadruped-v0"`` for a ``task_config``
            alone or a header written before the id was recorded.
        **env_kwargs: other constructor arguments, e.g. ``render_mode="rgb_array"`` or
            ``autoreset_mode="Disabled"`` (neither changes the trajectory).

    Returns:
        ``(env, obs, info)``: stepping ``env`` with the episode's actions reproduces it bit for bit.

    Raises:
        ValueError: ``record`` lacks a physics parameter, or ``env_id`` is not a registered id of a
            :class:`UniLabVectorEnv` class (named in the message).
    """
    if env_config.get("type") == "header":  # a whole header: its id (None: an unregistered class) and config
        header_id = env_config.get("env_id", QUADRUPED_ID)
        env_config = env_config.get("env", {})
    else:
        header_id = QUADRUPED_ID
    env_id = header_id if env_id is None else env_id
    if env_id is None:
        raise ValueError(
            "env_id None: the trace was written by an env class with no registered id; register the class "
            "(gym.register(id, vector_entry_point=cls)) and pass env_id=id"
        )
    env_type = vector_env_type(env_id)
    parameters = record.get("parameters", {})
    missing = sorted(set(PARAMETER_NAMES) - set(parameters))
    if missing:
        raise ValueError(f"record has no value for parameter(s) {missing}")
    physics = {name: parameters[name] for name in PARAMETER_NAMES}
    task = env_type.task_type.replay_kwargs(parameters)
    env = env_type(1, **{**env_config, **task, "domain_randomization": physics, **env_kwargs})
    obs, info = env.reset(options={"episode_seed": record["episode_seed"]})
    return env, obs, info
