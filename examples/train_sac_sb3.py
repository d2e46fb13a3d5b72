"""Train Stable-Baselines3 SAC on UniLab/Quadruped-v0 with 64 envs and the shared-memory replay.

    python examples/train_sac_sb3.py                       # defaults: 64 envs, 300k env steps
    python examples/train_sac_sb3.py --total-steps 2000 --num-envs 4 --save-path /tmp/sac

Writes ``<save-path>.zip`` (load it with ``SAC.load``; watch it with ``examples/play.py``).
Progress: SB3's progress bar and its ``rollout/ep_rew_mean`` log (from ``VecMonitor``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from stable_baselines3 import SAC
from stable_baselines3.common.callbacks import ProgressBarCallback

import unilab_gym  # noqa: F401  (registers UniLab/Quadruped-v0)
from unilab_gym.cli import HelpFormatter
from unilab_gym.sb3.replay_buffer import SharedReplayBuffer
from unilab_gym.sb3.vec_env import make_sb3_env


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    parser.add_argument(
        "--total-steps",
        type=int,
        default=300_000,
        help="env steps (transitions) to train for; the default takes ~8 min on 2 idle cores "
        "(~620 env-steps/s in benchmarks/learning_check.py, 2026-12-05: the gradient steps set the pace)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the model and the envs")
    parser.add_argument("--num-envs", type=int, default=64, help="envs, stepped in this process")
    parser.add_argument(
        "--gradient-steps", type=int, default=8, help="gradient steps per vector step (of num-envs transitions)"
    )
    parser.add_argument("--buffer-size", type=int, default=1_000_000, help="replay capacity in transitions")
    parser.add_argument("--learning-starts", type=int, default=10_000, help="random transitions before training")
    parser.add_argument("--save-path", type=Path, default=Path("runs/sac_sb3/model"), help="writes <save-path>.zip")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (1 is fastest for small nets on a busy CPU)"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (e.g. in CI logs)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    env = make_sb3_env("UniLab/Quadruped-v0", args.num_envs, seed=args.seed)
    model = SAC(
        "MlpPolicy",
        env,
        replay_buffer_class=SharedReplayBuffer,
        buffer_size=args.buffer_size,
        learning_starts=min(args.learning_starts, args.total_steps // 2),
        batch_size=256,
        learning_rate=3e-4,
        gamma=0.98,
        ent_coef="auto_0.01",  # rewards are at most ~0.05 per step: SB3's initial 1.0 would drown them for ~20k updates
        train_freq=1,
        gradient_steps=args.gradient_steps,
        policy_kwargs=dict(net_arch=[256, 256]),
        seed=args.seed,
        device="cpu",
        verbose=1,
    )
    bar = None if args.no_progress else ProgressBarCallback()
    try:
        model.learn(total_timesteps=args.total_steps, callback=bar, log_interval=10)
    finally:  # SB3 closes its bar only when training ends: an open one breaks a Ctrl-C exit (tqdm ImportError)
        if bar is not None and getattr(bar, "pbar", None) is not None:
            bar.pbar.close()
    args.save_path.parent.mkdir(parents=True, exist_ok=True)
    model.save(args.save_path)
    print(f"saved {args.save_path.with_suffix('.zip')}")
    env.close()
    return args.save_path.with_suffix(".zip")


if __name__ == "__main__":
    main()
