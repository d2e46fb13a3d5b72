"""Robots as data: :class:`RobotDescription` and the shipped robots (:data:`ROBOTS`).

A robot is a frozen, validated description: its URDF, the actuated joints in the order actions and
observations use them, their nominal pose, PD gains and torque limits, the named links a task reads (feet,
contact-penalized links, base, end effector), an action scale and where to spawn it. The physics layer
(:class:`unilab_gym.sim.world.ClusterWorld`) loads one description the same way into every world of every
cluster, and checks the names against the URDF when it loads it. Nothing here imports pybullet.

Shipped robots (all URDFs in ``pybullet_data``): ``"a1"`` (the default), ``"aliengo"``, ``"laikago"``,
``"mini_cheetah"``; see :mod:`unilab_gym.robots.quadrupeds` for each one's numbers and their sources. The Franka
Panda arm (:data:`PANDA`, :mod:`unilab_gym.robots.panda`) is the robot of the Panda tasks, not a quadruped: it is not
in :data:`ROBOTS`.
"""

from __future__ import annotations

from unilab_gym.robots.description import RobotDescription, resolve_urdf
from unilab_gym.robots.panda import PANDA
from unilab_gym.robots.quadrupeds import A1, ALIENGO, LAIKAGO, MINI_CHEETAH

#: The shipped robots by name: ``robot=NAME`` of ``UniLab/Quadruped-v0``.
ROBOTS: dict[str, RobotDescription] = {r.name: r for r in (A1, ALIENGO, LAIKAGO, MINI_CHEETAH)}


def get_robot(robot: str | RobotDescription | dict) -> RobotDescription:
    """The :class:`RobotDescription` of ``robot``.

    Args:
        robot: a shipped robot's name (a key of :data:`ROBOTS`), a :class:`RobotDescription` (returned as is), or
            the dict :meth:`RobotDescription.to_dict` writes (the form a ``task_config`` or a trace header holds).

    Raises:
        ValueError: an unknown name (the message lists the shipped ones), or an invalid description (naming the
            field).
        TypeError: ``robot`` of another type.
    """
    if isinstance(robot, RobotDescription):
        return robot
    if isinstance(robot, str):
        if robot not in ROBOTS:
            raise ValueError(
                f"robot must be one of the shipped robots {sorted(ROBOTS)} or a unilab_gym.robots.RobotDescription, "
                f"got {robot!r}"
            )
        return ROBOTS[robot]
    if isinstance(robot, dict):
        return RobotDescription.from_dict(robot)
    raise TypeError(
        f"robot must be a robot name ({sorted(ROBOTS)}), a unilab_gym.robots.RobotDescription or its to_dict() form, "
        f"got {type(robot).__name__}: {robot!r}"
    )


def robot_to_json(robot: RobotDescription) -> str | dict:
    """``robot`` in a ``task_config``: its name if it is the shipped robot of that name, else its full dict."""
    return robot.name if ROBOTS.get(robot.name) == robot else robot.to_dict()


__all__ = [
    "A1",
    "ALIENGO",
    "LAIKAGO",
    "MINI_CHEETAH",
    "PANDA",
    "ROBOTS",
    "RobotDescription",
    "get_robot",
    "resolve_urdf",
    "robot_to_json",
]
