"""The task seam: :class:`Task`, batched numpy over all N envs, and the :class:`TaskConfig` it is built from.

:class:`~unilab_gym.vector_env.UniLabVectorEnv` (the engine) owns everything every task shares: the Gymnasium
contract, seeding and episode seeds, autoreset modes, the EIC clusters of pybullet worlds (the only pybullet
caller is :mod:`unilab_gym.sim.world`), PD actuation with latency and pushes, domain randomization, the parameter
trace and privileged observations. A :class:`Task` owns what makes the task: what the robot is
(:attr:`TaskConfig.robot`), what world it needs (:attr:`Task.scene`), each episode's command or target and initial
pose (:meth:`Task.sample_episode`), the observation (:meth:`Task.observe`, :meth:`Task.critic_observe`), the weighted
reward terms and the termination conditions (:meth:`Task.evaluate`) and the truncation (:meth:`Task.truncation`).
A task only reads :class:`~unilab_gym.sim.world.RobotState` arrays and writes numpy arrays: it never calls pybullet.

One control step, as the engine calls the task::

    actions (N, A) -> engine: PD targets = nominal pose + action_scale * action -> every world: K substeps
      -> robot states (N, ...) -> task.observe(state, last_action, out=obs)
      -> task.evaluate(state, action, previous_action, restarting) -> (reward terms, conditions)
      -> engine: reward = sum of the terms in order; terminated = any condition; truncated = task.truncation(...)
      -> engine: autoreset -> for each new episode: task.sample_episode(env, rng) -> task.start_episodes(idx)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np

from unilab_gym.randomization import DomainRandomization
from unilab_gym.robots import RobotDescription
from unilab_gym.sim.camera import Camera
from unilab_gym.sim.scene import ObjectEpisodes, Scene, TerrainEpisodes

#: The values of :attr:`Task.actuation`.
ACTUATIONS = ("joint_pd", "external")

if TYPE_CHECKING:  # the task layer never imports the physics layer (nor pybullet) at run time
    from unilab_gym.sim.world import RobotState


class TaskConfig(Protocol):
    """What the engine reads from a task's configuration.

    A frozen dataclass, e.g. :class:`~unilab_gym.tasks.config.QuadrupedConfig`; its fields are the task's keyword
    arguments.
    """

    @property
    def robot(self) -> RobotDescription:
        """The robot every env holds."""
        ...

    @property
    def max_episode_steps(self) -> int:
        """Control steps before ``truncated``."""
        ...

    @property
    def dt(self) -> float:
        """Physics time step in s."""
        ...

    @property
    def substeps(self) -> int:
        """Physics steps per control step."""
        ...

    @property
    def solver_iterations(self) -> int:
        """The pybullet ``numSolverIterations``."""
        ...

    @property
    def kp(self) -> tuple[float, ...]:
        """PD stiffness per joint, N·m/rad."""
        ...

    @property
    def kd(self) -> tuple[float, ...]:
        """PD damping per joint, N·m·s/rad."""
        ...

    @property
    def action_scale(self) -> float:
        """Joint target offset in rad per unit of action."""
        ...

    @property
    def domain_randomization(self) -> DomainRandomization:
        """Physics parameter ranges."""
        ...

    @property
    def control_dt(self) -> float:
        """The control period ``dt * substeps`` in s."""
        ...

    def to_dict(self) -> dict[str, Any]:
        """The configuration as JSON types: the env's ``task_config``."""
        ...


class Task(ABC):
    """Batched task math of N envs: observation, reward terms, termination, truncation, episode sampling.

    A subclass sets the class attributes, and implements the abstract methods with numpy over all N envs (a loop
    over envs only in :meth:`sample_episode`, which draws one episode from that episode's own random stream).

    Args:
        num_envs: N.
        config: the task's configuration (a :meth:`config_type`), validated.

    Attributes:
        config: the configuration.
        robot: ``config.robot``.
        scene: the world the task needs (default: a plane); the engine builds every world from it.
        command: (N, C) float64, each env's command or target for its current episode (written by
            :meth:`sample_episode`); in the reset info as ``"command"`` and in the parameter trace.
        nominal_joint_pos: (N, J) float64, the robot's nominal pose, per env.
        episode_parameters: (N, len(:attr:`episode_parameter_names`)) float64, each env's episode parameters for
            its current episode (written by :meth:`sample_episode`, from the episode's stream); in the trace.
        objects: ``None`` (default), or with ``scene.objects`` each env's object for its current episode
            (:class:`~unilab_gym.sim.scene.ObjectEpisodes`, written by :meth:`sample_episode`); the engine builds it
            in the physics world at the env's reset.
        terrain: ``None`` (default), or with ``scene.terrain`` each env's heightfield tile for its current episode
            (:class:`~unilab_gym.sim.scene.TerrainEpisodes`, heights written by :meth:`sample_episode`); the engine
            builds it at the env's reset, spawns the robot above its centre and writes the centre into ``origin``.
    """

    #: Policy observation width.
    obs_dim: ClassVar[int]
    #: Critic (privileged) observation width (``privileged_obs=True``).
    critic_obs_dim: ClassVar[int]
    #: Observation layout: name -> (start, stop) columns.
    obs_layout: ClassVar[dict[str, tuple[int, int]]]
    #: Critic observation layout: name -> (start, stop) columns.
    critic_obs_layout: ClassVar[dict[str, tuple[int, int]]]
    #: Command width C.
    command_dim: ClassVar[int]
    #: Names of the termination conditions, the columns of :meth:`evaluate`'s conditions.
    termination_names: ClassVar[tuple[str, ...]]
    #: How the engine moves the robots (one of :data:`ACTUATIONS`). ``"joint_pd"`` (default): the action is joint
    #: position targets ``nominal pose + action_scale * action``, tracked by PD torques every substep.
    #: ``"external"``: the robot has no actuated joints; once per control step the engine asks :meth:`forces` for a
    #: force and torque on each robot's base and the physics layer applies them in every substep (a quadrotor's
    #: rotors, :mod:`unilab_gym.tasks.quadrotor`).
    actuation: ClassVar[str] = "joint_pd"
    #: Names of the task's own per-episode parameters (e.g. an object's shape, size, mass), recorded in the
    #: parameter trace after the physics parameters; their values are :attr:`episode_parameters`.
    episode_parameter_names: ClassVar[tuple[str, ...]] = ()
    #: Where the frames of ``render_mode="rgb_array"`` are taken from (:class:`~unilab_gym.sim.camera.Camera`):
    #: default the quadruped's view, following the base at z = 0.25 m.
    camera: ClassVar[Camera] = Camera()

    def __init__(self, num_envs: int, config: TaskConfig):
        """Allocate the per-env arrays of ``num_envs`` envs for ``config`` (arguments: see the class docstring)."""
        self.num_envs = num_envs
        self.config = config
        self.robot: RobotDescription = config.robot
        self.scene = Scene()
        self.command = np.zeros((num_envs, self.command_dim))
        self.episode_parameters = np.zeros((num_envs, len(self.episode_parameter_names)))
        self.objects: ObjectEpisodes | None = None
        self.terrain: TerrainEpisodes | None = None
        self.nominal_joint_pos = np.tile(np.array(self.robot.nominal_joint_pos), (num_envs, 1))

    @classmethod
    @abstractmethod
    def config_type(cls) -> type:
        """The configuration dataclass whose fields are the task's keyword arguments (a :class:`TaskConfig`)."""

    @property
    def act_dim(self) -> int:
        """Action width: one joint position target per actuated joint of the robot."""
        return self.robot.num_joints

    @abstractmethod
    def sample_episode(self, env: int, rng: np.random.Generator) -> np.ndarray:
        """Draw env ``env``'s new episode from ``rng`` (its episode's stream).

        Writes ``command[env]`` and returns its initial joint angles (J,) float64 in rad. The engine then draws the
        physics parameters from the same stream, so the number of draws here must not depend on anything but the
        configuration.
        """

    @classmethod
    def replay_kwargs(cls, parameters: dict[str, Any]) -> dict[str, Any]:
        """Configuration changes that make a fresh env's first episode the recorded one.

        Computed from a trace record's ``parameters`` (the physics parameters and :attr:`episode_parameter_names`):
        what the episode seed alone does not give, e.g. state the task carries across episodes (a terrain
        curriculum's level). Default: none (``{}``: every draw of :meth:`sample_episode` comes from the episode seed).
        :func:`~unilab_gym.trace_replay.replay_env` passes them to the env with the trace's configuration.
        """
        return {}

    @abstractmethod
    def start_episodes(self, idx: np.ndarray) -> None:
        """Clear the task's per-episode state (e.g. feet air times) of envs ``idx`` ((k,) int).

        Called when those envs start a new episode.
        """

    @abstractmethod
    def observe(self, state: RobotState, last_action: np.ndarray, out: np.ndarray) -> None:
        """Write the (N, :attr:`obs_dim`) float32 observation of ``state`` into ``out``.

        Args:
            state: the N robots' states after this step (or reset).
            last_action: (N, A) float64, the clipped action of this step (0 for an env that just started).
            out: (N, obs_dim) float32, written in place.
        """

    @abstractmethod
    def critic_observe(self, state: RobotState, obs: np.ndarray, parameters: np.ndarray, out: np.ndarray) -> None:
        """Write the (N, :attr:`critic_obs_dim`) float32 critic observation into ``out``.

        Args:
            state: the robots' states.
            obs: (N, obs_dim) float32, the policy observation of the same step.
            parameters: (N, P) float64, the episodes' physics parameters
                (:data:`~unilab_gym.randomization.PARAMETER_NAMES`).
            out: written in place.
        """

    @abstractmethod
    def evaluate(
        self, state: RobotState, action: np.ndarray, previous_action: np.ndarray, restarting: np.ndarray
    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """The outcome of this step, after :meth:`observe` of the same state.

        Args:
            state: the robots' states after this step.
            action: (N, A) float64, this step's clipped action.
            previous_action: (N, A) float64, the previous step's.
            restarting: (N,) bool, envs that started a new episode at this step (NEXT_STEP autoreset): their task
                state must be that of a fresh episode; the engine zeroes their terms and flags.

        Returns:
            ``(terms, conditions)``: the weighted reward terms, each (N,) float64, in the order the reward sums them
            (``info["reward_terms"]``); and (N, len(:attr:`termination_names`)) bool, which termination conditions
            hold (``terminated`` is their OR).
        """

    def forces(self, state: RobotState, action: np.ndarray) -> np.ndarray:
        """The external wrench on each robot's base during this control step (:attr:`actuation` ``"external"``).

        Called once per control step, before the physics slice, with the states the last step (or reset) read;
        the physics layer (:meth:`~unilab_gym.sim.world.ClusterWorld.step_external`) applies the same wrench at
        the base's centre of mass in every substep of the slice (pybullet clears external forces after each).

        Args:
            state: the N robots' states before this step.
            action: (N, A) float64, the action applied this step (clipped; after latency; 0 for an env that is
                restarting).

        Returns:
            (N, 6) float64: force (N) then torque (N·m), both in the base (link) frame.

        Raises:
            NotImplementedError: the default, for a ``"joint_pd"`` task.
        """
        raise NotImplementedError(f"{type(self).__name__} has actuation {self.actuation!r}: it defines no forces()")

    def joint_targets(self, action: np.ndarray, action_scale: float) -> np.ndarray:
        """(N, J) float64 joint position targets (rad, m for prismatic joints) of the applied action.

        ``action`` is (N, :attr:`act_dim`) (``"joint_pd"`` actuation). Default: ``nominal pose + action_scale *
        action`` (one target per joint); a task whose action is not one number per joint (e.g. one gripper action for
        two fingers) maps it here.
        """
        return self.nominal_joint_pos + action_scale * action

    def step_info(self) -> dict[str, np.ndarray]:
        """Task-specific entries of this step's info, each (N,) (e.g. ``"is_success"``, bool).

        Computed in the last :meth:`evaluate`; the engine puts them in the info next to ``reward_terms`` (with their
        ``_key`` masks, and in ``final_info`` with SAME_STEP autoreset). Default: none.
        """
        return {}

    def render_target(self) -> np.ndarray | None:
        """(N, 3) float64 m: a point to mark in rendered frames (the episode's target), or ``None`` (default).

        Relative to each env's spawn point (its base at reset), world axes; ``None``: no marker. Drawn as a small red
        sphere that nothing collides with (:meth:`unilab_gym.sim.world.ClusterWorld.render`).
        """
        return None

    def truncation(self, episode_step: np.ndarray, max_episode_steps: int) -> np.ndarray:
        """(N,) bool ``truncated``: by default the episode reached ``max_episode_steps`` control steps."""
        return episode_step >= max_episode_steps
