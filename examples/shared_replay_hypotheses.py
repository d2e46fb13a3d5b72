"""Several SAC hypotheses trained from ONE shared replay, compared on the same experience.

    python examples/shared_replay_hypotheses.py        # the documented run (docs/replay-v2.md), see below
    python examples/shared_replay_hypotheses.py --total-steps 3000 --learning-starts 1000 --eval-episodes 2

Variants (``--gammas`` and ``--learning-rates``, one value each; default A: gamma 0.99, lr 3e-4,
SB3's SAC defaults; B: gamma 0.5, a short horizon; C: lr 1e-5, a slow learner). One collector pool
(``AsyncRunner``, driving learner A) fills A's ``SharedReplayBuffer``. Learners B, C, ..., each in
its own process, open the same replay read-only (``SharedReplayBuffer.attach(handle)``) and run
SAC's own ``train()`` on it: no env steps of their own, no copy of the replay. Every learner starts
from the same initial weights (``--seed``) and runs the same number of gradient steps,
``floor((total_steps - learning_starts) * replay_ratio)``, paced on the replay's size as A is
(a reader that falls behind catches up on the full replay at the end). Each logs SAC's ``train/*``
figures to its own SB3 CSV logger every ``--log-every`` gradient steps
(``<log-dir>/<name>/progress.csv``, e.g. ``A_gamma0.99_lr0.0003``).

Once every learner has stopped, the collectors run ``--holdout`` more transitions with A's final
policy and no training (replay ratio 0): that slice of the shared replay was never sampled by any
learner. Each variant is then measured on the same data and the same episodes:

- return and tracking error: :func:`unilab_gym.evaluation.evaluate_gait` on the same evaluation
  seeds (``1000 + seed`` onwards, deterministic actions) for every variant;
- TD error: the RMS over the held-out rows and both critics of ``Q_i(s, a) - y``, with SAC's own
  critic target ``y = r + gamma (1 - done) (min_j Qtarget_j(s', a') - alpha log pi(a' | s'))``,
  ``a' ~ pi(. | s')`` (``stable_baselines3/sac/sac.py``, ``SAC.train``), each variant with its own
  gamma, target critics and entropy coefficient alpha (``a'`` drawn with torch seeded ``seed``);
- Q scale: the mean of ``Q_i(s, a)`` over the held-out rows and both critics (soft Q values: SAC's
  entropy bonus ``-alpha log pi`` counts as reward).

Prints a markdown table and writes it to ``<log-dir>/comparison.csv`` (one row per variant).

Budget: the defaults (18,000 transitions, 4,000 gradient steps per learner, 3 learners) took
80-87 s of wall clock on 2 idle cores (two runs on 2026-12-05), 8.5-11.7 min on an older CPU at a load
average of 9-13 (docs/replay-v2.md). The gradient steps set the pace.
"""

from __future__ import annotations

import argparse
import csv
import math
import multiprocessing as mp
import queue
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from stable_baselines3 import SAC
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import Logger, configure

from unilab_gym import AsyncRunner, SharedReplayBuffer
from unilab_gym.cli import HelpFormatter
from unilab_gym.evaluation import evaluate_gait
from unilab_gym.sb3.vec_env import make_sb3_env

ID = "UniLab/Quadruped-v0"
SAC_KWARGS: dict[str, Any] = dict(
    batch_size=256,
    ent_coef="auto_0.01",  # rewards are at most ~0.05 per step (see train_sac_sb3.py)
    policy_kwargs=dict(net_arch=[256, 256]),
    device="cpu",
)
#: Columns of ``comparison.csv`` (and of :func:`main`'s rows), in order. ``wall_s``: seconds from the
#: learner's start of training (A: ``runner.learn``; a reader: its loop, waiting included) to its last step.
COLUMNS = (
    "learner", "gamma", "learning_rate", "gradient_steps", "wall_s", "return_mean", "return_std",
    "tracking_error_mps", "fall_rate", "td_error", "q_mean", "ent_coef",
)  # fmt: skip
READER_TIMEOUT_S = 3600.0  # a reader that has not finished this long after A is reported as failed


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    parser.add_argument(
        "--gammas", type=float, nargs="+", default=[0.99, 0.5, 0.99], help="per variant: A (collects), B, ..."
    )
    parser.add_argument(
        "--learning-rates", type=float, nargs="+", default=[3e-4, 3e-4, 1e-5], help="per variant, as --gammas"
    )
    parser.add_argument(
        "--total-steps",
        type=int,
        default=18_000,
        help="transitions collected while the learners train; the default takes 80-87 s on 2 idle cores (2026-12-05)",
    )
    parser.add_argument("--learning-starts", type=int, default=2_000, help="random transitions before training")
    parser.add_argument("--replay-ratio", type=float, default=0.25, help="gradient steps per transition, every learner")
    parser.add_argument(
        "--holdout", type=int, default=2_048, help="transitions collected after training, never trained on"
    )
    parser.add_argument("--seed", type=int, default=0, help="initial weights of every learner, collectors' envs")
    parser.add_argument("--num-collectors", type=int, default=1, help="collector processes")
    parser.add_argument("--envs-per-collector", type=int, default=16, help="envs stepped by each collector")
    parser.add_argument("--buffer-size", type=int, default=200_000, help="replay capacity (transitions)")
    parser.add_argument("--eval-episodes", type=int, default=8, help="evaluation episodes per variant (same seeds)")
    parser.add_argument("--log-every", type=int, default=100, help="gradient steps between two rows of progress.csv")
    parser.add_argument(
        "--log-dir", type=Path, default=Path("runs/hypotheses"), help="progress.csv files, comparison.csv"
    )
    args = parser.parse_args(argv)
    if len(args.gammas) != len(args.learning_rates):
        parser.error(
            f"--gammas and --learning-rates need one value per variant, got {args.gammas} and {args.learning_rates}"
        )
    if not all(0.0 <= g <= 1.0 for g in args.gammas):
        parser.error(f"--gammas must lie in [0, 1], got {args.gammas}")
    if not all(lr >= 0.0 for lr in args.learning_rates):
        parser.error(f"--learning-rates must be >= 0, got {args.learning_rates}")
    if not 0 < args.learning_starts < args.total_steps:
        parser.error(f"--learning-starts must lie in (0, --total-steps), got {args.learning_starts}")
    if not args.replay_ratio > 0:
        parser.error(f"--replay-ratio must be > 0, got {args.replay_ratio}")
    if not 1 <= args.holdout < args.buffer_size:
        parser.error(f"--holdout must lie in [1, --buffer-size), got {args.holdout}")
    for name in ("eval_episodes", "log_every", "num_collectors", "envs_per_collector"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


def variant_names(args: argparse.Namespace) -> list[str]:
    """``A_gamma0.99_lr0.0003``, ... : the learner's letter, then its hypothesis (its log folder's name)."""
    return [f"{chr(65 + i)}_gamma{g:g}_lr{lr:g}" for i, (g, lr) in enumerate(zip(args.gammas, args.learning_rates))]


def gradient_steps_due(transitions: int, args: argparse.Namespace) -> int:
    """Gradient steps a learner has run once the replay holds ``transitions``: AsyncRunner's rule
    ``floor((transitions - learning_starts) * replay_ratio)``, capped at the run's total."""
    counted = min(transitions, args.total_steps)
    return math.floor(max(0, counted - args.learning_starts) * args.replay_ratio)


def make_sac(gamma: float, learning_rate: float, args: argparse.Namespace, **kwargs: Any) -> SAC:
    # the model's own env only gives SB3 the spaces: the collectors step their own envs
    return SAC("MlpPolicy", make_sb3_env(ID, 1, seed=args.seed), gamma=gamma, learning_rate=learning_rate,
               learning_starts=args.learning_starts, seed=args.seed, **kwargs, **SAC_KWARGS)  # fmt: skip


def log_row(model: SAC, last_logged: int, every: int, *, final: bool = False) -> int:
    """Dump one row of ``model``'s logger when its gradient steps crossed a multiple of ``every``
    (or at the end); return the gradient-step count of the last row written."""
    n = model._n_updates
    if n == last_logged or (not final and n // every == last_logged // every):
        return last_logged
    model.logger.record("train/replay_size", model.replay_buffer.size() * model.replay_buffer.n_envs)
    model.logger.dump(n)
    return n


class _LogEvery(BaseCallback):
    """Learner A's CSV row every ``every`` gradient steps, as the readers write theirs.

    (AsyncRunner, like SB3's off-policy ``learn``, dumps the logger every 4 finished episodes:
    with 1000-step episodes that is after 16,000 transitions of 16 envs, so a short run's log
    would stay empty.)
    """

    def __init__(self, every: int) -> None:
        super().__init__()
        self.every, self.last = every, 0

    def _on_step(self) -> bool:
        self.last = log_row(self.model, self.last, self.every)
        return True


def reader(handle: Any, index: int, name: str, args: argparse.Namespace, results: Any, stop: Any) -> None:
    """Learner B, C, ...: SAC trained from the shared replay (read-only), paced on its size as A is."""
    torch.set_num_threads(1)
    gamma, lr = args.gammas[index], args.learning_rates[index]
    model = make_sac(gamma, lr, args, buffer_size=1)  # its own buffer is replaced at once
    buffer = SharedReplayBuffer.attach(handle, read_only=True, seed=args.seed + index)
    model.replay_buffer = buffer
    folder = args.log_dir / name
    model.set_logger(configure(str(folder), ["csv"]))
    total = gradient_steps_due(args.total_steps, args)
    t0, last = time.perf_counter(), 0
    try:
        while model._n_updates < total and not stop.is_set():
            due = gradient_steps_due(buffer.size() * buffer.n_envs, args) - model._n_updates
            if due <= 0:
                time.sleep(0.05)  # waiting for the collectors (a poll, not a synchronisation)
                continue
            model.train(gradient_steps=min(due, args.log_every), batch_size=model.batch_size)
            last = log_row(model, last, args.log_every)
        if stop.is_set():
            return
        log_row(model, last, args.log_every, final=True)
        model.save(folder / "model")
        results.put((index, str(folder / "model.zip"), model._n_updates, time.perf_counter() - t0))
    finally:
        buffer.close()


def critic_figures(model: SAC, samples: Any, seed: int) -> tuple[float, float]:
    """(TD error, Q scale) of ``model`` on ``samples`` (SB3 ``ReplayBufferSamples``), see the module docstring."""
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(seed)
        next_actions, next_log_prob = model.actor.action_log_prob(samples.next_observations)
        next_q = torch.cat(model.critic_target(samples.next_observations, next_actions), dim=1)
        next_q = next_q.min(dim=1, keepdim=True).values
        alpha = ent_coef_of(model)
        target = samples.rewards + (1 - samples.dones) * model.gamma * (next_q - alpha * next_log_prob.reshape(-1, 1))
        q = torch.cat(model.critic(samples.observations, samples.actions), dim=1)  # (rows, 2)
        return float((q - target).pow(2).mean().sqrt()), float(q.mean())


def ent_coef_of(model: SAC) -> float:
    return (
        float(torch.exp(model.log_ent_coef.detach()))
        if model.log_ent_coef is not None
        else float(model.ent_coef_tensor)
    )


def print_table(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    """The comparison as a markdown table, one row per variant."""
    header = (
        "learner", "gamma", "learning rate", "gradient steps", f"return (mean ± std, {args.eval_episodes} episodes)",
        "fall rate", "tracking error (m/s)", f"TD error ({args.holdout} held-out rows)", "Q scale (mean Q)", "alpha",
    )  # fmt: skip
    print("| " + " | ".join(header) + " |")
    print("|---|---|---|" + "---:|" * (len(header) - 3))
    for r in rows:
        cells = (
            r["learner"], f"{r['gamma']:g}", f"{r['learning_rate']:g}", str(r["gradient_steps"]),
            f"{r['return_mean']:.2f} ± {r['return_std']:.2f}", f"{r['fall_rate']:.2f}",
            f"{r['tracking_error_mps']:.3f}", f"{r['td_error']:.4f}", f"{r['q_mean']:.3f}", f"{r['ent_coef']:.4f}",
        )  # fmt: skip
        print("| " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    torch.set_num_threads(1)
    names = variant_names(args)
    total_steps = gradient_steps_due(args.total_steps, args)
    model = make_sac(args.gammas[0], args.learning_rates[0], args, replay_buffer_class=SharedReplayBuffer,
                     buffer_size=args.buffer_size)  # fmt: skip
    model.set_logger(configure(str(args.log_dir / names[0]), ["csv"]))
    ctx = mp.get_context("spawn")
    results, stop = ctx.Queue(), ctx.Event()
    readers = [ctx.Process(target=reader, args=(model.replay_buffer.handle, i, names[i], args, results, stop))
               for i in range(1, len(names))]  # fmt: skip
    wall: dict[int, float] = {}
    t_start = time.perf_counter()
    try:
        for p in readers:
            p.start()  # they wait for learning_starts transitions
        with AsyncRunner(
            model, env_id=ID, num_collectors=args.num_collectors, envs_per_collector=args.envs_per_collector,
            replay_ratio=args.replay_ratio, seed=args.seed, collector_timeout_s=600.0,
        ) as runner:  # fmt: skip
            t0 = time.perf_counter()
            log = _LogEvery(args.log_every)
            runner.learn(args.total_steps, callback=log, reset_num_timesteps=True)
            log_row(model, log.last, args.log_every, final=True)
            wall[0] = time.perf_counter() - t0
            paths: dict[int, str | None] = {0: None}
            deadline = time.monotonic() + READER_TIMEOUT_S
            while len(paths) < len(names):
                try:
                    index, path, updates, seconds = results.get(timeout=1.0)
                except queue.Empty:
                    # a reader exits 0 only after putting its result: any other exit code is a failure
                    if any(p.exitcode not in (None, 0) for p in readers) or time.monotonic() > deadline:
                        raise RuntimeError("a reader learner failed or hung (its traceback is above)") from None
                    continue
                if updates != total_steps:
                    raise RuntimeError(
                        f"learner {names[index]} stopped after {updates} of {total_steps} gradient steps"
                    )
                paths[index], wall[index] = path, seconds
            # every learner has stopped: what the collectors add from here was never trained on
            first = model.replay_buffer.storage.committed
            model.set_logger(Logger(folder=None, output_formats=[]))  # A's log ends with its training
            runner.set_hyperparameters(replay_ratio=0.0)
            runner.learn(args.holdout, reset_num_timesteps=False)
        print(f"{first} transitions collected for training in {wall[0]:.0f} s (every learner: {total_steps} "
              f"gradient steps), then {args.holdout} held-out transitions; evaluating on {args.eval_episodes} "
              f"episodes (seeds {1000 + args.seed}..{1000 + args.seed + args.eval_episodes - 1})")  # fmt: skip
        held = np.arange(first, first + args.holdout) % args.buffer_size  # n_envs = 1: a step is a row
        samples = model.replay_buffer._get_samples(held)
        rows: list[dict[str, Any]] = []
        for i, name in enumerate(names):
            path = paths[i]
            policy = model if path is None else SAC.load(path, device="cpu")
            gait = evaluate_gait(policy, n_episodes=args.eval_episodes, seed=1000 + args.seed)
            td, q = critic_figures(policy, samples, args.seed)
            rows.append(dict(
                learner=name, gamma=policy.gamma, learning_rate=args.learning_rates[i],
                gradient_steps=policy._n_updates, wall_s=round(wall[i], 1), return_mean=gait["return_mean"],
                return_std=gait["return_std"], tracking_error_mps=gait["tracking_error_mps"],
                fall_rate=gait["fall_rate"], td_error=td, q_mean=q, ent_coef=ent_coef_of(policy),
            ))  # fmt: skip
    finally:
        stop.set()
        for p in readers:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
                p.join()
        model.replay_buffer.close()
    args.log_dir.mkdir(parents=True, exist_ok=True)
    with open(args.log_dir / "comparison.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    print_table(rows, args)
    print(f"wall clock {time.perf_counter() - t_start:.0f} s; comparison written to {args.log_dir / 'comparison.csv'}")
    return rows


if __name__ == "__main__":
    main()
