"""The tasks on the engine's task seam (:class:`~unilab_gym.tasks.base.Task`): batched numpy, never pybullet.

:mod:`~unilab_gym.tasks.quadruped` (velocity tracking), :mod:`~unilab_gym.tasks.rough` (the same on rough terrain,
with :mod:`~unilab_gym.tasks.terrain`'s tiles), :mod:`~unilab_gym.tasks.panda` (reach and pick) and
:mod:`~unilab_gym.tasks.quadrotor` (fly to a target and hover); :mod:`~unilab_gym.tasks.config` checks their keyword
arguments.
"""
