"""Velocity-tracking locomotion task for a quadruped: pure, batched numpy functions.

Nothing here touches physics: every function maps state arrays of N robots to
observations, reward terms or termination flags, so it can be tested on hand-made states.

Reward terms follow legged_gym (Rudin et al. 2022, "Learning to Walk in Minutes Using
Massively Parallel Deep Reinforcement Learning", ``legged_robot.py``): each term is
multiplied by its weight and by the control period ``dt`` (s), so weights are per second.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from unilab_gym.sim import a1
from unilab_gym.sim.rotation import quat_rotate_inverse, roll_pitch
from unilab_gym.validation import check_real

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
    """(N, 3) bool: which fall conditions hold, columns ``height`` (base under ``min_base_height``),
    ``tilt`` (|roll| or |pitch| over ``max_tilt``), ``trunk_contact`` (only if ``cfg.trunk_contact``)."""
    roll, pitch = roll_pitch(base_quat)
    out = np.empty((base_height.shape[0], 3), dtype=bool)
    out[:, 0] = base_height < cfg.min_base_height
    out[:, 1] = (np.abs(roll) > cfg.max_tilt) | (np.abs(pitch) > cfg.max_tilt)
    out[:, 2] = trunk_contact if cfg.trunk_contact else False
    return out
