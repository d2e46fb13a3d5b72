"""The physics layer: pybullet cluster worlds, scenes, free objects, terrain tiles and rotor models.

:mod:`~unilab_gym.sim.world` (:class:`~unilab_gym.sim.world.ClusterWorld`) is the only place that calls pybullet;
the other modules here are handed the pybullet module by it.
"""
