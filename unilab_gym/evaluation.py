"""Policy evaluation: episodes of any task, and what a policy does with a legged robot, beyond its return.

:func:`evaluate_episodes` works for every registered task: one episode per env, its return, length, whether it
ended ``terminated``, and its success (``info["is_success"]`` at the episode's last step, the Gymnasium-Robotics
convention) where the task defines one (:class:`EpisodeRecord`).

:func:`evaluate_gait` is for the legged tasks alone (a :class:`~unilab_gym.tasks.quadruped.QuadrupedTask`:
``UniLab/Quadruped-v0`` and ``UniLab/QuadrupedRough-v0``, with any ``robot=``); another task (an arm, a
quadrotor: no feet, no velocity command) is refused with a ``ValueError`` naming it. It runs
``n_episodes`` episodes of a policy, one per env of ONE :class:`~unilab_gym.vector_env.UniLabVectorEnv`
(env ``i`` seeded ``seed + i``, so the result is the same for a given seed, whatever else ran before),
and summarizes them:

=======================  =====================================================================
key                      meaning
=======================  =====================================================================
``return_mean``          mean episode return (sum of rewards)
``return_std``           its standard deviation over episodes
``tracking_error_mps``   mean ``|v_x - command v_x|`` over all steps of all episodes, m/s
                         (``v_x``: base forward velocity in the base frame, as observed)
``fall_rate``            fraction of episodes that ended ``terminated`` (a fall), not truncated
``duty_factor``          mean fraction of steps each foot is in contact with the ground
``cost_of_transport``    ``sum_t P_t / (m g sum_t |v_xy,t|)``: mechanical power
                         ``P = sum_j |tau_j * qdot_j|`` (W) over mass ``m`` (kg, URDF of the
                         env's robot plus added mass), ``g = 9.81`` m/s², and planar speed
                         (m/s); dimensionless. The ratio of sums keeps a robot that stands
                         still finite (large) instead of dividing by zero per step. Source:
                         the mechanical cost of transport of Tucker (1975), as used for legged
                         robots by Seok et al. (2015), "Design principles for
                         energy-efficient legged locomotion", IEEE/ASME T-Mech.
``base_height_m``        mean base (trunk) height above the ground (on rough terrain: above the
                         terrain under the base, the task's ``base_height``), m
``tilt_rad``             mean ``|roll| + |pitch|`` of the base, rad
``episodes``             number of episodes (``n_episodes``)
=======================  =====================================================================

Per-foot and per-episode figures are in :func:`record_gait`'s :class:`GaitRecord`.
"""

from __future__ import annotations

import contextlib
import math
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from unilab_gym.registration import QUADRUPED_ID
from unilab_gym.robots import resolve_urdf
from unilab_gym.sim import a1
from unilab_gym.sim.rotation import roll_pitch
from unilab_gym.sim.world import GRAVITY
from unilab_gym.tasks.quadruped import OBS_LAYOUT, QuadrupedTask
from unilab_gym.validation import check_int, check_positive_int
from unilab_gym.vector_env import UniLabVectorEnv

#: Foot order of :attr:`GaitRecord.duty_factor` columns (the joint order's legs).
FEET: tuple[str, ...] = ("FR", "FL", "RR", "RL")

_VX = OBS_LAYOUT["base_lin_vel"][0]
_VY = _VX + 1
_CMD_VX = OBS_LAYOUT["command"][0]


@cache
def urdf_mass(path: str = a1.URDF_PATH) -> float:
    """Total mass in kg of the links of a URDF file (sum of every ``<inertial><mass value=...>``)."""
    root = ET.parse(path).getroot()
    return float(sum(float(m.get("value", 0.0)) for m in root.iter("mass")))


@dataclass(frozen=True)
class GaitRecord:
    """Per-episode figures of an evaluation (``E`` episodes), float64 unless noted.

    ``returns`` (E,); ``lengths`` (E,) int64, control steps; ``terminated`` (E,) bool, the episode
    ended in a fall; ``tracking_error_sum`` (E,) sum over steps of ``|v_x - command v_x|`` (m/s);
    ``duty_factor`` (E, 4) fraction of steps each foot (:data:`FEET` order) was in contact;
    ``energy`` (E,) sum over steps of mechanical power (W, one value per control step);
    ``distance`` (E,) sum over steps of planar speed (m/s); ``mass`` (E,) kg;
    ``base_height_sum`` (E,) m; ``tilt_sum`` (E,) rad.
    """

    returns: np.ndarray
    lengths: np.ndarray
    terminated: np.ndarray
    tracking_error_sum: np.ndarray
    duty_factor: np.ndarray
    energy: np.ndarray
    distance: np.ndarray
    mass: np.ndarray
    base_height_sum: np.ndarray
    tilt_sum: np.ndarray

    def summary(self) -> dict[str, float | int]:
        """The figures of :func:`evaluate_gait` (see the module docstring for their meaning)."""
        steps = float(self.lengths.sum())
        distance_weighted = float((self.mass * GRAVITY * self.distance).sum())
        return {
            "return_mean": float(self.returns.mean()),
            "return_std": float(self.returns.std()),
            "tracking_error_mps": float(self.tracking_error_sum.sum() / steps),
            "fall_rate": float(self.terminated.mean()),
            "duty_factor": float(self.duty_factor.mean()),
            "cost_of_transport": float(self.energy.sum() / distance_weighted) if distance_weighted > 0 else math.inf,
            "base_height_m": float(self.base_height_sum.sum() / steps),
            "tilt_rad": float(self.tilt_sum.sum() / steps),
            "episodes": int(self.returns.size),
        }

    def episode_figures(self, i: int) -> dict[str, float]:
        """Episode ``i``'s gait figures, as per-step means in the units of :meth:`summary`.

        ``tracking_error_mps``, ``duty_factor`` (mean over feet), ``base_height_m`` and ``tilt_rad``.
        """
        steps = float(self.lengths[i])
        return {
            "tracking_error_mps": float(self.tracking_error_sum[i] / steps),
            "duty_factor": float(self.duty_factor[i].mean()),
            "base_height_m": float(self.base_height_sum[i] / steps),
            "tilt_rad": float(self.tilt_sum[i] / steps),
        }


class GaitMeter:
    """Accumulates the gait of ``n`` envs step by step, one episode per env, into a :class:`GaitRecord`.

    Call :meth:`update` after every step of the vector env; an env's episode ends at its first
    ``terminated | truncated``, and later steps of that env are ignored (whatever the autoreset mode).

    Args:
        added_mass: (n,) kg added to each robot (``reset`` info ``["parameters"]["added_mass"]``).
        robot_mass: the robot's own mass, kg (:func:`urdf_mass` of its URDF); default the A1's.
    """

    def __init__(self, added_mass: np.ndarray, robot_mass: float | None = None) -> None:
        """Start every env's episode with zero sums (arguments: see the class docstring)."""
        n = len(added_mass)
        self.mass = (urdf_mass() if robot_mass is None else float(robot_mass)) + np.asarray(added_mass, np.float64)
        #: (n,) bool: envs whose episode has not ended yet.
        self.active = np.ones(n, bool)
        self.returns, self.tracking, self.energy = np.zeros(n), np.zeros(n), np.zeros(n)
        self.distance, self.height, self.tilt = np.zeros(n), np.zeros(n), np.zeros(n)
        self.contact_steps = np.zeros((n, len(FEET)))
        self.lengths = np.zeros(n, np.int64)
        self.fell = np.zeros(n, bool)

    def update(
        self,
        obs: np.ndarray,
        reward: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        state: Any,
        base_height: np.ndarray | None = None,
    ) -> None:
        """Count one step of the envs whose episode has not ended.

        ``obs`` (n, 48), ``reward``/``terminated``/``truncated`` (n,), ``state`` the env's ``robot_state`` after the
        step, ``base_height`` (n,) m above the ground (default: the base's z, above the plane; on rough terrain pass
        the task's ``base_height(state)``).
        """
        active = self.active
        live = active.astype(np.float64)
        self.returns += live * reward
        self.lengths += active
        self.tracking += live * np.abs(obs[:, _VX] - obs[:, _CMD_VX])
        self.contact_steps += live[:, None] * state.foot_contact
        self.energy += live * np.abs(state.torques * state.joint_vel).sum(axis=1)
        self.distance += live * np.hypot(obs[:, _VX], obs[:, _VY])
        self.height += live * (state.base_pos[:, 2] if base_height is None else base_height)
        roll, pitch = roll_pitch(state.base_quat)
        self.tilt += live * (np.abs(roll) + np.abs(pitch))
        ended = active & (terminated | truncated)
        self.fell |= ended & terminated
        self.active = active & ~ended

    def record(self) -> GaitRecord:
        """The figures so far (every episode should have ended: ``not active.any()``)."""
        return GaitRecord(
            returns=self.returns.copy(),
            lengths=self.lengths.copy(),
            terminated=self.fell.copy(),
            tracking_error_sum=self.tracking.copy(),
            duty_factor=self.contact_steps / np.maximum(self.lengths, 1)[:, None],
            energy=self.energy.copy(),
            distance=self.distance.copy(),
            mass=self.mass.copy(),
            base_height_sum=self.height.copy(),
            tilt_sum=self.tilt.copy(),
        )


def _normalizer(vecnormalize: Any) -> Any:
    """A function obs -> normalized obs from a ``VecNormalize`` (or a path to its saved statistics), or identity."""
    if vecnormalize is None:
        return lambda obs: obs
    if isinstance(vecnormalize, (str, Path)):
        import pickle

        with open(vecnormalize, "rb") as f:  # a file the caller named: SB3's own format (a pickle)
            vecnormalize = pickle.load(f)
    if not hasattr(vecnormalize, "normalize_obs"):
        raise ValueError(
            f"vecnormalize must be a VecNormalize, a path to its saved statistics, or None; got {vecnormalize!r}"
        )
    return vecnormalize.normalize_obs


def _checked_arguments(model: Any, n_episodes: Any, seed: Any, vecnormalize: Any) -> tuple[int, int, Any]:
    """``(n_episodes, seed, normalize)`` of an evaluation, checked before any env is made.

    Raises:
        ValueError: ``n_episodes`` is not a positive int, ``seed`` not an int >= 0, ``model`` has no ``predict``,
            or ``vecnormalize`` is not a ``VecNormalize``, a path to its statistics, or ``None``.
    """
    n = check_positive_int("n_episodes", n_episodes)
    seed = check_int("seed", seed, minimum=0)
    if not hasattr(model, "predict"):
        raise ValueError(
            f"model must have an SB3-style predict(obs, deterministic=...) method, got {type(model).__name__}"
        )
    return n, seed, _normalizer(vecnormalize)


def record_gait(
    model: Any,
    env_id: str = QUADRUPED_ID,
    n_episodes: int = 16,
    *,
    vecnormalize: Any = None,
    seed: int = 0,
    deterministic: bool = True,
    **env_kwargs: Any,
) -> GaitRecord:
    """Run one episode per env of a ``n_episodes``-env vector env and record its gait (see :func:`evaluate_gait`)."""
    n, seed, normalize = _checked_arguments(model, n_episodes, seed, vecnormalize)
    env = gym.make_vec(env_id, num_envs=n, **env_kwargs)
    base = env.unwrapped
    if not isinstance(base, UniLabVectorEnv):
        env.close()
        raise ValueError(
            f"evaluate_gait needs a UniLabVectorEnv (it reads robot states); {env_id!r} made {type(base).__name__}"
        )
    if not isinstance(base.task, QuadrupedTask):
        env.close()
        raise ValueError(
            f"evaluate_gait measures a legged gait (feet contacts, tracking of a base-velocity command), but "
            f"{env_id!r} is a {type(base.task).__name__}, which has neither; use evaluate_episodes (returns, "
            "lengths, terminations, success rate), which works for every task"
        )
    # sampled actions draw from torch's global generator: seed it for this evaluation, and restore it after
    sampling = contextlib.nullcontext() if deterministic else _seeded_torch(seed)
    try:
        with sampling:
            obs, info = env.reset(seed=seed)
            meter = GaitMeter(info["parameters"]["added_mass"], urdf_mass(resolve_urdf(base.robot.urdf)))
            while meter.active.any():
                action, _ = model.predict(normalize(obs), deterministic=deterministic)
                obs, reward, terminated, truncated, _ = env.step(np.asarray(action, np.float32))
                state = base.robot_state
                task: QuadrupedTask = base.task  # checked above
                meter.update(obs, reward, terminated, truncated, state, task.base_height(state))
    finally:
        env.close()
    return meter.record()


@contextlib.contextmanager
def _seeded_torch(seed: int) -> Iterator[None]:
    """Within the block, torch's generators (CPU and CUDA) start from ``seed``; their state is restored after."""
    import torch

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        yield


def evaluate_gait(
    model: Any,
    env_id: str = QUADRUPED_ID,
    n_episodes: int = 16,
    *,
    vecnormalize: Any = None,
    seed: int = 0,
    deterministic: bool = True,
) -> dict[str, float | int]:
    """Evaluate a policy's gait over ``n_episodes`` episodes, all in one vector env.

    Args:
        model: anything with SB3's ``predict(obs, deterministic=...) -> (actions, state)``
            (``PPO``, ``SAC``, ...), taking (n, 48) float32 observations and giving (n, 12) actions.
        env_id: a registered id whose vector env is a :class:`~unilab_gym.vector_env.UniLabVectorEnv` of a
            legged task (a :class:`~unilab_gym.tasks.quadruped.QuadrupedTask`: ``UniLab/Quadruped-v0``,
            ``UniLab/QuadrupedRough-v0``); for another task use :func:`evaluate_episodes`.
        n_episodes: episodes, one per env (env ``i`` seeded ``seed + i``), each up to the env's
            ``max_episode_steps`` (1000 control steps, 20 s, by default).
        vecnormalize: the ``VecNormalize`` the model was trained with (its observation statistics
            are applied, not updated), or the path of its saved statistics (``VecNormalize.save``;
            a pickle, so only pass a file you trust), or ``None``.
        seed: the evaluation seed (int >= 0); the result is deterministic for a given seed.
        deterministic: the policy's deterministic action (its mean), else sampled actions (drawn
            from torch's generators seeded with ``seed`` for the evaluation, then restored, so
            sampled evaluations are deterministic for a given seed too).

    Returns:
        A dict with the keys ``return_mean``, ``return_std``, ``tracking_error_mps``,
        ``fall_rate``, ``duty_factor``, ``cost_of_transport``, ``base_height_m``, ``tilt_rad``
        and ``episodes`` (see the module docstring for units and formulas).

    Raises:
        ValueError: a bad ``n_episodes`` or ``seed``, a model without ``predict``, a bad
            ``vecnormalize``, an ``env_id`` whose vector env is not a ``UniLabVectorEnv``, or the id of a
            task that is not legged (an arm, a quadrotor: the message names the task and :func:`evaluate_episodes`).
    """
    record = record_gait(model, env_id, n_episodes, vecnormalize=vecnormalize, seed=seed, deterministic=deterministic)
    return record.summary()


@dataclass(frozen=True)
class EpisodeRecord:
    """Per-episode figures of :func:`record_episodes` (``E`` episodes), for any task.

    ``returns`` (E,) float64, sums of rewards; ``lengths`` (E,) int64, control steps; ``terminated`` (E,) bool,
    the episode ended ``terminated`` (not truncated); ``success`` (E,) bool, ``info["is_success"]`` at the
    episode's last step, or ``None`` when the task's info has no ``is_success``.
    """

    returns: np.ndarray
    lengths: np.ndarray
    terminated: np.ndarray
    success: np.ndarray | None

    def summary(self) -> dict[str, float | int | None]:
        """The figures over the episodes, by name.

        ``return_mean``, ``return_std``, ``length_mean`` (steps), ``terminated_rate``, ``success_rate`` (``None`` for
        a task without success) and ``episodes``.
        """
        return {
            "return_mean": float(self.returns.mean()),
            "return_std": float(self.returns.std()),
            "length_mean": float(self.lengths.mean()),
            "terminated_rate": float(self.terminated.mean()),
            "success_rate": None if self.success is None else float(self.success.mean()),
            "episodes": int(self.returns.size),
        }


def record_episodes(
    model: Any,
    env_id: str = QUADRUPED_ID,
    n_episodes: int = 16,
    *,
    vecnormalize: Any = None,
    seed: int = 0,
    deterministic: bool = True,
    **env_kwargs: Any,
) -> EpisodeRecord:
    """Run the first episode of each env of a ``n_episodes``-env vector env of ``env_id`` and record it.

    Env ``i`` is seeded ``seed + i``; an env's episode ends at its first ``terminated | truncated`` and its later
    steps are ignored, so the record is the same for a given seed. ``env_kwargs`` go to ``gym.make_vec`` (e.g.
    ``max_episode_steps``, ``robot``). The other arguments are :func:`evaluate_gait`'s.

    Raises:
        ValueError: a bad ``n_episodes``, ``seed`` or ``vecnormalize``, or a model without ``predict``.
        gymnasium.error.Error: ``env_id`` is not registered.
    """
    n, seed, normalize = _checked_arguments(model, n_episodes, seed, vecnormalize)
    env = gym.make_vec(env_id, num_envs=n, **env_kwargs)
    returns, lengths = np.zeros(n), np.zeros(n, np.int64)
    fell, success, has_success = np.zeros(n, bool), np.zeros(n, bool), False
    active = np.ones(n, bool)
    sampling = contextlib.nullcontext() if deterministic else _seeded_torch(seed)
    try:
        with sampling:
            obs, _ = env.reset(seed=seed)
            while active.any():
                action, _ = model.predict(normalize(obs), deterministic=deterministic)
                obs, reward, terminated, truncated, info = env.step(np.asarray(action, np.float32))
                returns += np.where(active, reward, 0.0)
                lengths += active
                ended = active & (np.asarray(terminated) | np.asarray(truncated))
                fell |= ended & np.asarray(terminated)
                if "is_success" in info:
                    has_success = True
                    success[ended] = np.asarray(info["is_success"], bool)[ended]
                active &= ~ended
    finally:
        env.close()
    return EpisodeRecord(returns=returns, lengths=lengths, terminated=fell, success=success if has_success else None)


def evaluate_episodes(
    model: Any,
    env_id: str = QUADRUPED_ID,
    n_episodes: int = 16,
    *,
    vecnormalize: Any = None,
    seed: int = 0,
    deterministic: bool = True,
    **env_kwargs: Any,
) -> dict[str, float | int | None]:
    """Evaluate a policy on any registered task: :func:`record_episodes`'s :meth:`EpisodeRecord.summary`.

    Args:
        model: anything with SB3's ``predict(obs, deterministic=...) -> (actions, state)``, taking the task's
            ``(n, O)`` float32 observations and giving ``(n, A)`` actions.
        env_id: a registered id (any ``UniLab/*`` task).
        n_episodes: episodes, one per env (env ``i`` seeded ``seed + i``).
        vecnormalize: as :func:`evaluate_gait`.
        seed: the evaluation seed (int >= 0); the result is deterministic for a given seed.
        deterministic: as :func:`evaluate_gait`.
        **env_kwargs: arguments of the env (``gym.make_vec``).

    Returns:
        ``return_mean``, ``return_std``, ``length_mean``, ``terminated_rate``, ``success_rate`` (the fraction of
        episodes whose last step's ``info["is_success"]`` is true; ``None`` for a task without it) and
        ``episodes``.

    Raises:
        ValueError: as :func:`record_episodes`.
    """
    record = record_episodes(
        model, env_id, n_episodes, vecnormalize=vecnormalize, seed=seed, deterministic=deterministic, **env_kwargs
    )
    return record.summary()
