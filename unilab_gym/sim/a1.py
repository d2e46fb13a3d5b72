"""Constants of the Unitree A1 model shipped with ``pybullet_data`` (``a1/a1.urdf``).

Joint order used everywhere in unilab-gym (12 actuated revolute joints)::

    FR_hip, FR_thigh, FR_calf, FL_hip, FL_thigh, FL_calf,
    RR_hip, RR_thigh, RR_calf, RL_hip, RL_thigh, RL_calf

(the URDF calls the thigh and calf joints ``*_upper_joint`` and ``*_lower_joint``).
"""

from __future__ import annotations

import numpy as np
import pybullet_data

URDF_PATH = pybullet_data.getDataPath() + "/a1/a1.urdf"
PLANE_MESH_PATH = pybullet_data.getDataPath() + "/plane100.obj"

#: Number of actuated joints.
NUM_JOINTS = 12

#: URDF joint names of the 12 actuated joints, in unilab-gym's order.
JOINT_NAMES: tuple[str, ...] = tuple(
    f"{leg}_{part}_joint" for leg in ("FR", "FL", "RR", "RL") for part in ("hip", "upper", "lower")
)

#: URDF names of the four foot links (the toe spheres), in leg order FR, FL, RR, RL.
FOOT_LINK_NAMES: tuple[str, ...] = tuple(f"{leg}_toe" for leg in ("FR", "FL", "RR", "RL"))

#: URDF names of the thigh and calf links (``*_upper``, ``*_lower``), in leg order FR, FL, RR, RL: the
#: links whose ground contact legged_gym's A1 config penalizes (``penalize_contacts_on = ["thigh", "calf"]``).
LEG_LINK_NAMES: tuple[str, ...] = tuple(
    f"{leg}_{part}" for leg in ("FR", "FL", "RR", "RL") for part in ("upper", "lower")
)

#: Nominal standing pose in rad, in joint order. Source: legged_gym's A1 config
#: (``a1_config.py``, Rudin et al. 2022, "Learning to Walk in Minutes Using Massively
#: Parallel Deep RL"): hip ±0.1, thigh 0.8 (front) / 1.0 (rear), calf -1.5.
NOMINAL_JOINT_POS = np.array([-0.1, 0.8, -1.5, 0.1, 0.8, -1.5, -0.1, 1.0, -1.5, 0.1, 1.0, -1.5], dtype=np.float64)

#: Base (trunk) height in m at which the robot is spawned, feet just above the ground
#: in the nominal pose (thigh and calf are 0.2 m each in the URDF).
SPAWN_HEIGHT = 0.32

#: Trunk (base link) mass in kg, from the URDF's ``<inertial>``.
TRUNK_MASS = 4.713

#: Lateral friction coefficient of every A1 link. The URDF has no ``<contact>`` tags, so pybullet's
#: default 0.5 applies; the ground's coefficient is 1.0 and pybullet multiplies the two, so 0.5 is
#: the robot-ground friction coefficient.
LINK_FRICTION = 0.5

#: Distance in m between neighbouring lanes of a world, across the walking direction.
LANE_SPACING = 1.0

#: Number of lanes in a world. A robot's lane comes from its episode seed (see
#: :meth:`unilab_gym.sim.world.ClusterWorld.reset_robots`), never from its slot in the world.
NUM_LANES = 128
