"""Domain randomization: the physics parameters of one quadruped episode, drawn from its episode seed.

Every episode of every env has one value of each parameter of :data:`PARAMETERS`. With a key
absent from the ``domain_randomization`` config the value is the nominal one (the A1 model as
loaded); with a key present it is drawn uniformly from the configured range at reset, from the
episode's own random stream (so the determinism contract holds with randomization on).

A config is a dict ``{name: (low, high)}`` or ``{name: value}`` (a fixed value, e.g. the
``parameters`` of a trace record, which replays that episode's physics). Ranges are inclusive;
``latency`` takes integers.

Pure numpy: nothing here touches physics (see :meth:`unilab_gym.sim.world.ClusterWorld.set_dynamics`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from unilab_gym.sim import a1
from unilab_gym.validation import check_real

#: Upper bound of ``latency`` in control steps (1 s at 50 Hz): the action FIFO holds this many + 1 actions per env.
MAX_LATENCY = 50


@dataclass(frozen=True)
class Parameter:
    """One randomizable physics parameter.

    ``nominal``: its value when not randomized. ``unit``: its unit (``""`` for the friction
    coefficient, ``"×"`` for a scale factor). ``valid``: which values are
    allowed, ``requirement``: the same in words (for error messages). ``integer``: integer values only.
    ``doc``: meaning and source.
    """

    nominal: float
    unit: str
    valid: Callable[[float], bool]
    requirement: str
    doc: str
    integer: bool = False


#: The randomizable parameters, in the order of :data:`PARAMETER_NAMES` (the columns of parameter arrays).
#: Ranges in the docs are the defaults of legged_gym (Rudin et al. 2022, ``legged_robot_config.py``) or of
#: walk-these-ways (Margolis & Agrawal 2022, ``go1_gym/envs/base/legged_robot_config.py``), for reference.
PARAMETERS: dict[str, Parameter] = {
    "friction": Parameter(
        a1.LINK_FRICTION,
        "",
        lambda v: 0.0 <= v <= 10.0,
        "0 <= friction <= 10",
        "Robot-ground lateral friction coefficient: set on every robot link (the ground's is 1.0 and pybullet "
        "multiplies the two; it caps the product at 10). legged_gym friction_range (0.5, 1.25).",
    ),
    "added_mass": Parameter(
        0.0,
        "kg",
        lambda v: a1.TRUNK_MASS + v > 0.0,
        f"added_mass > -{a1.TRUNK_MASS} kg (the trunk's mass)",
        "Mass added to the trunk (4.713 kg); pybullet scales the trunk's inertia with its mass. "
        "legged_gym added_mass_range (-1, 1).",
    ),
    "com_x": Parameter(
        0.0,
        "m",
        lambda v: abs(v) <= 0.2,
        "|com_x| <= 0.2 m",
        "Trunk centre-of-mass offset along the trunk's x axis (forward). pybullet cannot move a link's "
        "centre of mass after loading, so the trunk's weight is made to act at the offset point: an "
        "external torque offset x (trunk mass x g) each physics step. "
        "walk-these-ways com_displacement_range (-0.15, 0.15).",
    ),
    "com_y": Parameter(
        0.0, "m", lambda v: abs(v) <= 0.2, "|com_y| <= 0.2 m", "As com_x, along the trunk's y axis (left)."
    ),
    "com_z": Parameter(
        0.0, "m", lambda v: abs(v) <= 0.2, "|com_z| <= 0.2 m", "As com_x, along the trunk's z axis (up)."
    ),
    "motor_strength": Parameter(
        1.0,
        "×",
        lambda v: v >= 0.0,
        "motor_strength >= 0",
        "Scale of every joint's torque limit (URDF: hip 20, thigh and calf 55 N·m). "
        "walk-these-ways motor_strength_range (0.9, 1.1) (which scales the whole torque).",
    ),
    "kp_factor": Parameter(
        1.0,
        "×",
        lambda v: v >= 0.0,
        "kp_factor >= 0",
        "Scale of the PD stiffness kp. walk-these-ways Kp_factor_range (0.8, 1.3).",
    ),
    "kd_factor": Parameter(
        1.0,
        "×",
        lambda v: v >= 0.0,
        "kd_factor >= 0",
        "Scale of the PD damping kd. walk-these-ways Kd_factor_range (0.5, 1.5).",
    ),
    "latency": Parameter(
        0,
        "control steps",
        lambda v: 0 <= v <= MAX_LATENCY,
        f"0 <= latency <= {MAX_LATENCY} control steps",
        "Action latency: the action applied at control step t is the one the policy sent at step t - latency "
        "(the zero action, i.e. the nominal pose, before the episode's first). One control step is "
        "dt x substeps (20 ms by default). walk-these-ways lag_timesteps 6 (physics steps of 5 ms: 30 ms).",
        integer=True,
    ),
    "push_interval": Parameter(
        15.0,
        "s",
        lambda v: v > 0.0,
        "push_interval > 0 s",
        "Time between pushes, rounded to whole control steps (at least one). legged_gym push_interval_s 15.",
    ),
    "push_velocity": Parameter(
        0.0,
        "m/s",
        lambda v: v >= 0.0,
        "push_velocity >= 0 m/s",
        "Horizontal speed added to the base at each push, in a direction drawn uniformly from the episode's "
        "stream (legged_gym instead sets v_xy uniform in +-max_push_vel_xy, 1.0 m/s). 0 = no pushes.",
    ),
}

#: Parameter names; the column order of parameter arrays.
PARAMETER_NAMES: tuple[str, ...] = tuple(PARAMETERS)

#: Nominal value of every parameter, (P,) float64 in :data:`PARAMETER_NAMES` order.
NOMINAL = np.array([PARAMETERS[name].nominal for name in PARAMETER_NAMES], dtype=np.float64)


def _bounds(name: str, value: Any) -> tuple[float, float]:
    """(low, high) of config entry ``name``; raises ValueError naming the entry."""
    spec = PARAMETERS[name]
    label = f"domain_randomization[{name!r}]"
    if isinstance(value, (Sequence, np.ndarray)) and not isinstance(value, (str, bytes)):
        if len(value) != 2:
            raise ValueError(f"{label} must be a number or a (low, high) pair of numbers, got {value!r}")
        lo, hi = check_real(label, value[0]), check_real(label, value[1])
    else:
        lo = hi = check_real(label, value)
    if lo > hi:
        raise ValueError(f"domain_randomization[{name!r}] must have low <= high, got {value!r}")
    if spec.integer and not (lo.is_integer() and hi.is_integer()):
        raise ValueError(f"domain_randomization[{name!r}] takes integers ({spec.unit}), got {value!r}")
    if not (spec.valid(lo) and spec.valid(hi)):
        raise ValueError(f"domain_randomization[{name!r}] = {value!r} is out of range: need {spec.requirement}")
    return lo, hi


class DomainRandomization:
    """A validated ``domain_randomization`` config: a range for some of :data:`PARAMETERS`.

    Args:
        config: ``None`` or ``{}`` (off: every parameter nominal), or a mapping from parameter
            names to a number (fixed value) or a ``(low, high)`` pair (uniform, inclusive).

    Raises:
        ValueError: ``config`` is not a mapping, has an unknown key (the message lists the
            valid ones), or a value that is not a number / pair, not finite, with low > high,
            outside the parameter's valid range, or not an integer where one is needed.
    """

    def __init__(self, config: Mapping[str, Any] | None = None):
        """Validate ``config`` into :attr:`ranges` (arguments: see the class docstring)."""
        if config is None:
            config = {}
        if not isinstance(config, Mapping):
            raise ValueError(f"domain_randomization must be a dict of parameter ranges or None, got {config!r}")
        unknown = sorted(str(k) for k in config if k not in PARAMETERS)
        if unknown:
            raise ValueError(f"unknown domain_randomization key(s) {unknown}; valid keys: {list(PARAMETER_NAMES)}")
        #: name -> (low, high) of the configured parameters, in :data:`PARAMETER_NAMES` order.
        self.ranges: dict[str, tuple[float, float]] = {
            name: _bounds(name, config[name]) for name in PARAMETER_NAMES if name in config
        }
        #: (P,) float64 lower / upper bounds of every parameter (nominal for unconfigured ones).
        self.low = NOMINAL.copy()
        self.high = NOMINAL.copy()
        for name, (lo, hi) in self.ranges.items():
            k = PARAMETER_NAMES.index(name)
            self.low[k], self.high[k] = lo, hi
        self._integer = np.array([PARAMETERS[n].integer for n in PARAMETER_NAMES])
        #: Largest latency (control steps) this config can draw.
        self.max_latency = int(self.high[PARAMETER_NAMES.index("latency")])
        #: Whether this config can draw a push velocity > 0.
        self.pushes = bool(self.high[PARAMETER_NAMES.index("push_velocity")] > 0.0)

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        """One episode's parameters, (P,) float64 in :data:`PARAMETER_NAMES` order.

        Always draws exactly P uniforms from ``rng`` whatever the config, so the draws that
        follow in the same stream do not depend on it, and a fixed value ``v`` (low = high)
        is returned exactly. A continuous parameter is ``low + (high - low) * u``; an integer
        one ``floor(low + (high - low + 1) * u)``, uniform over ``low..high``.
        """
        u = rng.random(len(PARAMETER_NAMES))
        values = self.low + (self.high - self.low) * u
        ints = np.minimum(np.floor(self.low + (self.high - self.low + 1.0) * u), self.high)
        return np.where(self._integer, ints, values)

    def to_dict(self) -> dict[str, list[float]]:
        """The config as JSON-able ``{name: [low, high]}`` (``DomainRandomization(d.to_dict())`` is equivalent)."""
        return {name: [lo, hi] for name, (lo, hi) in self.ranges.items()}

    def __eq__(self, other: object) -> bool:
        """Configs are equal when they have the same ranges."""
        return isinstance(other, DomainRandomization) and self.ranges == other.ranges

    def __hash__(self) -> int:
        """Hash of the ranges (equal configs hash equal)."""
        return hash(tuple(self.ranges.items()))

    def __repr__(self) -> str:
        """``DomainRandomization({name: [low, high]})``."""
        return f"DomainRandomization({self.to_dict()})"


def parameters_dict(values: np.ndarray) -> dict[str, float | int]:
    """One episode's (P,) parameter array as ``{name: value}`` of Python numbers (ints for integer parameters)."""
    return {name: int(v) if PARAMETERS[name].integer else float(v) for name, v in zip(PARAMETER_NAMES, values)}
