"""``UniLabVectorEnv``: N robots stepped in one process, grouped in EIC clusters, with a task on the seam.

The engine (this module) owns the Gymnasium contract, seeding, autoreset, actuation, domain randomization
and the parameter trace; the robot is data (:class:`~unilab_gym.robots.RobotDescription`, ``robot=``) and the
task is batched numpy (:class:`~unilab_gym.tasks.base.Task`, :attr:`UniLabVectorEnv.task_type`, by default
:class:`~unilab_gym.tasks.quadruped.QuadrupedTask`); :mod:`unilab_gym.sim.world` is the only pybullet caller.

One :meth:`UniLabVectorEnv.step` is five phases, each a private method::

    actions (N, 12) -> validate, clip
      -> actuate:   [latency FIFO] -> [pushes] -> PD targets
      -> simulate:  every cluster world: K substeps -> [NEXT_STEP: new episodes of restarting envs]
                    -> robot states (N, ...)
      -> evaluate:  batched task math (obs, reward terms, terminated, truncated)
      -> record:    episode returns, parameter trace of finished episodes
      -> autoreset: per ``autoreset_mode``
"""

from __future__ import annotations

import numbers
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.error import ClosedEnvironmentError, ResetNeeded
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from unilab_gym.env_ids import env_id_of
from unilab_gym.latency import StepLatency
from unilab_gym.memory import check_memory
from unilab_gym.randomization import PARAMETER_NAMES
from unilab_gym.sim import a1
from unilab_gym.sim.camera import Camera
from unilab_gym.sim.scene import ObjectEpisodes
from unilab_gym.sim.world import ClusterWorld, RobotState, lane_origins
from unilab_gym.tasks.base import ACTUATIONS, Task
from unilab_gym.tasks.config import check_task_kwargs
from unilab_gym.tasks.quadruped import QuadrupedTask
from unilab_gym.trace import DEFAULT_TRACE_MAX_RECORDS, ParameterTrace, write_jsonl
from unilab_gym.validation import check_action_array, check_int, check_positive_int, check_seed

#: Default robots per pybullet world; see README "Choosing envs_per_cluster" for the benchmark.
DEFAULT_ENVS_PER_CLUSTER = 32

_COL = {name: k for k, name in enumerate(PARAMETER_NAMES)}  # column of each parameter

#: The constructor arguments that are not part of the task configuration (they change no trajectory).
VECTOR_ENV_ARGS = (
    "num_envs",
    "envs_per_cluster",
    "render_mode",
    "autoreset_mode",
    "trace_max_records",
    "trace_path",
    "privileged_obs",
)

#: The keys ``reset(options=...)`` accepts; any other key raises ``ValueError``.
RESET_OPTIONS = ("reset_mask", "episode_seed")


class FinishedEnvError(ResetNeeded, AssertionError):
    """``step()`` with autoreset ``"Disabled"`` while some envs terminated or truncated and were not reset.

    An ``AssertionError``, what Gymnasium's ``SyncVectorEnv`` raises in that case, and a
    :class:`gymnasium.error.ResetNeeded`. The message names the env indices.
    """


def check_reset_options(options: Any, valid: Sequence[str] = RESET_OPTIONS) -> dict[str, Any]:
    """``options`` of ``reset()`` as a dict (``{}`` for ``None``), if every key is one of ``valid``.

    Raises:
        TypeError: ``options`` is not a dict (a ``Mapping``) or ``None``.
        ValueError: an unknown key, named, with the valid ones (e.g. the typo ``"reset_masks"``).
    """
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise TypeError(f"options must be a dict or None, got {type(options).__name__}: {options!r}")
    unknown = [key for key in options if key not in valid]
    if unknown:
        raise ValueError(f"unknown reset option(s) {unknown!r}; valid options: {list(valid)}")
    return dict(options)


class UniLabVectorEnv(VectorEnv, gym.Env):  # type: ignore[misc]  # gymnasium's two bases type np_random_seed differently
    """``num_envs`` quadrupeds (a Unitree A1 by default, ``robot=``) following velocity commands, in one process.

    Robots are grouped in EIC clusters (Environment Instance Clusters) of ``envs_per_cluster``:
    each cluster is one pybullet world in which its robots share a ground but never collide.
    A step writes all actions, advances every world ``substeps`` physics steps, reads all
    robot states into preallocated arrays, then computes observations, rewards and
    terminations batched in numpy.

    **Determinism.** Env ``i``'s trajectory (obs, reward, terminated, truncated, bit for bit)
    depends only on its seed and its actions: not on ``num_envs``, ``envs_per_cluster``, its
    neighbours' actions or resets. ``reset(seed=s)`` seeds env ``i`` with ``s + i``. Each episode
    draws an *episode seed* from its env's stream; its command, initial pose, lane, physics
    parameters and pushes come from that seed alone, so an episode replays bit for bit from its
    episode seed (``reset(options={"episode_seed": seed})``) and its actions, whatever ran before.

    **Domain randomization** (off by default): ``domain_randomization={name: (low, high) or value}``
    over the parameters of :data:`unilab_gym.randomization.PARAMETERS` (friction, added_mass,
    com_x/y/z, motor_strength, kp_factor, kd_factor, latency, push_interval, push_velocity).
    Every episode's parameters are drawn at reset and fully applied (unconfigured ones at their
    nominal value). They are in the reset info (``info["parameters"]``) and in the record of
    every finished episode (:meth:`parameter_trace`, :meth:`save_parameter_trace`).

    Spaces:
        ``single_action_space``: Box(-1, 1, (12,), float32). Joint position targets are
        ``nominal pose + action_scale * action`` (rad), tracked by PD torques clipped to
        the robot's torque limits (A1: the URDF's effort limits, hip 20 N·m, thigh and calf 55 N·m).
        Actions outside [-1, 1] are clipped.
        ``single_observation_space``: Box(-inf, inf, (48,), float32), layout in
        :data:`unilab_gym.tasks.quadruped.OBS_LAYOUT`: base linear velocity (3, m/s, base
        frame), base angular velocity (3, rad/s, base frame), projected gravity (3, unit
        vector), command (vx m/s, vy m/s, yaw rate rad/s), joint positions minus the
        nominal pose (12, rad), joint velocities (12, rad/s), previous action (12).

    Reward: the sum of the legged_gym terms of :class:`~unilab_gym.tasks.quadruped.RewardWeights`,
    each multiplied by its weight and the control period ``dt * substeps`` (s). Each
    weighted term is in ``info["reward_terms"][name]`` (N,) float64.

    ``terminated``: the robot fell (see :class:`~unilab_gym.tasks.quadruped.TerminationConfig`).
    ``truncated``: the episode reached ``max_episode_steps`` control steps.

    Args:
        num_envs: number of robots N (>= 1).
        envs_per_cluster: robots per pybullet world (>= 1).
        render_mode: ``None`` or ``"rgb_array"`` (frames of env 0; visual shapes are loaded
            in cluster 0 only).
        autoreset_mode: ``AutoresetMode`` or its value: ``"NextStep"`` (default),
            ``"SameStep"`` (``info["final_obs"]`` / ``info["final_info"]``), ``"Disabled"``
            (reset through ``reset(options={"reset_mask": mask})``; stepping a finished env before
            that raises :class:`FinishedEnvError`). Infos are built as Gymnasium's ``SyncVectorEnv``
            builds them in each mode (see :meth:`step`).
        trace_max_records: records of the parameter trace kept in memory, an int >= 0 (default
            :data:`~unilab_gym.trace.DEFAULT_TRACE_MAX_RECORDS` = 10,000, 156 bytes each): :meth:`parameter_trace`
            returns the last ``trace_max_records`` finished episodes.
        trace_path: ``None`` (default) or a file to stream every record of the parameter trace to, as JSON Lines
            (created or truncated; one file per env object: see :class:`~unilab_gym.trace.ParameterTrace`).
        privileged_obs: ``False`` (default): the observation is the (N, 48) array above. ``True``: it is a
            ``Dict`` with ``"policy"``, that (N, 48) array, and ``"critic"``, (N, 68) float32: the same 48
            columns followed by the privileged terms a critic may see in simulation (the episode's physics
            parameters, base height, foot contacts, feet air times), layout and units in
            :data:`unilab_gym.tasks.quadruped.CRITIC_OBS_LAYOUT`. The trajectories are the same either way.
        **task_kwargs: the task configuration, the fields of
            :class:`~unilab_gym.tasks.config.QuadrupedConfig` (``robot``: ``"a1"`` (default), ``"aliengo"``,
            ``"laikago"``, ``"mini_cheetah"`` or a :class:`~unilab_gym.robots.RobotDescription`;
            ``max_episode_steps``, ``dt``, ``substeps``, ``kp``, ``kd`` (default: the robot's), ``action_scale``,
            ``solver_iterations``,
            ``lin_vel_x_range``, ``lin_vel_y_range``, ``yaw_rate_range``, ``reward_weights``,
            ``base_height_target``, ``feet_air_time_target``, ``feet_air_time_max``,
            ``termination``, ``init_joint_noise``, ``domain_randomization``), each with its default.

    Attributes:
        config: the :class:`~unilab_gym.tasks.config.QuadrupedConfig` of ``task_kwargs``.
        robot: the :class:`~unilab_gym.robots.RobotDescription` of ``config.robot``.
        task: the :class:`~unilab_gym.tasks.base.Task` (``task_type(num_envs, config)``).
        task_config: ``config.to_dict()``, the arguments that determine the trajectories, JSON-able:
            ``UniLabVectorEnv(n, **env.task_config)`` makes envs that follow the same ones.
        max_episode_steps: the value of :attr:`config`; may be changed with :meth:`set_attr`.
        dt, substeps, control_dt, action_scale: the values of :attr:`config` (``control_dt`` =
            ``dt * substeps`` s).
        reward_weights, termination, init_joint_noise, domain_randomization: the values of :attr:`config`.
        kp, kd, torque_limits: (N, 12) float64, the PD gains and torque limits of each env's
            current episode (nominal values times its ``kp_factor``, ``kd_factor``,
            ``motor_strength``; rewritten at each reset of that env).
        parameters: (N, P) float64, each env's current episode parameters, columns
            :data:`~unilab_gym.randomization.PARAMETER_NAMES`.
        step_latency: :class:`~unilab_gym.latency.StepLatency`, wall-clock µs of every
            ``step()``: ``.physics`` (every cluster's slice and reading the states back) and
            ``.task`` (the rest: action checks, task math, infos, resets) histograms. Set it to
            ``None`` to stop timing (AsyncRunner collectors re-bind it to shared memory).

    Raises:
        ValueError: for an invalid argument, naming it and its value.
        TypeError: for an unknown keyword argument (the message lists the valid ones).
        MemoryError: the estimated memory of ``num_envs`` robots (:func:`~unilab_gym.memory.estimate_env_bytes`)
            exceeds the available memory; raised before anything is built.
    """

    #: The task on the seam (a :class:`~unilab_gym.tasks.base.Task` subclass); a subclass of this env sets another.
    task_type: type[Task] = QuadrupedTask

    # The env's state, in three groups (set in __init__). Configuration: fixed once built (the task's values are
    # read from ``config``, see the properties below; ``max_episode_steps`` alone may change, through set_attr).
    num_envs: int
    config: Any  # the task's TaskConfig (task_type.config_type()), e.g. a QuadrupedConfig
    task_config: dict[str, Any]
    task: Task
    autoreset_mode: AutoresetMode
    privileged_obs: bool
    render_mode: str | None
    max_episode_steps: int
    _clusters: list[tuple[slice, ClusterWorld]]  # (rows, world) of each EIC cluster
    _external: bool  # task.actuation == "external": forces from task.forces(), no joint PD
    _kp_nominal: np.ndarray  # (J,) the config's gains and the URDF's torque limits, before randomization
    _kd_nominal: np.ndarray
    _torque_limits_nominal: np.ndarray
    # Per-env episode state: row i is env i's current episode, rewritten when env i resets.
    episode_step: np.ndarray  # (N,) int64 control steps of the episode
    episode_seed: np.ndarray  # (N,) int64
    parameters: np.ndarray  # (N, P) float64 physics parameters
    kp: np.ndarray  # (N, J) float64 PD gains and torque limits of the episode
    kd: np.ndarray
    torque_limits: np.ndarray
    _env_rngs: list[np.random.Generator | None]  # each env's stream (episode seeds); env_rng / set_env_rng
    _episode_rngs: list[np.random.Generator | None]  # each episode's stream (pushes)
    _episode_index: np.ndarray  # (N,) int64 episodes started (-1 before the first)
    _episode_return: np.ndarray  # (N,) float64
    _episode_recorded: np.ndarray  # (N,) bool: this episode is in the parameter trace
    _latency: np.ndarray  # (N,) int64 control steps of action latency
    _push_every: np.ndarray  # (N,) int64 control steps between pushes, 0 = none
    _last_action: np.ndarray  # (N, A) float64 the previous applied action (in the observation)
    _autoreset_envs: np.ndarray  # (N,) bool NEXT_STEP: restart at the next step
    _finished: np.ndarray  # (N,) bool DISABLED: terminated or truncated since their reset
    _needs_reset: bool  # no reset() yet
    _fifo: np.ndarray | None  # (N, max_latency + 1, A) the latency ring of actions, with its head
    _fifo_head: int
    # Scratch: buffers and views reused every step (their values mean nothing between steps).
    _state: RobotState  # (N, ...) robot states, read from the worlds; _state_view its read-only view
    _state_view: RobotState
    _obs: np.ndarray  # (N, obs_dim) float32
    _critic_obs: np.ndarray | None  # (N, critic_obs_dim) float32 with privileged_obs
    _arange: np.ndarray  # (N,) int64
    _all_envs: np.ndarray  # (N,) bool, read-only masks
    _no_envs: np.ndarray

    # ------------------------------------------------------------------ configuration, read from config
    @property
    def robot(self) -> Any:
        """The :class:`~unilab_gym.robots.RobotDescription` every env holds (``config.robot``)."""
        return self.config.robot

    @property
    def dt(self) -> Any:
        """Physics step in s (``config.dt``)."""
        return self.config.dt

    @property
    def substeps(self) -> Any:
        """Physics steps per control step (``config.substeps``)."""
        return self.config.substeps

    @property
    def control_dt(self) -> Any:
        """Control period in s, ``dt * substeps`` (``config.control_dt``)."""
        return self.config.control_dt

    @property
    def action_scale(self) -> Any:
        """Action to joint-target scale (``config.action_scale``, rad per unit action for joint tasks)."""
        return self.config.action_scale

    @property
    def domain_randomization(self) -> Any:
        """The :class:`~unilab_gym.randomization.DomainRandomization` of ``config``."""
        return self.config.domain_randomization

    @property
    def reward_weights(self) -> Any:
        """``config.reward_weights``, or ``None`` for a task without them."""
        return getattr(self.config, "reward_weights", None)

    @property
    def termination(self) -> Any:
        """``config.termination``, or ``None`` for a task without it."""
        return getattr(self.config, "termination", None)

    @property
    def init_joint_noise(self) -> Any:
        """``config.init_joint_noise``, or ``None`` for a task without it."""
        return getattr(self.config, "init_joint_noise", None)

    def __init__(
        self,
        num_envs: int = 1,
        *,
        envs_per_cluster: int = DEFAULT_ENVS_PER_CLUSTER,
        render_mode: str | None = None,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        trace_max_records: int = DEFAULT_TRACE_MAX_RECORDS,
        trace_path: str | Path | None = None,
        privileged_obs: bool = False,
        **task_kwargs: Any,
    ):
        """Check the arguments, build the task and the cluster worlds (arguments: see the class docstring)."""
        check_task_kwargs("UniLabVectorEnv", task_kwargs, VECTOR_ENV_ARGS, self.task_type.config_type())
        self.num_envs = check_positive_int("num_envs", num_envs)
        envs_per_cluster = check_positive_int("envs_per_cluster", envs_per_cluster)
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
        try:
            self.autoreset_mode = (
                AutoresetMode(autoreset_mode)
                if isinstance(autoreset_mode, str)
                else AutoresetMode(autoreset_mode.value)
            )
        except (ValueError, AttributeError):
            raise ValueError(
                f"autoreset_mode must be one of {[m.value for m in AutoresetMode]}, got {autoreset_mode!r}"
            ) from None
        if not isinstance(privileged_obs, (bool, np.bool_)):
            raise ValueError(f"privileged_obs must be True or False, got {privileged_obs!r}")
        self.privileged_obs = bool(privileged_obs)
        self.config = config = self.task_type.config_type()(**task_kwargs)
        trace_max_records = check_int("trace_max_records", trace_max_records, minimum=0)
        check_memory(
            self.num_envs, envs_per_cluster, config.domain_randomization.max_latency, trace_max_records,
            task_type=self.task_type, env_name=type(self).__name__,
        )  # fmt: skip
        self.task_config: dict[str, Any] = config.to_dict()
        self.max_episode_steps = config.max_episode_steps  # the one copy: set_attr may change it
        #: The task math on the seam (:class:`~unilab_gym.tasks.base.Task`), batched over the N envs.
        self.task: Task = self.task_type(self.num_envs, config)
        task = self.task
        if task.actuation not in ACTUATIONS:
            raise ValueError(
                f"{type(task).__name__}.actuation must be one of {list(ACTUATIONS)}, got {task.actuation!r}"
            )
        self._external = task.actuation == "external"  # forces from task.forces(), no joint PD

        self.render_mode = render_mode
        self.metadata = {
            "render_modes": ["rgb_array"],
            "render_fps": round(1.0 / self.control_dt),
            "autoreset_mode": self.autoreset_mode,
        }
        policy_space = spaces.Box(-np.inf, np.inf, (task.obs_dim,), np.float32)
        self.single_observation_space: spaces.Box | spaces.Dict = (
            spaces.Dict(
                {"policy": policy_space, "critic": spaces.Box(-np.inf, np.inf, (task.critic_obs_dim,), np.float32)}
            )
            if self.privileged_obs
            else policy_space
        )
        self.single_action_space = spaces.Box(-1.0, 1.0, (task.act_dim,), np.float32)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)

        n = self.num_envs
        self._state = RobotState.zeros(n, self.robot)
        self._state_view = self._state.read_only()
        self._clusters: list[tuple[slice, ClusterWorld]] = []
        self.closed = False
        self._trace = ParameterTrace(
            trace_max_records,
            trace_path,
            self.task_config,
            env_id=env_id_of(type(self)),
            command_dim=task.command_dim,
            condition_names=task.termination_names,
            parameter_names=PARAMETER_NAMES + task.episode_parameter_names,
        )
        try:
            for start in range(0, n, envs_per_cluster):
                rows = slice(start, min(start + envs_per_cluster, n))
                world = ClusterWorld(
                    self._state.rows(rows),
                    self.dt,
                    config.solver_iterations,
                    visual=render_mode is not None and start == 0,
                    robot=self.robot,
                    scene=task.scene,
                )
                self._clusters.append((rows, world))
        except BaseException:
            self.close_extras()
            raise
        mass = self._clusters[0][1].nominal_trunk_mass
        lowest = config.domain_randomization.low[_COL["added_mass"]]
        if not self.robot.fixed_base and mass + lowest <= 0.0:  # a fixed base has no mass (added_mass unused)
            self.close_extras()
            raise ValueError(
                f"domain_randomization['added_mass'] reaches {lowest} kg, which leaves robot {self.robot.name!r}'s "
                f"trunk ({mass} kg in its URDF) no mass: need added_mass > -{mass} kg"
            )
        self._kp_nominal = np.array(config.kp)
        self._kd_nominal = np.array(config.kd)
        self._torque_limits_nominal = self._clusters[0][1].torque_limits
        self.kp = np.tile(self._kp_nominal, (n, 1))
        self.kd = np.tile(self._kd_nominal, (n, 1))
        self.torque_limits = np.tile(self._torque_limits_nominal, (n, 1))
        self.nominal_joint_pos = task.nominal_joint_pos  # (N, J) rad, the task's array

        dr = self.domain_randomization
        self.parameters = np.tile(dr.low, (n, 1))
        # latency: a ring of the last max_latency + 1 policy actions per env (None when no latency)
        self._fifo = np.zeros((n, dr.max_latency + 1, task.act_dim)) if dr.max_latency > 0 else None
        self._fifo_head = 0
        self._latency = np.zeros(n, dtype=np.int64)
        self._push_every = np.zeros(n, dtype=np.int64)  # control steps between pushes, 0 = none
        self._episode_rngs: list[np.random.Generator | None] = [None] * n  # for pushes
        self._episode_index = np.full(n, -1, dtype=np.int64)
        self._episode_return = np.zeros(n)
        self._episode_recorded = np.zeros(n, dtype=bool)
        self._arange = np.arange(n)
        self._all_envs = np.ones(n, dtype=bool)
        self._no_envs = np.zeros(n, dtype=bool)
        self._all_envs.flags.writeable = self._no_envs.flags.writeable = False  # shared masks: never written

        #: (N, C) float64: each env's command (target) of its current episode, the task's array.
        self.command = task.command
        self.episode_step = np.zeros(n, dtype=np.int64)
        #: (N,) int64: seed of each env's current episode (drawn from the env's stream at reset).
        self.episode_seed = np.zeros(n, dtype=np.int64)
        self._obs = np.zeros((n, task.obs_dim), dtype=np.float32)
        self._critic_obs = np.zeros((n, task.critic_obs_dim), dtype=np.float32) if self.privileged_obs else None
        self._last_action = np.zeros((n, task.act_dim))
        self._autoreset_envs = np.zeros(n, dtype=bool)
        self._finished = np.zeros(n, dtype=bool)  # DISABLED: envs that terminated or truncated since their reset
        self._env_rngs: list[np.random.Generator | None] = [None] * n
        self._needs_reset = True
        self.step_latency: StepLatency | None = StepLatency()

    @property
    def unwrapped(self) -> UniLabVectorEnv:
        """This env (Gymnasium's ``VectorEnv.unwrapped``).

        Raises:
            TypeError: asked by a single-env ``gymnasium.Wrapper`` wrapped around this vector env, such as the
                ``Monitor`` SB3 puts around an env it is given (``SAC("MlpPolicy", gym.make(ID, num_envs=N))``),
                which would treat the N envs as one env with (N, 48) observations and fail on its (N,) rewards.
                SB3's ``DummyVecEnv`` reads ``unwrapped`` before the algorithm builds anything, so this is where
                that misuse can be named. The message points to ``make_sb3_env``.
        """
        caller = sys._getframe(1).f_locals.get("self")
        if isinstance(caller, gym.Wrapper):
            raise TypeError(
                f"{type(caller).__name__} is a single-env gymnasium.Wrapper around a UniLabVectorEnv of "
                f"{self.num_envs} envs: it would take the N envs for one env with observation space "
                f"{self.observation_space}. For Stable-Baselines3 pass "
                f"unilab_gym.integrations.sb3.make_sb3_env('UniLab/Quadruped-v0', {self.num_envs}) (an SB3 VecEnv) "
                "to the algorithm, not the vector env (SB3 wraps a non-VecEnv in Monitor and DummyVecEnv); for "
                "Gymnasium use the wrappers of gymnasium.wrappers.vector, or gym.make('UniLab/Quadruped-v0') for "
                "one env"
            )
        return self

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Refuse ``copy.copy``, ``copy.deepcopy`` and ``pickle``.

        Raises:
            TypeError: always. A copy would share the pybullet worlds (physics client ids) of this env: stepping
                it would move this env's robots, closing it would break this env, and unpickling it in another
                process would move that process's robots. The message says how to make an independent env.
        """
        raise TypeError(
            f"a UniLabVectorEnv cannot be copied or pickled: its pybullet worlds live in this process and a copy "
            f"would share them. Make an independent env instead: UniLabVectorEnv({self.num_envs}, **env.task_config) "
            f"or gym.make_vec('UniLab/Quadruped-v0', num_envs={self.num_envs}, **env.task_config) (the same "
            "configuration; reset(seed=...) for the same trajectories); to start one in another process, send a "
            "function that builds it (an env_fn) or the env id and kwargs, as AsyncRunner does"
        )

    @property
    def robot_state(self) -> RobotState:
        """The robots' states after the last :meth:`step` or :meth:`reset`, row ``i`` = env ``i`` (read-only).

        Read-only views (no copy) of the arrays the env writes at every step, so they change with the
        next step or reset: copy what you keep. Fields (float64 unless noted; see
        :class:`~unilab_gym.sim.world.RobotState`): ``base_pos`` (N, 3) m and ``base_quat`` (N, 4) xyzw,
        world frame; ``lin_vel`` (N, 3) m/s and ``ang_vel`` (N, 3) rad/s, world frame; ``joint_pos``
        (N, 12) rad; ``joint_vel`` (N, 12) rad/s; ``torques`` (N, 12) N·m applied during the last
        substep; ``trunk_contact`` (N,) bool; ``foot_contact`` (N, 4) bool, feet FR, FL, RR, RL;
        ``leg_contact`` (N, 8) bool, thighs and calves (FR thigh, FR calf, FL thigh, ...). After
        an env's reset, before its first step, its torques are 0 and its contact flags ``False``.
        """
        return self._state_view

    @property
    def feet_air_time(self) -> np.ndarray:
        """(N, 4) float64, read-only copy: each foot's time in the air in s (0 while in contact), feet FR, FL, RR, RL.

        It grows by ``control_dt`` every step a foot is off the ground, is cleared when the foot touches it, and
        starts at 0 with every episode (see :func:`~unilab_gym.tasks.quadruped.feet_air_time`).
        """
        out = np.array(getattr(self.task, "feet_air_time", np.zeros((self.num_envs, 0))))
        out.flags.writeable = False
        return out

    def env_rng(self, index: int) -> np.random.Generator | None:
        """Env ``index``'s random stream: each of its resets draws its episode seed from it.

        ``None`` before the env's first reset (which seeds it from ``reset(seed=...)`` or fresh entropy).

        Raises:
            IndexError: ``index`` is not in [0, ``num_envs``).
        """
        return self._env_rngs[self._check_env_index(index)]

    def set_env_rng(self, index: int, rng: np.random.Generator | None) -> None:
        """Replace env ``index``'s random stream with ``rng`` (used as is, not copied).

        ``None`` reseeds it from fresh entropy at its next reset. The next episode seed it draws is
        ``rng.integers(2**63)``.

        This continues a stream in a new env (e.g. :class:`~unilab_gym.envs.QuadrupedEnv` reconnecting after
        ``close()``: ``new.set_env_rng(0, old.env_rng(0))``).

        Raises:
            IndexError: ``index`` is not in [0, ``num_envs``).
            TypeError: ``rng`` is not a ``numpy.random.Generator`` or ``None``.
        """
        i = self._check_env_index(index)
        if rng is not None and not isinstance(rng, np.random.Generator):
            raise TypeError(f"rng must be a numpy.random.Generator or None, got {type(rng).__name__}: {rng!r}")
        self._env_rngs[i] = rng

    # ------------------------------------------------------------------ Gymnasium API
    def reset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset all envs, or those of ``options["reset_mask"]`` ((N,) bool).

        Args:
            seed: ``None`` (keep each env's random stream; fresh entropy if never seeded),
                an int ``s`` (env ``i`` gets ``s + i``) or a list of N ints / ``None``.
            options: ``{"reset_mask": (N,) bool array}`` resets only those envs.
                ``{"episode_seed": s}`` starts the reset envs' episodes from episode seed ``s``
                (an int in [0, 2**63), or a list of N ints / ``None``) instead of drawing it
                from their streams, which are left as they were: this replays a recorded
                episode (see :mod:`unilab_gym.trace`).

        Returns:
            obs (N, 48) float32 (with ``privileged_obs``, a dict of it and the (N, 68) ``"critic"``) and infos
            (dict of arrays with ``_key`` masks) of the reset
            envs: ``command`` (N, 3), ``episode_seed`` (N,) int64 and ``parameters`` (a dict
            of (N,) arrays, one per :data:`~unilab_gym.randomization.PARAMETER_NAMES`).

        Raises:
            TypeError: ``options`` is not a dict, or ``options["reset_mask"]`` is not a numpy array of dtype bool
                (as Gymnasium's ``SyncVectorEnv``).
            ValueError: a bad seed (negative, not an int, a list of the wrong length: named with its value), an
                unknown option key (named), a ``reset_mask`` of the wrong shape or selecting no env, a bad
                ``episode_seed``. Nothing is reset then.
            gymnasium.error.ClosedEnvironmentError: after ``close()``.
        """
        self._check_open()
        options = check_reset_options(options)
        seeds = self._seed_list(seed)
        mask = np.ones(self.num_envs, dtype=bool)
        if "reset_mask" in options:
            mask = self._check_reset_mask(options["reset_mask"])
        episode_seeds = self._episode_seed_list(options.get("episode_seed"))
        if isinstance(seed, (int, np.integer)):
            self._np_random, self._np_random_seed = seeding.np_random(int(seed))
        for i in np.flatnonzero(mask):
            if seeds[i] is not None or self._env_rngs[i] is None:
                self._env_rngs[i] = seeding.np_random(seeds[i])[0]
        self._reset_envs(mask, episode_seeds)
        self._read_states(mask)
        self._compute_obs()
        self._autoreset_envs[mask] = False
        self._finished[mask] = False
        self._needs_reset = False
        return self._observation(), self._reset_info(mask)

    def step(  # type: ignore[override]  # a VectorEnv step (batched arrays), not gym.Env's single-env one
        self, actions: np.ndarray, active: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Advance every env one control step (``substeps`` physics steps), or only the envs of ``active``.

        ``active=None`` (default) steps every env. An (N,) bool mask ``active`` is a *partial step*, in the
        spirit of EnvPool's ``step(action, env_id)``: the active envs are stepped with their actions exactly as
        a full step would step them (bit for bit: an env's trajectory never depends on its neighbours). An
        inactive env *idles*:

        - its row of ``actions`` is ignored (it may hold anything real, even NaN); a zero action is applied,
          and its robot is simulated with the others, since it shares its pybullet world with them (a robot
          cannot be paused there). Its episode is therefore no longer the one its actions determine: reset it
          before relying on its trajectory again (the Tianshou adapter marks such envs stale). Its task's
          per-env state (e.g. feet air times) follows its robot.
        - its episode bookkeeping does not advance: its ``episode_step``, episode return, previous action,
          pushes, autoreset (a NEXT_STEP restart waits for its next active step) and the parameter trace are
          left as they were; it cannot terminate or truncate.
        - it is returned as: its current observation (its robot's state after this step), reward ``0.0``,
          ``terminated`` and ``truncated`` ``False``, and no info entries (every ``_key`` mask is ``False``
          for it).

        Autoreset ``"Disabled"``: an *active* env that terminated or truncated and was not reset is refused
        (:class:`FinishedEnvError`, nothing is stepped); an inactive one is not, which is how to step the others
        while finished envs wait for their reset.

        Args:
            actions: (N, 12) array-like of floats (the task's action dimension); values outside [-1, 1] are
                clipped.
            active: ``None`` (every env) or an (N,) ``numpy`` array of dtype bool: the envs to step. All
                ``False`` is allowed (every env idles).

        Returns:
            obs (N, 48) float32 (with ``privileged_obs``, ``{"policy": (N, 48), "critic": (N, 68)}``; a
            ``final_obs`` entry is then one env's dict), reward (N,) float64, terminated (N,) bool,
            truncated (N,) bool and
            infos, as Gymnasium's ``SyncVectorEnv`` over single envs gives them: ``reward_terms`` (dict of
            (N,) float64) of the envs that stepped. NEXT_STEP: an env restarting at this step has only
            its reset info (``command``, ``episode_seed``, ``parameters``), no ``reward_terms``.
            SAME_STEP: a finished env has its reset info, ``final_obs`` and ``final_info`` (its
            ``reward_terms`` of this step), and no top-level ``reward_terms``. A key no env has is absent.

        Raises:
            TypeError: ``actions`` of the wrong type: a scalar, strings, complex numbers, objects.
            ValueError: wrong action shape (states the expected one), NaN/inf actions of active envs
                (names the env indices), or an ``active`` that is not an (N,) bool numpy array (named, with
                what it got). Nothing is stepped then.
            FinishedEnvError: (an ``AssertionError``, as ``SyncVectorEnv`` raises) with autoreset
                ``"Disabled"``, some active envs terminated or truncated and were not reset (named; nothing is
                stepped).
            gymnasium.error.ResetNeeded: before the first ``reset()``.
            gymnasium.error.ClosedEnvironmentError: after ``close()``.
        """
        t_start = time.perf_counter_ns()
        self._check_open()
        if self._needs_reset:
            raise ResetNeeded("call reset() before step()")
        mask = None if active is None else self._check_active(active)
        action = self._validate_actions(actions, mask)
        if self.autoreset_mode == AutoresetMode.DISABLED:
            blocked = self._finished if mask is None else self._finished & mask
            if blocked.any():
                raise FinishedEnvError(
                    f"envs {np.flatnonzero(blocked).tolist()} terminated or truncated and were not reset; with "
                    "autoreset_mode='Disabled' reset them (reset(options={'reset_mask': mask})) before stepping "
                    "them again, or leave them out of step(actions, active=mask). No env was stepped."
                )
        return self._advance(action, mask, t_start)

    def _advance(
        self, action: np.ndarray, active: np.ndarray | None, t_start: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """The five phases of a (checked) step; ``active`` ``None`` (every env) or the (N,) mask of a partial step."""
        mode = self.autoreset_mode
        # NEXT_STEP: the envs whose episode ended last step start a new one now, ignoring their action
        restarting = self._autoreset_envs.copy() if mode == AutoresetMode.NEXT_STEP else self._no_envs
        if active is not None:  # (its rows of `action` are zero: _validate_actions)
            restarting = restarting & active
        targets = self._actuate(action, restarting, active)
        physics_ns = self._simulate(targets, restarting, active)
        reward, terms, terminated, truncated, conditions = self._evaluate(action, restarting, active)
        done = terminated | truncated
        # as SyncVectorEnv: an env's entries are its step info, or its reset info if it restarts (NEXT_STEP) or
        # restarted (SAME_STEP, its step info goes to final_info)
        stepped = ~done if mode == AutoresetMode.SAME_STEP else ~restarting
        if active is not None:
            stepped &= active
        infos = self._step_info(terms, stepped) if stepped.any() else {}
        if restarting.any():
            infos.update(self._reset_info(restarting))
        self._record(reward, done, terminated, conditions)
        self._autoreset(done, terms, infos, active)
        if mode == AutoresetMode.DISABLED:
            self._finished |= done
        obs = self._observation()
        if self.step_latency is not None:
            self.step_latency.physics.observe(physics_ns / 1e3)
            self.step_latency.task.observe((time.perf_counter_ns() - t_start - physics_ns) / 1e3)
        return obs, reward, terminated, truncated, infos

    def render(self) -> EnvFrames | None:  # type: ignore[override]  # a lazy sequence where gymnasium says tuple
        """Frames of the envs as a sequence of N (H, W, 3) uint8 arrays, or ``None`` without a render mode.

        Only env 0 is drawn eagerly (the sequence is what gymnasium's vector ``RecordVideo``
        expects); env ``i`` is drawn when indexed. Robots outside cluster 0 are drawn from
        their collision shapes, as only cluster 0 loads visual shapes.
        """
        self._check_open()
        if self.render_mode is None:
            return None
        return EnvFrames(self)

    def render_env(
        self, index: int = 0, width: int = 320, height: int = 240, camera: Camera | None = None
    ) -> np.ndarray:
        """(height, width, 3) uint8 RGB frame of env ``index``.

        Args:
            index: the env, in [0, N).
            width: image width in pixels (default 320, as :meth:`render`'s frames).
            height: image height in pixels (default 240, as :meth:`render`'s frames).
            camera: ``None`` (default): the task's camera (:attr:`~unilab_gym.tasks.base.Task.camera`, following env
                ``index``'s robot or its spawn point); or another :class:`~unilab_gym.sim.camera.Camera`.

        The task's target (:meth:`~unilab_gym.tasks.base.Task.render_target`), if it has one, is a red sphere.
        """
        self._check_open()
        rows, world = self._cluster_of(index)
        targets = self.task.render_target()
        marker = None if targets is None else targets[index]
        return world.render(index - rows.start, width, height, self.task.camera if camera is None else camera, marker)

    def parameter_trace(self) -> list[dict[str, Any]]:
        """One record per finished episode (terminated or truncated) of every env, in the order they finished.

        Env index, episode index, episode seed, command, parameters, return, length and termination cause; the last
        ``trace_max_records`` of them (every one is in ``trace_path`` if given). The format is in
        :mod:`unilab_gym.trace`.
        """
        return self._trace.records()

    def save_parameter_trace(self, path: str | Path) -> Path:
        """Write :meth:`parameter_trace` (the records in memory) to ``path`` as JSON Lines; return the path.

        The records follow a header line with the package versions and :attr:`task_config` (see
        :mod:`unilab_gym.trace`).
        """
        return write_jsonl(path, self.task_config, self.parameter_trace(), env_id_of(type(self)))

    def close_extras(self, **kwargs: Any) -> None:
        """Disconnect every pybullet world and close the ``trace_path`` file (the trace stays readable)."""
        for _, world in getattr(self, "_clusters", []):
            world.close()
        if hasattr(self, "_trace"):
            self._trace.close()

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call method ``name`` once (all envs share this object) and return its result for each env.

        A non-callable attribute is returned as is, once per env, as ``SyncVectorEnv.call`` does.
        """
        attr = getattr(self, name)
        result = attr(*args, **kwargs) if callable(attr) else attr
        return tuple(result for _ in range(self.num_envs))

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Attribute ``name`` for each env (a tuple of N), as ``SyncVectorEnv.get_attr``."""
        return self.call(name)

    def set_attr(self, name: str, values: list[Any] | tuple[Any, ...] | Any) -> None:
        """Set attribute ``name``; ``values`` is one value or N equal values (the envs share one object).

        Raises:
            ValueError: a list of the wrong length, or of differing values.
        """
        if isinstance(values, (list, tuple)):
            if len(values) != self.num_envs:
                raise ValueError(
                    f"values must be a list or tuple with length equal to num_envs={self.num_envs}, got {len(values)}"
                )
            if any(v is not values[0] and v != values[0] for v in values[1:]):
                raise ValueError(f"UniLabVectorEnv envs share attribute {name!r}; per-env values must all be equal")
            values = values[0]
        setattr(self, name, values)

    # ------------------------------------------------------------------ step phases
    def _actuate(self, action: np.ndarray, restarting: np.ndarray, active: np.ndarray | None) -> np.ndarray:
        """PD targets (N, 12) rad of this step, and the pushes due before it.

        Zeroes the action of ``restarting`` envs in place; with latency, the applied action is the one
        sent ``latency`` steps ago (the zero action before the episode's first). Pushes (see
        :meth:`_push`) are applied to the worlds now, so they act during this step's slice. An env outside
        ``active`` (a partial step) gets the zero action and no push.
        """
        action[restarting] = 0.0
        applied = action
        if self._fifo is not None:  # latency: apply the action of `latency` steps ago
            size = self._fifo.shape[1]
            self._fifo[:, self._fifo_head] = action
            applied = self._fifo[self._arange, (self._fifo_head - self._latency) % size]
            applied[restarting] = 0.0
            if active is not None:
                applied[~active] = 0.0
            self._fifo_head = (self._fifo_head + 1) % size
        if self.domain_randomization.pushes:
            self._push(restarting if active is None else restarting | ~active)
        if self._external:  # the task turns the applied action into forces (_simulate)
            return applied
        return self.task.joint_targets(applied, self.action_scale)

    def _simulate(self, targets: np.ndarray, restarting: np.ndarray, active: np.ndarray | None) -> int:
        """Advance every cluster world one slice toward ``targets``, then read the robot states back.

        The ``restarting`` envs start their new episode after the slice (so it starts at rest) and
        before the states are read. The episode step of every env (of the ``active`` ones in a partial
        step) grows by one. Returns the wall-clock ns of the slices and the state reads.
        """
        t_slice = time.perf_counter_ns()
        if self._external:  # targets is the applied action: the task's wrench on each base instead of joint PD
            wrench = self.task.forces(self._state_view, targets)
            for rows, world in self._clusters:
                world.step_external(wrench[rows], self.substeps)
        else:
            for rows, world in self._clusters:
                world.step(targets[rows], self.kp[rows], self.kd[rows], self.torque_limits[rows], self.substeps)
        physics_ns = time.perf_counter_ns() - t_slice
        if active is None:
            self.episode_step += 1
        else:
            self.episode_step[active] += 1
        if restarting.any():
            self._reset_envs(restarting, [None] * self.num_envs)
        t_read = time.perf_counter_ns()
        self._read_states(self._all_envs)
        return physics_ns + time.perf_counter_ns() - t_read

    def _evaluate(
        self, action: np.ndarray, restarting: np.ndarray, active: np.ndarray | None
    ) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray, np.ndarray, np.ndarray]:
        """The task math of this step, batched: writes the observation, returns the outcome.

        Returns:
            reward (N,) float64, weighted reward terms (dict of (N,) float64), terminated (N,) bool,
            truncated (N,) bool and the fall conditions (N, 3) bool. A ``restarting`` env, and an env outside
            ``active`` (which also keeps its previous action), gets reward 0 and neither flag.
        """
        previous_action = self._last_action
        self._last_action = action
        self._last_action[restarting] = 0.0
        if active is not None:
            self._last_action[~active] = previous_action[~active]
        self._compute_obs()
        terms, conditions = self.task.evaluate(self._state, action, previous_action, restarting)
        terminated: np.ndarray = np.logical_or.reduce(conditions, axis=1)
        truncated = self.task.truncation(self.episode_step, self.max_episode_steps)
        silent = restarting if active is None else restarting | ~active
        terminated[silent] = False
        truncated[silent] = False
        for value in terms.values():
            value[silent] = 0.0
        reward = np.zeros(self.num_envs)
        for value in terms.values():  # in order, one term at a time: np.sum's pairwise sum would depend on N
            reward += value
        return reward, terms, terminated, truncated, conditions

    def _record(self, reward: np.ndarray, done: np.ndarray, terminated: np.ndarray, conditions: np.ndarray) -> None:
        """Add ``reward`` to the episode returns; trace the episodes that just finished (``done``, not yet traced)."""
        self._episode_return += reward
        finished = done & ~self._episode_recorded
        if not finished.any():
            return
        idx = np.flatnonzero(finished)
        self._trace.append(
            env=idx,
            episode=self._episode_index[idx],
            episode_seed=self.episode_seed[idx],
            command=self.command[idx],
            parameters=self._trace_parameters(idx),
            returns=self._episode_return[idx],
            lengths=self.episode_step[idx],
            terminated=terminated[idx],
            conditions=conditions[idx],
        )
        self._episode_recorded[idx] = True

    def _trace_parameters(self, idx: np.ndarray) -> np.ndarray:
        """(k, P + E) float64: envs ``idx``'s physics parameters, then their task's episode parameters (if any)."""
        if not self.task.episode_parameter_names:
            return self.parameters[idx]
        return np.concatenate([self.parameters[idx], self.task.episode_parameters[idx]], axis=1)

    def _autoreset(
        self, done: np.ndarray, terms: dict[str, np.ndarray], infos: dict[str, Any], active: np.ndarray | None
    ) -> None:
        """Autoreset the ``done`` envs as ``autoreset_mode`` says.

        SAME_STEP: reset them now; the observation becomes the reset one and ``infos`` gains the
        reset info, ``final_obs`` and ``final_info`` (this step's reward terms). NEXT_STEP: mark them
        to restart at the next step (an env outside ``active`` keeps its mark). DISABLED: nothing.
        """
        if self.autoreset_mode == AutoresetMode.SAME_STEP and done.any():
            final_obs = np.full(self.num_envs, None, dtype=object)
            last = self._observation()
            for i in np.flatnonzero(done):
                final_obs[i] = {k: v[i] for k, v in last.items()} if isinstance(last, dict) else last[i]
            final_info = self._step_info(terms, done)
            self._reset_envs(done, [None] * self.num_envs)
            self._read_states(done)
            self._compute_obs()
            infos.update(self._reset_info(done))
            infos.update(
                {
                    "final_obs": final_obs,
                    "_final_obs": done.copy(),
                    "final_info": final_info,
                    "_final_info": done.copy(),
                }
            )
        elif self.autoreset_mode == AutoresetMode.NEXT_STEP:
            self._autoreset_envs = done.copy() if active is None else done | (self._autoreset_envs & ~active)

    # ------------------------------------------------------------------ internals
    def _check_open(self) -> None:
        if self.closed:
            raise ClosedEnvironmentError("UniLabVectorEnv is closed; create a new env")

    def _seed_list(self, seed: int | Sequence[int | None] | None) -> list[int | None]:
        if seed is None:
            return [None] * self.num_envs
        if isinstance(seed, (list, tuple, np.ndarray)):
            if len(seed) != self.num_envs:
                raise ValueError(f"seed list has length {len(seed)}, expected num_envs={self.num_envs}")
            return [None if s is None else check_seed(f"seed[{i}]", s) for i, s in enumerate(seed)]
        if isinstance(seed, numbers.Number):
            first = check_seed("seed", seed)  # env i gets first + i, which must be a seed too
            return [check_seed("seed + num_envs - 1", first + i) if i else first for i in range(self.num_envs)]
        raise ValueError(f"seed must be an int, a list of {self.num_envs} ints/None, or None; got {seed!r}")

    def _check_reset_mask(self, mask: Any) -> np.ndarray:
        """``options["reset_mask"]``, checked as Gymnasium's ``SyncVectorEnv`` checks it (TypeError / ValueError)."""
        name = "`options['reset_mask']`"  # the messages are SyncVectorEnv's, word for word
        if not isinstance(mask, np.ndarray):
            raise TypeError(f"{name} must be a numpy array, got {type(mask)} (a numpy array of dtype bool)")
        if mask.shape != (self.num_envs,):
            raise ValueError(f"{name} must have shape `({self.num_envs},)`, got {mask.shape}")
        if mask.dtype != np.bool_:
            raise TypeError(f"{name} must have `dtype=np.bool_`, got {mask.dtype}")
        if not mask.any():
            raise ValueError(f"{name} must contain a boolean array with at least one True value, got reset_mask={mask}")
        return mask.copy()

    def _check_active(self, active: Any) -> np.ndarray:
        """``step(actions, active=...)``'s mask, as a copy: an (N,) numpy array of dtype bool, else ValueError."""
        if not isinstance(active, np.ndarray):
            raise ValueError(
                f"active must be None or a numpy array of shape ({self.num_envs},) and dtype bool, "
                f"got {type(active).__name__}: {active!r}"
            )
        if active.dtype != np.bool_:
            raise ValueError(f"active must have dtype bool, got dtype {active.dtype}: {active!r}")
        if active.shape != (self.num_envs,):
            raise ValueError(f"active must have shape ({self.num_envs},) (num_envs), got shape {active.shape}")
        return active.copy()

    def _validate_actions(self, actions: Any, active: np.ndarray | None) -> np.ndarray:
        """``actions`` as a clipped float64 copy; NaN / inf are refused in the rows of ``active`` (all if ``None``)."""
        action = check_action_array("actions", actions, (self.num_envs, self.task.act_dim))
        finite = np.isfinite(action).all(axis=1)
        if active is not None:
            finite |= ~active  # an idle env's row is ignored
            action[~active] = 0.0
        bad = np.flatnonzero(~finite)
        if bad.size:
            raise ValueError(f"actions contain NaN or inf for env indices {bad.tolist()}; the envs were not stepped")
        return np.clip(action, -1.0, 1.0)

    def _check_env_index(self, index: Any) -> int:
        """``index`` as an int in [0, num_envs), else IndexError (TypeError for a non-integer)."""
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise TypeError(f"env index must be an int, got {type(index).__name__}: {index!r}")
        if not 0 <= index < self.num_envs:
            raise IndexError(f"env index {index} out of range [0, {self.num_envs})")
        return int(index)

    def _cluster_of(self, index: int) -> tuple[slice, ClusterWorld]:
        if not 0 <= index < self.num_envs:
            raise IndexError(f"env index {index} out of range [0, {self.num_envs})")
        for rows, world in self._clusters:
            if rows.start <= index < rows.stop:
                return rows, world
        raise AssertionError("unreachable")

    def _episode_seed_list(self, value: Any) -> list[int | None]:
        """``options["episode_seed"]`` as one int or ``None`` per env; raises ValueError naming the bad value."""
        if value is None:
            return [None] * self.num_envs
        values = (
            [value] * self.num_envs if isinstance(value, (int, np.integer)) and not isinstance(value, bool) else value
        )
        if not isinstance(values, (list, tuple, np.ndarray)) or len(values) != self.num_envs:
            raise ValueError(
                f"options['episode_seed'] must be an int or a list of num_envs={self.num_envs} ints/None, got {value!r}"
            )
        name = "options['episode_seed']"
        return [
            None if s is None else check_int(f"{name}[{i}]", s, minimum=0, maximum=2**63 - 1)
            for i, s in enumerate(values)
        ]

    def _reset_envs(self, mask: np.ndarray, episode_seeds: list[int | None]) -> None:
        """New episode for the envs of ``mask``.

        Each env draws an episode seed from its own stream (or takes ``episode_seeds[i]``);
        the episode's command, initial pose, lane, physics parameters and pushes come from that
        seed alone (see :mod:`unilab_gym.sim.world` for why the lane matters to determinism).
        Every parameter is applied, so nothing of the slot's earlier episodes remains.
        """
        idx = np.flatnonzero(mask)
        joint_pos = np.empty((idx.size, self.robot.num_joints))
        for row, i in enumerate(idx):
            given = episode_seeds[i]
            self.episode_seed[i] = _stream(self._env_rngs[i]).integers(2**63) if given is None else given
            rng = np.random.default_rng(int(self.episode_seed[i]))
            joint_pos[row] = self.task.sample_episode(int(i), rng)  # the command (target), then the initial pose
            self.parameters[i] = self.domain_randomization.sample(rng)
            self._episode_rngs[i] = rng  # the episode's stream goes on for its pushes
        params = self.parameters[idx]
        self.kp[idx] = self._kp_nominal * params[:, _COL["kp_factor"], None]
        self.kd[idx] = self._kd_nominal * params[:, _COL["kd_factor"], None]
        self.torque_limits[idx] = self._torque_limits_nominal * params[:, _COL["motor_strength"], None]
        self._latency[idx] = params[:, _COL["latency"]].astype(np.int64)
        push_every = np.maximum(1, np.rint(params[:, _COL["push_interval"]] / self.control_dt)).astype(np.int64)
        self._push_every[idx] = np.where(params[:, _COL["push_velocity"]] > 0.0, push_every, 0)
        if self._fifo is not None:
            self._fifo[idx] = 0.0
        lanes = self.episode_seed[idx] % a1.NUM_LANES
        com = params[:, [_COL["com_x"], _COL["com_y"], _COL["com_z"]]]
        for rows, world in self._clusters:
            inside = (idx >= rows.start) & (idx < rows.stop)
            if inside.any():
                local = idx[inside] - rows.start
                trunk_mass = world.nominal_trunk_mass + params[inside, _COL["added_mass"]]
                world.set_dynamics(local, params[inside, _COL["friction"]], trunk_mass, com[inside])
                terrain = self.task.terrain if world.terrain is not None else None  # Scene(terrain=True)
                if terrain is not None:
                    envs = idx[inside]
                    world.reset_terrain(local, lanes[inside], terrain.heights[envs], terrain.horizontal_scale)
                    terrain.origin[envs] = lane_origins(lanes[inside])
                ground = None if terrain is None else terrain.spawn_height(idx[inside])
                world.reset_robots(local, lanes[inside], joint_pos[inside], ground)
                if world.objects is not None and self.task.objects is not None:  # Scene(objects=True)
                    envs = idx[inside]
                    episodes = {f.name: getattr(self.task.objects, f.name)[envs] for f in fields(ObjectEpisodes)}
                    world.reset_objects(local, lanes[inside], episodes)
        self.episode_step[idx] = 0
        self._last_action[idx] = 0.0
        self.task.start_episodes(idx)
        self._episode_index[idx] += 1
        self._episode_return[idx] = 0.0
        self._episode_recorded[idx] = False

    def _push(self, restarting: np.ndarray) -> None:
        """Push the envs whose push is due before this step.

        Adds ``push_velocity`` m/s to the base, horizontally, in a direction drawn from the episode's stream.
        """
        every = self._push_every
        due = (every > 0) & (self.episode_step > 0) & (self.episode_step % np.maximum(every, 1) == 0) & ~restarting
        if not due.any():
            return
        idx = np.flatnonzero(due)
        angle = np.array([_stream(self._episode_rngs[i]).uniform(0.0, 2.0 * np.pi) for i in idx])
        speed = self.parameters[idx, _COL["push_velocity"]]
        delta_v = np.stack([speed * np.cos(angle), speed * np.sin(angle), np.zeros(idx.size)], axis=1)
        for rows, world in self._clusters:
            inside = (idx >= rows.start) & (idx < rows.stop)
            if inside.any():
                world.push(idx[inside] - rows.start, delta_v[inside])

    def _read_states(self, mask: np.ndarray) -> None:
        for rows, world in self._clusters:
            if mask[rows].any():
                world.read_state()

    def _compute_obs(self) -> None:
        """Refresh ``self._obs`` from the current states (:meth:`Task.observe <unilab_gym.tasks.base.Task.observe>`)."""
        self.task.observe(self._state, self._last_action, out=self._obs)

    def _observation(self) -> Any:  # np.ndarray, or dict[str, np.ndarray] with privileged_obs
        """A copy of the current observation.

        (N, 48), or ``{"policy": (N, 48), "critic": (N, 68)}`` with ``privileged_obs`` (the critic columns written
        now, from the current state).
        """
        if self._critic_obs is None:
            return self._obs.copy()
        self.task.critic_observe(self._state, self._obs, self.parameters, out=self._critic_obs)
        return {"policy": self._obs.copy(), "critic": self._critic_obs.copy()}

    def _reset_info(self, mask: np.ndarray) -> dict[str, Any]:
        parameters: dict[str, Any] = {}
        for k, name in enumerate(PARAMETER_NAMES):
            column = self.parameters[:, k]
            parameters[name] = np.where(mask, column, 0).astype(np.int64 if name == "latency" else np.float64)
            parameters[f"_{name}"] = mask.copy()
        return {
            "command": np.where(mask[:, None], self.command, 0.0),
            "_command": mask.copy(),
            "episode_seed": np.where(mask, self.episode_seed, 0),
            "_episode_seed": mask.copy(),
            "parameters": parameters,
            "_parameters": mask.copy(),
        }

    def _step_info(self, terms: dict[str, np.ndarray], mask: np.ndarray) -> dict[str, Any]:
        """Gymnasium vector info for the reward terms of the envs in ``mask``, and the task's own entries.

        The task's entries are :meth:`Task.step_info <unilab_gym.tasks.base.Task.step_info>` (e.g. ``is_success``).
        """
        nested: dict[str, Any] = {}
        for name, value in terms.items():
            nested[name] = np.where(mask, value, 0.0)
            nested[f"_{name}"] = mask.copy()
        info: dict[str, Any] = {"reward_terms": nested, "_reward_terms": mask.copy()}
        for name, value in self.task.step_info().items():
            info[name] = np.where(mask, value, np.zeros((), dtype=value.dtype))
            info[f"_{name}"] = mask.copy()
        return info


def _stream(rng: np.random.Generator | None) -> np.random.Generator:
    """A random stream that is set before its first use (an env's at its first reset, an episode's at its start)."""
    assert rng is not None, "random stream used before it was set"
    return rng


class EnvFrames(Sequence):
    """A lazy sequence of the N envs' frames: ``frames[i]`` draws env ``i`` when first indexed."""

    def __init__(self, env: UniLabVectorEnv):
        """Draw env 0's frame now; the others when first indexed."""
        self._env = env
        self._cache: dict[int, np.ndarray] = {0: env.render_env(0)}

    def __len__(self) -> int:
        """N, the number of envs."""
        return self._env.num_envs

    def __getitem__(self, index: int) -> np.ndarray:  # type: ignore[override]
        """Env ``index``'s frame (negative indices count from the end; a slice gives a list)."""
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        index = index + len(self) if index < 0 else index
        if index not in self._cache:
            self._cache[index] = self._env.render_env(index)
        return self._cache[index]


def __getattr__(name: str) -> Any:
    """``replay_env``, defined in :mod:`unilab_gym.trace_replay` (it needs the registry, which imports this module)."""
    if name == "replay_env":
        import importlib

        return importlib.import_module("unilab_gym.trace_replay").replay_env
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
