"""The shipped quadrotor: :data:`CF2X`, a Crazyflie 2.x, URDF in the package (``unilab_gym/assets/cf2x.urdf``).

It has no actuated joints: ``UniLab/Quadrotor-v0`` moves it by the rotors' thrust and drag torque, applied by the
engine as external forces (:mod:`unilab_gym.sim.rotor`, :attr:`unilab_gym.tasks.base.Task.actuation`).
"""

from __future__ import annotations

from pathlib import Path

from unilab_gym.robots.description import RobotDescription

#: The shipped URDF.
CF2X_URDF = str(Path(__file__).resolve().parent.parent / "assets" / "cf2x.urdf")

#: Crazyflie 2.x (X configuration): 0.027 kg, inertia diag(1.4e-5, 1.4e-5, 2.17e-5) kg·m^2, collision a 0.06 m
#: radius, 0.025 m disc; all from gym-pybullet-drones' ``cf2x.urdf`` (see the URDF's header), loaded with that
#: inertia (``use_urdf_inertia``; pybullet would otherwise compute ~2-3x larger values from the disc). Spawned and
#: reset 1 m above the ground, upright and at rest. ``action_scale`` 0.2: a motor command of ±1 is ±20% of the
#: hover speed (gym-pybullet-drones' RL envs use ±5%, ``BaseRLAviary._preprocessAction``).
CF2X = RobotDescription(
    name="cf2x",
    urdf=CF2X_URDF,
    joint_names=(),
    nominal_joint_pos=(),
    kp=(),
    kd=(),
    spawn_height=1.0,
    standing_height=1.0,
    base_link="base_link",
    action_scale=0.2,
    use_urdf_inertia=True,
)
