"""``Scene``: what a task needs in its world besides the robots, as data (no pybullet here).

Today one ground: an infinite plane. Later tasks add a heightfield or objects as new fields; the physics layer
(:class:`unilab_gym.sim.world.ClusterWorld`) builds each world of a cluster from it, the same way in every world.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from unilab_gym.validation import check_real

#: The grounds :class:`Scene` knows.
GROUNDS = ("plane",)

#: The shapes of a scene's objects, by code (:attr:`ObjectEpisodes.shape`): 0 box, 1 cylinder, 2 sphere.
OBJECT_SHAPES = ("box", "cylinder", "sphere")


@dataclass
class ObjectEpisodes:
    """Each env's object for its current episode (``Scene(objects=True)``), as (N, ...) arrays a task writes in
    :meth:`~unilab_gym.tasks.base.Task.sample_episode`; the engine hands the rows of the envs it resets to the
    physics layer, which builds each object anew (:mod:`unilab_gym.sim.objects`)."""

    shape: np.ndarray
    """(N,) int64, index in :data:`OBJECT_SHAPES`."""
    size: np.ndarray
    """(N, 3) float64 full extents in m: a box's edges (x, y, z); a cylinder's (diameter, diameter, height), its axis
    along z; a sphere's (diameter, diameter, diameter)."""
    mass: np.ndarray
    """(N,) float64 kg, > 0 (pybullet computes the inertia of the solid shape)."""
    friction: np.ndarray
    """(N,) float64 lateral friction coefficient of the object (pybullet multiplies it with the other body's)."""
    position: np.ndarray
    """(N, 3) float64 m: the object's centre at reset, relative to its robot's base position, world axes."""
    yaw: np.ndarray
    """(N,) float64 rad: the object's rotation about the world z axis at reset."""

    @classmethod
    def zeros(cls, n: int) -> ObjectEpisodes:
        """``n`` rows of zeros (shape 0: boxes), to be written per episode."""
        return cls(np.zeros(n, np.int64), np.zeros((n, 3)), np.zeros(n), np.zeros(n), np.zeros((n, 3)), np.zeros(n))


@dataclass(frozen=True)
class Scene:
    """The static world around the robots.

    Raises:
        ValueError: an unknown ``ground`` (the message lists :data:`GROUNDS`) or a negative friction, naming the field.
    """

    ground: str = "plane"
    """``"plane"``: an infinite plane at z = 0 (pybullet_data's ``plane.urdf`` is a 200 m box that lanes and long
    walks would leave)."""
    ground_friction: float = 1.0
    """Lateral friction coefficient of the ground, >= 0 (1.0 as in ``plane.urdf``; pybullet multiplies it with the
    robot link's)."""
    objects: bool = False
    """One free rigid object per env (``True``): built and shaped anew at each of its episodes from the task's
    :attr:`~unilab_gym.tasks.base.Task.objects` (:class:`ObjectEpisodes`); it collides with the ground and its own
    env's robot only; its state is in :class:`~unilab_gym.sim.world.RobotState` (``object_pos``, ...)."""

    def __post_init__(self) -> None:
        if self.ground not in GROUNDS:
            raise ValueError(f"Scene: ground must be one of {list(GROUNDS)}, got {self.ground!r}")
        object.__setattr__(
            self, "ground_friction", check_real("Scene: ground_friction", self.ground_friction, minimum=0.0)
        )
        if not isinstance(self.objects, (bool, np.bool_)):
            raise ValueError(f"Scene: objects must be True or False, got {self.objects!r}")
