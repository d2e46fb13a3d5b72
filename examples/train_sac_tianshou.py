"""Train Tianshou's procedural SAC on UniLab/Quadruped-v0: Collector + OffPolicyTrainer, shared replay.

    python examples/train_sac_tianshou.py                  # defaults: 64 envs, 300k env steps
    python examples/train_sac_tianshou.py --total-steps 2000 --num-envs 4 --save-path /tmp/sac_ts.pt

The training envs are one ``TianshouVectorEnv`` (64 robots stepped in one batched call), the
replay is a ``SharedVectorReplayBuffer`` (a ``VectorReplayBuffer`` in shared memory). Writes
the algorithm's ``state_dict`` to ``--save-path`` (``torch.load`` + ``algorithm.load_state_dict``).
Progress: Tianshou's progress bars and epoch summaries (test return of ``--test-envs`` episodes).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import torch
from tianshou.algorithm.modelfree.sac import SAC, AutoAlpha, SACPolicy
from tianshou.algorithm.optim import AdamOptimizerFactory
from tianshou.data import Collector, CollectStats
from tianshou.trainer import OffPolicyTrainerParams
from tianshou.utils.net.common import Net
from tianshou.utils.net.continuous import ContinuousActorProbabilistic, ContinuousCritic

import unilab_gym  # noqa: F401  (registers UniLab/Quadruped-v0)
from unilab_gym.cli import HelpFormatter
from unilab_gym.tianshou import SharedVectorReplayBuffer, make_tianshou_env


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    parser.add_argument(
        "--total-steps",
        type=int,
        default=300_000,
        help="env steps (transitions) to train for; not timed for Tianshou (the same replay "
        "ratio as train_sac_sb3.py, which steps ~620 env-steps/s on 2 idle cores: ~8 min for 300k)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of numpy, torch and the envs")
    parser.add_argument("--num-envs", type=int, default=64, help="training envs, stepped in this process")
    parser.add_argument("--test-envs", type=int, default=8, help="envs (= episodes) of each epoch's test")
    parser.add_argument("--epochs", type=int, default=10, help="the total steps are split into this many epochs")
    parser.add_argument(
        "--gradient-steps", type=int, default=8, help="gradient steps per vector step (of num-envs transitions)"
    )
    parser.add_argument("--buffer-size", type=int, default=1_000_000, help="replay capacity in transitions")
    parser.add_argument("--start-steps", type=int, default=10_000, help="random transitions before training")
    parser.add_argument(
        "--max-episode-steps", type=int, default=1000, help="episode length limit (also of the test episodes)"
    )
    parser.add_argument(
        "--save-path", type=Path, default=Path("runs/sac_tianshou/algorithm.pt"), help="the state_dict file"
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (1 is fastest for small nets on a busy CPU)"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars (e.g. in CI logs)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    env_kwargs = dict(max_episode_steps=args.max_episode_steps)
    train_envs = make_tianshou_env("UniLab/Quadruped-v0", args.num_envs, seed=args.seed, **env_kwargs)
    test_envs = make_tianshou_env("UniLab/Quadruped-v0", args.test_envs, seed=args.seed + 10_000, **env_kwargs)
    obs_dim = train_envs.get_env_attr("observation_space")[0].shape[0]
    action_space = train_envs.get_env_attr("action_space")[0]
    act_dim = action_space.shape[0]

    # networks: a tanh-Gaussian actor and two Q critics, 256x256 MLPs
    actor = ContinuousActorProbabilistic(
        preprocess_net=Net(state_shape=obs_dim, hidden_sizes=[256, 256]),
        action_shape=act_dim,
        unbounded=True,
        conditioned_sigma=True,
    )
    critics = [
        ContinuousCritic(
            preprocess_net=Net(state_shape=obs_dim, action_shape=act_dim, hidden_sizes=[256, 256], concat=True)
        )
        for _ in range(2)
    ]
    algorithm = SAC(
        policy=SACPolicy(actor=actor, action_space=action_space),
        policy_optim=AdamOptimizerFactory(lr=3e-4),
        critic=critics[0],
        critic_optim=AdamOptimizerFactory(lr=3e-4),
        critic2=critics[1],
        critic2_optim=AdamOptimizerFactory(lr=3e-4),
        tau=0.005,
        gamma=0.98,
        # rewards are at most ~0.05 per step: start alpha at 0.01, not 1.0, or the entropy term drowns them
        alpha=AutoAlpha(
            target_entropy=-float(act_dim), log_alpha=float(np.log(0.01)), optim=AdamOptimizerFactory(lr=3e-4)
        ),
    )

    # data: the shared replay (one sub-buffer per env) and the collectors
    buffer = SharedVectorReplayBuffer(args.buffer_size, len(train_envs))
    train_collector = Collector[CollectStats](algorithm, train_envs, buffer, exploration_noise=True)
    test_collector = Collector[CollectStats](algorithm, test_envs)
    train_collector.reset()
    start_steps = min(args.start_steps, args.total_steps // 2)
    start_steps = max(args.num_envs, start_steps - start_steps % args.num_envs)
    train_collector.collect(n_step=start_steps, random=True)

    epoch_steps = max(args.num_envs, math.ceil((args.total_steps - start_steps) / args.epochs))
    result = algorithm.run_training(
        OffPolicyTrainerParams(
            training_collector=train_collector,
            test_collector=test_collector,
            max_epochs=args.epochs,
            epoch_num_steps=epoch_steps,
            collection_step_num_env_steps=args.num_envs,  # one vector step per collection
            update_step_num_gradient_steps_per_sample=args.gradient_steps / args.num_envs,
            batch_size=256,
            test_step_num_episodes=args.test_envs,
            verbose=True,
            show_progress=not args.no_progress,
        )
    )
    print(
        f"best test return {result.best_reward:.2f} +- {result.best_reward_std:.2f}; "
        f"{result.train_step} env steps, {result.update_step} gradient steps"
    )
    args.save_path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(algorithm.state_dict(), args.save_path)
    print(f"saved {args.save_path}")
    train_envs.close(), test_envs.close(), buffer.close()
    return args.save_path


if __name__ == "__main__":
    main()
