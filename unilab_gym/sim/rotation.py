"""Quaternion rotations of batches of vectors: pure numpy, shared by the physics layer and the task math.

Quaternions are (x, y, z, w), unit, rotating body-frame vectors into the world frame, as pybullet
returns base orientations (``getBasePositionAndOrientation``). Nothing here imports pybullet, so
:mod:`unilab_gym.tasks` can use it without the physics layer.
"""

from __future__ import annotations

import numpy as np

#: Sign flips that turn a unit quaternion (x, y, z, w) into its conjugate, the inverse rotation.
_CONJUGATE = np.array([-1.0, -1.0, -1.0, 1.0])


def quat_rotate_inverse(quat: np.ndarray, vec: np.ndarray) -> np.ndarray:
    """Rotate world-frame vectors into the body frame.

    Args:
        quat: (N, 4) float64 unit quaternions (x, y, z, w), body -> world.
        vec: (N, 3) float64 vectors in the world frame.

    Returns:
        (N, 3) float64, the vectors in the body frame: ``R(quat)^T @ vec``, computed as
        ``v (2w^2 - 1) - 2w (u x v) + 2u (u . v)`` with ``u = (x, y, z)`` (the expansion of
        ``q* v q`` for a unit quaternion; legged_gym's ``quat_rotate_inverse``).
    """
    xyz = quat[:, :3]
    w = quat[:, 3:4]
    a = vec * (2.0 * w * w - 1.0)
    b = np.cross(xyz, vec) * (2.0 * w)
    c = xyz * (2.0 * np.sum(xyz * vec, axis=1, keepdims=True))
    return a - b + c


def quat_rotate(quat: np.ndarray, vec: np.ndarray) -> np.ndarray:
    """Rotate body-frame vectors into the world frame: ``R(quat) @ vec``.

    Args:
        quat: (N, 4) float64 unit quaternions (x, y, z, w), body -> world.
        vec: (N, 3) float64 vectors in the body frame.

    Returns:
        (N, 3) float64, the vectors in the world frame (:func:`quat_rotate_inverse` of the
        conjugate quaternion, which is the inverse rotation).
    """
    return quat_rotate_inverse(quat * _CONJUGATE, vec)


def roll_pitch(quat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Roll and pitch of (N, 4) xyzw unit quaternions (ZYX Euler convention, as pybullet's ``getEulerFromQuaternion``).

    Returns:
        roll (N,) float64 in rad, in [-pi, pi]; pitch (N,) float64 in rad, in [-pi/2, pi/2].
    """
    x, y, z, w = quat[:, 0], quat[:, 1], quat[:, 2], quat[:, 3]
    roll = np.arctan2(2.0 * (w * x + y * z), 1.0 - 2.0 * (x * x + y * y))
    pitch = np.arcsin(np.clip(2.0 * (w * y - z * x), -1.0, 1.0))
    return roll, pitch
