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
    """Each env's object for its current episode (``Scene(objects=True)``), as (N, ...) arrays.

    A task writes them in :meth:`~unilab_gym.tasks.base.Task.sample_episode`; the engine hands the rows of the envs it
    resets to the physics layer, which builds each object anew (:mod:`unilab_gym.sim.objects`).
    """

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


@dataclass
class TerrainEpisodes:
    """Each env's terrain tile for its current episode (``Scene(terrain=True)``).

    Written by the task in :meth:`~unilab_gym.tasks.base.Task.sample_episode`; the engine hands the rows of the envs
    it resets to the physics layer, which gives each robot's tile these heights, centred on the robot's spawn point
    (:mod:`unilab_gym.sim.terrain`), and writes that centre into :attr:`origin`.
    """

    heights: np.ndarray
    """(N, n, n) float32 heights in m (row = y, column = x), centred on the tile's centre (world z = height)."""
    horizontal_scale: float
    """Grid spacing in m."""
    origin: np.ndarray
    """(N, 2) float64 world x, y in m of each tile's centre (the robot's spawn point), written by the engine."""

    @classmethod
    def zeros(cls, n: int, cells: int, horizontal_scale: float) -> TerrainEpisodes:
        """``n`` flat tiles of ``cells`` x ``cells`` points."""
        return cls(np.zeros((n, cells, cells), np.float32), float(horizontal_scale), np.zeros((n, 2)))

    def spawn_height(self, rows: np.ndarray) -> np.ndarray:
        """(k,) m: the height of the tiles ``rows`` at their centre (where the robot spawns)."""
        c = (self.heights.shape[-1] - 1) // 2
        return self.heights[rows, c, c].astype(np.float64)


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
    terrain: bool = False
    """One heightfield tile per env (``True``), given new heights at each of its episodes from the task's
    :attr:`~unilab_gym.tasks.base.Task.terrain` (:class:`TerrainEpisodes`); it collides with its own env's robot
    only, and the plane then collides with no robot."""

    def __post_init__(self) -> None:
        """Check the fields.

        Raises:
            ValueError: an unknown ``ground``, a negative ``ground_friction``, or ``objects`` / ``terrain`` not a bool.
        """
        if self.ground not in GROUNDS:
            raise ValueError(f"Scene: ground must be one of {list(GROUNDS)}, got {self.ground!r}")
        object.__setattr__(
            self, "ground_friction", check_real("Scene: ground_friction", self.ground_friction, minimum=0.0)
        )
        if not isinstance(self.objects, (bool, np.bool_)):
            raise ValueError(f"Scene: objects must be True or False, got {self.objects!r}")
        if not isinstance(self.terrain, (bool, np.bool_)):
            raise ValueError(f"Scene: terrain must be True or False, got {self.terrain!r}")
