"""``UniLabVectorEnv``: N quadrupeds stepped in one process, grouped in EIC clusters.

Data flow of one :meth:`UniLabVectorEnv.step`::

    actions (N, 12) -> validate, clip -> [latency FIFO] -> PD targets -> [pushes]
                    -> every cluster world: K substeps
                    -> robot states (N, ...) -> batched task math (obs, reward terms, terminated, truncated)
                    -> parameter trace of finished episodes -> autoreset (per ``autoreset_mode``)
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.error import ClosedEnvironmentError, ResetNeeded
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from unilab_gym.latency import StepLatency
from unilab_gym.randomization import PARAMETER_NAMES, DomainRandomization
from unilab_gym.sim import a1
from unilab_gym.sim.world import ClusterWorld, RobotState
from unilab_gym.tasks import quadruped as task
from unilab_gym.trace import ParameterTrace, write_jsonl

#: Default robots per pybullet world; see README "Choosing envs_per_cluster" for the benchmark.
DEFAULT_ENVS_PER_CLUSTER = 32

_COL = {name: k for k, name in enumerate(PARAMETER_NAMES)}  # column of each parameter


def _range(name: str, value: Sequence[float]) -> tuple[float, float]:
    try:
        lo, hi = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a (low, high) pair of numbers, got {value!r}") from None
    if not (np.isfinite(lo) and np.isfinite(hi) and lo <= hi):
        raise ValueError(f"{name} must satisfy finite low <= high, got {value!r}")
    return lo, hi


def _positive(name: str, value: float, integer: bool = False) -> Any:
    if integer and (isinstance(value, bool) or not isinstance(value, (int, np.integer))):
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if not (np.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return int(value) if integer else float(value)


def _joint_gains(name: str, value: float | Sequence[float]) -> np.ndarray:
    try:
        gains = np.broadcast_to(np.asarray(value, dtype=np.float64), (a1.NUM_JOINTS,)).copy()
    except (TypeError, ValueError):
        gains = np.array([np.nan])
    if not np.all(np.isfinite(gains)) or np.any(gains < 0):
        raise ValueError(f"{name} must be a finite number >= 0 or {a1.NUM_JOINTS} of them, got {value!r}")
    return gains


class UniLabVectorEnv(VectorEnv, gym.Env):
    """``num_envs`` Unitree A1 quadrupeds following velocity commands, in one process.

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
        the URDF's effort limits (hip 20 N·m, thigh and calf 55 N·m). Actions outside
        [-1, 1] are clipped.
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
        envs_per_cluster: robots per pybullet world.
        render_mode: ``None`` or ``"rgb_array"`` (frames of env 0; visual shapes are loaded
            in cluster 0 only).
        autoreset_mode: ``AutoresetMode`` or its value: ``"NextStep"`` (default),
            ``"SameStep"`` (``info["final_obs"]`` / ``info["final_info"]``), ``"Disabled"``
            (reset through ``reset(options={"reset_mask": mask})``).
        max_episode_steps: control steps before ``truncated`` (default 1000 = 20 s).
        dt: physics time step in s (default 0.005).
        substeps: physics steps per control step (decimation; default 4 -> 50 Hz control).
        kp: PD stiffness in N·m/rad, a number or 12 values (default 20, legged_gym A1).
        kd: PD damping in N·m·s/rad, a number or 12 values (default 0.5, legged_gym A1).
        action_scale: rad of joint target per unit of action (default 0.25, legged_gym).
        solver_iterations: pybullet ``numSolverIterations`` (default 10).
        lin_vel_x_range, lin_vel_y_range: command ranges in m/s, sampled uniformly per episode.
        yaw_rate_range: command range in rad/s.
        reward_weights: overrides of :class:`~unilab_gym.tasks.quadruped.RewardWeights`.
        termination: overrides of :class:`~unilab_gym.tasks.quadruped.TerminationConfig`.
        init_joint_noise: half-width in rad of the uniform noise added to the nominal pose at reset.
        domain_randomization: ``None`` (off) or a dict of parameter ranges, see
            :class:`~unilab_gym.randomization.DomainRandomization`.

    Attributes:
        task_config: the constructor arguments that determine the trajectories, JSON-able:
            ``UniLabVectorEnv(n, **env.task_config)`` makes envs that follow the same ones.
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
        ValueError: for an invalid argument, naming it.
    """

    def __init__(
        self,
        num_envs: int = 1,
        *,
        envs_per_cluster: int = DEFAULT_ENVS_PER_CLUSTER,
        render_mode: str | None = None,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        max_episode_steps: int = 1000,
        dt: float = 0.005,
        substeps: int = 4,
        kp: float | Sequence[float] = 20.0,
        kd: float | Sequence[float] = 0.5,
        action_scale: float = 0.25,
        solver_iterations: int = 10,
        lin_vel_x_range: Sequence[float] = (0.3, 1.0),
        lin_vel_y_range: Sequence[float] = (0.0, 0.0),
        yaw_rate_range: Sequence[float] = (0.0, 0.0),
        reward_weights: dict[str, float] | None = None,
        termination: dict[str, Any] | None = None,
        init_joint_noise: float = 0.05,
        domain_randomization: dict[str, Any] | None = None,
    ):
        self.num_envs = _positive("num_envs", num_envs, integer=True)
        envs_per_cluster = _positive("envs_per_cluster", envs_per_cluster, integer=True)
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
        self.max_episode_steps = _positive("max_episode_steps", max_episode_steps, integer=True)
        self.dt = _positive("dt", dt)
        self.substeps = _positive("substeps", substeps, integer=True)
        self.control_dt = self.dt * self.substeps
        self.action_scale = _positive("action_scale", action_scale)
        solver_iterations = _positive("solver_iterations", solver_iterations, integer=True)
        self.command_ranges = np.array(
            [
                _range("lin_vel_x_range", lin_vel_x_range),
                _range("lin_vel_y_range", lin_vel_y_range),
                _range("yaw_rate_range", yaw_rate_range),
            ]
        )
        self.reward_weights = task.RewardWeights.from_dict(reward_weights)
        try:
            self.termination = task.TerminationConfig(**(termination or {}))
        except TypeError as exc:
            raise ValueError(f"invalid termination config {termination!r}: {exc}") from None
        if not (np.isfinite(init_joint_noise) and init_joint_noise >= 0):
            raise ValueError(f"init_joint_noise must be >= 0, got {init_joint_noise!r}")
        self.init_joint_noise = float(init_joint_noise)
        self.domain_randomization = DomainRandomization(domain_randomization)
        kp_nominal, kd_nominal = _joint_gains("kp", kp), _joint_gains("kd", kd)
        self.task_config: dict[str, Any] = {
            "max_episode_steps": self.max_episode_steps,
            "dt": self.dt,
            "substeps": self.substeps,
            "kp": kp_nominal.tolist(),
            "kd": kd_nominal.tolist(),
            "action_scale": self.action_scale,
            "solver_iterations": solver_iterations,
            "lin_vel_x_range": self.command_ranges[0].tolist(),
            "lin_vel_y_range": self.command_ranges[1].tolist(),
            "yaw_rate_range": self.command_ranges[2].tolist(),
            "reward_weights": dataclasses.asdict(self.reward_weights),
            "termination": dataclasses.asdict(self.termination),
            "init_joint_noise": self.init_joint_noise,
            "domain_randomization": self.domain_randomization.to_dict(),
        }

        self.render_mode = render_mode
        self.metadata = {
            "render_modes": ["rgb_array"],
            "render_fps": int(round(1.0 / self.control_dt)),
            "autoreset_mode": self.autoreset_mode,
        }
        self.single_observation_space = spaces.Box(-np.inf, np.inf, (task.OBS_DIM,), np.float32)
        self.single_action_space = spaces.Box(-1.0, 1.0, (task.ACT_DIM,), np.float32)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)

        n = self.num_envs
        self.state = RobotState.zeros(n)
        self._clusters: list[tuple[slice, ClusterWorld]] = []
        self.closed = False
        try:
            for start in range(0, n, envs_per_cluster):
                rows = slice(start, min(start + envs_per_cluster, n))
                world = ClusterWorld(
                    self.state.rows(rows), self.dt, solver_iterations, visual=render_mode is not None and start == 0
                )
                self._clusters.append((rows, world))
        except BaseException:
            self.close_extras()
            raise
        self._kp_nominal, self._kd_nominal = kp_nominal, kd_nominal
        self._torque_limits_nominal = self._clusters[0][1].torque_limits
        self.kp = np.tile(kp_nominal, (n, 1))
        self.kd = np.tile(kd_nominal, (n, 1))
        self.torque_limits = np.tile(self._torque_limits_nominal, (n, 1))
        self.nominal_joint_pos = np.tile(a1.NOMINAL_JOINT_POS, (n, 1))

        dr = self.domain_randomization
        self.parameters = np.tile(dr.low, (n, 1))
        # latency: a ring of the last max_latency + 1 policy actions per env (None when no latency)
        self._fifo = np.zeros((n, dr.max_latency + 1, task.ACT_DIM)) if dr.max_latency > 0 else None
        self._fifo_head = 0
        self._latency = np.zeros(n, dtype=np.int64)
        self._push_every = np.zeros(n, dtype=np.int64)  # control steps between pushes, 0 = none
        self._episode_rngs: list[np.random.Generator | None] = [None] * n  # for pushes
        self._trace = ParameterTrace()
        self._episode_index = np.full(n, -1, dtype=np.int64)
        self._episode_return = np.zeros(n)
        self._episode_recorded = np.zeros(n, dtype=bool)
        self._arange = np.arange(n)

        self.command = np.zeros((n, 3))
        self.episode_step = np.zeros(n, dtype=np.int64)
        #: (N,) int64: seed of each env's current episode (drawn from the env's stream at reset).
        self.episode_seed = np.zeros(n, dtype=np.int64)
        self._obs = np.zeros((n, task.OBS_DIM), dtype=np.float32)
        self._last_action = np.zeros((n, task.ACT_DIM))
        self._autoreset_envs = np.zeros(n, dtype=bool)
        self._env_rngs: list[np.random.Generator | None] = [None] * n
        self._needs_reset = True
        self.step_latency: StepLatency | None = StepLatency()

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
            obs (N, 48) float32 and infos (dict of arrays with ``_key`` masks) of the reset
            envs: ``command`` (N, 3), ``episode_seed`` (N,) int64 and ``parameters`` (a dict
            of (N,) arrays, one per :data:`~unilab_gym.randomization.PARAMETER_NAMES`).

        Raises:
            ValueError: seed list of the wrong length, a bad ``reset_mask`` or ``episode_seed``.
            gymnasium.error.ClosedEnvironmentError: after ``close()``.
        """
        self._check_open()
        seeds = self._seed_list(seed)
        mask = np.ones(self.num_envs, dtype=bool)
        options = options or {}
        if "reset_mask" in options:
            mask = options["reset_mask"]
            if not isinstance(mask, np.ndarray) or mask.dtype != np.bool_ or mask.shape != (self.num_envs,):
                raise ValueError(
                    f"options['reset_mask'] must be a bool numpy array of shape ({self.num_envs},), got {mask!r}"
                )
            if not mask.any():
                raise ValueError("options['reset_mask'] must select at least one env")
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
        self._needs_reset = False
        return self._obs.copy(), self._reset_info(mask)

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Advance every env one control step (``substeps`` physics steps).

        Args:
            actions: (N, 12) array-like of floats; values outside [-1, 1] are clipped.

        Returns:
            obs (N, 48) float32, reward (N,) float64, terminated (N,) bool, truncated (N,) bool,
            infos: ``reward_terms`` (dict of (N,) float64), plus in SAME_STEP mode
            ``final_obs`` / ``final_info`` and in NEXT_STEP mode the reset info of autoreset envs.

        Raises:
            ValueError: wrong action shape (states the expected one) or NaN/inf actions
                (names the env indices; the world is not stepped).
            gymnasium.error.ResetNeeded: before the first ``reset()``.
            gymnasium.error.ClosedEnvironmentError: after ``close()``.
        """
        t_start = time.perf_counter_ns()
        self._check_open()
        if self._needs_reset:
            raise ResetNeeded("call reset() before step()")
        action = self._validate_actions(actions)
        restarting = (
            self._autoreset_envs.copy()
            if self.autoreset_mode == AutoresetMode.NEXT_STEP
            else np.zeros(self.num_envs, bool)
        )
        action[restarting] = 0.0  # NEXT_STEP: the action of an env that restarts now is ignored

        applied = action
        if self._fifo is not None:  # latency: apply the action of `latency` steps ago
            size = self._fifo.shape[1]
            self._fifo[:, self._fifo_head] = action
            applied = self._fifo[self._arange, (self._fifo_head - self._latency) % size]
            applied[restarting] = 0.0
            self._fifo_head = (self._fifo_head + 1) % size
        if self.domain_randomization.pushes:
            self._push(restarting)
        targets = self.nominal_joint_pos + self.action_scale * applied
        t_slice = time.perf_counter_ns()
        for rows, world in self._clusters:
            world.step(targets[rows], self.kp[rows], self.kd[rows], self.torque_limits[rows], self.substeps)
        physics_ns = time.perf_counter_ns() - t_slice
        self.episode_step += 1
        if restarting.any():
            self._reset_envs(restarting, [None] * self.num_envs)  # after the slice, so the new episode starts at rest
        t_read = time.perf_counter_ns()
        self._read_states(np.ones(self.num_envs, dtype=bool))
        physics_ns += time.perf_counter_ns() - t_read

        previous_action = self._last_action
        self._last_action = action
        self._last_action[restarting] = 0.0
        lin_b, ang_b = self._compute_obs()
        terms = task.reward_terms(
            lin_b,
            ang_b,
            self.command,
            self.state.torques,
            action,
            previous_action,
            self.reward_weights,
            self.control_dt,
        )
        conditions = task.fall_conditions(
            self.state.base_pos[:, 2], self.state.base_quat, self.state.trunk_contact, self.termination
        )
        terminated = conditions.any(axis=1)
        truncated = self.episode_step >= self.max_episode_steps
        terminated[restarting] = False
        truncated[restarting] = False
        for value in terms.values():
            value[restarting] = 0.0
        reward = np.sum(list(terms.values()), axis=0)
        all_envs = np.ones(self.num_envs, dtype=bool)
        infos: dict[str, Any] = self._step_info(terms, all_envs)
        if restarting.any():
            infos.update(self._reset_info(restarting))

        done = terminated | truncated
        self._episode_return += reward
        finished = done & ~self._episode_recorded
        if finished.any():
            self._record(finished, terminated, conditions)
        if self.autoreset_mode == AutoresetMode.SAME_STEP and done.any():
            final_obs = np.full(self.num_envs, None, dtype=object)
            for i in np.flatnonzero(done):
                final_obs[i] = self._obs[i].copy()
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
            self._autoreset_envs = done.copy()
        obs = self._obs.copy()
        if self.step_latency is not None:
            self.step_latency.physics.observe(physics_ns / 1e3)
            self.step_latency.task.observe((time.perf_counter_ns() - t_start - physics_ns) / 1e3)
        return obs, reward, terminated, truncated, infos

    def render(self) -> EnvFrames | None:
        """Frames of the envs as a sequence of N (H, W, 3) uint8 arrays, or ``None`` without a render mode.

        Only env 0 is drawn eagerly (the sequence is what gymnasium's vector ``RecordVideo``
        expects); env ``i`` is drawn when indexed. Robots outside cluster 0 are drawn from
        their collision shapes, as only cluster 0 loads visual shapes.
        """
        self._check_open()
        if self.render_mode is None:
            return None
        return EnvFrames(self)

    def render_env(self, index: int = 0, width: int = 320, height: int = 240) -> np.ndarray:
        """(height, width, 3) uint8 frame of a camera following env ``index``."""
        self._check_open()
        rows, world = self._cluster_of(index)
        return world.render(index - rows.start, width, height)

    def parameter_trace(self) -> list[dict[str, Any]]:
        """One record per finished episode (terminated or truncated) of every env, in the order they
        finished: env index, episode index, episode seed, command, parameters, return, length and
        termination cause. The format is in :mod:`unilab_gym.trace`."""
        return self._trace.records()

    def save_parameter_trace(self, path: str | Path) -> Path:
        """Write :meth:`parameter_trace` to ``path`` as JSON Lines, after a header line with the
        package versions and :attr:`task_config` (see :mod:`unilab_gym.trace`). Returns the path."""
        return write_jsonl(path, self.task_config, self.parameter_trace())

    def close_extras(self, **kwargs: Any) -> None:
        """Disconnect every pybullet world."""
        for _, world in getattr(self, "_clusters", []):
            world.close()

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

    # ------------------------------------------------------------------ internals
    def _check_open(self) -> None:
        if self.closed:
            raise ClosedEnvironmentError("UniLabVectorEnv is closed; create a new env")

    def _seed_list(self, seed: int | Sequence[int | None] | None) -> list[int | None]:
        if seed is None:
            return [None] * self.num_envs
        if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
            return [int(seed) + i for i in range(self.num_envs)]
        if isinstance(seed, (list, tuple, np.ndarray)):
            if len(seed) != self.num_envs:
                raise ValueError(f"seed list has length {len(seed)}, expected num_envs={self.num_envs}")
            bad = [
                s
                for s in seed
                if s is not None and (isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 0)
            ]
            if bad:
                raise ValueError(f"seeds must be non-negative ints or None, got {bad}")
            return [None if s is None else int(s) for s in seed]
        raise ValueError(f"seed must be an int, a list of {self.num_envs} ints/None, or None; got {seed!r}")

    def _validate_actions(self, actions: Any) -> np.ndarray:
        try:
            action = np.array(actions, dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"actions must be a numeric array of shape ({self.num_envs}, 12)") from None
        if action.shape != (self.num_envs, task.ACT_DIM):
            raise ValueError(f"actions must have shape ({self.num_envs}, {task.ACT_DIM}), got {action.shape}")
        bad = np.flatnonzero(~np.isfinite(action).all(axis=1))
        if bad.size:
            raise ValueError(f"actions contain NaN or inf for env indices {bad.tolist()}; the envs were not stepped")
        return np.clip(action, -1.0, 1.0)

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
        bad = [
            s
            for s in values
            if s is not None and (isinstance(s, bool) or not isinstance(s, (int, np.integer)) or not 0 <= s < 2**63)
        ]
        if bad:
            raise ValueError(f"options['episode_seed'] values must be ints in [0, 2**63) or None, got {bad}")
        return [None if s is None else int(s) for s in values]

    def _reset_envs(self, mask: np.ndarray, episode_seeds: list[int | None]) -> None:
        """New episode for the envs of ``mask``.

        Each env draws an episode seed from its own stream (or takes ``episode_seeds[i]``);
        the episode's command, initial pose, lane, physics parameters and pushes come from that
        seed alone (see :mod:`unilab_gym.sim.world` for why the lane matters to determinism).
        Every parameter is applied, so nothing of the slot's earlier episodes remains.
        """
        idx = np.flatnonzero(mask)
        joint_pos = np.empty((idx.size, task.ACT_DIM))
        lo, hi = self.command_ranges[:, 0], self.command_ranges[:, 1]
        for row, i in enumerate(idx):
            given = episode_seeds[i]
            self.episode_seed[i] = self._env_rngs[i].integers(2**63) if given is None else given
            rng = np.random.default_rng(int(self.episode_seed[i]))
            self.command[i] = rng.uniform(lo, hi)
            joint_pos[row] = self.nominal_joint_pos[i] + rng.uniform(
                -self.init_joint_noise, self.init_joint_noise, task.ACT_DIM
            )
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
                world.reset_robots(local, lanes[inside], joint_pos[inside])
        self.episode_step[idx] = 0
        self._last_action[idx] = 0.0
        self._episode_index[idx] += 1
        self._episode_return[idx] = 0.0
        self._episode_recorded[idx] = False

    def _push(self, restarting: np.ndarray) -> None:
        """Push the envs whose push is due before this step: add ``push_velocity`` m/s to the base,
        horizontally, in a direction drawn from the episode's stream."""
        every = self._push_every
        due = (every > 0) & (self.episode_step > 0) & (self.episode_step % np.maximum(every, 1) == 0) & ~restarting
        if not due.any():
            return
        idx = np.flatnonzero(due)
        angle = np.array([self._episode_rngs[i].uniform(0.0, 2.0 * np.pi) for i in idx])
        speed = self.parameters[idx, _COL["push_velocity"]]
        delta_v = np.stack([speed * np.cos(angle), speed * np.sin(angle), np.zeros(idx.size)], axis=1)
        for rows, world in self._clusters:
            inside = (idx >= rows.start) & (idx < rows.stop)
            if inside.any():
                world.push(idx[inside] - rows.start, delta_v[inside])

    def _record(self, finished: np.ndarray, terminated: np.ndarray, conditions: np.ndarray) -> None:
        """Add the episodes that just finished in envs ``finished`` to the parameter trace."""
        idx = np.flatnonzero(finished)
        self._trace.append(
            env=idx,
            episode=self._episode_index[idx],
            episode_seed=self.episode_seed[idx],
            command=self.command[idx],
            parameters=self.parameters[idx],
            returns=self._episode_return[idx],
            lengths=self.episode_step[idx],
            terminated=terminated[idx],
            conditions=conditions[idx],
        )
        self._episode_recorded[idx] = True

    def _read_states(self, mask: np.ndarray) -> None:
        for rows, world in self._clusters:
            if mask[rows].any():
                world.read_state()

    def _compute_obs(self) -> tuple[np.ndarray, np.ndarray]:
        """Refresh ``self._obs``; return base-frame linear and angular velocities (N, 3)."""
        s = self.state
        return task.observation(
            s.base_quat,
            s.lin_vel,
            s.ang_vel,
            self.command,
            s.joint_pos,
            self.nominal_joint_pos,
            s.joint_vel,
            self._last_action,
            out=self._obs,
        )

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

    @staticmethod
    def _step_info(terms: dict[str, np.ndarray], mask: np.ndarray) -> dict[str, Any]:
        """Gymnasium vector info for the reward terms of the envs in ``mask``."""
        nested: dict[str, Any] = {}
        for name, value in terms.items():
            nested[name] = np.where(mask, value, 0.0)
            nested[f"_{name}"] = mask.copy()
        return {"reward_terms": nested, "_reward_terms": mask.copy()}


class EnvFrames(Sequence):
    """A lazy sequence of the N envs' frames: ``frames[i]`` draws env ``i`` when first indexed."""

    def __init__(self, env: UniLabVectorEnv):
        self._env = env
        self._cache: dict[int, np.ndarray] = {0: env.render_env(0)}

    def __len__(self) -> int:
        return self._env.num_envs

    def __getitem__(self, index: int) -> np.ndarray:  # type: ignore[override]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        index = index + len(self) if index < 0 else index
        if index not in self._cache:
            self._cache[index] = self._env.render_env(index)
        return self._cache[index]


def replay_env(
    env_config: dict[str, Any], record: dict[str, Any], **env_kwargs: Any
) -> tuple[UniLabVectorEnv, np.ndarray, dict[str, Any]]:
    """A fresh 1-env :class:`UniLabVectorEnv` at the start of ``record``'s episode.

    Args:
        env_config: the env's ``task_config`` (a trace header's ``"env"``).
        record: a trace record: its ``parameters`` are fixed (as ``domain_randomization``) and the
            env is reset with ``options={"episode_seed": record["episode_seed"]}``.
        **env_kwargs: other constructor arguments, e.g. ``render_mode="rgb_array"`` or
            ``autoreset_mode="Disabled"`` (neither changes the trajectory).

    Returns:
        ``(env, obs, info)``: stepping ``env`` with the episode's actions reproduces it bit for bit.
    """
    missing = sorted(set(PARAMETER_NAMES) - set(record.get("parameters", {})))
    if missing:
        raise ValueError(f"record has no value for parameter(s) {missing}")
    env = UniLabVectorEnv(1, **{**env_config, "domain_randomization": record["parameters"], **env_kwargs})
    obs, info = env.reset(options={"episode_seed": record["episode_seed"]})
    return env, obs, info
