"""Fixed rollouts of ``UniLab/Quadruped-v0`` recorded before the robot/task seam (issue 27) and compared since.

``python tests/helpers/_quadruped_rollout.py`` rewrites ``tests/env/data/quadruped_v0_rollout.npz``; it was run once
with the code before issue 27 (commit 671a332), so the stored arrays are the old code path's. Only the public API is
used, so the same function runs on the old code and on the new.
"""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np

import unilab_gym  # noqa: F401  (registers the ids)

STORED = Path(__file__).resolve().parents[1] / "env" / "data" / "quadruped_v0_rollout.npz"

#: Reward terms in the order the stored arrays hold them.
TERMS = (
    "tracking_lin_vel",
    "tracking_ang_vel",
    "lin_vel_z",
    "ang_vel_xy",
    "torques",
    "action_rate",
    "alive",
    "feet_air_time",
    "base_height",
    "orientation",
    "collision",
)

#: name -> (num_envs, envs_per_cluster, steps, kwargs). "default" is the env with its defaults; the others add
#: falls with autoresets (a high fall height), truncations, domain randomization and privileged observations.
SCENARIOS: dict[str, tuple[int, int, int, dict]] = {
    "default": (4, 2, 100, {}),
    "falls": (4, 3, 80, {"max_episode_steps": 30, "termination": {"min_base_height": 0.27}}),
    "dr_privileged": (
        3,
        2,
        60,
        {
            "privileged_obs": True,
            "autoreset_mode": "SameStep",
            "max_episode_steps": 25,
            "domain_randomization": {
                "friction": (0.3, 1.2),
                "added_mass": (-1.0, 1.0),
                "com_x": (-0.05, 0.05),
                "motor_strength": (0.8, 1.1),
                "kp_factor": (0.8, 1.2),
                "latency": (0, 2),
                "push_interval": (0.2, 0.4),
                "push_velocity": (0.0, 0.5),
            },
        },
    ),
}


def vector_rollout(name: str) -> dict[str, np.ndarray]:
    """Scenario ``name`` under seeded random actions: obs (steps + 1, n, 48) float32 (and ``critic``), rew (steps, n),
    term/trunc (steps, n) bool, terms (steps, 11, n) float64 (NaN where an env has no reward terms)."""
    n, per_cluster, steps, kwargs = SCENARIOS[name]
    env = gym.make_vec("UniLab/Quadruped-v0", num_envs=n, envs_per_cluster=per_cluster, **kwargs)
    try:
        rng = np.random.default_rng(5)
        obs, _ = env.reset(seed=11)
        out: dict[str, list] = {"obs": [], "critic": [], "rew": [], "term": [], "trunc": [], "terms": []}

        def keep(o):
            if isinstance(o, dict):
                out["obs"].append(o["policy"])
                out["critic"].append(o["critic"])
            else:
                out["obs"].append(o)

        keep(obs)
        for _ in range(steps):
            obs, rew, term, trunc, info = env.step(rng.uniform(-1, 1, (n, 12)))
            keep(obs)
            terms = info.get("reward_terms", {})
            if "final_info" in info:  # SameStep: a finished env's terms are in final_info
                final = info["final_info"]["reward_terms"]
                terms = {k: np.where(info["_final_info"], final[k], terms.get(k, np.nan)) for k in TERMS}
            out["terms"].append(np.stack([np.asarray(terms.get(k, np.full(n, np.nan)), np.float64) for k in TERMS]))
            out["rew"].append(rew)
            out["term"].append(term)
            out["trunc"].append(trunc)
    finally:
        env.close()
    return {f"{name}/{k}": np.stack(v) for k, v in out.items() if v}


def single_rollout(steps: int = 60) -> dict[str, np.ndarray]:
    """``gym.make("UniLab/Quadruped-v0")`` with its defaults: obs (steps + 1, 48), rew (steps,)."""
    env = gym.make("UniLab/Quadruped-v0")
    try:
        rng = np.random.default_rng(8)
        obs, _ = env.reset(seed=2)
        seen, rewards = [obs], []
        for _ in range(steps):
            obs, rew, _, _, _ = env.step(rng.uniform(-1, 1, 12))
            seen.append(obs)
            rewards.append(rew)
    finally:
        env.close()
    return {"single/obs": np.stack(seen), "single/rew": np.array(rewards)}


def record() -> dict[str, np.ndarray]:
    """Every scenario's arrays."""
    arrays: dict[str, np.ndarray] = {}
    for name in SCENARIOS:
        arrays.update(vector_rollout(name))
    arrays.update(single_rollout())
    return arrays


if __name__ == "__main__":
    STORED.parent.mkdir(exist_ok=True)
    np.savez_compressed(STORED, **record())
    print(STORED, STORED.stat().st_size, "bytes")
