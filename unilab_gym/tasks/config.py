"""``QuadrupedConfig``: every constructor argument of ``UniLab/Quadruped-v0`` that shapes its trajectories.

The fields are the task keyword arguments of :class:`~unilab_gym.vector_env.UniLabVectorEnv` and
:class:`~unilab_gym.envs.QuadrupedEnv` (``gym.make(..., **kwargs)``), written here once with their
units and defaults; ``env.task_config`` is :meth:`QuadrupedConfig.to_dict`. The arguments that do not
change a trajectory (``num_envs``, ``envs_per_cluster``, ``render_mode``, ``autoreset_mode``,
``trace_max_records``, ``trace_path``) are not part of it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from unilab_gym.randomization import DomainRandomization
from unilab_gym.sim import a1
from unilab_gym.tasks.quadruped import RewardWeights, TerminationConfig
from unilab_gym.validation import check_positive, check_positive_int, check_real


@dataclass(frozen=True)
class QuadrupedConfig:
    """The task configuration of ``UniLab/Quadruped-v0``, validated once when made.

    Each field also accepts the JSON form :meth:`to_dict` writes (lists for tuples, dicts for
    ``reward_weights``, ``termination`` and ``domain_randomization``) and a single number for
    ``kp`` / ``kd``; :meth:`__post_init__` converts it to the stored type, so
    ``QuadrupedConfig(**config.to_dict()) == config``.

    Raises:
        ValueError: an invalid value, naming the field (or the key inside it) and the value.
    """

    max_episode_steps: int = 1000
    """Control steps before ``truncated`` (1000 = 20 s at the default 50 Hz), >= 1."""
    dt: float = 0.005
    """Physics time step in s, > 0."""
    substeps: int = 4
    """Physics steps per control step (decimation), >= 1: the control period is ``dt * substeps`` (20 ms)."""
    kp: tuple[float, ...] = (20.0,) * a1.NUM_JOINTS
    """PD stiffness in N·m/rad per joint (12 values >= 0, or one for all); default 20 (legged_gym A1)."""
    kd: tuple[float, ...] = (0.5,) * a1.NUM_JOINTS
    """PD damping in N·m·s/rad per joint (12 values >= 0, or one for all); default 0.5 (legged_gym A1)."""
    action_scale: float = 0.25
    """Joint target offset in rad per unit of action, > 0 (legged_gym 0.25)."""
    solver_iterations: int = 10
    """pybullet ``numSolverIterations``, >= 1."""
    lin_vel_x_range: tuple[float, float] = (0.3, 1.0)
    """(low, high) of the forward velocity command in m/s, drawn uniformly per episode."""
    lin_vel_y_range: tuple[float, float] = (0.0, 0.0)
    """(low, high) of the sideways velocity command in m/s."""
    yaw_rate_range: tuple[float, float] = (0.0, 0.0)
    """(low, high) of the yaw rate command in rad/s."""
    reward_weights: RewardWeights = field(default_factory=RewardWeights)
    """Weights of the reward terms (a dict overrides the defaults of :class:`RewardWeights`)."""
    base_height_target: float = 0.27
    """Base height in m the ``base_height`` reward term pulls toward, > 0: the A1's nominal standing height
    (0.269 m measured by ``evaluate_gait``; legged_gym's A1 ``base_height_target`` is 0.25)."""
    feet_air_time_target: float = 0.25
    """Air time in s over which a touchdown makes ``feet_air_time`` positive, >= 0 (legged_gym 0.5; with 0.5 every
    step of the A1's short strides costs reward and dragging a foot pays best, see ``docs/env.md``)."""
    feet_air_time_max: float = 1000.0
    """Air time in s at which a touchdown's ``feet_air_time`` stops growing, > 0. The default (longer than any
    episode) is no cap, as in legged_gym; a cap of a stride's swing (e.g. 0.3 s) stops the term from paying for a
    foot held up, which with ``action_scale`` 0.5 stock PPO learned (a three-legged limp, ``docs/env.md``)."""
    termination: TerminationConfig = field(default_factory=TerminationConfig)
    """When a robot has fallen (a dict overrides the defaults of :class:`TerminationConfig`)."""
    init_joint_noise: float = 0.05
    """Half-width in rad (>= 0) of the uniform noise added to the nominal joint angles at reset."""
    domain_randomization: DomainRandomization = field(default_factory=DomainRandomization)
    """Physics parameter ranges (``None`` or a dict: see :class:`~unilab_gym.randomization.DomainRandomization`)."""

    def __post_init__(self) -> None:
        """Validate every field and convert it to its stored type (see the class docstring)."""
        converted = {
            "max_episode_steps": check_positive_int("max_episode_steps", self.max_episode_steps),
            "dt": check_positive("dt", self.dt),
            "substeps": check_positive_int("substeps", self.substeps),
            "kp": _joint_gains("kp", self.kp),
            "kd": _joint_gains("kd", self.kd),
            "action_scale": check_positive("action_scale", self.action_scale),
            "solver_iterations": check_positive_int("solver_iterations", self.solver_iterations),
            "lin_vel_x_range": _range("lin_vel_x_range", self.lin_vel_x_range),
            "lin_vel_y_range": _range("lin_vel_y_range", self.lin_vel_y_range),
            "yaw_rate_range": _range("yaw_rate_range", self.yaw_rate_range),
            "reward_weights": _overrides("reward_weights", RewardWeights, self.reward_weights),
            "base_height_target": check_positive("base_height_target", self.base_height_target),
            "feet_air_time_target": check_real("feet_air_time_target", self.feet_air_time_target, minimum=0.0),
            "feet_air_time_max": check_positive("feet_air_time_max", self.feet_air_time_max),
            "termination": _overrides("termination", TerminationConfig, self.termination),
            "init_joint_noise": check_real("init_joint_noise", self.init_joint_noise, minimum=0.0),
            "domain_randomization": (
                self.domain_randomization
                if isinstance(self.domain_randomization, DomainRandomization)
                else DomainRandomization(self.domain_randomization)
            ),
        }
        for name, value in converted.items():
            object.__setattr__(self, name, value)

    @property
    def control_dt(self) -> float:
        """The control period in s: ``dt * substeps``."""
        return self.dt * self.substeps

    def to_dict(self) -> dict[str, Any]:
        """The configuration as JSON types (lists, dicts, numbers, bools), in field order.

        ``UniLabVectorEnv(n, **config.to_dict())`` makes envs with this configuration; it is the
        envs' ``task_config`` and the ``"env"`` of a parameter-trace header.
        """
        return {f.name: _jsonable(getattr(self, f.name)) for f in fields(self)}


def check_task_kwargs(owner: str, kwargs: Mapping[str, Any], other_args: Sequence[str]) -> None:
    """Check that every key of ``kwargs`` is a field of :class:`QuadrupedConfig` or one of ``other_args``.

    Args:
        owner: the name of the class taking them, for the message.
        kwargs: keyword arguments given to ``owner``.
        other_args: the arguments ``owner`` takes besides the task configuration.

    Raises:
        TypeError: naming the unknown keys and listing the valid ones.
    """
    task_args = [f.name for f in fields(QuadrupedConfig)]
    unknown = sorted(str(k) for k in kwargs if k not in task_args and k not in other_args)
    if unknown:
        raise TypeError(
            f"{owner} got unexpected keyword argument(s) {unknown}; valid arguments: {[*other_args, *task_args]}"
        )


def _joint_gains(name: str, value: Any) -> tuple[float, ...]:
    """One gain per joint: a number for all of them or a sequence of 12, each a finite float >= 0."""
    if isinstance(value, (Sequence, np.ndarray)) and not isinstance(value, (str, bytes)):
        values = list(value)
    else:
        values = [value] * a1.NUM_JOINTS
    if len(values) != a1.NUM_JOINTS:
        raise ValueError(f"{name} must be a number >= 0 or {a1.NUM_JOINTS} of them, got {value!r}")
    return tuple(check_real(name, v, minimum=0.0) for v in values)


def _range(name: str, value: Any) -> tuple[float, float]:
    """A (low, high) pair of finite floats with low <= high."""
    if not isinstance(value, (Sequence, np.ndarray)) or isinstance(value, (str, bytes)) or len(value) != 2:
        raise ValueError(f"{name} must be a (low, high) pair of numbers, got {value!r}")
    lo, hi = check_real(name, value[0]), check_real(name, value[1])
    if lo > hi:
        raise ValueError(f"{name} must satisfy low <= high, got {value!r}")
    return lo, hi


def _overrides(name: str, cls: Any, value: Any) -> Any:
    """``value`` if it is a ``cls``, else ``cls.from_dict(value)`` (a mapping of overrides or ``None``)."""
    if isinstance(value, cls):
        return value
    if value is not None and not isinstance(value, Mapping):
        raise ValueError(f"{name} must be a {cls.__name__}, a dict of its fields or None, got {value!r}")
    return cls.from_dict(value)


def _jsonable(value: Any) -> Any:
    if isinstance(value, DomainRandomization):
        return value.to_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, tuple):
        return list(value)
    return value
