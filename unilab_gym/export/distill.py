"""Distillation of a policy into a small MLP student by behaviour cloning with DAgger.

DAgger (Ross, Gordon and Bagnell 2011, "A Reduction of Imitation Learning and Structured Prediction
to No-Regret Online Learning", AISTATS): round 0 collects states with the teacher driving; each
later round lets the current student drive the same deterministic vector env while the teacher
labels every state it visits with its deterministic action. The student is fitted to all labels so
far by mean squared error on actions (Adam). The env keeps running across rounds (autoreset), so
later rounds see later parts of the episodes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from unilab_gym.evaluation import record_episodes
from unilab_gym.export._deps import require_onnx
from unilab_gym.export.policy import PolicyNet, load_vecnormalize, policy_net
from unilab_gym.export.to_onnx import export_onnx, onnx_bytes, onnx_latency_us
from unilab_gym.registration import QUADRUPED_ID
from unilab_gym.validation import check_int, check_positive, check_positive_int, check_seed

#: Minibatch size of the behaviour-cloning updates.
BATCH_SIZE = 512


@dataclass
class DistillResult:
    """What :func:`distill` returns.

    Attributes:
        student: the student, raw ``(batch, O)`` float32 observations -> ``(batch, A)`` float32 actions (the
            task's widths: 48 and 12 for ``UniLab/Quadruped-v0``).
        teacher: the teacher as a :class:`~unilab_gym.export.policy.PolicyNet` (what was distilled).
        metrics: ``action_mse`` (mean squared action error on held-out states: those the student visits
            in its evaluation episodes), ``teacher_return`` / ``student_return`` (mean episode return of
            the deterministic policies over ``eval_episodes`` episodes, seeds ``seed + 10_000 + i``, by
            :func:`~unilab_gym.evaluation.record_episodes`),
            ``return_ratio`` (student / teacher), ``teacher_params`` / ``student_params`` (weights and
            biases from observation to action), ``teacher_latency_us`` / ``student_latency_us`` (p50 of
            a batch-1 onnxruntime call, one thread, µs), ``teacher_latency_p99_us`` /
            ``student_latency_p99_us`` (p99), ``labels`` (labelled states trained on) and
            ``train_seconds`` (wall-clock time of collection and training).
        env_id: the task distilled on (the parity observations of :meth:`export_onnx`).
    """

    student: PolicyNet
    teacher: PolicyNet
    metrics: dict[str, float] = field(default_factory=dict)
    env_id: str = QUADRUPED_ID

    def export_onnx(self, path: str | Path, *, opset: int = 17) -> Path:
        """Write the student as ONNX (input ``obs``, output ``action``, as :func:`~unilab_gym.export.export_onnx`).

        Raises:
            ImportError: onnx or onnxruntime is missing.
            RuntimeError: the parity check fails (see :func:`~unilab_gym.export.export_onnx`).
        """
        return export_onnx(self.student, path, opset=opset, env_id=self.env_id)


def distill(
    model: Any,
    env_id: str = QUADRUPED_ID,
    *,
    hidden: Sequence[int] = (64, 64),
    vecnormalize: Any = None,
    num_envs: int = 64,
    steps: int = 250,
    dagger_rounds: int = 4,
    epochs: int = 20,
    lr: float = 1e-3,
    eval_episodes: int | None = None,
    seed: int = 0,
    **env_kwargs: Any,
) -> DistillResult:
    """Distil an SB3 policy into a small MLP student (behaviour cloning with DAgger, see the module docstring).

    The student is ``Linear -> ELU`` per ``hidden`` width, then ``Linear -> tanh`` rescaled to the
    action bounds; it takes raw observations: the teacher's ``VecNormalize`` statistics are folded in
    (or, without them, the mean and variance of the round-0 states, with ``VecNormalize``'s epsilon
    1e-8 and clip 10).

    Args:
        model: the teacher: a SAC, TD3, DDPG, PPO or A2C model (``MlpPolicy``, or an asymmetric policy:
            its actor, see :func:`~unilab_gym.export.policy.policy_net`).
        env_id: a registered id whose vector env is a :class:`~unilab_gym.vector_env.UniLabVectorEnv`.
        hidden: the student's hidden layer widths (each >= 1).
        vecnormalize: the teacher's ``VecNormalize`` (over a ``Dict`` too: its ``"policy"`` statistics), the
            path of its saved statistics, or ``None``.
        num_envs: envs stepped together while collecting.
        steps: vector-env steps per round (``num_envs * steps`` labelled states per round).
        dagger_rounds: rounds with the student driving, after the teacher-driven round 0 (>= 0).
        epochs: passes over all labels so far after each round.
        lr: Adam learning rate.
        eval_episodes: episodes for the returns and the held-out ``action_mse``, one per env of one vector env
            (default: ``num_envs``).
        seed: seeds the collection envs (``seed + i``), torch, and the evaluation (``seed + 10_000 + i``).
        **env_kwargs: task arguments of the env (e.g. ``max_episode_steps``), for collection and evaluation.

    Returns:
        A :class:`DistillResult` (the student, the teacher's ``PolicyNet``, the metrics).

    Raises:
        ImportError: onnx or onnxruntime is missing (the message gives the install command).
        ValueError: a bad argument, naming it, or an unsupported teacher.
    """
    require_onnx()
    if isinstance(hidden, (str, bytes)) or not isinstance(hidden, Sequence) or not hidden:
        raise ValueError(f"hidden must be a non-empty sequence of layer widths, got {hidden!r}")
    widths = [check_positive_int("hidden[i]", h) for h in hidden]
    num_envs = check_positive_int("num_envs", num_envs)
    steps = check_positive_int("steps", steps)
    dagger_rounds = check_int("dagger_rounds", dagger_rounds, minimum=0)
    epochs = check_positive_int("epochs", epochs)
    lr = check_positive("lr", lr)
    eval_episodes = num_envs if eval_episodes is None else check_positive_int("eval_episodes", eval_episodes)
    seed = check_seed("seed", seed)
    stats = load_vecnormalize(vecnormalize)
    teacher = policy_net(model, stats)
    torch.manual_seed(seed)

    start = time.perf_counter()
    env = gym.make_vec(env_id, num_envs=num_envs, **env_kwargs)
    try:
        obs, _ = env.reset(seed=seed)
        states, obs = _collect(env, obs, teacher, steps)
        student = _student(teacher, widths, states)
        optimizer = torch.optim.Adam(student.parameters(), lr=lr)
        dataset = [states]
        _fit(student, optimizer, dataset, teacher, epochs)
        for _ in range(dagger_rounds):
            states, obs = _collect(env, obs, student, steps)
            dataset.append(states)
            _fit(student, optimizer, dataset, teacher, epochs)
    finally:
        env.close()
    train_seconds = time.perf_counter() - start
    student.eval()

    eval_seed = seed + 10_000
    if isinstance(getattr(stats, "obs_rms", None), dict):  # a VecNormalize over a Dict: the env here is flat, so
        # the teacher runs as its PolicyNet (model.predict on the normalized "policy" values: export's parity)
        teacher_return = record_episodes(teacher, env_id, eval_episodes, seed=eval_seed, **env_kwargs)
    else:
        teacher_return = record_episodes(model, env_id, eval_episodes, vecnormalize=stats, seed=eval_seed, **env_kwargs)
    recorder = _Recorder(student)
    student_return = record_episodes(recorder, env_id, eval_episodes, seed=eval_seed, **env_kwargs)
    held_out = np.concatenate(recorder.seen)
    action_mse = float(np.mean((student.act(held_out) - teacher.act(held_out)) ** 2))
    t_ret, s_ret = float(teacher_return.returns.mean()), float(student_return.returns.mean())
    t_p50, t_p99 = onnx_latency_us(onnx_bytes(teacher), held_out)
    s_p50, s_p99 = onnx_latency_us(onnx_bytes(student), held_out)
    metrics = {
        "action_mse": action_mse,
        "teacher_return": t_ret,
        "student_return": s_ret,
        "return_ratio": s_ret / t_ret if t_ret != 0 else float("nan"),
        "teacher_params": teacher.num_params(),
        "student_params": student.num_params(),
        "teacher_latency_us": t_p50,
        "student_latency_us": s_p50,
        "teacher_latency_p99_us": t_p99,
        "student_latency_p99_us": s_p99,
        "labels": sum(len(s) for s in dataset),
        "train_seconds": train_seconds,
    }
    return DistillResult(student=student, teacher=teacher, metrics=metrics, env_id=env_id)


def _collect(env: Any, obs: np.ndarray, driver: PolicyNet, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Step ``env`` ``steps`` times with ``driver``'s actions: the states seen ``(steps * N, O)`` and the last obs."""
    seen = []
    for _ in range(steps):
        seen.append(obs)
        obs, *_ = env.step(driver.act(obs))
    return np.concatenate(seen), obs


def _student(teacher: PolicyNet, widths: list[int], states: np.ndarray) -> PolicyNet:
    """A fresh student with the teacher's normalization (or the statistics of ``states``) and action bounds."""
    layers: list[nn.Module] = []
    for n_in, n_out in zip([teacher.obs_dim, *widths[:-1]], widths):
        layers += [nn.Linear(n_in, n_out), nn.ELU()]
    layers += [nn.Linear(widths[-1], teacher.act_dim), nn.Tanh()]
    if teacher.normalizes:  # the same constants: obs_std**2 with epsilon 0 gives back obs_std
        mean, var, clip = teacher.obs_mean.numpy(), teacher.obs_std.numpy() ** 2, teacher.clip_obs
        epsilon = 0.0
    else:
        mean, var, clip = states.mean(0, dtype=np.float64), states.var(0, dtype=np.float64), 10.0
        epsilon = 1e-8
    return PolicyNet(
        nn.Sequential(*layers),
        action_low=teacher.action_low.numpy(),
        action_high=teacher.action_high.numpy(),
        squash_output=True,
        obs_mean=mean,
        obs_var=var,
        epsilon=epsilon,
        clip_obs=clip,
    )


def _fit(
    student: PolicyNet, optimizer: torch.optim.Optimizer, dataset: list[np.ndarray], teacher: PolicyNet, epochs: int
) -> None:
    """``epochs`` passes of minibatch MSE regression of the student onto the teacher's actions over ``dataset``."""
    x = torch.as_tensor(np.concatenate(dataset))
    with torch.no_grad():
        y = teacher(x)
    student.train()
    for _ in range(epochs):
        for idx in torch.randperm(len(x)).split(BATCH_SIZE):
            loss = nn.functional.mse_loss(student(x[idx]), y[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    student.eval()


class _Recorder:
    """An SB3-style ``predict`` over a ``PolicyNet`` that keeps every observation it is given."""

    def __init__(self, net: PolicyNet):
        self.net = net
        self.seen: list[np.ndarray] = []

    def predict(self, obs: np.ndarray, deterministic: bool = True) -> tuple[np.ndarray, None]:
        self.seen.append(np.array(obs, np.float32))
        return self.net.act(obs), None
