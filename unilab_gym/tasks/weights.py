"""Per-robot reward weights: a task's weights with its robot's overrides (:attr:`RobotDescription.reward_weights`).

One job: :func:`resolve` turns a task configuration's ``reward_weights`` argument and its robot's overrides into the
task's weights dataclass, with the precedence caller > robot > the dataclass's defaults.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import Any, TypeVar

from unilab_gym.robots import RobotDescription

W = TypeVar("W")


def resolve(cls: type[W], robot: RobotDescription, value: Any, convert: Callable[[Any], W]) -> W:
    """The weights of a task configured with ``robot`` and ``reward_weights=value``.

    Args:
        cls: the task's weights dataclass (e.g. :class:`unilab_gym.tasks.quadruped.RewardWeights`); its fields are
            the task's reward term names, its defaults the task's weights.
        robot: the task's robot; its :attr:`~unilab_gym.robots.RobotDescription.reward_weights` override ``cls``'s
            defaults.
        value: ``None`` (the defaults with the robot's overrides), a dict of overrides (applied over the robot's),
            or a ``cls`` instance (used as it is: every weight given).
        convert: the task's own conversion of a ``reward_weights`` argument (a dict of overrides, or anything else
            it refuses with its own message) into ``cls``.

    Returns:
        A ``cls`` instance: ``value`` itself if it is one, else ``convert({**robot.reward_weights, **value})``.

    Raises:
        ValueError: a name in the robot's ``reward_weights`` that is not a field of ``cls`` (the message names the
            robot, the field and the known terms), or whatever ``convert`` raises (an unknown name in ``value``, a
            weight that is not a finite number, ``value`` of another type).
    """
    if isinstance(value, cls) or not robot.reward_weights:
        return convert(value)
    known = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    unknown = sorted(str(k) for k in robot.reward_weights if k not in known)
    if unknown:
        raise ValueError(
            f"robot {robot.name!r}: reward_weights names unknown reward term(s) {unknown} of this task "
            f"({cls.__name__}); known: {known}"
        )
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        return convert(value)  # refused with the task's message
    return convert({**robot.reward_weights, **value})
