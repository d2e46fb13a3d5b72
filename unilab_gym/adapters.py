"""Framework-neutral helpers of the adapters: make the vector env, vector infos to one dict per env."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["make_unilab_vector_env", "unbatch_infos"]


def make_unilab_vector_env(env_id: str, num_envs: int, caller: str, alternative: str, **env_kwargs: Any) -> Any:
    """``gym.make_vec(env_id, num_envs=num_envs, **env_kwargs)``, which must give a ``UniLabVectorEnv``.

    Raises:
        TypeError: ``env_id`` makes another kind of env; the message names ``caller`` and suggests
            ``alternative`` (the framework's own vectorization for other envs).
    """
    import gymnasium as gym

    from unilab_gym.vector_env import UniLabVectorEnv

    venv = gym.make_vec(env_id, num_envs=num_envs, **env_kwargs)
    if not isinstance(venv, UniLabVectorEnv):
        venv.close()
        raise TypeError(
            f"{caller}({env_id!r}) made a {type(venv).__name__}, not a UniLabVectorEnv; "
            f"use {alternative} for other envs"
        )
    return venv


def unbatch_infos(infos: dict[str, Any], num_envs: int) -> list[dict[str, Any]]:
    """Turn Gymnasium vector infos (dict of arrays with ``_key`` masks) into one dict per env.

    Env ``i`` gets ``key`` only where ``infos["_key"][i]`` is true (or there is no mask);
    nested dicts are unbatched recursively; 1-D arrays give Python scalars (as the single env
    gives), other arrays give row ``i``.

    Args:
        infos: the ``infos`` of ``UniLabVectorEnv.step`` / ``reset``.
        num_envs: N.

    Returns:
        A list of N dicts.
    """
    out: list[dict[str, Any]] = [{} for _ in range(num_envs)]
    for key, value in infos.items():
        if key.startswith("_"):
            continue
        mask = infos.get(f"_{key}")
        envs = range(num_envs) if mask is None else np.flatnonzero(mask).tolist()
        if isinstance(value, dict):
            column = unbatch_infos(value, num_envs)
        elif isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype != object:
            column = value.tolist()
        else:
            column = value
        for i in envs:
            out[i][key] = column[i]
    return out
