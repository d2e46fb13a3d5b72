"""The Franka Emika Panda arm from ``pybullet_data`` (``franka_panda/panda.urdf``).

7 revolute arm joints and 2 prismatic finger joints, bolted to the ground (a fixed base).

Not a choice of ``UniLab/Quadruped-v0``'s ``robot=`` (not in :data:`unilab_gym.robots.ROBOTS`): it is the robot of
``UniLab/PandaReach-v0`` and ``UniLab/PandaPick-v0`` (:mod:`unilab_gym.tasks.panda`).
"""

from __future__ import annotations

from unilab_gym.robots.description import RobotDescription

#: Arm joints of the Panda, base to flange.
PANDA_ARM_JOINTS: tuple[str, ...] = tuple(f"panda_joint{k}" for k in range(1, 8))
#: Finger joints (prismatic, 0 to 0.04 m each: the gripper opens to 0.08 m).
PANDA_FINGER_JOINTS: tuple[str, ...] = ("panda_finger_joint1", "panda_finger_joint2")
#: Joint limits of the arm joints in rad, the URDF's ``<limit lower upper>`` (Franka's datasheet values).
PANDA_ARM_LIMITS: tuple[tuple[float, float], ...] = (
    (-2.9671, 2.9671),
    (-1.8326, 1.8326),
    (-2.9671, 2.9671),
    (-3.1416, 0.0),
    (-2.9671, 2.9671),
    (-0.0873, 3.8223),
    (-2.9671, 2.9671),
)
#: Opening of each finger in m, fully open (the URDF's finger joint ``upper`` limit).
PANDA_FINGER_OPEN = 0.04

#: Franka Panda (``franka_panda/panda.urdf``, fixed base, 9 joints: ``panda_joint1..7``, then the two fingers).
#: Nominal pose: panda-gym's neutral arm pose (Gallouédec et al. 2021, "panda-gym: Open-source goal-conditioned
#: environments for robotic learning", ``Panda.neutral_joint_values``: 0, 0.41, 0, -1.85, 0, 2.26, 0.79 rad), hand
#: pointing down with the grasp point 0.64 m in front of the base, 0.2 m up; fingers open (0.04 m each).
#: Torque limits: the URDF's (87 N·m joints 1-4, 12 N·m joints 5-7, 20 N per finger). Inertia: the URDF's
#: (``use_urdf_inertia``): pybullet's estimate from the collision meshes gives the wrist ~4e-4 kg·m², on which
#: explicit PD at 5 ms chatters (measured here: joint 7 oscillated at ~8 rad/s with kd 2). Gains kp 600 / kd 30
#: (joints 1-4), 100 / 5 (joints 5-7), 1000 / 10 (fingers) were measured here: stable, and the arm settles in its
#: nominal pose within 0.06 rad of it (gravity sag of joint 2). Action scale 1 rad: every target of the tasks is
#: within 0.75 rad of the nominal pose (pybullet inverse kinematics).
PANDA = RobotDescription(
    name="panda",
    urdf="franka_panda/panda.urdf",
    joint_names=PANDA_ARM_JOINTS + PANDA_FINGER_JOINTS,
    nominal_joint_pos=(0.0, 0.41, 0.0, -1.85, 0.0, 2.26, 0.79, PANDA_FINGER_OPEN, PANDA_FINGER_OPEN),
    kp=(600.0,) * 4 + (100.0,) * 3 + (1000.0,) * 2,
    kd=(30.0,) * 4 + (5.0,) * 3 + (10.0,) * 2,
    spawn_height=0.001,
    standing_height=0.001,
    base_link="panda_link0",
    end_effector_link="panda_grasptarget",
    action_scale=1.0,
    fixed_base=True,
    use_urdf_inertia=True,
)
