"""The learner loops ``AsyncRunner`` runs.

:mod:`~unilab_gym.sb3.loops.off_policy` (SAC, TD3, DDPG) and :mod:`~unilab_gym.sb3.loops.on_policy` (PPO, A2C), on
the shared :class:`~unilab_gym.sb3.loops.base.LearnerLoop`.
"""
