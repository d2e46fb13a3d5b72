"""The registered ids of our envs and the id of a vector env class (gymnasium only: the env modules import it).

:mod:`unilab_gym.registration` registers the ids and re-exports these names.
"""

from __future__ import annotations

import gymnasium as gym

QUADRUPED_ID = "UniLab/Quadruped-v0"
QUADRUPED_ROUGH_ID = "UniLab/QuadrupedRough-v0"
QUADROTOR_ID = "UniLab/Quadrotor-v0"
PANDA_REACH_ID = "UniLab/PandaReach-v0"
PANDA_PICK_ID = "UniLab/PandaPick-v0"

#: The vector env class of each registered id, as ``"module:class"`` (imported only when asked for, by
#: :func:`vector_env_type`): what a parameter trace's ``env_id`` rebuilds (:func:`unilab_gym.vector_env.replay_env`).
VECTOR_ENV_TYPES: dict[str, str] = {
    QUADRUPED_ID: "unilab_gym.vector_env:UniLabVectorEnv",
    QUADRUPED_ROUGH_ID: "unilab_gym.envs_rough:QuadrupedRoughVectorEnv",
    PANDA_REACH_ID: "unilab_gym.envs_panda:PandaReachVectorEnv",
    PANDA_PICK_ID: "unilab_gym.envs_panda:PandaPickVectorEnv",
    QUADROTOR_ID: "unilab_gym.envs_quadrotor:QuadrotorVectorEnv",
}


def env_id_of(env_type: type) -> str | None:
    """The registered id whose vector env is exactly ``env_type`` (a class, not its subclasses), else ``None``.

    Our ids are looked up in :data:`VECTOR_ENV_TYPES`; another id is found when its spec's ``vector_entry_point``
    is ``env_type`` itself or its ``"module:class"`` name (``gym.register(id, vector_entry_point=MyVectorEnv)``).
    The trace header records it as ``"env_id"`` (:mod:`unilab_gym.trace`).
    """
    name = f"{env_type.__module__}:{env_type.__qualname__}"
    for env_id, known in VECTOR_ENV_TYPES.items():
        if known == name:
            return env_id
    for spec in gym.registry.values():
        if spec.vector_entry_point is env_type or spec.vector_entry_point == name:
            return spec.id
    return None
