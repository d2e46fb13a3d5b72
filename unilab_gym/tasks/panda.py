"""Manipulation tasks for the Franka Panda (:data:`~unilab_gym.robots.PANDA`).

``UniLab/PandaReach-v0`` (move the grasp point to a target) and ``UniLab/PandaPick-v0`` (pick up an object of a
random shape, size, mass and friction and lift it to a target height).

Batched numpy over all N envs, never pybullet (:class:`~unilab_gym.tasks.base.Task`). Positions in observations,
commands and targets are relative to each env's robot base (world axes), so they do not depend on the lane the
engine puts the robot in. The goal convention is Gymnasium-Robotics' (Plappert et al. 2018, "Multi-Goal
Reinforcement Learning: Challenging Robotics Environments and Request for Research"; Fetch and panda-gym's Panda
tasks): ``info["is_success"]`` when the end effector (reach) or the object (pick) is within 5 cm of the goal
(:data:`SUCCESS_DISTANCE`).

Actions, tracked by the engine's PD torques as for the quadrupeds. Reach: 7 joint position targets around the
nominal pose, each arm joint's target ``nominal + action_scale * a`` (rad, clipped to the joint's limits,
:data:`~unilab_gym.robots.panda.PANDA_ARM_LIMITS`); the fingers stay open. Pick: panda-gym's end-effector control
(``Panda(control_type="ee")``): 3 displacements of the grasp point (``ee_max_step`` m per unit, 0.05 as panda-gym)
with the hand kept pointing down, turned into joint targets by numpy inverse kinematics
(:mod:`unilab_gym.tasks.panda_kinematics`), then the gripper: both fingers' target opening ``0.04 * (a + 1) / 2`` m
(-1 closed, +1 open).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from unilab_gym.randomization import PARAMETER_NAMES, DomainRandomization
from unilab_gym.robots import PANDA, RobotDescription, get_robot
from unilab_gym.robots.panda import PANDA_ARM_LIMITS, PANDA_FINGER_OPEN
from unilab_gym.sim.camera import Camera
from unilab_gym.sim.scene import OBJECT_SHAPES, ObjectEpisodes, Scene
from unilab_gym.tasks import weights
from unilab_gym.tasks.base import Task
from unilab_gym.tasks.panda_kinematics import BASE_COM_OFFSET, forward_kinematics, ik_step
from unilab_gym.validation import check_positive, check_positive_int, check_real

if TYPE_CHECKING:
    from unilab_gym.sim.world import RobotState

#: Distance in m under which a goal is reached (``info["is_success"]``): Gymnasium-Robotics' ``distance_threshold``
#: (0.05 in Fetch and panda-gym).
SUCCESS_DISTANCE = 0.05
#: Pick's object sizes are drawn in whole millimetres (m): the physics layer caches one collision shape per size
#: (pybullet never frees a used one, :mod:`unilab_gym.sim.objects`).
SIZE_RESOLUTION = 0.001
#: Arm joints (the first 7 of the robot's joints) and fingers (the last 2).
ARM_JOINTS = 7
_ARM_LOW = np.array([lo for lo, _ in PANDA_ARM_LIMITS])
_ARM_HIGH = np.array([hi for _, hi in PANDA_ARM_LIMITS])
_NUM_PHYSICS = len(PARAMETER_NAMES)


def _layout(*widths: tuple[str, int]) -> dict[str, tuple[int, int]]:
    out, start = {}, 0
    for name, width in widths:
        out[name] = (start, start + width)
        start += width
    return out


#: ``UniLab/PandaReach-v0`` observation layout: name -> (start, stop) columns, with units.
REACH_OBS_LAYOUT = _layout(
    ("joint_pos", 7),  # rad, arm joints relative to the nominal pose
    ("joint_vel", 7),  # rad/s
    ("end_effector_pos", 3),  # m, grasp point relative to the base, world axes
    ("end_effector_vel", 3),  # m/s, world frame
    ("target", 3),  # m, the target relative to the base (the command)
    ("target_minus_end_effector", 3),  # m
    ("last_action", 7),  # the clipped action of the previous step
)
#: Critic layout of Reach: the observation, then the episode's physics parameters (:data:`PARAMETER_NAMES`).
REACH_CRITIC_OBS_LAYOUT = {**REACH_OBS_LAYOUT, "parameters": (33, 33 + _NUM_PHYSICS)}

#: ``UniLab/PandaPick-v0`` observation layout: name -> (start, stop) columns, with units.
PICK_OBS_LAYOUT = _layout(
    ("joint_pos", 9),  # rad (m for the two fingers), relative to the nominal pose
    ("joint_vel", 9),  # rad/s (m/s)
    ("end_effector_pos", 3),  # m, relative to the base
    ("end_effector_vel", 3),  # m/s
    ("object_pos", 3),  # m, relative to the base
    ("object_minus_end_effector", 3),  # m
    ("object_quat", 4),  # unit quaternion (x, y, z, w), object -> world
    ("object_lin_vel", 3),  # m/s, world frame
    ("object_ang_vel", 3),  # rad/s, world frame
    ("goal", 3),  # m, relative to the base (the command)
    ("goal_minus_object", 3),  # m
    ("grasp_point_command", 3),  # m, relative to the base: where the end-effector control aims the grasp point
    ("last_action", 4),  # the clipped action of the previous step
)
#: Critic layout of Pick: the observation, the physics parameters, then the object's (:data:`OBJECT_PARAMETERS`).
PICK_CRITIC_OBS_LAYOUT = {
    **PICK_OBS_LAYOUT,
    "parameters": (53, 53 + _NUM_PHYSICS),
    "object_parameters": (53 + _NUM_PHYSICS, 57 + _NUM_PHYSICS),
}
#: Pick's episode parameters (the parameter trace's extra columns): the object's shape code (0 box, 1 cylinder,
#: 2 sphere: :data:`~unilab_gym.sim.scene.OBJECT_SHAPES`), size in m (box edge; cylinder diameter and height;
#: sphere diameter), mass in kg and friction coefficient.
OBJECT_PARAMETERS = ("object_shape", "object_size", "object_mass", "object_friction")


@dataclass(frozen=True)
class ReachRewardWeights:
    """Reach reward terms, each its raw value times its weight, per control step.

    ``distance``: ``|p_ee - p_target|`` in m (panda-gym's dense reward, weight -1); ``success``: 1 within
    :data:`SUCCESS_DISTANCE`; ``action_rate``: ``sum (a_t - a_{t-1})^2`` (legged_gym's term; the weight is ours).
    """

    distance: float = -1.0
    success: float = 0.0
    action_rate: float = -0.005


@dataclass(frozen=True)
class PickRewardWeights:
    """Pick reward terms, each its raw value times its weight, per control step.

    The staged reward of robosuite's ``Lift`` (Zhu et al. 2020, "robosuite: A Modular Simulation Framework and
    Benchmark for Robot Learning", ``Lift.reward(reward_shaping=True)``: reaching ``1 - tanh(10 d)`` weight 1,
    grasping 0.25, success 2.25 in place of the others), with a lifting stage and panda-gym's goal distance
    (Gallouédec et al. 2021, ``PickAndPlace``) added as robosuite's ``Stack`` adds its lifting stage:

    - ``reach``: ``1 - tanh(10 |p_grasp - p_object|)`` (d in m);
    - ``grasp``: 1 while the object is held (:meth:`PandaPickTask.grasped`: a geometric test, as the physics layer
      reports only ground contacts; robosuite checks both fingers' contacts);
    - ``lift``: while held, ``1 - |1 - f|`` clipped to [0, 1], ``f`` the object's height above its resting height
      as a fraction of the goal's: it grows to 1 at the goal's height and falls above it (until issue 27's second
      learning runs it stayed 1 above the goal, and the policies trained from grasped starts lifted past the goal
      and ended their episodes above it; panda-gym's distance reward likewise pays nothing for overshooting);
    - ``goal``: ``1 - tanh(10 |p_object - p_goal|)``;
    - ``success``: 1 within :data:`SUCCESS_DISTANCE` of the goal (``info["is_success"]``);
    - ``action_rate``: ``sum (a_t - a_{t-1})^2`` (legged_gym's term).

    The weights of ``lift``, ``goal``, ``success`` and ``action_rate`` are ours (measured to learn with stock PPO,
    ``docs/tasks/panda.md``).
    """

    reach: float = 1.0
    grasp: float = 1.0
    lift: float = 2.0
    goal: float = 1.0
    success: float = 4.0
    action_rate: float = -0.005


def _range(name: str, value: Any, minimum: float | None = None) -> tuple[float, float]:
    """A (low, high) pair of finite floats, low <= high (and >= ``minimum``)."""
    if not isinstance(value, (Sequence, np.ndarray)) or isinstance(value, (str, bytes)) or len(value) != 2:
        raise ValueError(f"{name} must be a (low, high) pair of numbers, got {value!r}")
    lo, hi = check_real(name, value[0], minimum=minimum), check_real(name, value[1], minimum=minimum)
    if lo > hi:
        raise ValueError(f"{name} must satisfy low <= high, got {value!r}")
    return lo, hi


def _box(name: str, value: Any) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
    """((x, y, z) low, (x, y, z) high) of a box, low <= high per axis."""
    if not isinstance(value, (Sequence, np.ndarray)) or isinstance(value, (str, bytes)) or len(value) != 2:
        raise ValueError(f"{name} must be ((x, y, z) low, (x, y, z) high) in m, got {value!r}")
    lo, hi = ([check_real(name, v) for v in corner] for corner in value)
    if len(lo) != 3 or len(hi) != 3 or any(a > b for a, b in zip(lo, hi)):
        raise ValueError(f"{name} must be ((x, y, z) low, (x, y, z) high) with low <= high, got {value!r}")
    return (lo[0], lo[1], lo[2]), (hi[0], hi[1], hi[2])


def _weights(name: str, cls: Any, value: Any) -> Any:
    if isinstance(value, cls):
        out = value
    elif value is None or isinstance(value, Mapping):
        known = [f.name for f in fields(cls)]
        unknown = sorted(str(k) for k in (value or {}) if k not in known)
        if unknown:
            raise ValueError(f"unknown {name} term(s) {unknown}; known: {known}")
        out = cls(**dict(value or {}))
    else:
        raise ValueError(f"{name} must be a {cls.__name__}, a dict of its fields or None, got {value!r}")
    for f in fields(out):
        check_real(f"{name}[{f.name!r}]", getattr(out, f.name))
    return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, RobotDescription):
        return "panda" if value == PANDA else value.to_dict()
    if isinstance(value, DomainRandomization):
        return value.to_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    return value


@dataclass(frozen=True)
class PandaConfig:
    """The fields both Panda tasks have (:class:`PandaReachConfig`, :class:`PandaPickConfig`)."""

    robot: RobotDescription = "panda"  # type: ignore[assignment]  # converted by __post_init__
    """``"panda"`` (:data:`~unilab_gym.robots.PANDA`) or a description (or its ``to_dict()``) with 9 joints (7 arm
    joints, then 2 fingers) and an ``end_effector_link``."""
    max_episode_steps: int = 50
    """Control steps before ``truncated`` (50 = 2 s at 25 Hz, as panda-gym), >= 1."""
    dt: float = 0.005
    """Physics time step in s, > 0."""
    substeps: int = 8
    """Physics steps per control step, >= 1 (control period 40 ms, panda-gym's)."""
    kp: tuple[float, ...] = None  # type: ignore[assignment]  # None: the robot's
    """PD stiffness per joint (9 values, or one for all); ``None``: the robot's."""
    kd: tuple[float, ...] = None  # type: ignore[assignment]
    """PD damping per joint (9 values, or one for all); ``None``: the robot's."""
    action_scale: float = None  # type: ignore[assignment]
    """Reach's arm joint target offset in rad per unit of action, > 0; ``None``: the robot's (Panda: 1.0). Pick
    moves the grasp point instead (``ee_max_step``) and does not use it."""
    solver_iterations: int = 10
    """pybullet ``numSolverIterations``, >= 1."""
    init_joint_noise: float = 0.05
    """Half-width in rad (>= 0) of the uniform noise added to the nominal arm joint angles at reset."""
    domain_randomization: DomainRandomization = field(default_factory=DomainRandomization)
    """Physics parameter ranges (:class:`~unilab_gym.randomization.DomainRandomization`). ``friction`` is the finger
    (every robot link) friction; ``added_mass`` and the centre-of-mass offsets act on the fixed base: not at all."""

    def __post_init__(self) -> None:
        """Resolve the robot and check and convert every field (raises ``ValueError`` naming the field)."""
        robot = get_robot(PANDA if self.robot == "panda" else self.robot)
        if robot.num_joints != ARM_JOINTS + 2 or robot.end_effector_link is None:
            raise ValueError(
                f"robot {robot.name!r}: the Panda tasks need 9 joint_names (7 arm joints, then 2 fingers) and an "
                f"end_effector_link, got {robot.num_joints} joints and end_effector_link={robot.end_effector_link!r}"
            )
        n = robot.num_joints
        converted = {
            "robot": robot,
            "max_episode_steps": check_positive_int("max_episode_steps", self.max_episode_steps),
            "dt": check_positive("dt", self.dt),
            "substeps": check_positive_int("substeps", self.substeps),
            "kp": robot.kp if self.kp is None else _gains("kp", self.kp, n),
            "kd": robot.kd if self.kd is None else _gains("kd", self.kd, n),
            "action_scale": (
                robot.action_scale if self.action_scale is None else check_positive("action_scale", self.action_scale)
            ),
            "solver_iterations": check_positive_int("solver_iterations", self.solver_iterations),
            "init_joint_noise": check_real("init_joint_noise", self.init_joint_noise, minimum=0.0),
            "domain_randomization": (
                self.domain_randomization
                if isinstance(self.domain_randomization, DomainRandomization)
                else DomainRandomization(self.domain_randomization)
            ),
        }
        converted.update(self._own_fields(robot))
        for name, value in converted.items():
            object.__setattr__(self, name, value)

    def _own_fields(self, robot: RobotDescription) -> dict[str, Any]:
        """The task's own fields, validated and converted (``robot``: the resolved robot)."""
        return {}

    @property
    def control_dt(self) -> float:
        """The control period in s: ``dt * substeps``."""
        return self.dt * self.substeps

    def to_dict(self) -> dict[str, Any]:
        """The configuration as JSON types, in field order: the env's ``task_config``."""
        return {f.name: _jsonable(getattr(self, f.name)) for f in fields(self)}


@dataclass(frozen=True)
class PandaReachConfig(PandaConfig):
    """The task configuration of ``UniLab/PandaReach-v0``, validated once when made.

    Its fields are the env's keyword arguments; ``PandaReachConfig(**config.to_dict()) == config``.

    Raises:
        ValueError: an invalid value, naming the field and the value.
    """

    target_range: tuple[tuple[float, float, float], tuple[float, float, float]] = (
        (0.35, -0.25, 0.05),
        (0.65, 0.25, 0.35),
    )
    """((x, y, z) low, (x, y, z) high) in m, relative to the base: the target is drawn uniformly in this box (0.3 m
    in x and z as panda-gym's ``goal_range`` 0.3, 0.5 m wide in y; centred 0.5 m in front of the base, 0.2 m up)."""
    reward_weights: ReachRewardWeights = None  # type: ignore[assignment]  # None: the defaults, the robot's overrides
    """Weights of the reward terms: ``None``, the defaults of :class:`ReachRewardWeights` with the robot's
    overrides (:attr:`~unilab_gym.robots.RobotDescription.reward_weights`); a dict overrides those; a
    :class:`ReachRewardWeights` is used as it is."""

    def _own_fields(self, robot: RobotDescription) -> dict[str, Any]:
        return {
            "target_range": _box("target_range", self.target_range),
            "reward_weights": weights.resolve(
                ReachRewardWeights,
                robot,
                self.reward_weights,
                lambda v: _weights("reward_weights", ReachRewardWeights, v),
            ),
        }


@dataclass(frozen=True)
class PandaPickConfig(PandaConfig):
    """The task configuration of ``UniLab/PandaPick-v0``, validated once when made.

    Its fields are the env's keyword arguments; ``PandaPickConfig(**c.to_dict()) == c``.

    The object is drawn per episode from the episode's stream: its shape uniformly from ``object_shapes``, then
    uniformly in each range: size, mass, friction, position on the ground in front of the arm, yaw, and the goal
    height. Contact friction: pybullet multiplies the two bodies' coefficients, so object-ground friction is
    ``object_friction`` (the ground's is 1) and finger-object friction is ``friction * object_friction`` (the
    fingers' is the ``friction`` physics parameter, 0.5 when not randomized).

    Raises:
        ValueError: an invalid value, naming the field and the value.
    """

    max_episode_steps: int = 50
    """Control steps before ``truncated`` (50 = 2 s at 25 Hz, panda-gym's ``PickAndPlace``), >= 1."""
    ee_max_step: float = 0.05
    """Grasp point displacement in m per unit of action and control step, > 0 (panda-gym's 0.05)."""
    ee_workspace: tuple[tuple[float, float, float], tuple[float, float, float]] = ((0.25, -0.4, 0.0), (0.8, 0.4, 0.45))
    """((x, y, z) low, (x, y, z) high) in m, relative to the base: the commanded grasp point stays in this box."""
    solver_iterations: int = 20
    """pybullet ``numSolverIterations``, >= 1 (more than Reach's: the grasp is a contact problem)."""
    object_shapes: tuple[str, ...] = OBJECT_SHAPES
    """The shapes drawn from, a non-empty subset of :data:`~unilab_gym.sim.scene.OBJECT_SHAPES`."""
    object_size_range: tuple[float, float] = (0.03, 0.06)
    """(low, high) size in m: a box's edge (a cube), a cylinder's diameter and height, a sphere's diameter; within
    (0.01, 0.08): the open gripper is 0.08 m wide."""
    object_mass_range: tuple[float, float] = (0.05, 0.3)
    """(low, high) mass in kg, > 0."""
    object_friction_range: tuple[float, float] = (0.5, 1.5)
    """(low, high) lateral friction coefficient of the object, >= 0."""
    object_x_range: tuple[float, float] = (0.4, 0.6)
    """(low, high) in m of the object's initial position in front of the base."""
    object_y_range: tuple[float, float] = (-0.15, 0.15)
    """(low, high) in m of the object's initial sideways position (left > 0)."""
    object_yaw_range: tuple[float, float] = (-0.7854, 0.7854)
    """(low, high) in rad of the object's initial rotation about the vertical."""
    goal_height_range: tuple[float, float] = (0.1, 0.25)
    """(low, high) in m of the goal's height above the ground; the goal is above the object's initial position."""
    reward_weights: PickRewardWeights = None  # type: ignore[assignment]  # None: the defaults, the robot's overrides
    """Weights of the reward terms: ``None``, the defaults of :class:`PickRewardWeights` with the robot's
    overrides (:attr:`~unilab_gym.robots.RobotDescription.reward_weights`); a dict overrides those; a
    :class:`PickRewardWeights` is used as it is."""
    grasped_start_fraction: float = 0.0
    """Fraction in [0, 1] of episodes that start with the object already between the fingers (a training-time reset
    distribution; 0, the default, draws nothing extra, so every episode starts with the arm in its nominal pose).
    Such an episode puts the object (yaw 0, so that its faces meet the fingers' pads) at its drawn place on the
    ground and the arm over it by inverse kinematics, the grasp point at the object's centre and each finger
    touching it (:meth:`PandaPickTask.sample_episode`); the policy must still close the gripper and lift. Reset
    from states near the goal, so that the hard stage is seen early: "Overcoming Exploration in Reinforcement
    Learning with Demonstrations" (Nair et al. 2018, resets to demonstration states) and "Reverse Curriculum
    Generation for Reinforcement Learning" (Florensa et al. 2017). ``benchmarks/learning_check.py`` trains Pick with
    0.5 and evaluates on the default (``docs/tasks/panda.md``)."""

    def _own_fields(self, robot: RobotDescription) -> dict[str, Any]:
        shapes = self.object_shapes
        if isinstance(shapes, str) or not isinstance(shapes, (Sequence, np.ndarray)) or not len(shapes):
            raise ValueError(f"object_shapes must be a non-empty list of {list(OBJECT_SHAPES)}, got {shapes!r}")
        bad = [s for s in shapes if s not in OBJECT_SHAPES]
        if bad or len(set(shapes)) != len(shapes):
            raise ValueError(f"object_shapes must be distinct names of {list(OBJECT_SHAPES)}, got {shapes!r}")
        size = _range("object_size_range", self.object_size_range, minimum=0.01)
        if size[1] > 0.08:
            raise ValueError(f"object_size_range must stay within (0.01, 0.08) m (the open gripper), got {size}")
        mass = _range("object_mass_range", self.object_mass_range, minimum=0.0)
        if mass[0] <= 0.0:
            raise ValueError(f"object_mass_range must be > 0 kg, got {self.object_mass_range!r}")
        return {
            "object_shapes": tuple(shapes),
            "object_size_range": size,
            "object_mass_range": mass,
            "object_friction_range": _range("object_friction_range", self.object_friction_range, minimum=0.0),
            "object_x_range": _range("object_x_range", self.object_x_range),
            "object_y_range": _range("object_y_range", self.object_y_range),
            "object_yaw_range": _range("object_yaw_range", self.object_yaw_range),
            "goal_height_range": _range("goal_height_range", self.goal_height_range, minimum=0.0),
            "ee_max_step": check_positive("ee_max_step", self.ee_max_step),
            "ee_workspace": _box("ee_workspace", self.ee_workspace),
            "reward_weights": weights.resolve(
                PickRewardWeights,
                robot,
                self.reward_weights,
                lambda v: _weights("reward_weights", PickRewardWeights, v),
            ),
            "grasped_start_fraction": check_real(
                "grasped_start_fraction", self.grasped_start_fraction, minimum=0.0, maximum=1.0
            ),
        }


def _gains(name: str, value: Any, n: int) -> tuple[float, ...]:
    values = list(value) if isinstance(value, (Sequence, np.ndarray)) and not isinstance(value, str) else [value] * n
    if len(values) != n:
        raise ValueError(f"{name} must be a number >= 0 or {n} of them, got {value!r}")
    return tuple(check_real(name, v, minimum=0.0) for v in values)


class _PandaTask(Task):
    """What Reach and Pick share: the arm's joint targets, the initial pose, the observation's arm part."""

    config: PandaConfig
    command_dim = 3
    #: Fixed at the base, looking at the middle of the target box from 1.4 m (the target is the red marker).
    camera = Camera(follow="spawn", offset=(0.4, 0.0, 0.2), distance=1.4, yaw=30.0, pitch=-25.0)

    def __init__(self, num_envs: int, config: PandaConfig):
        super().__init__(num_envs, config)
        self._success = np.zeros(num_envs, dtype=bool)

    def render_target(self) -> np.ndarray:
        """(N, 3) m: the target (Reach) or the goal (Pick), relative to the base: the ``command``."""
        return self.command

    def _arm_targets(self, action: np.ndarray, action_scale: float) -> np.ndarray:
        targets = self.nominal_joint_pos.copy()
        arm = self.nominal_joint_pos[:, :ARM_JOINTS] + action_scale * action[:, :ARM_JOINTS]
        targets[:, :ARM_JOINTS] = np.clip(arm, _ARM_LOW, _ARM_HIGH)
        return targets

    def _initial_pose(self, env: int, rng: np.random.Generator) -> np.ndarray:
        noise = self.config.init_joint_noise
        pose = self.nominal_joint_pos[env].copy()
        pose[:ARM_JOINTS] = np.clip(pose[:ARM_JOINTS] + rng.uniform(-noise, noise, ARM_JOINTS), _ARM_LOW, _ARM_HIGH)
        return pose

    def start_episodes(self, idx: np.ndarray) -> None:
        """Nothing to clear (success is recomputed every step)."""
        self._success[idx] = False

    def step_info(self) -> dict[str, np.ndarray]:
        """``{"is_success": (N,) bool}`` of the last :meth:`evaluate`."""
        return {"is_success": self._success.copy()}

    def _critic(self, obs: np.ndarray, parameters: np.ndarray, out: np.ndarray) -> None:
        d = self.obs_dim
        out[:, :d] = obs
        out[:, d : d + _NUM_PHYSICS] = parameters
        out[:, d + _NUM_PHYSICS :] = self.episode_parameters


class PandaReachTask(_PandaTask):
    """``UniLab/PandaReach-v0``: move the grasp point (``panda_grasptarget``) to a target.

    The target is drawn per episode in ``target_range``; no termination (time limit only); success within 5 cm.
    Observation :data:`REACH_OBS_LAYOUT`, reward :class:`ReachRewardWeights`, 7 actions (arm joint targets).
    """

    obs_dim = 33
    critic_obs_dim = 33 + _NUM_PHYSICS
    obs_layout = REACH_OBS_LAYOUT
    critic_obs_layout = REACH_CRITIC_OBS_LAYOUT
    termination_names = ()
    config: PandaReachConfig

    def __init__(self, num_envs: int, config: PandaReachConfig):
        """Set up ``num_envs`` envs of ``config`` (as :class:`~unilab_gym.tasks.base.Task`)."""
        super().__init__(num_envs, config)
        self._low, self._high = (np.array(corner) for corner in config.target_range)
        self._distance = np.zeros(num_envs)

    @classmethod
    def config_type(cls) -> type:
        """:class:`PandaReachConfig`."""
        return PandaReachConfig

    @property
    def act_dim(self) -> int:
        """7: one target per arm joint."""
        return ARM_JOINTS

    def joint_targets(self, action: np.ndarray, action_scale: float) -> np.ndarray:
        """Arm: ``nominal + action_scale * a`` clipped to the joint limits; fingers at their nominal (open)."""
        return self._arm_targets(action, action_scale)

    def sample_episode(self, env: int, rng: np.random.Generator) -> np.ndarray:
        """Target ``U(low, high)`` (3 draws), then the nominal pose plus ``U(-noise, noise)`` on the arm (7)."""
        self.command[env] = rng.uniform(self._low, self._high)
        return self._initial_pose(env, rng)

    def observe(self, state: RobotState, last_action: np.ndarray, out: np.ndarray) -> None:
        """Write :data:`REACH_OBS_LAYOUT`."""
        ee = state.end_effector_pos - state.base_pos
        out[:, 0:7] = state.joint_pos[:, :ARM_JOINTS] - self.nominal_joint_pos[:, :ARM_JOINTS]
        out[:, 7:14] = state.joint_vel[:, :ARM_JOINTS]
        out[:, 14:17] = ee
        out[:, 17:20] = state.end_effector_vel
        out[:, 20:23] = self.command
        out[:, 23:26] = self.command - ee
        out[:, 26:33] = last_action

    def critic_observe(self, state: RobotState, obs: np.ndarray, parameters: np.ndarray, out: np.ndarray) -> None:
        """The observation, then the physics parameters."""
        self._critic(obs, parameters, out)

    def evaluate(
        self, state: RobotState, action: np.ndarray, previous_action: np.ndarray, restarting: np.ndarray
    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Terms ``distance``, ``success``, ``action_rate`` (:class:`ReachRewardWeights`); no conditions."""
        w = self.config.reward_weights
        distance = np.linalg.norm(state.end_effector_pos - state.base_pos - self.command, axis=1)
        self._distance = distance
        self._success = distance < SUCCESS_DISTANCE
        terms = {
            "distance": w.distance * distance,
            "success": w.success * self._success,
            "action_rate": w.action_rate * np.sum((action - previous_action) ** 2, axis=1),
        }
        return terms, np.zeros((self.num_envs, 0), dtype=bool)


class PandaPickTask(_PandaTask):
    """``UniLab/PandaPick-v0``: grasp the env's object and lift it to the goal.

    The object is a box, cylinder or sphere of random size, mass and friction (:class:`PandaPickConfig`); the goal is
    above its initial position at a random height. Success when the object is within 5 cm of the goal; terminated
    when the object is knocked more than 1 m from the base (``object_lost``). Observation :data:`PICK_OBS_LAYOUT`,
    reward :class:`PickRewardWeights`, 4 actions (the grasp point's displacement, the hand pointing down, and the
    gripper: panda-gym's end-effector control). Each episode's object is in the parameter trace
    (:data:`OBJECT_PARAMETERS`).
    """

    obs_dim = 53
    critic_obs_dim = 53 + _NUM_PHYSICS + len(OBJECT_PARAMETERS)
    obs_layout = PICK_OBS_LAYOUT
    critic_obs_layout = PICK_CRITIC_OBS_LAYOUT
    termination_names = ("object_lost",)
    episode_parameter_names: ClassVar[tuple[str, ...]] = OBJECT_PARAMETERS
    config: PandaPickConfig
    #: Closer than Reach's, on the table in front of the base where the object starts (the goal is the red marker).
    camera = Camera(follow="spawn", offset=(0.45, 0.0, 0.1), distance=1.1, yaw=40.0, pitch=-30.0)

    #: Distance in m of the object from the base (horizontally) beyond which it is lost.
    LOST_DISTANCE = 1.0
    #: Hand rotation (hand -> base) the end-effector control keeps: pointing down, fingers closing along y.
    HAND_DOWN = np.array([[1.0, 0.0, 0.0], [0.0, -1.0, 0.0], [0.0, 0.0, -1.0]])
    #: Grasp test (:meth:`grasped`): the object's centre within this distance in m of the grasp point, and the
    #: fingers' opening at most ``GRASP_WIDTH_FACTOR`` times the object's size (a cube at 45 degrees is 1.41 wide).
    GRASP_DISTANCE = 0.02
    GRASP_WIDTH_FACTOR = 1.5

    def __init__(self, num_envs: int, config: PandaPickConfig):
        """Set up ``num_envs`` envs of ``config``, with one object each and the end-effector controller's state."""
        super().__init__(num_envs, config)
        self.scene = Scene(objects=True)
        self.objects = ObjectEpisodes.zeros(num_envs)
        self._shape_codes = np.array([OBJECT_SHAPES.index(s) for s in config.object_shapes])
        self._ws_low, self._ws_high = (np.array(corner) for corner in config.ee_workspace)
        # the end-effector controller's state per env: the commanded grasp point, the inverse kinematics' solution
        self._point = np.zeros((num_envs, 3))
        self._q = np.tile(self.nominal_joint_pos[0, :ARM_JOINTS], (num_envs, 1))
        self._rest_z = np.zeros(num_envs)  # the object's resting height, relative to the base
        self._grasped = np.zeros(num_envs, dtype=bool)

    @classmethod
    def config_type(cls) -> type:
        """:class:`PandaPickConfig`."""
        return PandaPickConfig

    @property
    def act_dim(self) -> int:
        """4: the grasp point's displacement (x, y, z), and the gripper."""
        return 4

    def joint_targets(self, action: np.ndarray, action_scale: float) -> np.ndarray:
        """End-effector control: (N, 9) joint targets (rad, m for the fingers) from (N, 4) actions.

        The commanded grasp point moves by ``ee_max_step * a[:3]`` m (kept in ``ee_workspace``); two damped least
        squares steps from the last joint solution (:func:`~unilab_gym.tasks.panda_kinematics.ik_step`) give the
        arm's targets (clipped to the joint limits) for the hand pointing down; both fingers' target opening is
        ``0.04 * (a[3] + 1) / 2`` m. ``action_scale`` is not used.
        """
        c = self.config
        self._point = np.clip(self._point + c.ee_max_step * action[:, :3], self._ws_low, self._ws_high)
        aim = self._point + BASE_COM_OFFSET  # the kinematics' frame is panda_link0's
        q = self._q
        for _ in range(2):
            q = np.clip(ik_step(q, aim, self.HAND_DOWN), _ARM_LOW, _ARM_HIGH)
        self._q = q
        targets = self.nominal_joint_pos.copy()
        targets[:, :ARM_JOINTS] = q
        targets[:, ARM_JOINTS:] = (PANDA_FINGER_OPEN * 0.5 * (action[:, 3] + 1.0))[:, None]
        return targets

    def sample_episode(self, env: int, rng: np.random.Generator) -> np.ndarray:
        """Draw the episode's object, goal and initial arm pose.

        The object: shape (1 draw), size (rounded to :data:`SIZE_RESOLUTION`), mass, friction, x, y, yaw, goal
        height (7 uniforms), then the initial arm pose (7); writes the goal (``command``), :attr:`objects` and
        :attr:`episode_parameters`.
        """
        c = self.config
        code = int(self._shape_codes[rng.integers(len(self._shape_codes))])
        size, mass, friction, x, y, yaw, height = rng.uniform(
            *np.array(
                [
                    c.object_size_range,
                    c.object_mass_range,
                    c.object_friction_range,
                    c.object_x_range,
                    c.object_y_range,
                    c.object_yaw_range,
                    c.goal_height_range,
                ]
            ).T
        )
        size = round(size / SIZE_RESOLUTION) * SIZE_RESOLUTION
        base_z = self.robot.spawn_height
        o = self.objects
        assert o is not None
        o.shape[env] = code
        o.size[env] = size
        o.mass[env] = mass
        o.friction[env] = friction
        o.position[env] = (x, y, 0.5 * size - base_z)  # resting on the ground (z = 0)
        o.yaw[env] = yaw
        self.command[env] = (x, y, height - base_z)
        self.episode_parameters[env] = (code, size, mass, friction)
        self._rest_z[env] = 0.5 * size - base_z
        pose = self._initial_pose(env, rng)
        if c.grasped_start_fraction > 0.0 and rng.uniform() < c.grasped_start_fraction:
            pose = self._grasped_pose(env, pose, size)
        self._q[env] = pose[:ARM_JOINTS]
        self._point[env] = forward_kinematics(pose[None, :ARM_JOINTS])[0][0] - BASE_COM_OFFSET
        return pose

    #: Damped least squares steps from the drawn pose to the grasp pose of a ``grasped_start_fraction`` episode.
    GRASPED_START_IK_STEPS = 40

    def _grasped_pose(self, env: int, pose: np.ndarray, size: float) -> np.ndarray:
        """``pose`` moved so that env ``env``'s object starts between the fingers (``grasped_start_fraction``).

        The object turns to yaw 0 (its faces square to the fingers, which close along the base's y axis); the arm's
        joints come from :attr:`GRASPED_START_IK_STEPS` damped least squares steps from ``pose`` to the grasp point
        at the object's centre with the hand down (clipped to the joint limits); each finger opens by half the object's
        size (its width across the fingers at yaw 0; at most fully open).
        """
        o = self.objects
        assert o is not None
        o.yaw[env] = 0.0
        q = pose[None, :ARM_JOINTS].copy()
        aim = o.position[env][None, :] + BASE_COM_OFFSET
        for _ in range(self.GRASPED_START_IK_STEPS):
            q = np.clip(ik_step(q, aim, self.HAND_DOWN), _ARM_LOW, _ARM_HIGH)
        out = pose.copy()
        out[:ARM_JOINTS] = q[0]
        out[ARM_JOINTS:] = min(0.5 * size, PANDA_FINGER_OPEN)
        return out

    def observe(self, state: RobotState, last_action: np.ndarray, out: np.ndarray) -> None:
        """Write :data:`PICK_OBS_LAYOUT`."""
        base = state.base_pos
        ee = state.end_effector_pos - base
        obj = state.object_pos - base
        out[:, 0:9] = state.joint_pos - self.nominal_joint_pos
        out[:, 9:18] = state.joint_vel
        out[:, 18:21] = ee
        out[:, 21:24] = state.end_effector_vel
        out[:, 24:27] = obj
        out[:, 27:30] = obj - ee
        out[:, 30:34] = state.object_quat
        out[:, 34:37] = state.object_lin_vel
        out[:, 37:40] = state.object_ang_vel
        out[:, 40:43] = self.command
        out[:, 43:46] = self.command - obj
        out[:, 46:49] = self._point
        out[:, 49:53] = last_action

    def critic_observe(self, state: RobotState, obs: np.ndarray, parameters: np.ndarray, out: np.ndarray) -> None:
        """The observation, the physics parameters, the object's parameters."""
        self._critic(obs, parameters, out)

    def grasped(self, state: RobotState) -> np.ndarray:
        """(N,) bool: each env's object is held.

        Held: its centre within :attr:`GRASP_DISTANCE` of the grasp point (between the fingertips) and the fingers'
        opening (the sum of the two finger joints, m) at most :attr:`GRASP_WIDTH_FACTOR` times its size, so that the
        closed fingers press on it.
        """
        near = np.linalg.norm(state.end_effector_pos - state.object_pos, axis=1) < self.GRASP_DISTANCE
        opening = state.joint_pos[:, ARM_JOINTS] + state.joint_pos[:, ARM_JOINTS + 1]
        return near & (opening <= self.GRASP_WIDTH_FACTOR * self.episode_parameters[:, 1])

    def evaluate(
        self, state: RobotState, action: np.ndarray, previous_action: np.ndarray, restarting: np.ndarray
    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """The reward terms and the termination condition.

        Terms ``reach``, ``grasp``, ``lift``, ``goal``, ``success``, ``action_rate`` (:class:`PickRewardWeights`);
        condition ``object_lost``.
        """
        w = self.config.reward_weights
        obj = state.object_pos - state.base_pos
        to_object = np.linalg.norm(state.end_effector_pos - state.object_pos, axis=1)
        to_goal = np.linalg.norm(obj - self.command, axis=1)
        self._success = to_goal < SUCCESS_DISTANCE
        self._grasped = self.grasped(state)
        height = (obj[:, 2] - self._rest_z) / np.maximum(self.command[:, 2] - self._rest_z, 1e-3)
        lift = np.clip(1.0 - np.abs(1.0 - height), 0.0, 1.0)  # peaks at the goal's height
        terms = {
            "reach": w.reach * (1.0 - np.tanh(10.0 * to_object)),
            "grasp": w.grasp * self._grasped,
            "lift": w.lift * (self._grasped * lift),
            "goal": w.goal * (1.0 - np.tanh(10.0 * to_goal)),
            "success": w.success * self._success,
            "action_rate": w.action_rate * np.sum((action - previous_action) ** 2, axis=1),
        }
        conditions = (np.hypot(obj[:, 0], obj[:, 1]) > self.LOST_DISTANCE)[:, None]
        return terms, conditions
