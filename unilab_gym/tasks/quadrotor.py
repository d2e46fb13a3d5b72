"""Fly to a target and hover: ``UniLab/Quadrotor-v0``'s task, :class:`QuadrotorConfig` and :class:`QuadrotorTask`.

A Crazyflie 2.x (:data:`unilab_gym.robots.quadrotors.CF2X`) starts each episode at rest, upright, 1 m above the
ground in its lane; its target is a point drawn uniformly in a box around that start (the episode's ``command``,
metres, relative to the start). The action is the four motor speeds, normalized to [-1, 1] around the hover speed;
the engine applies the rotors' thrust and drag torque as an external wrench on the body in every physics substep
(:attr:`QuadrotorTask.actuation` ``"external"``, :meth:`QuadrotorTask.forces`, :mod:`unilab_gym.sim.rotor`): the
quadrotor has no joints and no PD loop.

Everything here is batched numpy over the N envs; nothing calls pybullet.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import numpy as np

from unilab_gym.randomization import DomainRandomization
from unilab_gym.robots import RobotDescription
from unilab_gym.robots.quadrotors import CF2X
from unilab_gym.sim.camera import Camera
from unilab_gym.sim.rotation import quat_rotate_inverse
from unilab_gym.sim.rotor import CF2X as CF2X_ROTORS
from unilab_gym.sim.rotor import GRAVITY, RotorModel, rate_control
from unilab_gym.tasks import weights
from unilab_gym.tasks.base import Task
from unilab_gym.validation import check_positive, check_positive_int, check_real

if TYPE_CHECKING:
    from unilab_gym.sim.world import RobotState

#: Observation layout: name -> (start, stop) column range, with units.
OBS_LAYOUT: dict[str, tuple[int, int]] = {
    "position_error": (0, 3),  # m, world frame: base position - target
    "rotation": (3, 12),  # base -> world rotation matrix, row-major (R[0, 0], R[0, 1], ..., R[2, 2])
    "lin_vel": (12, 15),  # m/s, world frame
    "ang_vel": (15, 18),  # rad/s, base frame
    "last_action": (18, 22),  # the clipped action of the previous step, in [-1, 1]
}
#: Observation size.
OBS_DIM = 22
#: Critic (privileged) observation layout: the policy observation, then what only the simulator knows.
CRITIC_OBS_LAYOUT: dict[str, tuple[int, int]] = {
    **OBS_LAYOUT,
    "parameters": (22, 33),  # the episode's physics parameters, unilab_gym.randomization.PARAMETER_NAMES
    "height": (33, 34),  # m, base above the ground
}
#: Critic observation size.
CRITIC_OBS_DIM = 34
#: Action size: one speed command per rotor (rotors 0-3 of :data:`unilab_gym.sim.rotor.CF2X`).
ACT_DIM = 4
#: The values of :attr:`QuadrotorConfig.action_mode`.
ACTION_MODES = ("motor_speed", "thrust_rates")

_UP = np.array([0.0, 0.0, 1.0])


@dataclass(frozen=True)
class QuadrotorRewardWeights:
    """Weights of the reward terms, per second (each raw value times its weight times the control period ``dt``).

    ================  ============================================================  ==========
    term              raw value                                                     unit
    ================  ============================================================  ==========
    ``distance``      ``|p - target|``, distance to the target                      m
    ``velocity``      ``|v|``, speed                                                m/s
    ``angular_rate``  ``|w|^2``, squared body rate                                  (rad/s)^2
    ``action_rate``   ``sum_i (a_t - a_{t-1})_i^2``                                 1
    ``alive``         ``1``                                                         1
    ================  ============================================================  ==========

    The default ``alive`` (2) is at least ``-distance`` times the farthest an episode may go
    (``termination.max_distance``, 2 m), so staying in the air always pays more than crashing.

    Raises:
        ValueError: a weight that is not a finite real number, naming it.
    """

    distance: float = -1.0
    velocity: float = -0.2
    angular_rate: float = -0.01
    action_rate: float = -0.05
    alive: float = 2.0

    def __post_init__(self) -> None:
        """Check that every weight is a finite real number (raises ``ValueError`` naming it)."""
        for f in fields(self):
            object.__setattr__(self, f.name, check_real(f"reward_weights[{f.name!r}]", getattr(self, f.name)))


@dataclass(frozen=True)
class QuadrotorTermination:
    """When a quadrotor has crashed (``terminated``): the conditions :attr:`QuadrotorTask.termination_names`.

    Raises:
        ValueError: a non-positive value, naming it.
    """

    min_height: float = 0.2
    """``too_low``: the base is below this height in m (the ground is at 0; targets are 0.7 m or higher)."""
    max_tilt: float = 1.0
    """``too_tilted``: the angle in rad between the body's z axis and the world's up is above this (57°)."""
    max_distance: float = 2.0
    """``too_far``: the base is farther than this in m from the target."""

    def __post_init__(self) -> None:
        """Check that every value is positive (raises ``ValueError`` naming it)."""
        for f in fields(self):
            object.__setattr__(self, f.name, check_positive(f"termination[{f.name!r}]", getattr(self, f.name)))


@dataclass(frozen=True)
class QuadrotorConfig:
    """The configuration of ``UniLab/Quadrotor-v0``: its fields are the env's task keyword arguments.

    Raises:
        ValueError: naming the field: a robot with actuated joints, a bad number, range or weight.
    """

    robot: RobotDescription = "cf2x"  # type: ignore[assignment]  # converted in __post_init__
    """``"cf2x"`` (:data:`~unilab_gym.robots.quadrotors.CF2X`) or a :class:`~unilab_gym.robots.RobotDescription` with
    no joints (or its dict); the rotors are always :data:`unilab_gym.sim.rotor.CF2X`'s."""
    max_episode_steps: int = 240
    """Control steps before ``truncated`` (8 s at 30 Hz, gym-pybullet-drones' ``HoverAviary``)."""
    dt: float = 1.0 / 240.0
    """Physics time step in s (gym-pybullet-drones' default ``pyb_freq`` 240 Hz)."""
    substeps: int = 8
    """Physics steps per control step (30 Hz control, gym-pybullet-drones' default ``ctrl_freq``)."""
    solver_iterations: int = 10
    """pybullet ``numSolverIterations``."""
    action_mode: str = "motor_speed"
    """``"motor_speed"``: the 4 actions are the rotor speeds (:func:`motor_rpm`). ``"thrust_rates"``: collective
    thrust ``m g (1 + action_scale * a_0)`` N and body rates ``max_body_rate * a_1..3`` rad/s (roll, pitch, yaw),
    tracked by a one-step rate loop at the control rate (:func:`unilab_gym.sim.rotor.rate_control`)."""
    action_scale: float = None  # type: ignore[assignment]  # None: the robot's
    """In (0, 1]. ``motor_speed``: fraction of the hover speed per unit of action, rotor speed
    ``hover_rpm * (1 + action_scale * a)`` rpm, clipped to [0, ``max_rpm``]. ``thrust_rates``: fraction of the
    hover thrust per unit of ``a_0``. ``None``: the robot's (CF2X: 0.2)."""
    max_body_rate: float = 3.0
    """``thrust_rates``: the body rate in rad/s of a rate action of 1."""
    target_low: tuple[float, float, float] = (-0.5, -0.5, -0.3)
    """Low corner (x, y, z) in m of the box the target is drawn from, relative to the start."""
    target_high: tuple[float, float, float] = (0.5, 0.5, 0.3)
    """High corner (x, y, z) in m of that box."""
    reward_weights: QuadrotorRewardWeights = None  # type: ignore[assignment]  # None: defaults, robot's overrides
    """Weights of the reward terms: ``None``, the defaults with the robot's overrides
    (:attr:`~unilab_gym.robots.RobotDescription.reward_weights`); a dict overrides those; an instance is used as it
    is."""
    termination: QuadrotorTermination = field(default_factory=QuadrotorTermination)
    """Crash conditions (a dict overrides the defaults)."""
    success_distance: float = 0.1
    """``info["is_success"]``: within this distance in m of the target ..."""
    success_speed: float = 0.2
    """... and slower than this in m/s."""
    domain_randomization: DomainRandomization = field(default_factory=DomainRandomization)
    """Physics parameter ranges (see :class:`~unilab_gym.randomization.DomainRandomization`). ``friction``,
    ``added_mass`` (on the 0.027 kg body), ``com_*``, ``latency`` and pushes act on the quadrotor; ``motor_strength``,
    ``kp_factor`` and ``kd_factor`` scale joint PD terms it does not have, so they change nothing."""

    def __post_init__(self) -> None:
        """Validate every field and convert it to its stored type."""
        robot = _robot(self.robot)
        scale = robot.action_scale if self.action_scale is None else self.action_scale
        scale = check_real("action_scale", scale, minimum=0.0, maximum=1.0, exclusive_minimum=True)
        low = _vec3("target_low", self.target_low)
        high = _vec3("target_high", self.target_high)
        if any(lo > hi for lo, hi in zip(low, high)):
            raise ValueError(f"target_low must be <= target_high in every axis, got {low} and {high}")
        converted = {
            "robot": robot,
            "max_episode_steps": check_positive_int("max_episode_steps", self.max_episode_steps),
            "dt": check_positive("dt", self.dt),
            "substeps": check_positive_int("substeps", self.substeps),
            "solver_iterations": check_positive_int("solver_iterations", self.solver_iterations),
            "action_mode": _choice("action_mode", self.action_mode, ACTION_MODES),
            "action_scale": scale,
            "max_body_rate": check_positive("max_body_rate", self.max_body_rate),
            "target_low": low,
            "target_high": high,
            "reward_weights": weights.resolve(
                QuadrotorRewardWeights,
                robot,
                self.reward_weights,
                lambda v: _overrides("reward_weights", QuadrotorRewardWeights, v),
            ),
            "termination": _overrides("termination", QuadrotorTermination, self.termination),
            "success_distance": check_positive("success_distance", self.success_distance),
            "success_speed": check_positive("success_speed", self.success_speed),
            "domain_randomization": (
                self.domain_randomization
                if isinstance(self.domain_randomization, DomainRandomization)
                else DomainRandomization(self.domain_randomization)
            ),
        }
        for name, value in converted.items():
            object.__setattr__(self, name, value)

    @property
    def kp(self) -> tuple[float, ...]:
        """No joints, no PD gains: ``()``."""
        return ()

    @property
    def kd(self) -> tuple[float, ...]:
        """``()``."""
        return ()

    @property
    def control_dt(self) -> float:
        """The control period in s: ``dt * substeps``."""
        return self.dt * self.substeps

    def to_dict(self) -> dict[str, Any]:
        """The configuration as JSON types: the env's ``task_config``."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, RobotDescription):
                value = value.name if value == CF2X else value.to_dict()
            elif isinstance(value, DomainRandomization):
                value = value.to_dict()
            elif dataclasses.is_dataclass(value) and not isinstance(value, type):
                value = dataclasses.asdict(value)
            elif isinstance(value, tuple):
                value = list(value)
            out[f.name] = value
        return out


def rotation_matrices(quat: np.ndarray) -> np.ndarray:
    """(N, 3, 3) float64 base -> world rotation matrices of (N, 4) unit quaternions (x, y, z, w).

    The standard unit-quaternion formula (e.g. pybullet's ``getMatrixFromQuaternion``), batched.
    """
    x, y, z, w = quat[:, 0], quat[:, 1], quat[:, 2], quat[:, 3]
    out = np.empty((quat.shape[0], 3, 3))
    out[:, 0, 0] = 1.0 - 2.0 * (y * y + z * z)
    out[:, 0, 1] = 2.0 * (x * y - z * w)
    out[:, 0, 2] = 2.0 * (x * z + y * w)
    out[:, 1, 0] = 2.0 * (x * y + z * w)
    out[:, 1, 1] = 1.0 - 2.0 * (x * x + z * z)
    out[:, 1, 2] = 2.0 * (y * z - x * w)
    out[:, 2, 0] = 2.0 * (x * z - y * w)
    out[:, 2, 1] = 2.0 * (y * z + x * w)
    out[:, 2, 2] = 1.0 - 2.0 * (x * x + y * y)
    return out


def motor_rpm(action: np.ndarray, action_scale: float, rotors: RotorModel = CF2X_ROTORS) -> np.ndarray:
    """(N, 4) rotor speeds in rpm of (N, 4) actions in [-1, 1].

    ``hover_rpm * (1 + action_scale * a)``, clipped to [0, ``max_rpm``] (the zero action hovers;
    gym-pybullet-drones' ``ActionType.RPM`` with 0.05 for 0.2).
    """
    return np.clip(rotors.hover_rpm * (1.0 + action_scale * action), 0.0, rotors.max_rpm)


class QuadrotorTask(Task):
    """``UniLab/Quadrotor-v0``'s task: reach the episode's target and hover there.

    Per episode: the target offset (``command``, 3 draws of ``U(target_low, target_high)`` m, relative to the start)
    from the episode's stream; the start is the spawn point (the base position at the episode's first observation).

    Observation (:data:`OBS_LAYOUT`, 22 float32): position error to the target (world frame), the base rotation
    matrix, linear velocity (world frame), body rates (base frame), last action. Reward: the weighted terms of
    :class:`QuadrotorRewardWeights`. ``terminated``: ``too_low``, ``too_tilted``, ``too_far``
    (:class:`QuadrotorTermination`). ``info["is_success"]``: within ``success_distance`` m of the target and slower
    than ``success_speed`` m/s after this step (the episode goes on: the task is to stay there).
    """

    obs_dim = OBS_DIM
    critic_obs_dim = CRITIC_OBS_DIM
    obs_layout = OBS_LAYOUT
    critic_obs_layout = CRITIC_OBS_LAYOUT
    command_dim = 3
    termination_names = ("too_low", "too_tilted", "too_far")
    actuation = "external"
    #: Fixed at the spawn point (1 m up), from 0.8 m: the quadrotor flying to its target (the red marker) and hovering.
    camera = Camera(follow="spawn", offset=(0.0, 0.0, 0.0), distance=0.8, yaw=45.0, pitch=-20.0)
    config: QuadrotorConfig

    def __init__(self, num_envs: int, config: QuadrotorConfig):
        """Set up ``num_envs`` envs of ``config`` (as :class:`~unilab_gym.tasks.base.Task`)."""
        super().__init__(num_envs, config)
        self.rotors = CF2X_ROTORS
        #: (N, 3) float64: each episode's start (world frame, m), where its target is measured from.
        self.origin = np.zeros((num_envs, 3))
        self._fresh = np.ones(num_envs, dtype=bool)  # started, origin not yet read
        self._low = np.array(config.target_low)
        self._high = np.array(config.target_high)
        self._error = np.zeros((num_envs, 3))
        self._rotation = np.zeros((num_envs, 3, 3))
        self._ang_b = np.zeros((num_envs, 3))
        self._success = np.zeros(num_envs, dtype=bool)

    @property
    def act_dim(self) -> int:
        """4: one speed command per rotor."""
        return ACT_DIM

    @classmethod
    def config_type(cls) -> type:
        """:class:`QuadrotorConfig`."""
        return QuadrotorConfig

    def sample_episode(self, env: int, rng: np.random.Generator) -> np.ndarray:
        """The target offset ``U(target_low, target_high)`` (3 draws); no joints: returns an empty (0,) array."""
        self.command[env] = rng.uniform(self._low, self._high)
        return np.zeros(0)

    def render_target(self) -> np.ndarray:
        """(N, 3) m: the target, relative to the start (the spawn point): the ``command``."""
        return self.command

    def start_episodes(self, idx: np.ndarray) -> None:
        """The next observation of envs ``idx`` reads their start position."""
        self._fresh[idx] = True

    def forces(self, state: RobotState, action: np.ndarray) -> np.ndarray:
        """(N, 6) base-frame wrench of the rotors for ``action``.

        :meth:`RotorModel.wrench <unilab_gym.sim.rotor.RotorModel.wrench>` at :func:`motor_rpm` of ``action``, or
        (``thrust_rates``) at the rate loop's speeds, from the body rates of ``state``.
        """
        config = self.config
        if config.action_mode == "motor_speed":
            return self.rotors.wrench(motor_rpm(action, config.action_scale, self.rotors))
        thrust = self.rotors.mass * GRAVITY * (1.0 + config.action_scale * action[:, 0])
        body_rates = quat_rotate_inverse(state.base_quat, state.ang_vel)
        rpm = rate_control(self.rotors, thrust, config.max_body_rate * action[:, 1:], body_rates, config.control_dt)
        return self.rotors.wrench(rpm)

    def observe(self, state: RobotState, last_action: np.ndarray, out: np.ndarray) -> None:
        """Write the (N, 22) observation (:data:`OBS_LAYOUT`); keeps what :meth:`evaluate` needs."""
        fresh = self._fresh
        if fresh.any():
            self.origin[fresh] = state.base_pos[fresh]
            fresh[:] = False
        self._error = state.base_pos - (self.origin + self.command)
        self._rotation = rotation_matrices(state.base_quat)
        self._ang_b = quat_rotate_inverse(state.base_quat, state.ang_vel)  # elementwise: the same for any N
        out[:, 0:3] = self._error
        out[:, 3:12] = self._rotation.reshape(-1, 9)
        out[:, 12:15] = state.lin_vel
        out[:, 15:18] = self._ang_b
        out[:, 18:22] = last_action

    def critic_observe(self, state: RobotState, obs: np.ndarray, parameters: np.ndarray, out: np.ndarray) -> None:
        """The observation, the episode's physics parameters and the base height (:data:`CRITIC_OBS_LAYOUT`)."""
        out[:, :OBS_DIM] = obs
        out[:, 22:33] = parameters
        out[:, 33] = state.base_pos[:, 2]

    def evaluate(
        self, state: RobotState, action: np.ndarray, previous_action: np.ndarray, restarting: np.ndarray
    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Reward terms (:class:`QuadrotorRewardWeights`), crash conditions and success, from this step's state."""
        config = self.config
        w = config.reward_weights
        dt = config.control_dt
        distance = np.linalg.norm(self._error, axis=1)
        speed = np.linalg.norm(state.lin_vel, axis=1)
        terms = {
            "distance": w.distance * dt * distance,
            "velocity": w.velocity * dt * speed,
            "angular_rate": w.angular_rate * dt * np.sum(self._ang_b**2, axis=1),
            "action_rate": w.action_rate * dt * np.sum((action - previous_action) ** 2, axis=1),
            "alive": np.full(self.num_envs, w.alive * dt),
        }
        up = self._rotation[:, 2, 2]  # body z . world z
        t = config.termination
        conditions = np.stack(
            [
                state.base_pos[:, 2] < t.min_height,
                up < np.cos(t.max_tilt),
                distance > t.max_distance,
            ],
            axis=1,
        )
        self._success = (distance < config.success_distance) & (speed < config.success_speed) & ~restarting
        return terms, conditions

    def step_info(self) -> dict[str, np.ndarray]:
        """``{"is_success": (N,) bool}``: within ``success_distance`` of the target, slower than ``success_speed``."""
        return {"is_success": self._success}


def _robot(value: Any) -> RobotDescription:
    if isinstance(value, str):
        if value != CF2X.name:
            raise ValueError(f"robot must be 'cf2x' or a RobotDescription with no joints, got {value!r}")
        return CF2X
    robot = RobotDescription.from_dict(value) if isinstance(value, Mapping) else value
    if not isinstance(robot, RobotDescription):
        raise ValueError(f"robot must be 'cf2x' or a RobotDescription with no joints, got {value!r}")
    if robot.num_joints:
        raise ValueError(
            f"robot {robot.name!r}: joint_names: the Quadrotor task moves the body by rotor forces and needs a robot "
            f"with no actuated joints, got {list(robot.joint_names)}"
        )
    return robot


def _choice(name: str, value: Any, valid: tuple[str, ...]) -> str:
    if value not in valid:
        raise ValueError(f"{name} must be one of {list(valid)}, got {value!r}")
    return str(value)


def _vec3(name: str, value: Any) -> tuple[float, float, float]:
    if not isinstance(value, (Sequence, np.ndarray)) or isinstance(value, (str, bytes)) or len(value) != 3:
        raise ValueError(f"{name} must be 3 numbers (x, y, z) in m, got {value!r}")
    x, y, z = (check_real(name, v) for v in value)
    return x, y, z


def _overrides(name: str, cls: Any, value: Any) -> Any:
    if isinstance(value, cls):
        return value
    if value is not None and not isinstance(value, Mapping):
        raise ValueError(f"{name} must be a {cls.__name__}, a dict of its fields or None, got {value!r}")
    values = dict(value or {})
    known = [f.name for f in fields(cls)]
    unknown = sorted(str(k) for k in set(values) - set(known))
    if unknown:
        raise ValueError(f"unknown {name} field(s) {unknown}; known: {known}")
    return cls(**values)
