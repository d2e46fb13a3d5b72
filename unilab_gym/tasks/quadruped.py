"""Velocity-tracking locomotion task for a quadruped.

Pure, batched numpy functions, its configuration (:class:`QuadrupedConfig`) and :class:`QuadrupedTask`.

Nothing here touches physics: every function maps state arrays of N robots to
observations, reward terms or termination flags, so it can be tested on hand-made states.
:class:`QuadrupedTask` puts them on the task seam (:class:`~unilab_gym.tasks.base.Task`) for
any 12-joint, 4-foot robot (:mod:`unilab_gym.robots`).

Reward terms follow legged_gym (Rudin et al. 2022, "Learning to Walk in Minutes Using
Massively Parallel Deep Reinforcement Learning", ``legged_robot.py``): each term is
multiplied by its weight and by the control period ``dt`` (s), so weights are per second.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import numpy as np

from unilab_gym.randomization import DomainRandomization
from unilab_gym.robots import RobotDescription, get_robot, robot_to_json
from unilab_gym.sim import a1
from unilab_gym.sim.rotation import quat_rotate_inverse, roll_pitch
from unilab_gym.tasks import weights
from unilab_gym.tasks.base import Task
from unilab_gym.validation import check_positive, check_positive_int, check_real

if TYPE_CHECKING:
    from unilab_gym.sim.world import RobotState

#: Observation layout: name -> (start, stop) column range, with units.
OBS_LAYOUT: dict[str, tuple[int, int]] = {
    "base_lin_vel": (0, 3),  # m/s, base frame
    "base_ang_vel": (3, 6),  # rad/s, base frame
    "projected_gravity": (6, 9),  # unit vector of gravity in the base frame
    "command": (9, 12),  # (vx m/s, vy m/s, yaw rate rad/s)
    "joint_pos": (12, 24),  # rad, relative to the nominal pose
    "joint_vel": (24, 36),  # rad/s
    "last_action": (36, 48),  # the clipped action of the previous step, in [-1, 1]
}
#: Observation size: the columns of :data:`OBS_LAYOUT`.
OBS_DIM = 48
#: Action size: one joint position target per actuated joint.
ACT_DIM = a1.NUM_JOINTS

#: Critic (privileged) observation layout, ``privileged_obs=True``: name -> (start, stop) column range, with units.
#: The first 48 columns are the policy observation (:data:`OBS_LAYOUT`); the rest is what only the simulator knows.
CRITIC_OBS_LAYOUT: dict[str, tuple[int, int]] = {
    **OBS_LAYOUT,
    # the episode's physics parameters (nominal values when not randomized), unilab_gym.randomization.PARAMETERS:
    "friction": (48, 49),  # robot-ground friction coefficient, 1
    "added_mass": (49, 50),  # kg added to the trunk
    "com_offset": (50, 53),  # m, trunk centre-of-mass offset (x forward, y left, z up), trunk frame
    "motor_strength": (53, 54),  # x, scale of the torque limits
    "kp_factor": (54, 55),  # x, scale of the PD stiffness
    "kd_factor": (55, 56),  # x, scale of the PD damping
    "latency": (56, 57),  # control steps (20 ms each by default) between the policy's action and its application
    "push_interval": (57, 58),  # s between pushes
    "push_velocity": (58, 59),  # m/s added to the base at each push (0 = no pushes)
    # state the real robot does not measure:
    "base_height": (59, 60),  # m, base above the ground
    "foot_contact": (60, 64),  # 1.0 where the foot (FR, FL, RR, RL) touches the ground, else 0.0
    "feet_air_time": (64, 68),  # s each foot (FR, FL, RR, RL) has been in the air (0 in contact)
}
#: Critic observation size: the columns of :data:`CRITIC_OBS_LAYOUT`.
CRITIC_OBS_DIM = 68

_OBS_SLICES = {name: slice(start, stop) for name, (start, stop) in OBS_LAYOUT.items()}
_PRIVILEGED = slice(OBS_DIM, CRITIC_OBS_LAYOUT["push_velocity"][1])
_BASE_HEIGHT = slice(*CRITIC_OBS_LAYOUT["base_height"])
_FOOT_CONTACT = slice(*CRITIC_OBS_LAYOUT["foot_contact"])
_FEET_AIR_TIME = slice(*CRITIC_OBS_LAYOUT["feet_air_time"])
_GRAVITY_DIRECTION = np.array([0.0, 0.0, -1.0])

#: Width (variance) of the exponential tracking kernels, in (m/s)^2 and (rad/s)^2 (legged_gym ``tracking_sigma``).
TRACKING_SIGMA = 0.25
#: Planar command speed in m/s at or under which ``feet_air_time`` is 0 (legged_gym ``_reward_feet_air_time``).
AIR_TIME_MIN_COMMAND = 0.1


@dataclass(frozen=True)
class RewardWeights:
    """Weights of the reward terms, per second of simulated time (legged_gym convention).

    Each term's raw value (below) is multiplied by its weight and by the control period ``dt`` (s):

    ======================  ========================================================================  ==========
    term                    raw value                                                                 unit
    ======================  ========================================================================  ==========
    ``tracking_lin_vel``    ``exp(-|cmd_xy - v_xy|^2 / 0.25)``                                        1
    ``tracking_ang_vel``    ``exp(-(cmd_yaw - w_z)^2 / 0.25)``                                        1
    ``lin_vel_z``           ``v_z^2``                                                                 (m/s)^2
    ``ang_vel_xy``          ``w_x^2 + w_y^2``                                                         (rad/s)^2
    ``torques``             ``sum_j tau_j^2``                                                         (N·m)^2
    ``action_rate``         ``sum_j (a_t - a_{t-1})_j^2``                                             1
    ``alive``               ``1``                                                                     1
    ``feet_air_time``       ``sum_feet (min(t_air, feet_air_time_max) - feet_air_time_target)`` over   s
                            the feet touching down this step (``t_air``: their time in the air), 0
                            when ``|cmd_xy|`` <= 0.1 m/s (:func:`feet_air_time`)
    ``base_height``         ``(h - base_height_target)^2``, ``h`` the base height above the ground    m^2
    ``orientation``         ``g_x^2 + g_y^2``, ``g`` the unit gravity vector in the base frame        1
    ``collision``           number of thigh and calf links touching the ground (0 to 8)               1
    ======================  ========================================================================  ==========

    Source of every term but ``alive``: legged_gym (Rudin et al. 2022), ``legged_robot.py``
    (``_reward_tracking_lin_vel``, ..., ``_reward_feet_air_time``, ``_reward_base_height``,
    ``_reward_orientation``, ``_reward_collision``); the cap ``feet_air_time_max`` is ours (legged_gym has
    none). Defaults (issue 15, measured in ``docs/env.md``): legged_gym's A1 weights for ``tracking_ang_vel``,
    ``lin_vel_z``, ``ang_vel_xy``, ``torques``, ``action_rate``, ``feet_air_time`` and ``collision``, plus a small
    ``alive`` bonus; ``tracking_lin_vel`` 2 (legged_gym 1), ``base_height`` -50 and ``orientation`` -2 (legged_gym
    0 for both). The reward before issue 15 is ``RewardWeights(tracking_lin_vel=1, feet_air_time=0,
    base_height=0, orientation=0, collision=0)``.

    Raises:
        ValueError: a weight that is not a finite real number, naming it.
    """

    tracking_lin_vel: float = 2.0
    tracking_ang_vel: float = 0.5
    lin_vel_z: float = -2.0
    ang_vel_xy: float = -0.05
    torques: float = -0.0002
    action_rate: float = -0.01
    alive: float = 0.1
    feet_air_time: float = 1.0
    base_height: float = -50.0
    orientation: float = -2.0
    collision: float = -1.0

    def __post_init__(self) -> None:
        """Check that every weight is a finite real number (raises ``ValueError`` naming it)."""
        for f in fields(self):
            object.__setattr__(self, f.name, check_real(f"reward_weights[{f.name!r}]", getattr(self, f.name)))

    @classmethod
    def from_dict(cls, weights: Mapping[str, float] | None) -> RewardWeights:
        """Defaults overridden by ``weights``.

        Raises:
            ValueError: an unknown term name (the message lists the known ones) or a weight that is not a
                finite real number.
        """
        return cls(**_known_keys("reward term", cls, weights))


def _known_keys(what: str, cls: type, values: Mapping[str, Any] | None) -> dict[str, Any]:
    """``values`` as a dict, if every key is a field of dataclass ``cls``; raises ValueError naming the others."""
    values = dict(values or {})
    known = [f.name for f in fields(cls)]
    unknown = sorted(str(k) for k in set(values) - set(known))
    if unknown:
        raise ValueError(f"unknown {what}(s) {unknown}; known: {known}")
    return values


def observation(
    base_quat: np.ndarray,
    lin_vel_world: np.ndarray,
    ang_vel_world: np.ndarray,
    command: np.ndarray,
    joint_pos: np.ndarray,
    nominal_joint_pos: np.ndarray,
    joint_vel: np.ndarray,
    last_action: np.ndarray,
    out: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Write the (N, 48) float32 observation into ``out``, column ranges :data:`OBS_LAYOUT`.

    Args:
        base_quat: (N, 4) xyzw unit quaternions, base -> world.
        lin_vel_world: (N, 3) base linear velocity in m/s, world frame.
        ang_vel_world: (N, 3) base angular velocity in rad/s, world frame.
        command: (N, 3) (vx m/s, vy m/s, yaw rate rad/s).
        joint_pos: (N, 12) rad.
        nominal_joint_pos: (N, 12) rad.
        joint_vel: (N, 12) rad/s.
        last_action: (N, 12) the clipped action of the previous step.
        out: (N, 48) float32, written in place.

    Returns:
        The base-frame linear and angular velocities and the projected gravity, each (N, 3) float64, for
        the reward.
    """
    n = base_quat.shape[0]
    lin_b = quat_rotate_inverse(base_quat, lin_vel_world)
    ang_b = quat_rotate_inverse(base_quat, ang_vel_world)
    gravity = quat_rotate_inverse(base_quat, np.broadcast_to(_GRAVITY_DIRECTION, (n, 3)))
    cols = _OBS_SLICES
    out[:, cols["base_lin_vel"]] = lin_b
    out[:, cols["base_ang_vel"]] = ang_b
    out[:, cols["projected_gravity"]] = gravity
    out[:, cols["command"]] = command
    out[:, cols["joint_pos"]] = joint_pos - nominal_joint_pos
    out[:, cols["joint_vel"]] = joint_vel
    out[:, cols["last_action"]] = last_action
    return lin_b, ang_b, gravity


def critic_observation(
    obs: np.ndarray,
    parameters: np.ndarray,
    base_height: np.ndarray,
    foot_contact: np.ndarray,
    feet_air_time: np.ndarray,
    out: np.ndarray,
) -> None:
    """Write the (N, 68) float32 critic (privileged) observation into ``out``, column ranges :data:`CRITIC_OBS_LAYOUT`.

    Args:
        obs: (N, 48) float32, the policy observation of the same step (:func:`observation`).
        parameters: (N, 11) float64, the episodes' physics parameters, columns
            :data:`unilab_gym.randomization.PARAMETER_NAMES` (friction, added_mass, com_x, com_y, com_z,
            motor_strength, kp_factor, kd_factor, latency, push_interval, push_velocity).
        base_height: (N,) base height above the ground in m.
        foot_contact: (N, 4) bool, feet FR, FL, RR, RL touching the ground.
        feet_air_time: (N, 4) float64, each foot's time in the air in s (:func:`feet_air_time`).
        out: (N, 68) float32, written in place.

    Raises:
        ValueError: ``parameters`` without the 11 columns of the layout.
    """
    width = _PRIVILEGED.stop - _PRIVILEGED.start
    if parameters.shape[1:] != (width,):
        raise ValueError(f"parameters must be (N, {width}), got shape {parameters.shape}")
    out[:, :OBS_DIM] = obs
    out[:, _PRIVILEGED] = parameters
    out[:, _BASE_HEIGHT] = base_height[:, None]
    out[:, _FOOT_CONTACT] = foot_contact
    out[:, _FEET_AIR_TIME] = feet_air_time


def feet_air_time(air_time: np.ndarray, foot_contact: np.ndarray, dt: float) -> tuple[np.ndarray, np.ndarray]:
    """Advance each foot's time in the air by one control step.

    legged_gym's ``_reward_feet_air_time`` bookkeeping (Rudin et al. 2022): a foot's air time grows by
    ``dt`` every step and is cleared when the foot touches the ground; a foot that touches the ground
    after at least one step in the air *touches down* with its air time (including this step).
    legged_gym also counts a foot in contact if it was in contact the step before (a filter for PhysX's
    contact reports); pybullet's contact points need no such filter, so none is applied.

    Args:
        air_time: (N, F) float64, each foot's time in the air in s before this step (0 while in contact).
        foot_contact: (N, F) bool, each foot touches the ground after this step.
        dt: the control period in s.

    Returns:
        ``(air_time, touchdown)``: the new (N, F) air times (a new array), and (N, F) float64 holding
        the air time in s of each foot that touches down this step, 0 for the others.
    """
    grown = air_time + dt
    touchdown = np.where(foot_contact & (air_time > 0.0), grown, 0.0)
    return np.where(foot_contact, 0.0, grown), touchdown


def reward_terms(
    lin_vel_base: np.ndarray,
    ang_vel_base: np.ndarray,
    command: np.ndarray,
    torques: np.ndarray,
    action: np.ndarray,
    last_action: np.ndarray,
    weights: RewardWeights,
    dt: float,
    *,
    projected_gravity: np.ndarray,
    base_height: np.ndarray,
    touchdown_air_time: np.ndarray,
    leg_contact: np.ndarray,
    base_height_target: float,
    feet_air_time_target: float,
    feet_air_time_max: float,
) -> dict[str, np.ndarray]:
    """Weighted reward terms, each (N,) float64, already multiplied by ``weight * dt`` (see :class:`RewardWeights`).

    Args:
        lin_vel_base: (N, 3) base linear velocity in m/s, base frame.
        ang_vel_base: (N, 3) base angular velocity in rad/s, base frame.
        command: (N, 3) (vx m/s, vy m/s, yaw rate rad/s).
        torques: (N, 12) N·m.
        action: (N, 12) this step's clipped action.
        last_action: (N, 12) the previous step's clipped action.
        weights: the weight of each term, per second.
        dt: the control period in s.
        projected_gravity: (N, 3) unit gravity vector in the base frame.
        base_height: (N,) base height above the ground in m.
        touchdown_air_time: (N, 4) air time in s of the feet touching down this step, else 0
            (:func:`feet_air_time`).
        leg_contact: (N, 8) bool, thigh and calf links touching the ground.
        base_height_target: m.
        feet_air_time_target: s.
        feet_air_time_max: s, the cap on each touchdown's air time.

    Returns:
        One (N,) float64 array per field of :class:`RewardWeights`, in field order; the step reward is their sum.
    """
    lin_err = np.sum((command[:, :2] - lin_vel_base[:, :2]) ** 2, axis=1)
    yaw_err = (command[:, 2] - ang_vel_base[:, 2]) ** 2
    moving = np.hypot(command[:, 0], command[:, 1]) > AIR_TIME_MIN_COMMAND
    capped = np.minimum(touchdown_air_time, feet_air_time_max)
    air = np.sum(np.where(touchdown_air_time > 0.0, capped - feet_air_time_target, 0.0), axis=1)
    raw = {
        "tracking_lin_vel": np.exp(-lin_err / TRACKING_SIGMA),
        "tracking_ang_vel": np.exp(-yaw_err / TRACKING_SIGMA),
        "lin_vel_z": lin_vel_base[:, 2] ** 2,
        "ang_vel_xy": np.sum(ang_vel_base[:, :2] ** 2, axis=1),
        "torques": np.sum(torques**2, axis=1),
        "action_rate": np.sum((action - last_action) ** 2, axis=1),
        "alive": np.ones(lin_vel_base.shape[0]),
        "feet_air_time": np.where(moving, air, 0.0),
        "base_height": (base_height - base_height_target) ** 2,
        "orientation": np.sum(projected_gravity[:, :2] ** 2, axis=1),
        "collision": np.sum(leg_contact, axis=1, dtype=np.float64),
    }
    return {name: value * (getattr(weights, name) * dt) for name, value in raw.items()}


@dataclass(frozen=True)
class TerminationConfig:
    """When a robot has fallen (the ``terminated`` flag): any of the conditions of :func:`fall_conditions`.

    Raises:
        ValueError: ``min_base_height`` or ``max_tilt`` not a finite real number (``max_tilt`` < 0), or
            ``trunk_contact`` not a bool, naming it.
    """

    min_base_height: float = 0.15
    """Base height in m under which the robot has fallen."""
    max_tilt: float = 0.8
    """|roll| or |pitch| in rad over which the robot has fallen."""
    trunk_contact: bool = True
    """Whether the trunk touching the ground is a fall."""

    def __post_init__(self) -> None:
        """Check the thresholds and the ``trunk_contact`` flag (raises ``ValueError`` naming the field)."""
        object.__setattr__(self, "min_base_height", check_real("termination['min_base_height']", self.min_base_height))
        object.__setattr__(self, "max_tilt", check_real("termination['max_tilt']", self.max_tilt, minimum=0.0))
        if not isinstance(self.trunk_contact, (bool, np.bool_)):
            raise ValueError(f"termination['trunk_contact'] must be a bool, got {self.trunk_contact!r}")
        object.__setattr__(self, "trunk_contact", bool(self.trunk_contact))

    @classmethod
    def from_dict(cls, values: Mapping[str, Any] | None) -> TerminationConfig:
        """Defaults overridden by ``values``.

        Raises:
            ValueError: an unknown termination key (the message lists the known ones) or a bad value.
        """
        return cls(**_known_keys("termination key", cls, values))


def fall_conditions(
    base_height: np.ndarray, base_quat: np.ndarray, trunk_contact: np.ndarray, cfg: TerminationConfig
) -> np.ndarray:
    """(N, 3) bool: which fall conditions hold.

    Columns ``height`` (base under ``min_base_height``), ``tilt`` (|roll| or |pitch| over ``max_tilt``),
    ``trunk_contact`` (only if ``cfg.trunk_contact``).
    """
    roll, pitch = roll_pitch(base_quat)
    out = np.empty((base_height.shape[0], 3), dtype=bool)
    out[:, 0] = base_height < cfg.min_base_height
    out[:, 1] = (np.abs(roll) > cfg.max_tilt) | (np.abs(pitch) > cfg.max_tilt)
    out[:, 2] = trunk_contact if cfg.trunk_contact else False
    return out


@dataclass(frozen=True)
class QuadrupedConfig:
    """The task configuration of ``UniLab/Quadruped-v0``, validated once when made.

    Each field also accepts the JSON form :meth:`to_dict` writes (a name or a dict for ``robot``, lists for tuples,
    dicts for ``reward_weights``, ``termination`` and ``domain_randomization``) and a single number for
    ``kp`` / ``kd``; :meth:`__post_init__` converts it to the stored type, so
    ``QuadrupedConfig(**config.to_dict()) == config``. ``kp``, ``kd``, ``action_scale`` and ``base_height_target``
    default to ``None``: the robot's values (:class:`~unilab_gym.robots.RobotDescription`), stored resolved.

    Raises:
        ValueError: an invalid value, naming the field (or the key inside it) and the value.
    """

    robot: RobotDescription = "a1"  # type: ignore[assignment]  # converted by __post_init__
    """The robot: a shipped robot's name (``"a1"``, ``"aliengo"``, ``"laikago"``, ``"mini_cheetah"``,
    :data:`unilab_gym.robots.ROBOTS`) or a :class:`~unilab_gym.robots.RobotDescription` (or its ``to_dict()``); it must
    have 12 joints and 4 feet. ``to_dict()`` writes the name of a shipped robot, else the description's dict."""
    max_episode_steps: int = 1000
    """Control steps before ``truncated`` (1000 = 20 s at the default 50 Hz), >= 1."""
    dt: float = 0.005
    """Physics time step in s, > 0."""
    substeps: int = 4
    """Physics steps per control step (decimation), >= 1: the control period is ``dt * substeps`` (20 ms)."""
    kp: tuple[float, ...] = None  # type: ignore[assignment]  # None: the robot's
    """PD stiffness in N·m/rad per joint (12 values >= 0, or one for all); ``None``: the robot's (A1: 20)."""
    kd: tuple[float, ...] = None  # type: ignore[assignment]  # None: the robot's
    """PD damping in N·m·s/rad per joint (12 values >= 0, or one for all); ``None``: the robot's (A1: 0.5)."""
    action_scale: float = None  # type: ignore[assignment]  # None: the robot's
    """Joint target offset in rad per unit of action, > 0; ``None``: the robot's (A1: 0.25, legged_gym)."""
    solver_iterations: int = 10
    """pybullet ``numSolverIterations``, >= 1."""
    lin_vel_x_range: tuple[float, float] = (0.3, 1.0)
    """(low, high) of the forward velocity command in m/s, drawn uniformly per episode."""
    lin_vel_y_range: tuple[float, float] = (0.0, 0.0)
    """(low, high) of the sideways velocity command in m/s."""
    yaw_rate_range: tuple[float, float] = (0.0, 0.0)
    """(low, high) of the yaw rate command in rad/s."""
    reward_weights: RewardWeights = None  # type: ignore[assignment]  # None: the defaults with the robot's overrides
    """Weights of the reward terms: ``None`` (default), the defaults of :class:`RewardWeights` with the robot's
    overrides (:attr:`~unilab_gym.robots.RobotDescription.reward_weights`; the A1 has none); a dict overrides those;
    a :class:`RewardWeights` is used as it is."""
    base_height_target: float = None  # type: ignore[assignment]  # None: the robot's standing height
    """Base height in m the ``base_height`` reward term pulls toward, > 0; ``None``: the robot's ``standing_height``
    (A1: 0.27 m, its nominal standing height, 0.269 m measured by ``evaluate_gait``; legged_gym's A1
    ``base_height_target`` is 0.25)."""
    feet_air_time_target: float = 0.25
    """Air time in s over which a touchdown makes ``feet_air_time`` positive, >= 0 (legged_gym 0.5; with 0.5 every
    step of the A1's short strides costs reward and dragging a foot pays best, see ``docs/env.md``)."""
    feet_air_time_max: float = 1000.0
    """Air time in s at which a touchdown's ``feet_air_time`` stops growing, > 0. The default (longer than any
    episode) is no cap, as in legged_gym; a cap of a stride's swing (e.g. 0.3 s) stops the term from paying for a
    foot held up, which with ``action_scale`` 0.5 stock PPO learned (a three-legged limp, ``docs/env.md``)."""
    termination: TerminationConfig = field(default_factory=TerminationConfig)
    """When a robot has fallen (a dict overrides the defaults of :class:`TerminationConfig`)."""
    init_joint_noise: float = 0.05
    """Half-width in rad (>= 0) of the uniform noise added to the nominal joint angles at reset."""
    domain_randomization: DomainRandomization = field(default_factory=DomainRandomization)
    """Physics parameter ranges (``None`` or a dict: see :class:`~unilab_gym.randomization.DomainRandomization`)."""

    def __post_init__(self) -> None:
        """Validate every field and convert it to its stored type (see the class docstring)."""
        robot = get_robot(self.robot)
        n = robot.num_joints
        if n != 12 or len(robot.foot_links) != 4:
            raise ValueError(
                f"robot {robot.name!r}: the Quadruped task needs 12 joint_names and 4 foot_links, got "
                f"{n} joints and {len(robot.foot_links)} feet"
            )
        converted = {
            "robot": robot,
            "max_episode_steps": check_positive_int("max_episode_steps", self.max_episode_steps),
            "dt": check_positive("dt", self.dt),
            "substeps": check_positive_int("substeps", self.substeps),
            "kp": robot.kp if self.kp is None else _joint_gains("kp", self.kp, n),
            "kd": robot.kd if self.kd is None else _joint_gains("kd", self.kd, n),
            "action_scale": (
                robot.action_scale if self.action_scale is None else check_positive("action_scale", self.action_scale)
            ),
            "solver_iterations": check_positive_int("solver_iterations", self.solver_iterations),
            "lin_vel_x_range": _range("lin_vel_x_range", self.lin_vel_x_range),
            "lin_vel_y_range": _range("lin_vel_y_range", self.lin_vel_y_range),
            "yaw_rate_range": _range("yaw_rate_range", self.yaw_rate_range),
            "reward_weights": weights.resolve(
                RewardWeights, robot, self.reward_weights, lambda v: _overrides("reward_weights", RewardWeights, v)
            ),
            "base_height_target": (
                robot.standing_height
                if self.base_height_target is None
                else check_positive("base_height_target", self.base_height_target)
            ),
            "feet_air_time_target": check_real("feet_air_time_target", self.feet_air_time_target, minimum=0.0),
            "feet_air_time_max": check_positive("feet_air_time_max", self.feet_air_time_max),
            "termination": _overrides("termination", TerminationConfig, self.termination),
            "init_joint_noise": check_real("init_joint_noise", self.init_joint_noise, minimum=0.0),
            "domain_randomization": (
                self.domain_randomization
                if isinstance(self.domain_randomization, DomainRandomization)
                else DomainRandomization(self.domain_randomization)
            ),
        }
        for name, value in converted.items():
            object.__setattr__(self, name, value)

    @property
    def control_dt(self) -> float:
        """The control period in s: ``dt * substeps``."""
        return self.dt * self.substeps

    def to_dict(self) -> dict[str, Any]:
        """The configuration as JSON types (lists, dicts, numbers, bools), in field order.

        ``UniLabVectorEnv(n, **config.to_dict())`` makes envs with this configuration; it is the
        envs' ``task_config`` and the ``"env"`` of a parameter-trace header.
        """
        return {f.name: _jsonable(getattr(self, f.name)) for f in fields(self)}


class QuadrupedTask(Task):
    """``UniLab/Quadruped-v0``'s task on the seam: velocity tracking on flat ground for a 12-joint, 4-foot robot.

    The functions of this module, batched over the N envs: :func:`observation` (:data:`OBS_LAYOUT`),
    :func:`critic_observation` (:data:`CRITIC_OBS_LAYOUT`), :func:`feet_air_time`, :func:`reward_terms`
    (:class:`RewardWeights`) and :func:`fall_conditions` (:class:`TerminationConfig`). Each episode draws its
    command uniformly from the configured ranges and its initial pose as the nominal pose plus uniform noise of
    half-width ``init_joint_noise``, in that order, from the episode's stream.

    Args:
        num_envs: N.
        config: a :class:`~unilab_gym.tasks.config.QuadrupedConfig`; its robot must have 12 joints (3 per leg, legs
            FR, FL, RR, RL) and 4 feet.

    Raises:
        ValueError: a robot without 12 joints or 4 feet, naming the field.
    """

    obs_dim = OBS_DIM
    critic_obs_dim = CRITIC_OBS_DIM
    obs_layout = OBS_LAYOUT
    critic_obs_layout = CRITIC_OBS_LAYOUT
    command_dim = 3
    termination_names = ("height", "tilt", "trunk_contact")
    config: QuadrupedConfig

    def __init__(self, num_envs: int, config: QuadrupedConfig):
        """Check the robot and set up ``num_envs`` envs of ``config`` (arguments: see the class docstring)."""
        robot = config.robot
        if robot.num_joints != ACT_DIM:
            raise ValueError(
                f"robot {robot.name!r}: joint_names: the Quadruped task needs {ACT_DIM} actuated joints (hip, thigh "
                f"and calf of the FR, FL, RR and RL legs), got {robot.num_joints}"
            )
        if len(robot.foot_links) != 4:
            raise ValueError(
                f"robot {robot.name!r}: foot_links: the Quadruped task needs 4 feet (FR, FL, RR, RL), got "
                f"{list(robot.foot_links)}"
            )
        super().__init__(num_envs, config)
        self._command_low = np.array([config.lin_vel_x_range[0], config.lin_vel_y_range[0], config.yaw_rate_range[0]])
        self._command_high = np.array([config.lin_vel_x_range[1], config.lin_vel_y_range[1], config.yaw_rate_range[1]])
        #: (N, 4) float64: each foot's time in the air in s (0 while in contact).
        self.feet_air_time = np.zeros((num_envs, len(robot.foot_links)))
        self._lin_b = self._ang_b = self._gravity = np.zeros((num_envs, 3))

    @classmethod
    def config_type(cls) -> type:
        """:class:`QuadrupedConfig`."""
        return QuadrupedConfig

    def sample_episode(self, env: int, rng: np.random.Generator) -> np.ndarray:
        """Command ``U(low, high)`` (3 draws), then the nominal pose plus ``U(-noise, noise)`` (12 draws)."""
        self.command[env] = rng.uniform(self._command_low, self._command_high)
        noise = self.config.init_joint_noise
        return self.nominal_joint_pos[env] + rng.uniform(-noise, noise, ACT_DIM)

    def start_episodes(self, idx: np.ndarray) -> None:
        """Feet air times back to 0."""
        self.feet_air_time[idx] = 0.0

    def observe(self, state: RobotState, last_action: np.ndarray, out: np.ndarray) -> None:
        """:func:`observation`; keeps the base-frame velocities and projected gravity for :meth:`evaluate`."""
        self._lin_b, self._ang_b, self._gravity = observation(
            state.base_quat,
            state.lin_vel,
            state.ang_vel,
            self.command,
            state.joint_pos,
            self.nominal_joint_pos,
            state.joint_vel,
            last_action,
            out=out,
        )

    def critic_observe(self, state: RobotState, obs: np.ndarray, parameters: np.ndarray, out: np.ndarray) -> None:
        """:func:`critic_observation` with the base height, foot contacts and feet air times."""
        critic_observation(obs, parameters, state.base_pos[:, 2], state.foot_contact, self.feet_air_time, out=out)

    def evaluate(
        self, state: RobotState, action: np.ndarray, previous_action: np.ndarray, restarting: np.ndarray
    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """The reward terms and fall conditions of this step.

        Feet air times advance one step (cleared for ``restarting`` envs), then :func:`reward_terms` and
        :func:`fall_conditions` (columns :attr:`termination_names`), both with :meth:`base_height`.
        """
        config = self.config
        height = self.base_height(state)
        dt = config.control_dt
        self.feet_air_time, touchdown = feet_air_time(self.feet_air_time, state.foot_contact, dt)
        self.feet_air_time[restarting] = 0.0
        terms = reward_terms(
            self._lin_b,
            self._ang_b,
            self.command,
            state.torques,
            action,
            previous_action,
            config.reward_weights,
            dt,
            projected_gravity=self._gravity,
            base_height=height,
            touchdown_air_time=touchdown,
            leg_contact=state.leg_contact,
            base_height_target=config.base_height_target,
            feet_air_time_target=config.feet_air_time_target,
            feet_air_time_max=config.feet_air_time_max,
        )
        conditions = fall_conditions(height, state.base_quat, state.trunk_contact, config.termination)
        return terms, conditions

    def base_height(self, state: RobotState) -> np.ndarray:
        """(N,) float64 base height in m that the reward and the fall check use: above the plane, z."""
        return state.base_pos[:, 2]


def _joint_gains(name: str, value: Any, n: int) -> tuple[float, ...]:
    """One gain per joint: a number for all of them or a sequence of ``n``, each a finite float >= 0."""
    if isinstance(value, (Sequence, np.ndarray)) and not isinstance(value, (str, bytes)):
        values = list(value)
    else:
        values = [value] * n
    if len(values) != n:
        raise ValueError(f"{name} must be a number >= 0 or {n} of them, got {value!r}")
    return tuple(check_real(name, v, minimum=0.0) for v in values)


def _range(name: str, value: Any) -> tuple[float, float]:
    """A (low, high) pair of finite floats with low <= high."""
    if not isinstance(value, (Sequence, np.ndarray)) or isinstance(value, (str, bytes)) or len(value) != 2:
        raise ValueError(f"{name} must be a (low, high) pair of numbers, got {value!r}")
    lo, hi = check_real(name, value[0]), check_real(name, value[1])
    if lo > hi:
        raise ValueError(f"{name} must satisfy low <= high, got {value!r}")
    return lo, hi


def _overrides(name: str, cls: Any, value: Any) -> Any:
    """``value`` if it is a ``cls``, else ``cls.from_dict(value)`` (a mapping of overrides or ``None``)."""
    if isinstance(value, cls):
        return value
    if value is not None and not isinstance(value, Mapping):
        raise ValueError(f"{name} must be a {cls.__name__}, a dict of its fields or None, got {value!r}")
    return cls.from_dict(value)


def _jsonable(value: Any) -> Any:
    if isinstance(value, RobotDescription):
        return robot_to_json(value)
    if isinstance(value, DomainRandomization):
        return value.to_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, tuple):
        return list(value)
    return value
