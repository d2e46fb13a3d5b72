"""Train Stable-Baselines3 PPO on UniLab/Quadruped-v0 with per-env domain randomization (64 envs).

    python examples/train_ppo_dr.py                                   # 1M env steps
    python examples/train_ppo_dr.py --minutes 15                      # or stop after 15 min of wall clock
    python examples/train_ppo_dr.py --total-steps 2048 --num-envs 4 --save-path /tmp/ppo_dr

Each env draws its physics at every reset from :data:`DOMAIN_RANDOMIZATION` (friction, trunk
mass and centre of mass, motor strength, PD gains, action latency, pushes), from its own
random stream, so the run stays reproducible. Writes ``<save-path>.zip``, the ``VecNormalize``
statistics ``<save-path>_vecnormalize.pkl`` and the parameter trace of every training episode
``<save-path>_trace.jsonl``. Then see how robust the policy is::

    unilab-gym robustness --model <save-path>.zip --sibling-vecnormalize --algo ppo --episodes 320 \\
        --grid friction=0.3:1.2:4,mass=-1:3:4
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback, ProgressBarCallback
from stable_baselines3.common.vec_env import VecNormalize

import unilab_gym  # noqa: F401  (registers UniLab/Quadruped-v0)
from unilab_gym.cli import HelpFormatter
from unilab_gym.sb3.vec_env import make_sb3_env

#: Ranges drawn per env and episode (see unilab_gym.randomization.PARAMETERS for units and sources).
#: Centred on the nominal A1 (friction 0.5, +0 kg, kp/kd/strength x1), somewhat narrower than legged_gym's.
DOMAIN_RANDOMIZATION = {
    "friction": (0.4, 1.0),
    "added_mass": (-0.5, 1.5),  # kg on the 4.713 kg trunk
    "com_x": (-0.03, 0.03),  # m
    "com_y": (-0.02, 0.02),  # m
    "motor_strength": (0.8, 1.1),
    "kp_factor": (0.8, 1.2),
    "kd_factor": (0.8, 1.2),
    "latency": (0, 1),  # control steps (20 ms each)
    "push_interval": (5.0, 10.0),  # s
    "push_velocity": (0.0, 0.5),  # m/s
}


class WallClockLimit(BaseCallback):
    """Stop training after ``seconds`` of wall clock (checked every step)."""

    def __init__(self, seconds: float):
        super().__init__()
        self.deadline = time.monotonic() + seconds

    def _on_step(self) -> bool:
        return time.monotonic() < self.deadline


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    parser.add_argument(
        "--total-steps",
        type=int,
        default=1_000_000,
        help="env steps (transitions) to train for; the default takes ~5 min on 2 idle cores "
        "(277 s of training in a timed run on 2026-12-05; randomization costs ~10%% of the env's speed)",
    )
    parser.add_argument(
        "--minutes", type=float, default=None, help="also stop after this many minutes of wall clock (None: no limit)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the model and the envs")
    parser.add_argument("--num-envs", type=int, default=64, help="envs, stepped in this process")
    parser.add_argument("--n-steps", type=int, default=64, help="rollout length per env and update")
    parser.add_argument(
        "--save-path", type=Path, default=Path("runs/ppo_dr/model"), help="writes <save-path>.zip, _vecnormalize.pkl"
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (1 is fastest for small nets on a busy CPU)"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (e.g. in CI logs)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    env = VecNormalize(
        make_sb3_env("UniLab/Quadruped-v0", args.num_envs, seed=args.seed, domain_randomization=DOMAIN_RANDOMIZATION),
        gamma=0.99,
    )
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
    callbacks = [c for c in (WallClockLimit(60 * args.minutes) if args.minutes else None, bar) if c is not None]
    try:
        model.learn(total_timesteps=args.total_steps, callback=callbacks)
    finally:  # SB3 closes its bar only when training ends: an open one breaks a Ctrl-C exit (tqdm ImportError)
        if bar is not None and getattr(bar, "pbar", None) is not None:
            bar.pbar.close()
    args.save_path.parent.mkdir(parents=True, exist_ok=True)
    model.save(args.save_path)
    env.save(f"{args.save_path}_vecnormalize.pkl")
    venv = env.unwrapped.venv  # VecNormalize -> VecMonitor -> SB3VecEnv -> UniLabVectorEnv
    trace = venv.save_parameter_trace(f"{args.save_path}_trace.jsonl")
    print(f"trained {model.num_timesteps} env steps; {len(venv.parameter_trace())} episodes in {trace}")
    print(f"saved {args.save_path.with_suffix('.zip')} and {args.save_path}_vecnormalize.pkl")
    env.close()
    return args.save_path.with_suffix(".zip")


if __name__ == "__main__":
    main()
