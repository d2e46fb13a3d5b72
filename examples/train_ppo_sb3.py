"""Train Stable-Baselines3 PPO on UniLab/Quadruped-v0 with 64 envs (observations and rewards normalized).

    python examples/train_ppo_sb3.py                       # defaults: 64 envs, 1M env steps
    python examples/train_ppo_sb3.py --total-steps 2048 --num-envs 4 --save-path /tmp/ppo

Writes ``<save-path>.zip`` and the ``VecNormalize`` statistics ``<save-path>_vecnormalize.pkl``
(``examples/play.py <save-path>.zip --sibling-vecnormalize`` loads both). Progress: SB3's progress
bar and ``rollout/ep_rew_mean``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import ProgressBarCallback
from stable_baselines3.common.vec_env import VecNormalize

import unilab_gym  # noqa: F401  (registers UniLab/Quadruped-v0)
from unilab_gym.cli import HelpFormatter
from unilab_gym.sb3.vec_env import make_sb3_env


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    parser.add_argument(
        "--total-steps",
        type=int,
        default=1_000_000,
        help="env steps (transitions) to train for; the default takes ~5 min on 2 idle cores "
        "(~3,300 env-steps/s in benchmarks/learning_check.py, 2026-12-05; an older CPU took 4x longer)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the model and the envs")
    parser.add_argument("--num-envs", type=int, default=64, help="envs, stepped in this process")
    parser.add_argument("--n-steps", type=int, default=64, help="rollout length per env and update")
    parser.add_argument("--save-path", type=Path, default=Path("runs/ppo_sb3/model"), help="writes <save-path>.zip")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (1 is fastest for small nets on a busy CPU)"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (e.g. in CI logs)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    env = VecNormalize(make_sb3_env("UniLab/Quadruped-v0", args.num_envs, seed=args.seed), gamma=0.99)
    rollout = args.n_steps * args.num_envs
    model = PPO(
        "MlpPolicy",
        env,
        n_steps=args.n_steps,
        batch_size=min(1024, rollout),
        n_epochs=5,
        learning_rate=3e-4,
        gamma=0.99,
        gae_lambda=0.95,
        clip_range=0.2,
        ent_coef=0.0,
        max_grad_norm=1.0,
        policy_kwargs=dict(net_arch=dict(pi=[256, 128], vf=[256, 128]), activation_fn=torch.nn.ELU, log_std_init=-0.5),
        seed=args.seed,
        device="cpu",
        verbose=1,
    )
    bar = None if args.no_progress else ProgressBarCallback()
    try:
        model.learn(total_timesteps=args.total_steps, callback=bar)
    finally:  # SB3 closes its bar only when training ends: an open one breaks a Ctrl-C exit (tqdm ImportError)
        if bar is not None and getattr(bar, "pbar", None) is not None:
            bar.pbar.close()
    args.save_path.parent.mkdir(parents=True, exist_ok=True)
    model.save(args.save_path)
    env.save(f"{args.save_path}_vecnormalize.pkl")
    print(f"saved {args.save_path.with_suffix('.zip')} and {args.save_path}_vecnormalize.pkl")
    env.close()
    return args.save_path.with_suffix(".zip")


if __name__ == "__main__":
    main()
