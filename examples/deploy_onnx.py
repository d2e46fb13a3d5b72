"""Run an exported policy in UniLab/Quadruped-v0 with onnxruntime only: no torch, no Stable-Baselines3.

    unilab-gym export runs/ppo_sb3/model.zip --out policy.onnx
    python examples/deploy_onnx.py policy.onnx --episodes 4

The ONNX file (from ``unilab_gym.export.export_onnx`` or ``unilab-gym export``) takes raw
observations: its ``VecNormalize`` statistics and action clipping are inside the graph, so the loop
is ``action = session.run(None, {"obs": obs})[0]``. The env id comes from the file's metadata. It
runs ``--episodes`` episodes, one per env of one vector env (env ``i`` seeded ``seed + i``), as
``unilab_gym.evaluation.evaluate_gait`` does, so the returns equal the torch policy's on the same
seeds.
"""

from __future__ import annotations

import argparse
import json

import gymnasium as gym
import numpy as np
import onnxruntime as ort

import unilab_gym  # noqa: F401  (registers UniLab/Quadruped-v0)
from unilab_gym.cli import HelpFormatter


def episode_returns(path: str, episodes: int = 4, seed: int = 0, **env_kwargs) -> np.ndarray:
    """The return of each of ``episodes`` episodes of the exported policy at ``path``: (episodes,) float64."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    env_id = session.get_modelmeta().custom_metadata_map.get("env_id", "UniLab/Quadruped-v0")
    env = gym.make_vec(env_id, num_envs=episodes, **env_kwargs)
    obs, _ = env.reset(seed=seed)
    returns, active = np.zeros(episodes), np.ones(episodes, bool)
    while active.any():
        action = session.run(["action"], {"obs": obs})[0]  # (episodes, 12) float32 in [-1, 1]
        obs, reward, terminated, truncated, _ = env.step(action)
        returns += active * reward
        active &= ~(terminated | truncated)
    env.close()
    return returns


def main(argv: list[str] | None = None) -> np.ndarray:
    """Run the episodes and print their returns (as JSON with ``--json``)."""
    parser = argparse.ArgumentParser(
        description="Run an exported ONNX policy in UniLab/Quadruped-v0.", formatter_class=HelpFormatter
    )
    parser.add_argument("policy", help="an .onnx file written by unilab_gym.export")
    parser.add_argument("--episodes", type=int, default=4, help="episodes, one per env of one vector env")
    parser.add_argument("--seed", type=int, default=0, help="env i is seeded seed + i")
    parser.add_argument("--max-episode-steps", type=int, default=1000, help="control steps per episode (50 per s)")
    parser.add_argument("--json", action="store_true", help="print the returns as a JSON list")
    args = parser.parse_args(argv)
    returns = episode_returns(args.policy, args.episodes, args.seed, max_episode_steps=args.max_episode_steps)
    if args.json:
        print(json.dumps(returns.tolist()))
    else:
        print(f"returns over {args.episodes} episodes: mean {returns.mean():.3f}, each {np.round(returns, 3).tolist()}")
    return returns


if __name__ == "__main__":
    main()
