"""``UniLab/PandaReach-v0`` and ``UniLab/PandaPick-v0``'s envs.

The vector envs :class:`PandaReachVectorEnv`, :class:`PandaPickVectorEnv` (N Franka Panda arms) and the single envs
:class:`PandaReachEnv`, :class:`PandaPickEnv`.

They are the engine (:class:`~unilab_gym.vector_env.UniLabVectorEnv`, :class:`~unilab_gym.envs.QuadrupedEnv`) with
the tasks of :mod:`unilab_gym.tasks.panda`: seeding, autoreset modes, clusters of pybullet worlds (the arms, and for
Pick one object per arm, in lanes; arms and objects of different envs never touch), domain randomization, the
parameter trace and privileged observations are the engine's.
"""

from __future__ import annotations

from unilab_gym.envs import QuadrupedEnv
from unilab_gym.tasks.panda import PandaPickTask, PandaReachTask
from unilab_gym.vector_env import UniLabVectorEnv


class PandaReachVectorEnv(UniLabVectorEnv):
    """``num_envs`` Franka Panda arms (fixed base), each moving its grasp point to a target, in one process.

    Spaces:
        ``single_action_space``: Box(-1, 1, (7,), float32): arm joint targets ``nominal + action_scale * a`` rad
        (``action_scale`` 1.0), clipped to the joint limits, tracked by PD torques; the fingers stay open.
        ``single_observation_space``: Box(-inf, inf, (33,), float32), layout
        :data:`unilab_gym.tasks.panda.REACH_OBS_LAYOUT`; with ``privileged_obs=True`` a ``Dict`` of it and the (44,)
        ``"critic"`` (the physics parameters appended).

    Reward: :class:`~unilab_gym.tasks.panda.ReachRewardWeights` (distance, success, action_rate), each in
    ``info["reward_terms"]``. No ``terminated``; ``truncated`` after 50 control steps (2 s at 25 Hz).
    ``info["is_success"]`` (N,) bool: the grasp point within 5 cm of the target (Gymnasium-Robotics' threshold).

    Args: those of :class:`~unilab_gym.vector_env.UniLabVectorEnv`; the task keyword arguments are the fields of
    :class:`~unilab_gym.tasks.panda.PandaReachConfig`.
    """

    task_type = PandaReachTask


class PandaPickVectorEnv(UniLabVectorEnv):
    """``num_envs`` Franka Panda arms, each picking up its object and lifting it to a goal height, in one process.

    Every episode's object has a random shape (box, cylinder, sphere), size, mass and friction, drawn from the
    episode's seed in the ranges of :class:`~unilab_gym.tasks.panda.PandaPickConfig`; they are in each record of the
    parameter trace (``object_shape``, ``object_size``, ``object_mass``, ``object_friction``).

    Spaces:
        ``single_action_space``: Box(-1, 1, (4,), float32): panda-gym's end-effector control: the grasp point's
        displacement (x, y, z; 0.05 m per unit and control step, the hand kept pointing down, joint targets from
        numpy inverse kinematics), then the gripper (both fingers' target opening ``0.04 * (a + 1) / 2`` m).
        ``single_observation_space``: Box(-inf, inf, (53,), float32), layout
        :data:`unilab_gym.tasks.panda.PICK_OBS_LAYOUT`; with ``privileged_obs=True`` a ``Dict`` of it and the (68,)
        ``"critic"`` (physics parameters and the object's parameters appended).

    Reward: :class:`~unilab_gym.tasks.panda.PickRewardWeights` (robosuite Lift's staged reward: reach, grasp, lift,
    then goal, success, action_rate). ``terminated``: the object was knocked more than 1 m from the base
    (``object_lost``); ``truncated`` after 50 control steps (2 s).
    ``info["is_success"]`` (N,) bool: the object within 5 cm of the goal (Gymnasium-Robotics' pick-and-place rule).

    Args: those of :class:`~unilab_gym.vector_env.UniLabVectorEnv`; the task keyword arguments are the fields of
    :class:`~unilab_gym.tasks.panda.PandaPickConfig`.
    """

    task_type = PandaPickTask


class PandaReachEnv(QuadrupedEnv):
    """One Panda reaching (see :class:`PandaReachVectorEnv`).

    ``observation_space`` Box (33,), ``action_space`` Box(-1, 1, (7,)); ``info`` has ``reward_terms`` and
    ``is_success`` (bool).
    """

    vector_env_type = PandaReachVectorEnv


class PandaPickEnv(QuadrupedEnv):
    """One Panda picking (see :class:`PandaPickVectorEnv`).

    ``observation_space`` Box (53,), ``action_space`` Box(-1, 1, (4,)); ``info`` has ``reward_terms`` and
    ``is_success`` (bool).
    """

    vector_env_type = PandaPickVectorEnv
