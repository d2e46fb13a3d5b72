"""SAC on UniLab/Quadruped-v0 with a shared-memory replay that another process writes into.

    python examples/train_sac_shared_replay.py                          # ~1-2 min on 2 cores
    python examples/train_sac_shared_replay.py --total-steps 50000 --seed 1 --save-replay

1. SAC is built with ``replay_buffer_class=SharedReplayBuffer``: its replay is one packed
   float32 block in shared memory.
2. A collector *process* (spawned) attaches to that block by ``model.replay_buffer.handle``
   and writes ``--prefill`` random-action transitions into it: SAC's warm-up, done elsewhere,
   without copying the replay.
3. SAC trains as usual (its own transitions go to the same block) and the model is saved to
   ``<save-path>.zip`` (and the replay to ``<save-path>_replay.pkl`` with ``--save-replay``).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
from pathlib import Path

import numpy as np

from unilab_gym.cli import HelpFormatter

ENV_ID = "UniLab/Quadruped-v0"


def collect_random(handle, transitions: int, num_envs: int, seed: int) -> None:
    """Collector process: random actions, transitions written straight into the shared replay."""
    import unilab_gym  # noqa: F401  (registers the env)
    from unilab_gym.replay import ReplayStorage
    from unilab_gym.sb3.vec_env import make_sb3_env

    storage = ReplayStorage.attach(handle)  # zero copy, never unlinks the learner's segment
    env = make_sb3_env(ENV_ID, num_envs, seed=seed)
    env.action_space.seed(seed)
    low, high = env.action_space.low, env.action_space.high
    try:
        obs = env.reset()
        for _ in range(0, transitions, num_envs):
            action = np.stack([env.action_space.sample() for _ in range(num_envs)])
            new_obs, reward, done, infos = env.step(action)
            next_obs = new_obs.copy()  # at an episode end: the last obs, not the reset one
            for i in np.flatnonzero(done):
                next_obs[i] = infos[i]["terminal_observation"]
            time_limit = np.array([info.get("TimeLimit.truncated", False) for info in infos])
            storage.add(
                obs,
                next_obs,
                2.0 * (action - low) / (high - low) - 1.0,  # SAC stores actions scaled to [-1, 1]
                reward,
                terminated=done & ~time_limit,  # cuts the bootstrap
                truncated=done & time_limit,  # time limit: bootstrap kept
            )
            obs = new_obs
    finally:
        env.close()
        storage.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    p.add_argument(
        "--total-steps", type=int, default=10_000, help="SAC env steps (transitions) to train for (~1-2 min on 2 cores)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the model and the envs")
    p.add_argument("--num-envs", type=int, default=16, help="envs of SAC and of the collector process")
    p.add_argument("--prefill", type=int, default=2_000, help="random transitions written by the collector process")
    p.add_argument("--gradient-steps", type=int, default=2, help="gradient steps per vector step")
    p.add_argument("--buffer-size", type=int, default=200_000, help="replay capacity in transitions")
    p.add_argument(
        "--save-path", type=Path, default=Path("runs/sac_shared_replay/model"), help="writes <save-path>.zip"
    )
    p.add_argument("--save-replay", action="store_true", help="also save the replay (a plain copy)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    from stable_baselines3 import SAC

    import unilab_gym  # noqa: F401
    from unilab_gym.sb3.replay_buffer import SharedReplayBuffer
    from unilab_gym.sb3.vec_env import make_sb3_env

    env = make_sb3_env(ENV_ID, args.num_envs, seed=args.seed)
    model = SAC(
        "MlpPolicy",
        env,
        replay_buffer_class=SharedReplayBuffer,
        buffer_size=args.buffer_size,
        learning_starts=0 if args.prefill > 0 else 1_000,  # the collector did the warm-up
        batch_size=256,
        gamma=0.98,
        gradient_steps=args.gradient_steps,
        policy_kwargs=dict(net_arch=[256, 256]),
        seed=args.seed,
        device="cpu",
        verbose=1,
    )
    replay = model.replay_buffer
    if args.prefill > 0:
        collector = mp.get_context("spawn").Process(
            target=collect_random, args=(replay.handle, args.prefill, args.num_envs, args.seed + 10_000)
        )
        collector.start()
        collector.join()
        if collector.exitcode != 0:
            raise RuntimeError(f"collector process failed with exit code {collector.exitcode}")
        print(f"collector process wrote {replay.storage.committed} transitions into {replay.storage.name}")
    model.learn(total_timesteps=args.total_steps, log_interval=10)
    print(f"replay: {replay.storage.committed} transitions committed, size() = {replay.size()} steps")
    args.save_path.parent.mkdir(parents=True, exist_ok=True)
    model.save(args.save_path)
    print(f"saved {args.save_path.with_suffix('.zip')}")
    if args.save_replay:
        model.save_replay_buffer(f"{args.save_path}_replay.pkl")
        print(f"saved {args.save_path}_replay.pkl")
    replay.close()
    env.close()
    return args.save_path.with_suffix(".zip")


if __name__ == "__main__":
    main()
