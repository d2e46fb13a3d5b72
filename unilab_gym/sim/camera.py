"""``Camera``: where a task's frames are taken from, as data (no pybullet here).

A task sets :attr:`~unilab_gym.tasks.base.Task.camera`; the physics layer
(:meth:`unilab_gym.sim.world.ClusterWorld.render`) turns it into pybullet's orbit camera
(``computeViewMatrixFromYawPitchRoll``: the eye is ``distance`` m from the target, at ``yaw`` degrees about the
world z axis and ``pitch`` degrees of elevation, negative looking down) and a perspective projection of ``fov``
degrees (vertical). The target moves with the robot or stays at the env's spawn point (:data:`FOLLOW`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from unilab_gym.validation import check_real

#: The values of :attr:`Camera.follow`: ``"base"`` (the target is the robot's base position plus ``offset``),
#: ``"base_xy"`` (the base's x, y and ``offset``'s z: the camera follows a walking robot without bobbing with it),
#: ``"spawn"`` (the robot's spawn point of the current episode, its lane's origin at the spawn height, plus
#: ``offset``: a fixed view of a fixed-base arm or of a quadrotor flying to its target).
FOLLOW = ("base", "base_xy", "spawn")


@dataclass(frozen=True)
class Camera:
    """An orbit camera looking at a point that follows one env's robot.

    The default is the camera every task had before cameras were per task (``UniLab/Quadruped-v0``'s): it looks at
    the base's x, y at z = 0.25 m from 1.2 m away, 45° about z, 25° down.

    Raises:
        ValueError: an unknown ``follow`` (the message lists :data:`FOLLOW`), an ``offset`` that is not three finite
            numbers, a non-positive ``distance``, a ``pitch`` outside [-90, 90], a ``fov`` outside (0, 180), or
            ``near``/``far`` not with 0 < near < far; the message names the field.
    """

    follow: str = "base_xy"
    """What the target follows: one of :data:`FOLLOW`."""
    offset: tuple[float, float, float] = (0.0, 0.0, 0.25)
    """(x, y, z) in m, world axes, added to the followed point (with ``"base_xy"`` its z is the target's height)."""
    distance: float = 1.2
    """Eye-to-target distance in m, > 0."""
    yaw: float = 45.0
    """Degrees about the world z axis (pybullet's camera yaw: 0 looks along +y, 90 along -x)."""
    pitch: float = -25.0
    """Degrees of elevation in [-90, 90]; negative looks down at the target."""
    fov: float = 60.0
    """Vertical field of view in degrees, in (0, 180)."""
    near: float = 0.05
    """Near clipping distance in m."""
    far: float = 20.0
    """Far clipping distance in m."""

    def __post_init__(self) -> None:
        """Check and convert the fields (``ValueError`` naming the field)."""
        if self.follow not in FOLLOW:
            raise ValueError(f"Camera: follow must be one of {list(FOLLOW)}, got {self.follow!r}")
        offset = np.asarray(self.offset, dtype=np.float64) if _is_triple(self.offset) else None
        if offset is None or not np.all(np.isfinite(offset)):
            raise ValueError(f"Camera: offset must be three finite numbers (x, y, z) in m, got {self.offset!r}")
        object.__setattr__(self, "offset", tuple(float(v) for v in offset))
        set_ = object.__setattr__
        set_(self, "distance", check_real("Camera: distance", self.distance, minimum=0.0, exclusive_minimum=True))
        set_(self, "yaw", check_real("Camera: yaw", self.yaw))
        set_(self, "pitch", check_real("Camera: pitch", self.pitch, minimum=-90.0, maximum=90.0))
        set_(self, "fov", check_real("Camera: fov", self.fov, minimum=0.0, maximum=180.0, exclusive_minimum=True))
        set_(self, "near", check_real("Camera: near", self.near, minimum=0.0, exclusive_minimum=True))
        set_(self, "far", check_real("Camera: far", self.far, minimum=0.0, exclusive_minimum=True))
        if self.fov >= 180.0:
            raise ValueError(f"Camera: fov must be < 180 degrees, got {self.fov!r}")
        if self.far <= self.near:
            raise ValueError(f"Camera: far ({self.far!r}) must be greater than near ({self.near!r})")

    def target(self, base_pos: np.ndarray, spawn_pos: np.ndarray) -> np.ndarray:
        """(3,) float64 world point in m the camera looks at.

        Args:
            base_pos: (3,) m, the robot's base position now.
            spawn_pos: (3,) m, where its current episode spawned it (lane origin, spawn height).
        """
        offset = np.asarray(self.offset)
        if self.follow == "spawn":
            return np.asarray(spawn_pos, dtype=np.float64) + offset
        point = np.array(base_pos, dtype=np.float64) + offset
        if self.follow == "base_xy":
            point[2] = offset[2]
        return point


def _is_triple(value: Any) -> bool:
    try:
        return np.shape(value) == (3,)
    except (TypeError, ValueError):
        return False
