"""The shipped quadrupeds, all from ``pybullet_data``: joint order FR, FL, RR, RL legs, each hip (ab/ad), thigh, calf.

Each description cites where its nominal pose and gains come from. Standing heights were measured here: the base
height after 10 s standing in the nominal pose under zero action (pybullet 3.2.7, dt 5 ms, 10 solver iterations,
robot-ground friction 0.5); ``tests/env/test_robots.py`` checks that each one stands.
"""

from __future__ import annotations

from unilab_gym.robots.description import RobotDescription
from unilab_gym.sim import a1 as _a1

_LEGS = ("FR", "FL", "RR", "RL")

#: Unitree A1 (``a1/a1.urdf``), the default robot. Nominal pose, gains (kp 20, kd 0.5) and action scale 0.25 from
#: legged_gym's A1 config (``a1_config.py``, Rudin et al. 2022, "Learning to Walk in Minutes Using Massively Parallel
#: Deep RL"): hip ±0.1, thigh 0.8 (front) / 1.0 (rear), calf -1.5 rad. Torque limits: the URDF's (hip 20, thigh and
#: calf 55 N·m). Stands at 0.269 m.
A1 = RobotDescription(
    name="a1",
    urdf="a1/a1.urdf",
    joint_names=_a1.JOINT_NAMES,
    nominal_joint_pos=tuple(float(v) for v in _a1.NOMINAL_JOINT_POS),
    kp=(20.0,) * _a1.NUM_JOINTS,
    kd=(0.5,) * _a1.NUM_JOINTS,
    spawn_height=_a1.SPAWN_HEIGHT,
    standing_height=0.27,
    foot_links=_a1.FOOT_LINK_NAMES,
    contact_links=_a1.LEG_LINK_NAMES,
    base_link="trunk",
    action_scale=0.25,
)

#: Unitree Aliengo (``aliengo/aliengo.urdf``; 9.04 kg trunk, ~20.7 kg in all). legged_gym ships no Aliengo config;
#: the nominal pose (hip 0, thigh 0.69, calf -1.42 rad), the gains (kp 120, kd 1.5) and the 0.42 m spawn are those of
#: the legged_gym-style ``AlienGoCfg`` that public legged_gym forks use; spawned at 0.40 m here (the feet are 0.378 m
#: under the base in this pose). Measured here: with legged_gym's A1 gains (kp 20, kd 0.5) the Aliengo sags onto its
#: rear calves; with kd 3.5 (another fork's value) one robot in four chattered and slid 4 m in 10 s (pybullet's
#: explicit PD at 5 ms). Torque limits: the URDF's (44.4 N·m). Stands at 0.391 m.
ALIENGO = RobotDescription(
    name="aliengo",
    urdf="aliengo/aliengo.urdf",
    joint_names=tuple(f"{leg}_{part}_joint" for leg in _LEGS for part in ("hip", "upper", "lower")),
    nominal_joint_pos=(0.0, 0.69, -1.42) * 4,
    kp=(120.0,) * 12,
    kd=(1.5,) * 12,
    spawn_height=0.40,
    standing_height=0.39,
    foot_links=tuple(f"{leg}_toe" for leg in _LEGS),
    contact_links=tuple(f"{leg}_{part}" for leg in _LEGS for part in ("upper", "lower")),
    base_link="trunk",
    action_scale=0.25,
)

#: Unitree Laikago (``laikago/laikago_toes_zup.urdf``: the z-up variant; ``laikago_toes.urdf`` is y-up and needs a
#: rotated spawn, which pybullet's older examples apply). From pybullet's Laikago model
#: (``pybullet_envs/minitaur/robots/laikago.py`` and ``laikago_constants.py``): the nominal pose is the SDK pose
#: (ab/ad 0, hip 0.67, knee -1.25 rad) converted to URDF angles by ``(sdk + offset) * direction`` with offsets
#: (0, -0.6, 0.66) and directions +1 for the hip and knee joints: (0, 0.07, -0.59) rad; gains kp 220 and kd 0.3
#: (ab/ad) / 2.0 (hip, knee) (``ABDUCTION_P_GAIN`` ..., ``KNEE_D_GAIN``); spawn height ``INIT_POSITION`` 0.48 m.
#: Torque limits: the URDF's (100 N·m). The lower legs touch the ground with the toes, so only the upper legs are
#: contact-penalized. Stands at 0.480 m. Reward weights of its own (``reward_weights``): ``torques`` -1e-5, legged_gym's
#: base ``LeggedRobotCfg`` weight (the A1's -2e-4 with this stiff PD made every exploring step cost more than standing
#: earned, and stock PPO learned to fall within ~34 steps), and ``alive`` 0.5 per s (the A1's 0.1), so a fall costs
#: more than a stumble forward earns (measured: ``docs/benchmarks.md``, Laikago).
LAIKAGO = RobotDescription(
    name="laikago",
    urdf="laikago/laikago_toes_zup.urdf",
    joint_names=tuple(
        f"{leg}_{part}"
        for leg in _LEGS
        for part in ("hip_motor_2_chassis_joint", "upper_leg_2_hip_motor_joint", "lower_leg_2_upper_leg_joint")
    ),
    nominal_joint_pos=(0.0, 0.07, -0.59) * 4,
    kp=(220.0,) * 12,
    kd=(0.3, 2.0, 2.0) * 4,
    spawn_height=0.48,
    standing_height=0.48,
    foot_links=tuple(f"toe{leg}" for leg in _LEGS),
    contact_links=tuple(f"{leg}_upper_leg" for leg in _LEGS),
    base_link="chassis",
    action_scale=0.25,
    reward_weights={"torques": -1e-5, "alive": 0.5},
)

_MC_LEGS = ("fr", "fl", "hr", "hl")  # the URDF's front/hind right/left: FR, FL, RR, RL

#: MIT Mini Cheetah (``mini_cheetah/mini_cheetah.urdf``; 3.3 kg body). Nominal pose: the recovery-stand pose of MIT's
#: Cheetah-Software (``FSM_State_RecoveryStand.cpp``: ab/ad 0°, hip -45°, knee 91.5°, i.e. (0, -0.785398, 1.596976)
#: rad), as MIT Biomimetics' gpuGym ``mini_cheetah_config.py`` uses it, with its 0.33 m spawn height. Torque limits
#: (the URDF gives none): 17 N·m at the ab/ad and hip and 17 x 1.55 = 26.35 N·m at the knee (Katz, Di Carlo & Kim
#: 2019, "Mini Cheetah: A Platform for Pushing the Limits of Dynamic Quadruped Control": 17 N·m actuators, a 1.55
#: knee reduction). Gains: legged_gym's kp 20, kd 0.5; gpuGym's kp 80, kd 2 oscillate here and the robot walks off
#: sideways (measured: pybullet's explicit PD at 5 ms with this URDF's 64 g shanks). The shanks touch the ground with
#: the toes, so only the thighs are contact-penalized. Stands at 0.266 m.
MINI_CHEETAH = RobotDescription(
    name="mini_cheetah",
    urdf="mini_cheetah/mini_cheetah.urdf",
    joint_names=tuple(
        name
        for leg in _MC_LEGS
        for name in (f"torso_to_abduct_{leg}_j", f"abduct_{leg}_to_thigh_{leg}_j", f"thigh_{leg}_to_knee_{leg}_j")
    ),
    nominal_joint_pos=(0.0, -0.785398, 1.596976) * 4,
    kp=(20.0,) * 12,
    kd=(0.5,) * 12,
    spawn_height=0.33,
    standing_height=0.27,
    foot_links=tuple(f"toe_{leg}" for leg in _MC_LEGS),
    contact_links=tuple(f"thigh_{leg}" for leg in _MC_LEGS),
    base_link="body",
    torque_limits=(17.0, 17.0, 26.35) * 4,
    action_scale=0.25,
)
