"""``UniLab/QuadrupedRough-v0``'s envs.

:class:`QuadrupedRoughVectorEnv` (N quadrupeds) and :class:`QuadrupedRoughEnv` (one).

They are the engine (:class:`~unilab_gym.vector_env.UniLabVectorEnv`, :class:`~unilab_gym.envs.QuadrupedEnv`) with
the task :class:`~unilab_gym.tasks.rough.RoughTask`: heightfield tiles per env (:mod:`unilab_gym.tasks.terrain`,
:mod:`unilab_gym.sim.terrain`) and legged_gym's terrain curriculum; everything else is the engine's.
"""

from __future__ import annotations

from unilab_gym.envs import QuadrupedEnv
from unilab_gym.tasks.rough import RoughTask
from unilab_gym.vector_env import UniLabVectorEnv


class QuadrupedRoughVectorEnv(UniLabVectorEnv):
    """``num_envs`` quadrupeds (the A1 by default) following velocity commands on rough terrain, in one process.

    Spaces: ``single_action_space`` Box(-1, 1, (12,)); ``single_observation_space`` Box (48,) float32
    (:data:`~unilab_gym.tasks.quadruped.OBS_LAYOUT`), (235,) with ``height_obs=True`` (plus 187 height samples);
    with ``privileged_obs=True`` a ``Dict`` of it and the ``"critic"`` (255,) or (442,) (the instance's
    ``task.critic_obs_layout``).

    Reward and ``terminated``: :class:`~unilab_gym.envs.QuadrupedEnv`'s, with the base height above the terrain.
    ``truncated``: ``max_episode_steps`` reached or the base left its tile. ``info["terrain_level"]`` and
    ``info["terrain_type"]``: (N,) int64 of each env's current episode (also recorded in the parameter trace).

    Args: those of :class:`~unilab_gym.vector_env.UniLabVectorEnv`; the task keyword arguments are the fields of
    :class:`~unilab_gym.tasks.rough.RoughConfig`.
    """

    task_type = RoughTask


class QuadrupedRoughEnv(QuadrupedEnv):
    """One quadruped on rough terrain (see :class:`QuadrupedRoughVectorEnv`).

    ``info`` has ``reward_terms``, ``terrain_level`` and ``terrain_type``.
    """

    vector_env_type = QuadrupedRoughVectorEnv
