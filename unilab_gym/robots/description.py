"""``RobotDescription``: one robot as data, validated when it is made.

The checks that need only the description (types, shapes, signs, that the URDF file exists) run in
:meth:`RobotDescription.__post_init__`; the names of joints and links are checked against the URDF when the
physics layer loads it (:class:`unilab_gym.sim.world.ClusterWorld`), with the valid names in the message. Every
error is a ``ValueError`` naming the field.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

import numpy as np
import pybullet_data

from unilab_gym.validation import check_real


def resolve_urdf(urdf: str, owner: str = "RobotDescription") -> str:
    """The absolute path of the URDF ``urdf``.

    Args:
        urdf: an absolute path (``~`` is expanded), or a path relative to ``pybullet_data``
            (``pybullet_data.getDataPath()``, e.g. ``"a1/a1.urdf"``), or else to the current directory.
        owner: who asks, for the message.

    Raises:
        ValueError: ``urdf`` is not a non-empty string, or names no file (the message lists the places looked in).
    """
    if not isinstance(urdf, (str, os.PathLike)) or not str(urdf):
        raise ValueError(f"{owner}: urdf must be a path to a .urdf file, got {urdf!r}")
    path = os.path.expanduser(os.fspath(urdf))
    candidates = [path] if os.path.isabs(path) else [os.path.join(pybullet_data.getDataPath(), path), path]
    for candidate in candidates:
        if os.path.isfile(candidate):
            return os.path.abspath(candidate)
    raise ValueError(
        f"{owner}: urdf {os.fspath(urdf)!r} names no file (looked for {candidates}); give an absolute path or a path "
        f"relative to pybullet_data ({pybullet_data.getDataPath()})"
    )


@dataclass(frozen=True)
class RobotDescription:
    """A robot as data: what the physics layer loads and what a task reads.

    Joint-indexed fields (``nominal_joint_pos``, ``kp``, ``kd``, ``torque_limits``, ``joint_damping``) follow
    ``joint_names``; a single number for ``kp`` / ``kd`` / ``joint_damping`` is used for every joint. Each field also
    accepts the JSON form :meth:`to_dict` writes (lists for tuples, a dict for ``reward_weights``), so
    ``RobotDescription.from_dict(r.to_dict()) == r``.

    Frames: the URDF's base frame must have x forward, y left and z up (the base orientation is the identity at
    spawn); for a URDF with other conventions use or write a z-up variant (e.g. ``laikago_toes_zup.urdf``).

    Raises:
        ValueError: naming the field: a missing URDF file, repeated joint names, a pose, gain, damping or limit of
            the wrong length, negative gains or damping, non-positive limits, heights or action scale, reward weights
            that are not a dict of names to finite numbers (a name that is not one of the task's reward terms is
            refused when a task is configured with the robot). Unknown joint or link
            names are reported when the URDF is loaded (:class:`~unilab_gym.sim.world.ClusterWorld`), with the
            URDF's valid names.
    """

    name: str
    """Short name, recorded in ``task_config`` and the parameter trace header."""
    urdf: str
    """The URDF: an absolute path, or relative to ``pybullet_data`` (see :func:`resolve_urdf`)."""
    joint_names: tuple[str, ...]
    """URDF names of the actuated (revolute or prismatic) joints, in the order of actions and observations; empty for
    a robot that a task moves by external forces only (:attr:`unilab_gym.tasks.base.Task.actuation` ``"external"``,
    e.g. the quadrotor ``unilab_gym.robots.quadrotors.CF2X``)."""
    nominal_joint_pos: tuple[float, ...]
    """Nominal (standing) pose in rad (m for prismatic joints), one per joint: the PD target of the zero action."""
    kp: tuple[float, ...]
    """PD stiffness in N·m/rad per joint, >= 0 (one number for all)."""
    kd: tuple[float, ...]
    """PD damping in N·m·s/rad per joint, >= 0 (one number for all)."""
    spawn_height: float
    """Base height in m at which the robot is spawned and reset (feet just above the ground), > 0."""
    standing_height: float
    """Base height in m of the robot standing in its nominal pose, > 0: the default ``base_height_target``."""
    foot_links: tuple[str, ...] = ()
    """URDF names of the foot links (``RobotState.foot_contact`` columns), in leg order."""
    contact_links: tuple[str, ...] = ()
    """URDF names of the links whose ground contact a task penalizes (``RobotState.leg_contact`` columns)."""
    base_link: str | None = None
    """URDF name of the base (root) link; ``None``: whatever the URDF's root is. Checked against the URDF."""
    end_effector_link: str | None = None
    """URDF name of an end-effector link (manipulators); ``None``: none."""
    torque_limits: tuple[float, ...] | None = None
    """Torque limit of each joint in N·m, > 0; ``None``: the URDF's ``<limit effort=...>`` (which must then be > 0)."""
    action_scale: float = 0.25
    """Joint target offset in rad per unit of action, > 0: the default ``action_scale`` of a task."""
    fixed_base: bool = False
    """Whether the base is fixed in the world (a manipulator bolted to the ground; pybullet ``useFixedBase``). The
    base is still placed at each reset (lane, ``spawn_height``)."""
    use_urdf_inertia: bool = False
    """Load the URDF's ``<inertia>`` tensors (pybullet ``URDF_USE_INERTIA_FROM_FILE``); ``False`` (default):
    pybullet computes each link's inertia from its collision shapes and mass, as for the shipped quadrupeds."""
    joint_damping: tuple[float, ...] | None = None
    """Joint damping in N·m·s/rad per joint (one number for all), >= 0, replacing the URDF's
    ``<dynamics damping=...>`` of the actuated joints (pybullet ``changeDynamics(jointDamping=)``, which pybullet
    applies explicitly every physics step, besides the PD's ``kd``); ``None`` (default): the URDF's. A URDF's
    damping on a light link can spin it at pybullet's velocity cap (``docs/add-a-robot.md``): 0 turns it off."""
    reward_weights: Mapping[str, float] = field(default_factory=dict, hash=False)
    """Per-robot overrides of the task's reward weights, by term name (e.g. ``{"torques": -1e-5}`` for a robot
    with stiffer gains than the A1 whose weights are the defaults); empty (default): the task's defaults. Each value
    a finite real number. A task applies them under the ``reward_weights`` its caller gives (those win) and refuses a
    name that is none of its terms (a ``ValueError`` naming this field; :func:`unilab_gym.tasks.weights.resolve`)."""
    urdf_path: str = field(init=False, compare=False, repr=False)
    """The resolved absolute path of :attr:`urdf` (set at construction)."""

    def __post_init__(self) -> None:
        """Validate every field and convert it to its stored type (see the class docstring)."""
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"RobotDescription: name must be a non-empty string, got {self.name!r}")
        owner = f"RobotDescription {self.name!r}"
        set_ = object.__setattr__
        set_(self, "urdf_path", resolve_urdf(self.urdf, owner))
        set_(self, "urdf", os.fspath(self.urdf))
        joints = _names(owner, "joint_names", self.joint_names)  # () for a robot moved by external forces only
        set_(self, "joint_names", joints)
        n = len(joints)
        set_(self, "nominal_joint_pos", _per_joint(owner, "nominal_joint_pos", self.nominal_joint_pos, n, None, False))
        set_(self, "kp", _per_joint(owner, "kp", self.kp, n, 0.0, True))
        set_(self, "kd", _per_joint(owner, "kd", self.kd, n, 0.0, True))
        if self.torque_limits is not None:
            limits = _per_joint(owner, "torque_limits", self.torque_limits, n, 0.0, False)
            if min(limits) <= 0.0:
                raise ValueError(f"{owner}: torque_limits must all be > 0 N·m, got {self.torque_limits!r}")
            set_(self, "torque_limits", limits)
        if self.joint_damping is not None:
            set_(self, "joint_damping", _per_joint(owner, "joint_damping", self.joint_damping, n, 0.0, True))
        set_(self, "reward_weights", _weights(owner, self.reward_weights))
        set_(self, "foot_links", _names(owner, "foot_links", self.foot_links))
        set_(self, "contact_links", _names(owner, "contact_links", self.contact_links))
        for name in ("base_link", "end_effector_link"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{owner}: {name} must be a link name or None, got {value!r}")
        if not isinstance(self.use_urdf_inertia, (bool, np.bool_)):
            raise ValueError(f"{owner}: use_urdf_inertia must be True or False, got {self.use_urdf_inertia!r}")
        set_(self, "use_urdf_inertia", bool(self.use_urdf_inertia))
        if not isinstance(self.fixed_base, (bool, np.bool_)):
            raise ValueError(f"{owner}: fixed_base must be True or False, got {self.fixed_base!r}")
        set_(self, "fixed_base", bool(self.fixed_base))
        for name in ("spawn_height", "standing_height", "action_scale"):
            set_(self, name, check_real(f"{owner}: {name}", getattr(self, name), minimum=0.0, exclusive_minimum=True))

    @property
    def num_joints(self) -> int:
        """Number of actuated joints."""
        return len(self.joint_names)

    def to_dict(self) -> dict[str, Any]:
        """The description as JSON types (lists for tuples), in field order; :meth:`from_dict` reads it back."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.init:
                value = getattr(self, f.name)
                if isinstance(value, tuple):
                    value = list(value)
                elif isinstance(value, Mapping):
                    value = dict(value)
                out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> RobotDescription:
        """A description from the dict :meth:`to_dict` writes.

        Raises:
            ValueError: an unknown or missing key (named, with the known ones), or an invalid value (named).
        """
        known = [f.name for f in fields(cls) if f.init]
        unknown = sorted(str(k) for k in values if k not in known)
        if unknown:
            raise ValueError(f"unknown RobotDescription field(s) {unknown}; known: {known}")
        required = [f.name for f in fields(cls) if f.init and f.default is MISSING and f.default_factory is MISSING]
        missing = [k for k in required if k not in values]
        if missing:
            raise ValueError(f"RobotDescription needs field(s) {missing}; got {sorted(values)}")
        return cls(**dict(values))


def _weights(owner: str, value: Any) -> dict[str, float]:
    """``reward_weights``: a dict of non-empty term names to finite floats (the names are checked by the task)."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{owner}: reward_weights must be a dict of reward term names to weights, got {value!r}")
    bad = [k for k in value if not isinstance(k, str) or not k]
    if bad:
        raise ValueError(f"{owner}: reward_weights keys must be reward term names (non-empty strings), got {bad!r}")
    return {k: check_real(f"{owner}: reward_weights[{k!r}]", v) for k, v in value.items()}


def _names(owner: str, name: str, value: Any) -> tuple[str, ...]:
    """A tuple of distinct non-empty strings."""
    if isinstance(value, str) or not isinstance(value, (Sequence, np.ndarray)):
        raise ValueError(f"{owner}: {name} must be a sequence of names, got {value!r}")
    names = tuple(value)
    if not all(isinstance(v, str) and v for v in names):
        raise ValueError(f"{owner}: {name} must hold non-empty strings, got {value!r}")
    repeated = sorted({v for v in names if names.count(v) > 1})
    if repeated:
        raise ValueError(f"{owner}: {name} names {repeated} more than once")
    return names


def _per_joint(owner: str, name: str, value: Any, n: int, minimum: float | None, scalar_ok: bool) -> tuple[float, ...]:
    """One finite float per joint (a single number for all of them if ``scalar_ok``)."""
    if isinstance(value, (Sequence, np.ndarray)) and not isinstance(value, (str, bytes)):
        values = list(np.asarray(value, dtype=object).reshape(-1)) if isinstance(value, np.ndarray) else list(value)
        if isinstance(value, np.ndarray) and value.ndim != 1:
            raise ValueError(f"{owner}: {name} must have shape ({n},) (one per joint), got shape {value.shape}")
    elif scalar_ok:
        values = [value] * n
    else:
        raise ValueError(f"{owner}: {name} must be a sequence of {n} numbers (one per joint), got {value!r}")
    if len(values) != n:
        raise ValueError(
            f"{owner}: {name} must have {n} values (one per joint of joint_names)"
            f"{' or be one number' if scalar_ok else ''}, got {len(values)}: {value!r}"
        )
    return tuple(check_real(f"{owner}: {name}", v, minimum=minimum) for v in values)
