"""``Scene``: what a task needs in its world besides the robots, as data (no pybullet here).

Today one ground: an infinite plane. Later tasks add a heightfield or objects as new fields; the physics layer
(:class:`unilab_gym.sim.world.ClusterWorld`) builds each world of a cluster from it, the same way in every world.
"""

from __future__ import annotations

from dataclasses import dataclass

from unilab_gym.validation import check_real

#: The grounds :class:`Scene` knows.
GROUNDS = ("plane",)


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

    def __post_init__(self) -> None:
        if self.ground not in GROUNDS:
            raise ValueError(f"Scene: ground must be one of {list(GROUNDS)}, got {self.ground!r}")
        object.__setattr__(
            self, "ground_friction", check_real("Scene: ground_friction", self.ground_friction, minimum=0.0)
        )
