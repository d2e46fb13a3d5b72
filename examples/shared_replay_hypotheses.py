"""Three SAC hypotheses (gamma 0.99 / 0.995 / 0.999) learning in parallel from ONE shared replay.

    python examples/shared_replay_hypotheses.py                    # 120 s of wall clock
    python examples/shared_replay_hypotheses.py --seconds 30 --eval-episodes 4 --envs-per-collector 8

One collector pool (``AsyncRunner``, driving learner A, gamma 0.99) fills A's ``SharedReplayBuffer``.
Learners B (gamma 0.995) and C (gamma 0.999), each in its own process, open the same replay
read-only with ``SharedReplayBuffer.attach(handle)`` and run SAC's own ``train()`` on it for the
same wall clock: no env steps of their own, no copy of the replay. Each learner logs to its own SB3
logger (``<log-dir>/gamma_<g>/progress.csv``). At the end the example evaluates the three policies
on the same seeds (:func:`unilab_gym.evaluation.evaluate_gait`) and prints their returns.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time
from pathlib import Path
from typing import Any

import torch
from stable_baselines3 import SAC
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import configure

from unilab_gym import AsyncRunner, SharedReplayBuffer
from unilab_gym.evaluation import evaluate_gait
from unilab_gym.integrations.sb3 import make_sb3_env

ID = "UniLab/Quadruped-v0"
SAC_KWARGS: dict[str, Any] = dict(
    batch_size=256,
    ent_coef="auto_0.01",  # rewards are at most ~0.05 per step (see train_sac_sb3.py)
    policy_kwargs=dict(net_arch=[256, 256]),
    device="cpu",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0, help="wall clock of every learner")
    parser.add_argument("--gammas", type=float, nargs=3, default=[0.99, 0.995, 0.999], help="A (collects), B, C")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-collectors", type=int, default=1)
    parser.add_argument("--envs-per-collector", type=int, default=16)
    parser.add_argument("--buffer-size", type=int, default=200_000)
    parser.add_argument("--learning-starts", type=int, default=2_000)
    parser.add_argument("--gradient-steps", type=int, default=8, help="per train() call of B and C")
    parser.add_argument("--eval-episodes", type=int, default=8)
    parser.add_argument("--log-dir", type=Path, default=Path("runs/hypotheses"))
    return parser.parse_args(argv)


class _SameWallClock(BaseCallback):
    """Starts learners B and C once A's collectors run, and stops A after ``seconds`` of wall clock.

    The deadline (``time.time()``, shared by all processes) is set at A's first step and handed to
    B and C, so the three learn for the same wall clock from the same replay.
    """

    def __init__(self, seconds: float, start_readers: Any) -> None:
        super().__init__()
        self.seconds, self.start_readers, self.deadline = seconds, start_readers, 0.0

    def _on_step(self) -> bool:
        if not self.deadline:
            self.deadline = time.time() + self.seconds
            self.start_readers(self.deadline)
        return time.time() < self.deadline


def learner(handle: Any, gamma: float, deadline: float, args: argparse.Namespace, results: Any) -> None:
    """Learner B or C: SAC trained from the shared replay (read-only) until ``deadline`` (``time.time()``)."""
    torch.set_num_threads(1)
    # buffer_size=1: SAC's own buffer is replaced by the shared one at once
    model = SAC("MlpPolicy", make_sb3_env(ID, 1, seed=args.seed), gamma=gamma, buffer_size=1, seed=args.seed,
                **SAC_KWARGS)  # fmt: skip
    model.replay_buffer = SharedReplayBuffer.attach(handle, read_only=True, seed=args.seed + int(gamma * 1e4))
    folder = args.log_dir / f"gamma_{gamma}"
    model.set_logger(configure(str(folder), ["csv"]))
    while model.replay_buffer.size() < args.learning_starts and time.time() < deadline:
        time.sleep(0.2)  # waiting for the collectors (a poll, not a synchronisation)
    while time.time() < deadline:
        model.train(gradient_steps=args.gradient_steps, batch_size=model.batch_size)
        model.logger.record("train/replay_size", model.replay_buffer.size())
        model.logger.dump(model._n_updates)
    path = folder / "model"
    model.save(path)
    model.replay_buffer.close()
    results.put((gamma, str(path), model._n_updates))


def main(argv: list[str] | None = None) -> dict[float, dict[str, Any]]:
    args = parse_args(argv)
    torch.set_num_threads(1)
    gamma_a, *others = args.gammas
    model = SAC(
        "MlpPolicy",
        make_sb3_env(ID, 1, seed=args.seed),  # gives SB3 the spaces; the collectors step their own envs
        replay_buffer_class=SharedReplayBuffer,
        buffer_size=args.buffer_size,
        learning_starts=args.learning_starts,
        gamma=gamma_a,
        seed=args.seed,
        **SAC_KWARGS,
    )
    folder_a = args.log_dir / f"gamma_{gamma_a}"
    model.set_logger(configure(str(folder_a), ["csv"]))
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    readers: list[Any] = []

    def start_readers(deadline: float) -> None:
        for g in others:
            readers.append(ctx.Process(target=learner, args=(model.replay_buffer.handle, g, deadline, args, results)))
            readers[-1].start()

    with AsyncRunner(
        model, env_id=ID, num_collectors=args.num_collectors, envs_per_collector=args.envs_per_collector,
        replay_ratio=args.gradient_steps / 64, seed=args.seed, collector_timeout_s=600.0,
    ) as runner:  # fmt: skip
        runner.learn(10**9, callback=_SameWallClock(args.seconds, start_readers), reset_num_timesteps=True)
        transitions = model.replay_buffer.size() * model.replay_buffer.n_envs
        paths = {gamma_a: (None, model._n_updates)}
        for _ in readers:
            gamma, path, updates = results.get(timeout=args.seconds + 900)
            paths[gamma] = (path, updates)
        for p in readers:
            p.join()
    print(f"{transitions} transitions collected in {args.seconds:.0f} s; evaluating {args.eval_episodes} episodes each")
    report: dict[float, dict[str, Any]] = {}
    for gamma in args.gammas:
        path, updates = paths[gamma]
        policy = model if path is None else SAC.load(path, device="cpu")
        gait = evaluate_gait(policy, n_episodes=args.eval_episodes, seed=1000 + args.seed)
        report[gamma] = {"gradient_steps": updates, **gait}
    print("| learner | gamma | gradient steps | return (mean ± std) | fall rate | tracking error (m/s) |")
    print("|---|---|---|---|---|---|")
    for name, gamma in zip("ABC", args.gammas):
        r = report[gamma]
        print(f"| {name} | {gamma} | {r['gradient_steps']} | {r['return_mean']:.2f} ± {r['return_std']:.2f} | "
              f"{r['fall_rate']:.2f} | {r['tracking_error_mps']:.3f} |")  # fmt: skip
    model.replay_buffer.close()
    return report


if __name__ == "__main__":
    main()
