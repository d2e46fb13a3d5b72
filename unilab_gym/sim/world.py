"""One EIC (Environment Instance Cluster): a single pybullet world hosting many robots of one description.

This module is the only place in unilab-gym that calls pybullet. A :class:`ClusterWorld`
owns one ``DIRECT`` physics client with a ground plane (:class:`~unilab_gym.sim.scene.Scene`) and several robots
side by side, each loaded from the same :class:`~unilab_gym.robots.RobotDescription` (the A1 by default).
It gives the task layer batched state arrays (:class:`RobotState`) and takes batched commands (PD targets,
gains and torque limits, resets, dynamics, pushes).
Robots never collide with each other (collision group/mask filtering: robots are in group 2
and only collide with the ground's group 1) and the broadphase pairs are sorted
(``deterministicOverlappingPairs``), so a robot's trajectory does not depend on what its
neighbours do.

It does depend on *where* the robot stands: pybullet's contact math is done in world
coordinates, so the same robot 2 m to the side rounds differently and drifts apart after a
few steps (measured: 1e-13 after 2 control steps, then chaotic growth). Robots therefore
are not placed by their slot in the world but in a lane chosen by the caller at each reset
(unilab-gym derives it from the episode seed), so a robot follows the same trajectory
alone or among any neighbours. Robots of one world share a lane only by chance, which costs
broadphase time (overlapping bounding boxes) but never changes results.

A control step is one deterministic *slice*: write all PD targets, advance the world
``substeps`` times (explicit PD torques recomputed every substep), then read every
robot's state into preallocated arrays.

Per-robot physics (domain randomization, :meth:`ClusterWorld.set_dynamics`) is set on the
robot's own bodies only, so it never reaches its neighbours: the friction coefficient on every
robot link (the shared ground keeps 1.0; pybullet multiplies the two), the trunk mass, and a
trunk centre-of-mass offset. pybullet 3.2.7 cannot move a link's centre of mass after loading
(``changeDynamics`` has no such argument), and reloading the robot from an edited URDF at each
reset would cost ~16 ms (measured) and add and remove bodies in the middle of a deterministic run;
the offset is therefore modelled by its gravitational effect: each
physics step, an external torque ``(R offset) x (trunk mass * g)`` on the trunk makes its weight act
at the offset point. The trunk's inertia about its centre of mass and the inertial coupling of an
offset mass are not modelled.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, fields
from typing import NoReturn, SupportsIndex

import numpy as np


def _import_pybullet():
    """Import pybullet without the "pybullet build time: ..." line its C init prints to stderr.

    That line comes once per process; with collector and worker processes it floods the user's
    output and progress bars. Only file descriptor 2, only during the import, is sent to
    /dev/null; an import error is still raised (its traceback is printed later, as usual).
    """
    if "pybullet" in sys.modules:
        return sys.modules["pybullet"]
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (AttributeError, OSError, ValueError):  # no real stderr (e.g. some notebooks): import as is
        import pybullet

        return pybullet
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            import pybullet
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    return pybullet


p = _import_pybullet()

from unilab_gym.robots import A1, RobotDescription  # noqa: E402
from unilab_gym.sim import a1  # noqa: E402
from unilab_gym.sim.camera import Camera  # noqa: E402
from unilab_gym.sim.objects import ObjectSet  # noqa: E402
from unilab_gym.sim.rotation import quat_rotate  # noqa: E402
from unilab_gym.sim.scene import Scene  # noqa: E402
from unilab_gym.sim.terrain import TerrainSet  # noqa: E402

_ROBOT_GROUP = 2  # collision group of every robot link
_GROUND_GROUP = 1  # collision group of the plane

#: Gravitational acceleration in m/s^2 (pointing down the world z axis).
GRAVITY = 9.81


@dataclass
class RobotState:
    """States of n robots; row ``i`` is robot ``i``. Arrays are float64 unless noted.

    The contact flags come from the contact points of the last physics step (pybullet's
    ``getContactPoints``, which counts points closer than the contact threshold); they are all
    ``False`` for a robot reset since, as no physics step has seen its new pose yet.
    """

    base_pos: np.ndarray
    """(n, 3) base (trunk) position in m, world frame."""
    base_quat: np.ndarray
    """(n, 4) base orientation, unit quaternion (x, y, z, w), base -> world."""
    lin_vel: np.ndarray
    """(n, 3) base linear velocity in m/s, world frame."""
    ang_vel: np.ndarray
    """(n, 3) base angular velocity in rad/s, world frame."""
    joint_pos: np.ndarray
    """(n, J) joint angles in rad, in the robot's ``joint_names`` order (J = 12 for the A1:
    :data:`unilab_gym.sim.a1.JOINT_NAMES`)."""
    joint_vel: np.ndarray
    """(n, J) joint velocities in rad/s."""
    trunk_contact: np.ndarray
    """(n,) bool: the base (trunk) touches the ground."""
    foot_contact: np.ndarray
    """(n, F) bool: each of the robot's ``foot_links`` touches the ground (A1: (n, 4), columns FR, FL, RR, RL,
    :data:`unilab_gym.sim.a1.FOOT_LINK_NAMES`)."""
    leg_contact: np.ndarray
    """(n, L) bool: each of the robot's ``contact_links`` touches the ground (A1: (n, 8), each thigh and calf, columns
    FR thigh, FR calf, FL thigh, ..., :data:`unilab_gym.sim.a1.LEG_LINK_NAMES`)."""
    torques: np.ndarray
    """(n, J) joint torques in N·m: the PD torques applied during the last substep (0 after a reset)."""
    end_effector_pos: np.ndarray = None  # type: ignore[assignment]  # zeros(n, 3) when not given
    """(n, 3) position in m of the robot's ``end_effector_link`` frame, world frame (0 without one)."""
    end_effector_vel: np.ndarray = None  # type: ignore[assignment]
    """(n, 3) linear velocity in m/s of the ``end_effector_link``, world frame (0 without one)."""
    object_pos: np.ndarray = None  # type: ignore[assignment]
    """(n, 3) position in m of each env's object (``Scene(objects=True)``), world frame (0 without objects)."""
    object_quat: np.ndarray = None  # type: ignore[assignment]
    """(n, 4) orientation of the object, unit quaternion (x, y, z, w), object -> world."""
    object_lin_vel: np.ndarray = None  # type: ignore[assignment]
    """(n, 3) linear velocity in m/s of the object, world frame."""
    object_ang_vel: np.ndarray = None  # type: ignore[assignment]
    """(n, 3) angular velocity in rad/s of the object, world frame."""

    def __post_init__(self) -> None:
        """Allocate the optional (end-effector, object) arrays left out: zeros of n rows."""
        n = self.base_pos.shape[0]
        for name, width in _OPTIONAL_WIDTHS.items():
            if getattr(self, name) is None:
                setattr(self, name, np.zeros((n, width)))
                if name == "object_quat":
                    self.object_quat[:, 3] = 1.0  # the identity

    @classmethod
    def zeros(cls, n: int, robot: RobotDescription = A1) -> RobotState:
        """States of ``n`` robots described by ``robot``, every array zero (``False``)."""
        j = robot.num_joints
        return cls(
            base_pos=np.zeros((n, 3)),
            base_quat=np.zeros((n, 4)),
            lin_vel=np.zeros((n, 3)),
            ang_vel=np.zeros((n, 3)),
            joint_pos=np.zeros((n, j)),
            joint_vel=np.zeros((n, j)),
            trunk_contact=np.zeros(n, dtype=bool),
            foot_contact=np.zeros((n, len(robot.foot_links)), dtype=bool),
            leg_contact=np.zeros((n, len(robot.contact_links)), dtype=bool),
            torques=np.zeros((n, j)),
        )

    def rows(self, rows: slice) -> RobotState:
        """Views (no copy) of the rows ``rows`` of every array."""
        return RobotState(**{f.name: getattr(self, f.name)[rows] for f in fields(self)})

    def read_only(self) -> RobotState:
        """Read-only views (no copy) of every array: they show every later write, but cannot be written through."""
        views = {}
        for f in fields(self):
            view = getattr(self, f.name).view()
            view.flags.writeable = False
            views[f.name] = view
        return RobotState(**views)

    def __len__(self) -> int:
        """Number of robots (rows)."""
        return self.base_pos.shape[0]


#: Width of each optional :class:`RobotState` array.
_OPTIONAL_WIDTHS = {
    "end_effector_pos": 3,
    "end_effector_vel": 3,
    "object_pos": 3,
    "object_quat": 4,
    "object_lin_vel": 3,
    "object_ang_vel": 3,
}


#: Radius in m of the sphere :meth:`ClusterWorld.render` draws at a task's target.
MARKER_RADIUS = 0.02


def _lane_y(lane: int) -> float:
    """The y coordinate in m of lane ``lane``: lanes are LANE_SPACING apart, centred on y = 0."""
    return (lane - a1.NUM_LANES // 2) * a1.LANE_SPACING


def lane_origins(lanes: np.ndarray) -> np.ndarray:
    """(k, 2) float64 world x, y in m of the spawn points of lanes ``lanes`` ((k,) int): x 0, y :func:`_lane_y`."""
    out = np.zeros((len(lanes), 2))
    out[:, 1] = [_lane_y(int(lane)) for lane in lanes]
    return out


class ClusterWorld:
    """A pybullet world with ``num_robots`` robots of one description advanced in lockstep.

    Args:
        state: where this world writes its robots' states (:meth:`read_state`); its length is
            the number of robots (>= 1), its array widths those of ``robot`` (:meth:`RobotState.zeros`). Pass views
            of a larger :class:`RobotState` to gather several worlds' robots in one set of arrays without copies.
        dt: physics time step in s.
        solver_iterations: pybullet ``numSolverIterations``.
        visual: load visual shapes (needed only for rendering; costs ~19 MB per A1).
        robot: the robot every slot holds (default the A1), loaded the same way in every world.
        scene: the static world around the robots (default an infinite plane).

    Raises:
        ValueError: a name of ``robot`` the URDF does not have, naming the field, the URDF and the valid names
            (``joint_names``: its revolute and prismatic joints; ``foot_links``, ``contact_links``,
            ``end_effector_link``: its links; ``base_link``: its root link), or ``torque_limits=None`` where the URDF
            gives a joint no effort limit. The physics client is disconnected before raising.
    """

    def __init__(
        self,
        state: RobotState,
        dt: float,
        solver_iterations: int,
        visual: bool = False,
        robot: RobotDescription = A1,
        scene: Scene = Scene(),  # noqa: B008  # frozen: one shared default is safe
    ):
        """Connect a physics client and load the robots and scene (arguments: see the class docstring)."""
        num_robots = len(state)
        if num_robots < 1:
            raise ValueError(f"a cluster needs at least one robot, got {num_robots}")
        self.num_robots = num_robots
        self.state = state
        self.robot = robot
        self._closed = True  # until the client exists
        self._client = p.connect(p.DIRECT)
        self._closed = False
        try:
            self._build(dt, solver_iterations, visual, robot, scene)
        except BaseException:
            self.close()
            raise

    def _build(self, dt: float, solver_iterations: int, visual: bool, robot: RobotDescription, scene: Scene) -> None:
        c = self._client
        self._visual = visual
        self._marker: int | None = None  # the body render() draws a task's target with, made at its first use
        num_robots = self.num_robots
        p.setGravity(0.0, 0.0, -GRAVITY, physicsClientId=c)
        p.setPhysicsEngineParameter(
            fixedTimeStep=dt,
            numSolverIterations=solver_iterations,
            deterministicOverlappingPairs=1,
            physicsClientId=c,
        )
        if scene.objects:
            # Every solver iteration runs: with pybullet's default threshold (1e-7) the solver stops once the
            # residual summed over the world's contacts is small, so one robot's iterations depend on its
            # neighbours' (PandaPick: an object held in a gripper moved differently with envs_per_cluster). Only
            # with objects: the quadrupeds' trajectories stay those of the default.
            p.setPhysicsEngineParameter(solverResidualThreshold=0.0, physicsClientId=c)
        # An infinite ground plane (pybullet_data's plane.urdf is a 200 m box: lanes and long
        # walks would leave it), friction 1 as in plane.urdf.
        ground_visual = (
            p.createVisualShape(p.GEOM_MESH, fileName=a1.PLANE_MESH_PATH, physicsClientId=c) if visual else -1
        )
        if visual and scene.terrain:  # the plane touches no robot then; drawn, it would cover the tiles' pits
            ground_visual = p.createVisualShape(
                p.GEOM_SPHERE, radius=1e-3, visualFramePosition=[0.0, 0.0, -100.0], physicsClientId=c
            )
        self._plane = p.createMultiBody(
            0.0, p.createCollisionShape(p.GEOM_PLANE, physicsClientId=c), ground_visual, physicsClientId=c
        )
        p.changeDynamics(self._plane, -1, lateralFriction=scene.ground_friction, physicsClientId=c)
        p.setCollisionFilterGroupMask(self._plane, -1, _GROUND_GROUP, 0xFFFF, physicsClientId=c)
        flags = 0 if visual else p.URDF_IGNORE_VISUAL_SHAPES
        if robot.use_urdf_inertia:  # else pybullet computes the inertia from the collision shapes
            flags |= p.URDF_USE_INERTIA_FROM_FILE
        self._spawn_height = robot.spawn_height
        self._robots: list[int] = []
        self._spawn_pos = np.zeros((num_robots, 3))  # each robot's spawn point of its episode (for the camera)
        for i in range(num_robots):
            spawn = [0.0, _lane_y(i % a1.NUM_LANES), robot.spawn_height]
            self._spawn_pos[i] = spawn
            body = p.loadURDF(robot.urdf_path, spawn, flags=flags, useFixedBase=robot.fixed_base, physicsClientId=c)
            for link in range(-1, p.getNumJoints(body, physicsClientId=c)):
                p.setCollisionFilterGroupMask(body, link, _ROBOT_GROUP, _GROUND_GROUP, physicsClientId=c)
            self._robots.append(body)
            if i == 0:
                self._check_names(robot, body)  # before loading the others: a bad name fails fast
        first = self._robots[0]
        infos = [p.getJointInfo(first, j, physicsClientId=c) for j in range(p.getNumJoints(first, physicsClientId=c))]
        names = [info[1].decode() for info in infos]
        self.joint_ids = [names.index(n) for n in robot.joint_names]
        if robot.joint_damping is not None:  # in place of the URDF's <dynamics damping=...>
            for body in self._robots:
                for j, damping in zip(self.joint_ids, robot.joint_damping):
                    p.changeDynamics(body, j, jointDamping=damping, physicsClientId=c)
        # every link by name, as (link index + 1): column 0 is the base (link -1)
        columns = [p.getBodyInfo(first, physicsClientId=c)[0].decode()] + [info[12].decode() for info in infos]
        # contact flags of one world, as (robot, link index + 1)
        self._contact_hits = np.zeros((num_robots, len(columns)), dtype=bool)
        self._foot_columns = [columns.index(n) for n in robot.foot_links]
        self._leg_columns = [columns.index(n) for n in robot.contact_links]
        self._ee_link = None if robot.end_effector_link is None else columns.index(robot.end_effector_link) - 1
        self._row_of_body = np.full(max(self._robots) + 1, -1, dtype=np.int64)
        self._row_of_body[self._robots] = np.arange(num_robots)
        self._fresh = np.zeros(num_robots, dtype=bool)  # reset since the last physics step
        #: Torque limit of each joint in N·m: the description's, or the URDF ``<limit effort=...>``.
        self.torque_limits = (
            np.array([infos[j][10] for j in self.joint_ids])
            if robot.torque_limits is None
            else np.array(robot.torque_limits)
        )
        #: Links of a robot: -1 (the trunk) and every joint's child link.
        self._links = list(range(-1, len(infos)))
        base = p.getDynamicsInfo(first, -1, physicsClientId=c)
        #: Trunk mass in kg, as loaded.
        self.nominal_trunk_mass = base[0]
        self._nominal_inertia = np.array(base[2])  # trunk inertia diagonal in kg·m^2, as loaded
        #: Lateral friction coefficient of the robot links as loaded.
        self.nominal_friction = base[1]
        self._trunk_mass = np.full(num_robots, self.nominal_trunk_mass)
        self._com_offset = np.zeros((num_robots, 3))
        self._offset_robots = np.zeros(0, dtype=np.int64)  # robots with a non-zero centre-of-mass offset
        #: The objects (``scene.objects``), one per robot, or ``None``.
        self.objects = ObjectSet(p, c, self._robots, self._links) if scene.objects else None
        #: The heightfield tiles (``scene.terrain``), one per robot, or ``None``; the plane then touches no robot.
        self.terrain = (
            TerrainSet(p, c, self._robots, self._links, scene.ground_friction, visual=visual) if scene.terrain else None
        )
        if self.terrain is not None:
            p.setCollisionFilterGroupMask(self._plane, -1, 0, 0, physicsClientId=c)
        for body in self._robots:
            # pybullet's default velocity motors would fight the torques we apply.
            p.setJointMotorControlArray(
                body, self.joint_ids, p.VELOCITY_CONTROL, forces=[0.0] * robot.num_joints, physicsClientId=c
            )

    def _check_names(self, robot: RobotDescription, body: int) -> None:
        """Raise ValueError for a joint or link name of ``robot`` that the loaded URDF (``body``) does not have."""
        c = self._client
        infos = [p.getJointInfo(body, j, physicsClientId=c) for j in range(p.getNumJoints(body, physicsClientId=c))]
        actuated = [info[1].decode() for info in infos if info[2] in (p.JOINT_REVOLUTE, p.JOINT_PRISMATIC)]
        base = p.getBodyInfo(body, physicsClientId=c)[0].decode()
        links = [base] + [info[12].decode() for info in infos]
        where = f"robot {robot.name!r}: the URDF {robot.urdf_path}"
        unknown = [n for n in robot.joint_names if n not in actuated]
        if unknown:
            raise ValueError(
                f"{where} has no actuated (revolute or prismatic) joint(s) {unknown} of joint_names; its actuated "
                f"joints are {actuated}"
            )
        for field_name in ("foot_links", "contact_links"):
            unknown = [n for n in getattr(robot, field_name) if n not in links]
            if unknown:
                raise ValueError(f"{where} has no link(s) {unknown} of {field_name}; its links are {links}")
        if robot.end_effector_link is not None and robot.end_effector_link not in links:
            raise ValueError(
                f"{where} has no link {robot.end_effector_link!r} (end_effector_link); its links are {links}"
            )
        if robot.base_link is not None and robot.base_link != base:
            raise ValueError(f"{where} has root link {base!r}, not base_link {robot.base_link!r}")
        if robot.torque_limits is None:
            names = [info[1].decode() for info in infos]
            unlimited = [n for n in robot.joint_names if infos[names.index(n)][10] <= 0.0]
            if unlimited:
                raise ValueError(
                    f"{where} gives joint(s) {unlimited} no effort limit (<limit effort> 0 or absent) and "
                    "torque_limits is None: set torque_limits (N·m per joint) in the RobotDescription"
                )

    def reset_robots(
        self, idx: np.ndarray, lanes: np.ndarray, joint_pos: np.ndarray, ground_height: np.ndarray | None = None
    ) -> None:
        """Put robots ``idx`` upright and at rest at the start of lanes ``lanes``.

        Args:
            idx: (k,) int, robot indices in this world.
            lanes: (k,) int in [0, NUM_LANES), lane of each robot (see :func:`_lane_y`).
            joint_pos: (k, 12) float64, joint angles in rad.
            ground_height: ``None`` (the plane, z = 0) or (k,) m, the ground's height under each spawn point (a
                terrain tile's): the robot spawns ``spawn_height`` above it.
        """
        c = self._client
        for row, i in enumerate(idx):
            robot = self._robots[i]
            z = self._spawn_height if ground_height is None else self._spawn_height + float(ground_height[row])
            base = [0.0, _lane_y(int(lanes[row])), z]
            self._spawn_pos[i] = base
            p.resetBasePositionAndOrientation(robot, base, [0.0, 0.0, 0.0, 1.0], physicsClientId=c)
            p.resetBaseVelocity(robot, [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], physicsClientId=c)
            for k, j in enumerate(self.joint_ids):
                p.resetJointState(robot, j, joint_pos[row, k], 0.0, physicsClientId=c)
            # Forget the contacts of the robot's last episode: pybullet keeps a contact manifold across a teleport
            # when a foot lands within its breaking threshold (2 cm) of its last contact (a robot spawned at its
            # standing height, e.g. the Laikago), and the new episode would warm-start from those impulses, unlike
            # the same episode in a fresh world. Setting a link's collision filter drops its broadphase pairs.
            for link in self._links:
                p.setCollisionFilterGroupMask(robot, link, _ROBOT_GROUP, _GROUND_GROUP, physicsClientId=c)
        self.state.torques[idx] = 0.0
        self._fresh[idx] = True

    def set_dynamics(
        self, idx: np.ndarray, friction: np.ndarray, trunk_mass: np.ndarray, com_offset: np.ndarray
    ) -> None:
        """Set the physics of robots ``idx``; every value is written, so nothing of an earlier setting remains.

        Args:
            idx: (k,) int, robot indices in this world.
            friction: (k,) lateral friction coefficient of every link of each robot (the
                robot-ground coefficient: the ground's is 1.0 and pybullet multiplies them).
            trunk_mass: (k,) kg, > 0. pybullet scales the trunk's inertia from the loaded one by
                ``trunk_mass / nominal_trunk_mass`` (whatever the mass was before).
            com_offset: (k, 3) m, trunk centre-of-mass offset in the trunk frame, modelled by
                the torque of the trunk's weight (see the module docstring).
        """
        c = self._client
        for row, i in enumerate(idx):
            robot = self._robots[i]
            if not self.robot.fixed_base:  # a fixed base has no mass to change (pybullet loads it with 0)
                p.changeDynamics(robot, -1, mass=float(trunk_mass[row]), physicsClientId=c)
                if self.robot.use_urdf_inertia:  # changeDynamics(mass=) recomputed it from the collision shapes
                    inertia = self._nominal_inertia * (float(trunk_mass[row]) / self.nominal_trunk_mass)
                    p.changeDynamics(robot, -1, localInertiaDiagonal=inertia.tolist(), physicsClientId=c)
            mu = float(friction[row])
            for link in self._links:
                p.changeDynamics(robot, link, lateralFriction=mu, physicsClientId=c)
        self._trunk_mass[idx] = trunk_mass
        self._com_offset[idx] = com_offset
        self._offset_robots = np.flatnonzero(np.any(self._com_offset != 0.0, axis=1))

    def reset_objects(self, idx: np.ndarray, lanes: np.ndarray, episodes: dict[str, np.ndarray]) -> None:
        """Build new objects for robots ``idx`` (``Scene(objects=True)``), after :meth:`reset_robots`.

        Args:
            idx: (k,) int, robot indices in this world.
            lanes: (k,) int, the lanes the robots were reset in (the object is placed relative to its robot's base).
            episodes: the k rows of each field of :class:`~unilab_gym.sim.scene.ObjectEpisodes` by name
                (``shape``, ``size``, ``mass``, ``friction``, ``position``, ``yaw``; see
                :meth:`unilab_gym.sim.objects.ObjectSet.reset`).
        """
        assert self.objects is not None, "reset_objects needs a Scene with objects=True"
        base = np.zeros((len(idx), 3))
        base[:, 1] = [_lane_y(int(lane)) for lane in lanes]
        base[:, 2] = self._spawn_height
        self.objects.reset(idx, base, **episodes)

    def reset_terrain(self, idx: np.ndarray, lanes: np.ndarray, heights: np.ndarray, horizontal_scale: float) -> None:
        """Build new terrain tiles for robots ``idx`` (``Scene(terrain=True)``), centred on their lanes' spawn points.

        Args:
            idx: (k,) int, robot indices in this world.
            lanes: (k,) int, the lanes the robots are reset in.
            heights: (k, n, n) float32 tiles in m (:class:`~unilab_gym.sim.scene.TerrainEpisodes`).
            horizontal_scale: grid spacing in m.
        """
        assert self.terrain is not None, "reset_terrain needs a Scene with terrain=True"
        self.terrain.reset(idx, lane_origins(lanes), heights, horizontal_scale)

    def push(self, idx: np.ndarray, delta_v: np.ndarray) -> None:
        """Add ``delta_v`` ((k, 3) m/s, world frame) to the base linear velocity of robots ``idx``."""
        c = self._client
        for row, i in enumerate(idx):
            robot = self._robots[i]
            lin, ang = p.getBaseVelocity(robot, physicsClientId=c)
            p.resetBaseVelocity(robot, (np.asarray(lin) + delta_v[row]).tolist(), ang, physicsClientId=c)

    def _apply_com_torques(self) -> None:
        """Torque of the trunk weight about its loaded centre of mass, for the robots with an offset."""
        c = self._client
        rows = self._offset_robots
        quat = np.array([p.getBasePositionAndOrientation(self._robots[i], physicsClientId=c)[1] for i in rows])
        arm = quat_rotate(quat, self._com_offset[rows])  # world frame
        torque = np.cross(arm, np.array([0.0, 0.0, -GRAVITY])) * self._trunk_mass[rows, None]
        for i, t in zip(rows, torque):
            p.applyExternalTorque(self._robots[i], -1, t.tolist(), p.WORLD_FRAME, physicsClientId=c)

    def step(
        self, targets: np.ndarray, kp: np.ndarray, kd: np.ndarray, torque_limits: np.ndarray, substeps: int
    ) -> None:
        """Advance the world one slice of ``substeps`` physics steps under PD control.

        Every substep applies ``tau = clip(kp * (targets - q) - kd * qd, -limit, limit)`` to
        every joint of every robot, then calls ``stepSimulation`` once.

        Args:
            targets: (n, 12) joint position targets in rad.
            kp: (n, 12) stiffness in N·m/rad.
            kd: (n, 12) damping in N·m·s/rad.
            torque_limits: (n, 12) N·m.
            substeps: physics steps per slice.
        """
        c = self._client
        ids = self.joint_ids
        robots = self._robots
        q = self.state.joint_pos
        qd = self.state.joint_vel
        for _ in range(substeps):
            for i, robot in enumerate(robots):
                states = p.getJointStates(robot, ids, physicsClientId=c)
                q[i] = [s[0] for s in states]
                qd[i] = [s[1] for s in states]
            tau = np.clip(kp * (targets - q) - kd * qd, -torque_limits, torque_limits)
            for i, robot in enumerate(robots):
                p.setJointMotorControlArray(robot, ids, p.TORQUE_CONTROL, forces=tau[i], physicsClientId=c)
            if self._offset_robots.size:
                self._apply_com_torques()  # external forces last one stepSimulation
            p.stepSimulation(physicsClientId=c)
        self.state.torques[:] = tau
        self._fresh[:] = False

    def step_external(self, wrench: np.ndarray, substeps: int) -> None:
        """Advance the world one slice of ``substeps`` physics steps under external wrenches (no joint control).

        Every substep applies robot ``i``'s force ``wrench[i, :3]`` (N) at its base's centre of mass and torque
        ``wrench[i, 3:]`` (N·m), both in the base frame (pybullet ``LINK_FRAME`` on link -1), then calls
        ``stepSimulation`` once (pybullet clears external forces after each step). The task computes the wrench
        (:meth:`unilab_gym.tasks.base.Task.forces`, e.g. a quadrotor's rotor thrusts and drag torques).

        Args:
            wrench: (n, 6) float64, force then torque per robot, base frame.
            substeps: physics steps per slice.
        """
        c = self._client
        forces = wrench[:, :3].tolist()
        torques = wrench[:, 3:].tolist()
        origin = [0.0, 0.0, 0.0]
        for _ in range(substeps):
            for i, robot in enumerate(self._robots):
                p.applyExternalForce(robot, -1, forces[i], origin, p.LINK_FRAME, physicsClientId=c)
                p.applyExternalTorque(robot, -1, torques[i], p.LINK_FRAME, physicsClientId=c)
            if self._offset_robots.size:
                self._apply_com_torques()
            p.stepSimulation(physicsClientId=c)
        self.state.torques[:] = 0.0
        self._fresh[:] = False

    def read_state(self) -> None:
        """Refresh every state array from the physics world.

        The contact flags (base, feet, contact links) come from one ``getContactPoints`` call for
        the whole world (every robot-ground contact of the last physics step), not one call per robot.
        """
        c = self._client
        st = self.state
        for i, robot in enumerate(self._robots):
            pos, quat = p.getBasePositionAndOrientation(robot, physicsClientId=c)
            lin, ang = p.getBaseVelocity(robot, physicsClientId=c)
            st.base_pos[i] = pos
            st.base_quat[i] = quat
            st.lin_vel[i] = lin
            st.ang_vel[i] = ang
            if self.joint_ids:  # pybullet returns None for no joints (a quadrotor)
                states = p.getJointStates(robot, self.joint_ids, physicsClientId=c)
                st.joint_pos[i] = [s[0] for s in states]
                st.joint_vel[i] = [s[1] for s in states]
        if self._ee_link is not None:
            for i, robot in enumerate(self._robots):
                link = p.getLinkState(
                    robot, self._ee_link, computeLinkVelocity=1, computeForwardKinematics=1, physicsClientId=c
                )
                st.end_effector_pos[i] = link[4]  # the link frame's origin (link[0] is its centre of mass)
                st.end_effector_vel[i] = link[6]
        hits = self._contact_hits
        hits[:] = False
        if self.terrain is None:
            points = p.getContactPoints(bodyA=self._plane, physicsClientId=c)  # body B: a robot, link B: its link
        else:
            points = self.terrain.contact_points()  # body A: a tile, body B: its robot
        if self.objects is not None:
            self.objects.read(st.object_pos, st.object_quat, st.object_lin_vel, st.object_ang_vel)
            points = [pt for pt in points if pt[2] < len(self._row_of_body) and self._row_of_body[pt[2]] >= 0]
        if points:
            hits[self._row_of_body[[pt[2] for pt in points]], [pt[4] + 1 for pt in points]] = True
        hits[self._fresh] = False
        st.trunk_contact[:] = hits[:, 0]
        st.foot_contact[:] = hits[:, self._foot_columns]
        st.leg_contact[:] = hits[:, self._leg_columns]

    def render(
        self,
        robot: int,
        width: int,
        height: int,
        camera: Camera = Camera(),  # noqa: B008  # frozen: one shared default is safe
        marker: np.ndarray | None = None,
    ) -> np.ndarray:
        """An RGB frame of robot ``robot`` seen by ``camera``, drawn by pybullet's TinyRenderer (CPU).

        Args:
            robot: robot index in this world.
            width: image width in pixels.
            height: image height in pixels.
            camera: where from (:class:`~unilab_gym.sim.camera.Camera`; default the quadruped's view): its target
                follows this robot's base or its spawn point of the current episode.
            marker: ``None``, or (3,) m relative to the robot's spawn point (world axes): where to draw a red sphere
                of radius :data:`MARKER_RADIUS` (the task's target). The sphere is a body with a visual shape and no
                collision shape, made at the first marker: it touches nothing, so the physics is the same.

        Returns:
            (height, width, 3) uint8 RGB. In a world built with ``visual=True`` and terrain, the robot's own tile is
            drawn and no other (:meth:`unilab_gym.sim.terrain.TerrainSet.show`).
        """
        c = self._client
        if self.terrain is not None and self._visual:
            self.terrain.show(robot)
        self._place_marker(None if marker is None else self._spawn_pos[robot] + np.asarray(marker, dtype=np.float64))
        target = camera.target(self.state.base_pos[robot], self._spawn_pos[robot])
        view = p.computeViewMatrixFromYawPitchRoll(
            target.tolist(), camera.distance, camera.yaw, camera.pitch, 0.0, 2, physicsClientId=c
        )
        proj = p.computeProjectionMatrixFOV(camera.fov, width / height, camera.near, camera.far, physicsClientId=c)
        _, _, rgba, _, _ = p.getCameraImage(width, height, view, proj, renderer=p.ER_TINY_RENDERER, physicsClientId=c)
        return np.asarray(rgba, dtype=np.uint8).reshape(height, width, 4)[:, :, :3].copy()

    def _place_marker(self, position: np.ndarray | None) -> None:
        """Move the marker sphere to ``position`` ((3,) m, world), or out of sight (``None``); make it if needed."""
        c = self._client
        if position is None:
            if self._marker is not None:
                p.resetBasePositionAndOrientation(self._marker, [0.0, 0.0, -100.0], [0, 0, 0, 1], physicsClientId=c)
            return
        if self._marker is None:
            shape = p.createVisualShape(
                p.GEOM_SPHERE, radius=MARKER_RADIUS, rgbaColor=[0.9, 0.1, 0.1, 1.0], physicsClientId=c
            )
            self._marker = p.createMultiBody(0.0, -1, shape, position.tolist(), physicsClientId=c)
        else:
            p.resetBasePositionAndOrientation(self._marker, position.tolist(), [0, 0, 0, 1], physicsClientId=c)

    def __reduce_ex__(self, protocol: SupportsIndex) -> NoReturn:
        """Refuse ``copy.copy``, ``copy.deepcopy`` and ``pickle``.

        Raises:
            TypeError: always: a copy would hold this world's physics client id, so it would move (and
                ``close()`` would disconnect) this world's robots; in another process the id names another world.
        """
        raise TypeError(
            "a ClusterWorld cannot be copied or pickled: it is a live pybullet physics client of this process "
            f"(id {getattr(self, '_client', None)}); build a new ClusterWorld (or a new env) instead"
        )

    def close(self) -> None:
        """Disconnect the physics client. Idempotent."""
        if not getattr(self, "_closed", True):
            self._closed = True
            p.disconnect(physicsClientId=self._client)
