"""Batched forward kinematics, Jacobian and damped-least-squares inverse kinematics of the Franka Panda arm in numpy.

The chain is the one of ``pybullet_data``'s ``franka_panda/panda.urdf`` (:data:`~unilab_gym.robots.PANDA`): the
joint origins below are that URDF's ``<origin xyz rpy>`` of ``panda_joint1..7``, ``panda_joint8`` (the flange,
0.107 m), ``panda_hand_joint`` (-pi/4 about z) and ``panda_grasptarget_hand`` (0.105 m); every arm joint turns about
its frame's z axis. Positions are in m in the robot's base frame (``panda_link0``), angles in rad.

It lets a task turn an end-effector displacement into joint targets without calling pybullet (the task seam's
rule, :mod:`unilab_gym.tasks.base`). The inverse kinematics is damped least squares (Wampler 1986; Buss 2004,
"Introduction to inverse kinematics with Jacobian transpose, pseudoinverse and damped least squares methods"):
``dq = J^T (J J^T + lambda^2 I)^-1 e``. Every product is written out element by element (no BLAS matrix product,
whose rounding can depend on the batch size), and the 6x6 solve is LAPACK's per matrix, so env ``i``'s result does
not depend on how many envs are computed with it.
"""

from __future__ import annotations

import numpy as np

#: (xyz, rpy) of each arm joint's origin in its parent link's frame: ``panda_joint1..7`` of the URDF.
ARM_JOINT_ORIGINS: tuple[tuple[tuple[float, float, float], tuple[float, float, float]], ...] = (
    ((0.0, 0.0, 0.333), (0.0, 0.0, 0.0)),
    ((0.0, 0.0, 0.0), (-1.57079632679, 0.0, 0.0)),
    ((0.0, -0.316, 0.0), (1.57079632679, 0.0, 0.0)),
    ((0.0825, 0.0, 0.0), (1.57079632679, 0.0, 0.0)),
    ((-0.0825, 0.384, 0.0), (-1.57079632679, 0.0, 0.0)),
    ((0.0, 0.0, 0.0), (1.57079632679, 0.0, 0.0)),
    ((0.088, 0.0, 0.0), (1.57079632679, 0.0, 0.0)),
)
#: Fixed chain from link 7 to the grasp point: ``panda_joint8`` (0.107 m along z), ``panda_hand_joint`` (-pi/4 about
#: z) and ``panda_grasptarget_hand`` (0.105 m along z).
GRASP_ORIGINS: tuple[tuple[tuple[float, float, float], tuple[float, float, float]], ...] = (
    ((0.0, 0.0, 0.107), (0.0, 0.0, 0.0)),
    ((0.0, 0.0, 0.0), (0.0, 0.0, -0.785398163397)),
    ((0.0, 0.0, 0.105), (0.0, 0.0, 0.0)),
)


def _rpy_matrix(rpy: tuple[float, float, float]) -> np.ndarray:
    """URDF rotation ``Rz(yaw) Ry(pitch) Rx(roll)`` (3, 3)."""
    r, p, y = rpy
    cr, sr, cp, sp, cy, sy = np.cos(r), np.sin(r), np.cos(p), np.sin(p), np.cos(y), np.sin(y)
    return np.array(
        [
            [cy * cp, cy * sp * sr - sy * cr, cy * sp * cr + sy * sr],
            [sy * cp, sy * sp * sr + cy * cr, sy * sp * cr - cy * sr],
            [-sp, cp * sr, cp * cr],
        ]
    )


#: Position in m of ``panda_link0``'s centre of mass in its frame (the URDF's ``<inertial><origin>``): the base
#: position pybullet reports (and the tasks measure from) is this point, not the link frame.
BASE_COM_OFFSET = np.array([0.0, 0.0, 0.05])

_JOINT_R = np.array([_rpy_matrix(rpy) for _, rpy in ARM_JOINT_ORIGINS])  # (7, 3, 3)
_JOINT_T = np.array([xyz for xyz, _ in ARM_JOINT_ORIGINS])  # (7, 3)
_GRASP_R = _rpy_matrix(GRASP_ORIGINS[1][1])
_GRASP_T = np.array(GRASP_ORIGINS[0][0]) + _GRASP_R @ np.array(GRASP_ORIGINS[2][0])  # link 7 -> grasp point


def _matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` for (..., 3, 3) by (..., 3, k), summed in a fixed order (k = 3 or 1)."""
    return (
        a[..., :, 0, None] * b[..., None, 0, :]
        + a[..., :, 1, None] * b[..., None, 1, :]
        + a[..., :, 2, None] * b[..., None, 2, :]
    )


def forward_kinematics(q: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Grasp point pose and the joint axes of N arms.

    Args:
        q: (N, 7) float64 arm joint angles in rad.

    Returns:
        ``(position, rotation, axes, origins)``: (N, 3) grasp point position in m and (N, 3, 3) hand rotation
        (hand -> base; its columns are the hand's x, y, z axes), (N, 7, 3) each joint's axis and (N, 7, 3) each
        joint's origin, base frame.
    """
    n = q.shape[0]
    rot = np.broadcast_to(np.eye(3), (n, 3, 3)).copy()
    pos = np.zeros((n, 3))
    axes, origins = np.empty((n, 7, 3)), np.empty((n, 7, 3))
    for j in range(7):
        pos = pos + _matmul(rot, np.broadcast_to(_JOINT_T[j][:, None], (n, 3, 1)))[..., 0]
        rot = _matmul(rot, np.broadcast_to(_JOINT_R[j], (n, 3, 3)))
        axes[:, j], origins[:, j] = rot[:, :, 2], pos
        c, s = np.cos(q[:, j]), np.sin(q[:, j])
        rz = np.zeros((n, 3, 3))
        rz[:, 0, 0], rz[:, 0, 1], rz[:, 1, 0], rz[:, 1, 1], rz[:, 2, 2] = c, -s, s, c, 1.0
        rot = _matmul(rot, rz)
    pos = pos + _matmul(rot, np.broadcast_to(_GRASP_T[:, None], (n, 3, 1)))[..., 0]
    rot = _matmul(rot, np.broadcast_to(_GRASP_R, (n, 3, 3)))
    return pos, rot, axes, origins


def _cross(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cross product along the last axis, written out."""
    return np.stack(
        [
            a[..., 1] * b[..., 2] - a[..., 2] * b[..., 1],
            a[..., 2] * b[..., 0] - a[..., 0] * b[..., 2],
            a[..., 0] * b[..., 1] - a[..., 1] * b[..., 0],
        ],
        axis=-1,
    )


def orientation_error(rotation: np.ndarray, target: np.ndarray) -> np.ndarray:
    """(N, 3) rotation vector (small-angle) from ``rotation`` to ``target``.

    Both are (N, 3, 3), or ``target`` is (3, 3): ``0.5 * sum_k r_k x t_k`` over the frames' axes (Siciliano et al.
    2009, "Robotics", eq. 3.85).
    """
    target = np.broadcast_to(target, rotation.shape)
    return 0.5 * (
        _cross(rotation[..., 0], target[..., 0])
        + _cross(rotation[..., 1], target[..., 1])
        + _cross(rotation[..., 2], target[..., 2])
    )


def ik_step(q: np.ndarray, position: np.ndarray, rotation: np.ndarray, damping: float = 0.05) -> np.ndarray:
    """One damped-least-squares step of N arms toward a grasp point pose.

    Args:
        q: (N, 7) float64 arm joint angles in rad.
        position: (N, 3) target grasp point position in m, base frame.
        rotation: (3, 3) or (N, 3, 3) target hand rotation (hand -> base).
        damping: lambda of ``J^T (J J^T + lambda^2 I)^-1``, > 0 (m, with rad weighted as m).

    Returns:
        (N, 7) float64 joint angles ``q + dq``.
    """
    pos, rot, axes, origins = forward_kinematics(q)
    error = np.concatenate([position - pos, orientation_error(rot, rotation)], axis=1)  # (N, 6)
    jac = np.concatenate([_cross(axes, pos[:, None, :] - origins), axes], axis=2)  # (N, 7, 6): J^T
    jjt = np.zeros((q.shape[0], 6, 6))
    for j in range(7):  # J J^T, joint by joint
        jjt = jjt + jac[:, j, :, None] * jac[:, j, None, :]
    jjt = jjt + (damping**2) * np.eye(6)
    y = np.linalg.solve(jjt, error[:, :, None])[..., 0]  # (N, 6)
    dq = jac[:, :, 0] * y[:, None, 0]
    for k in range(1, 6):
        dq = dq + jac[:, :, k] * y[:, None, k]
    return q + dq
