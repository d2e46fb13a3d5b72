"""Velocity-tracking locomotion task for a quadruped: pure, batched numpy functions.

Nothing here touches physics: every function maps state arrays of N robots to
observations, reward terms or termination flags, so it can be tested on hand-made states.

Reward terms follow legged_gym (Rudin et al. 2022, "Learning to Walk in Minutes Using
Massively Parallel Deep Reinforcement Learning", ``legged_robot.py``): each term is
multiplied by its weight and by the control period ``dt`` (s), so weights are per second.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

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
OBS_DIM = 48
ACT_DIM = 12

#: Width (variance) of the exponential tracking kernels, in (m/s)^2 and (rad/s)^2 (legged_gym ``tracking_sigma``).
TRACKING_SIGMA = 0.25


@dataclass(frozen=True)
class RewardWeights:
    """Weights of the reward terms, per second of simulated time (legged_gym convention).

    ``tracking_lin_vel``: exp(-|cmd_xy - v_xy|^2 / 0.25). ``tracking_ang_vel``: exp(-(cmd_yaw - w_z)^2 / 0.25).
    ``lin_vel_z``: v_z^2 (m/s)^2. ``ang_vel_xy``: w_x^2 + w_y^2 (rad/s)^2. ``torques``: sum tau^2 (N·m)^2.
    ``action_rate``: sum (a_t - a_{t-1})^2. ``alive``: 1 per step.
    Defaults are legged_gym's A1 values, plus a small alive bonus.
    """

    tracking_lin_vel: float = 1.0
    tracking_ang_vel: float = 0.5
    lin_vel_z: float = -2.0
    ang_vel_xy: float = -0.05
    torques: float = -0.0002
    action_rate: float = -0.01
    alive: float = 0.1

    @classmethod
    def from_dict(cls, weights: dict[str, float] | None) -> RewardWeights:
        """Defaults overridden by ``weights``; an unknown name raises ``ValueError``."""
        weights = dict(weights or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(weights) - known)
        if unknown:
            raise ValueError(f"unknown reward term(s) {unknown}; known terms: {sorted(known)}")
        return cls(**{k: float(v) for k, v in weights.items()})


def quat_rotate_inverse(quat: np.ndarray, vec: np.ndarray) -> np.ndarray:
    """Rotate world-frame vectors into the body frame.

    Args:
        quat: (N, 4) unit quaternions (x, y, z, w), body -> world, as pybullet returns them.
        vec: (N, 3) vectors in the world frame.

    Returns:
        (N, 3) the vectors in the body frame, ``R(quat)^T @ vec``.
    """
    xyz = quat[:, :3]
    w = quat[:, 3:4]
    a = vec * (2.0 * w * w - 1.0)
    b = np.cross(xyz, vec) * (2.0 * w)
    c = xyz * (2.0 * np.sum(xyz * vec, axis=1, keepdims=True))
    return a - b + c


def roll_pitch(quat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Roll and pitch in rad of (N, 4) xyzw quaternions (ZYX Euler convention)."""
    x, y, z, w = quat[:, 0], quat[:, 1], quat[:, 2], quat[:, 3]
    roll = np.arctan2(2.0 * (w * x + y * z), 1.0 - 2.0 * (x * x + y * y))
    pitch = np.arcsin(np.clip(2.0 * (w * y - z * x), -1.0, 1.0))
    return roll, pitch


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
) -> tuple[np.ndarray, np.ndarray]:
    """Write the (N, 48) float32 observation into ``out`` (layout: :data:`OBS_LAYOUT`).

    Returns the base-frame linear and angular velocities (N, 3), float64, for the reward.
    """
    n = base_quat.shape[0]
    lin_b = quat_rotate_inverse(base_quat, lin_vel_world)
    ang_b = quat_rotate_inverse(base_quat, ang_vel_world)
    gravity = quat_rotate_inverse(base_quat, np.broadcast_to(np.array([0.0, 0.0, -1.0]), (n, 3)))
    out[:, 0:3] = lin_b
    out[:, 3:6] = ang_b
    out[:, 6:9] = gravity
    out[:, 9:12] = command
    out[:, 12:24] = joint_pos - nominal_joint_pos
    out[:, 24:36] = joint_vel
    out[:, 36:48] = last_action
    return lin_b, ang_b


def reward_terms(
    lin_vel_base: np.ndarray,
    ang_vel_base: np.ndarray,
    command: np.ndarray,
    torques: np.ndarray,
    action: np.ndarray,
    last_action: np.ndarray,
    weights: RewardWeights,
    dt: float,
) -> dict[str, np.ndarray]:
    """Weighted reward terms, each (N,) float64, already multiplied by ``weight * dt``.

    The step reward is the sum of the returned terms.
    """
    lin_err = np.sum((command[:, :2] - lin_vel_base[:, :2]) ** 2, axis=1)
    yaw_err = (command[:, 2] - ang_vel_base[:, 2]) ** 2
    raw = {
        "tracking_lin_vel": np.exp(-lin_err / TRACKING_SIGMA),
        "tracking_ang_vel": np.exp(-yaw_err / TRACKING_SIGMA),
        "lin_vel_z": lin_vel_base[:, 2] ** 2,
        "ang_vel_xy": np.sum(ang_vel_base[:, :2] ** 2, axis=1),
        "torques": np.sum(torques**2, axis=1),
        "action_rate": np.sum((action - last_action) ** 2, axis=1),
        "alive": np.ones(lin_vel_base.shape[0]),
    }
    return {name: value * (getattr(weights, name) * dt) for name, value in raw.items()}


@dataclass(frozen=True)
class TerminationConfig:
    """When a robot has fallen: base height under ``min_base_height`` m, |roll| or |pitch| over
    ``max_tilt`` rad, or (if ``trunk_contact``) the trunk touching the ground."""

    min_base_height: float = 0.15
    max_tilt: float = 0.8
    trunk_contact: bool = True


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


def fallen(
    base_height: np.ndarray, base_quat: np.ndarray, trunk_contact: np.ndarray, cfg: TerminationConfig
) -> np.ndarray:
    """(N,) bool: which robots have fallen (the ``terminated`` flag): any of :func:`fall_conditions`."""
    return fall_conditions(base_height, base_quat, trunk_contact, cfg).any(axis=1)
