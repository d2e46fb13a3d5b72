"""Train stock SB3 SAC on UniLab/Quadruped-v0 with AsyncRunner: collectors in their own processes.

    python examples/train_sac_async.py                          # 2 collectors x 32 envs, 300k env steps
    python examples/train_sac_async.py --total-steps 3000 --envs-per-collector 4 --save-path /tmp/sac_async
    python examples/train_sac_async.py --metrics-port 9100      # + Prometheus at http://127.0.0.1:9100/metrics

The model (same settings as ``train_sac_sb3.py``: 8 gradient steps per 64 transitions) trains
with its own ``train()`` while 2 collector processes step their EIC clusters and write to its
``SharedReplayBuffer``. Writes ``<save-path>.zip``, a normal SB3 file (``SAC.load`` works
without unilab_gym); watch it with ``python examples/play.py <save-path>.zip``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from stable_baselines3 import SAC

from unilab_gym import AsyncRunner, SharedReplayBuffer
from unilab_gym.cli import HelpFormatter
from unilab_gym.sb3.vec_env import make_sb3_env

ID = "UniLab/Quadruped-v0"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    parser.add_argument(
        "--total-steps",
        type=int,
        default=300_000,
        help="env steps (transitions) to train for; the default takes ~7 min on 2 idle cores "
        "(~780 env-steps/s in benchmarks/learning_check.py, 2026-12-05: the gradient steps set the pace)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the model and the collectors' envs")
    parser.add_argument("--num-collectors", type=int, default=2, help="collector processes (one per core)")
    parser.add_argument("--envs-per-collector", type=int, default=32, help="envs stepped by each collector")
    parser.add_argument("--replay-ratio", type=float, default=8 / 64, help="gradient steps per transition")
    parser.add_argument("--learning-starts", type=int, default=10_000, help="random transitions before training")
    parser.add_argument("--save-path", type=Path, default=Path("runs/sac_async/model"), help="writes <save-path>.zip")
    parser.add_argument("--threads", type=int, default=1, help="learner torch threads (collectors use 1)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (e.g. in CI logs)")
    parser.add_argument(
        "--metrics-port", type=int, default=None, help="serve pipeline metrics to Prometheus on this port (None: off)"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    # the model's own env only gives SB3 the spaces (and is not stepped): one env is enough
    model = SAC(
        "MlpPolicy",
        make_sb3_env(ID, 1, seed=args.seed),
        replay_buffer_class=SharedReplayBuffer,
        buffer_size=1_000_000,
        learning_starts=min(args.learning_starts, args.total_steps // 2),
        batch_size=256,
        gamma=0.98,
        ent_coef="auto_0.01",  # rewards are at most ~0.05 per step (see train_sac_sb3.py)
        policy_kwargs=dict(net_arch=[256, 256]),
        seed=args.seed,
        device="cpu",
        verbose=1,
    )
    with AsyncRunner(
        model,
        env_id=ID,
        num_collectors=args.num_collectors,
        envs_per_collector=args.envs_per_collector,
        replay_ratio=args.replay_ratio,
        seed=args.seed,
        metrics_port=args.metrics_port,
    ) as runner:
        if runner.metrics_url:
            print(f"Prometheus metrics at {runner.metrics_url}")
        runner.learn(args.total_steps, progress_bar=not args.no_progress, log_interval=10)
    args.save_path.parent.mkdir(parents=True, exist_ok=True)
    model.save(args.save_path)
    model.replay_buffer.close()
    print(f"saved {args.save_path.with_suffix('.zip')}")
    return args.save_path.with_suffix(".zip")


if __name__ == "__main__":
    main()
