"""Train stock SB3 PPO on UniLab/Quadruped-v0 with AsyncRunner: 2 collector processes x 32 envs.

    python examples/train_ppo_async.py                          # defaults: 2 x 32 envs, 1M env steps, lag 1
    python examples/train_ppo_async.py --max-policy-lag 0       # strictly on-policy (reproducible for a seed)
    python examples/train_ppo_async.py --total-steps 2048 --num-collectors 1 --envs-per-collector 8 --save-path /tmp/ppo

The model is a plain ``PPO`` with the settings of ``train_ppo_sb3.py``; its env
(``VecNormalize(make_sb3_env(id, collectors * envs))``) only gives the spaces, ``n_envs`` and the
normalization statistics: the collectors step their own envs in parallel processes, normalize
with the learner's statistics (shipped with the weights) and write each rollout into shared
memory; the learner merges their observation statistics, runs SB3's own GAE and ``train()``.
With ``--max-policy-lag 1`` the collectors gather the next rollout while the learner trains (one
update behind: slightly off-policy). Writes ``<save-path>.zip`` and
``<save-path>_vecnormalize.pkl`` (``PPO.load``; watch it with ``unilab-gym play --sibling-vecnormalize``).
Progress: SB3's progress bar, ``rollout/ep_rew_mean`` and the ``unilab/*`` pipeline metrics
(``policy_lag_mean``, env-steps/s, ...) in the log.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from stable_baselines3 import PPO
from stable_baselines3.common.vec_env import VecNormalize

import unilab_gym  # noqa: F401  (registers UniLab/Quadruped-v0)
from unilab_gym import AsyncRunner
from unilab_gym.cli import HelpFormatter
from unilab_gym.sb3.vec_env import make_sb3_env

ENV_ID = "UniLab/Quadruped-v0"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    parser.add_argument(
        "--total-steps",
        type=int,
        default=1_000_000,
        help="env steps (transitions) to train for; the default takes ~3 min on 2 idle cores "
        "(~6,400 env-steps/s at lag 1, ~5,400 at lag 0, in benchmarks/learning_check.py, 2026-12-05)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the model and the collectors' envs")
    parser.add_argument("--num-collectors", type=int, default=2, help="collector processes (one per core)")
    parser.add_argument("--envs-per-collector", type=int, default=32, help="envs stepped by each collector")
    parser.add_argument("--n-steps", type=int, default=64, help="rollout length per env")
    parser.add_argument(
        "--max-policy-lag", type=int, default=1, choices=(0, 1), help="0: strictly on-policy; 1: overlap"
    )
    parser.add_argument("--max-episode-steps", type=int, default=1000, help="episode length (control steps at 50 Hz)")
    parser.add_argument("--save-path", type=Path, default=Path("runs/ppo_async/model"), help="writes <save-path>.zip")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads of the learner")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (e.g. in CI logs)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    n_envs = args.num_collectors * args.envs_per_collector
    env_kwargs = dict(max_episode_steps=args.max_episode_steps)
    rollout = args.n_steps * n_envs
    # spaces, n_envs and the normalization statistics; the collectors step their own envs
    env = VecNormalize(make_sb3_env(ENV_ID, n_envs, seed=args.seed, **env_kwargs), gamma=0.99)
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
    with AsyncRunner(
        model,
        env_id=ENV_ID,
        num_collectors=args.num_collectors,
        envs_per_collector=args.envs_per_collector,
        env_kwargs=env_kwargs,
        max_policy_lag=args.max_policy_lag,
    ) as runner:
        runner.learn(total_timesteps=args.total_steps, progress_bar=not args.no_progress)
    args.save_path.parent.mkdir(parents=True, exist_ok=True)
    model.save(args.save_path)
    env.save(f"{args.save_path}_vecnormalize.pkl")
    print(f"trained {model.num_timesteps} env steps; saved {args.save_path.with_suffix('.zip')}")
    model.env.close()
    return args.save_path.with_suffix(".zip")


if __name__ == "__main__":
    main()
