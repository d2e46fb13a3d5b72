"""``UniLab/Quadrotor-v0``'s envs: :class:`QuadrotorVectorEnv` (N quadrotors) and :class:`QuadrotorEnv` (one).

They are the engine (:class:`~unilab_gym.vector_env.UniLabVectorEnv`, :class:`~unilab_gym.envs.QuadrupedEnv`) with
the task :class:`~unilab_gym.tasks.quadrotor.QuadrotorTask`: everything else (seeding, autoreset modes, clusters of
pybullet worlds with the quadrotors in lanes that never collide, domain randomization, the parameter trace,
privileged observations) is the engine's.
"""

from __future__ import annotations

from unilab_gym.envs import QuadrupedEnv
from unilab_gym.tasks.quadrotor import QuadrotorTask
from unilab_gym.vector_env import UniLabVectorEnv


class QuadrotorVectorEnv(UniLabVectorEnv):
    """``num_envs`` Crazyflie 2.x quadrotors flying to a target each and hovering there, in one process.

    Spaces:
        ``single_action_space``: Box(-1, 1, (4,), float32): rotor speeds ``hover_rpm * (1 + action_scale * a)``
        (hover 14,476 rpm, ``action_scale`` 0.2; :func:`~unilab_gym.tasks.quadrotor.motor_rpm`); the engine applies
        their thrust and drag torque on the body every physics substep (:mod:`unilab_gym.sim.rotor`).
        ``single_observation_space``: Box(-inf, inf, (22,), float32), layout
        :data:`unilab_gym.tasks.quadrotor.OBS_LAYOUT`; with ``privileged_obs=True`` a ``Dict`` of it and the (34,)
        ``"critic"`` (:data:`~unilab_gym.tasks.quadrotor.CRITIC_OBS_LAYOUT`).

    Reward: the weighted terms of :class:`~unilab_gym.tasks.quadrotor.QuadrotorRewardWeights` (distance, velocity,
    angular_rate, action_rate, alive), each in ``info["reward_terms"]``. ``terminated``: crashed (too low, too
    tilted, too far: :class:`~unilab_gym.tasks.quadrotor.QuadrotorTermination`); ``truncated``: 240 control steps
    (8 s). ``info["is_success"]`` (N,) bool: within 0.1 m of the target and slower than 0.2 m/s.

    Args: those of :class:`~unilab_gym.vector_env.UniLabVectorEnv`; the task keyword arguments are the fields of
    :class:`~unilab_gym.tasks.quadrotor.QuadrotorConfig`.
    """

    task_type = QuadrotorTask


class QuadrotorEnv(QuadrupedEnv):
    """One quadrotor (see :class:`QuadrotorVectorEnv`).

    ``observation_space`` Box (22,), ``action_space`` Box(-1, 1, (4,)); ``info`` has ``reward_terms`` and
    ``is_success`` (bool).
    """

    vector_env_type = QuadrotorVectorEnv
