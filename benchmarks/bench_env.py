"""Env stepping benchmark: env-steps/s and RSS of UniLabVectorEnv vs the raw physics loop and stock vectorization.

    python benchmarks/bench_env.py                # N = 64 and 256, 3 repeats
    python benchmarks/bench_env.py --quick        # N = 64, 1 repeat, fewer steps
    python benchmarks/bench_env.py --sweep-cluster  # envs_per_cluster at N = 64

Configurations (each run in a fresh process, interleaved, median of repeats):
- ``raw pybullet``: the same cluster worlds, substeps, PD and solver settings, stepped and read
  with no task code (``ClusterWorld.step`` + ``read_state``): the physics limit.
- ``UniLabVectorEnv``: the vector env, one process.
- ``UniLabVectorEnv, domain randomization``: the same with every parameter randomized (the ranges of
  ``examples/train_ppo_dr.py``: friction, mass, centre of mass, motor strength, gains, latency, pushes).
- ``DummyVecEnv``: SB3's DummyVecEnv over N single ``UniLab/Quadruped-v0`` envs.
- ``SubprocVecEnv (2 workers)`` / ``AsyncVectorEnv (2 workers)``: SB3 / gymnasium, one process per
  env as they are built, with 2 envs (one per core); their env-steps/s is directly comparable, their
  RSS is for 2 envs only.
- ``SubprocVecEnv (N procs)``: SB3's usual answer, one process per env (N = 64 only).
Also: 1024 envs construct and step (RSS and env-steps/s).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import RESULTS_DIR, machine_info, peak_rss_mb, run_interleaved, summarize, tree_rss_mb, write_json

from unilab_gym.cli import HelpFormatter


def _timed(step, n_envs: int, steps: int, warmup: int) -> dict[str, float]:
    rng = np.random.default_rng(0)
    actions = rng.uniform(-1, 1, (warmup + steps, n_envs, 12)).astype(np.float32)
    for a in actions[:warmup]:
        step(a)
    t0 = time.perf_counter()
    for a in actions[warmup:]:
        step(a)
    elapsed = time.perf_counter() - t0
    return {"env_steps_per_s": steps * n_envs / elapsed, "rss_mb": tree_rss_mb(), "peak_rss_mb": peak_rss_mb()}


def run_raw(num_envs: int, steps: int, warmup: int, envs_per_cluster: int | None = None) -> dict[str, float]:
    from unilab_gym import UniLabVectorEnv

    env = UniLabVectorEnv(num_envs, **({"envs_per_cluster": envs_per_cluster} if envs_per_cluster else {}))
    env.reset(seed=0)
    clusters = env._clusters  # same worlds, same settings; only the physics
    nominal, scale = env.nominal_joint_pos, env.action_scale

    def step(a):
        targets = nominal + scale * a
        for rows, world in clusters:
            world.step(targets[rows], env.kp[rows], env.kd[rows], env.torque_limits[rows], env.substeps)
            world.read_state()

    return _timed(step, num_envs, steps, warmup)


#: The ranges of examples/train_ppo_dr.py.
DOMAIN_RANDOMIZATION = {
    "friction": (0.4, 1.0),
    "added_mass": (-0.5, 1.5),
    "com_x": (-0.03, 0.03),
    "com_y": (-0.02, 0.02),
    "motor_strength": (0.8, 1.1),
    "kp_factor": (0.8, 1.2),
    "kd_factor": (0.8, 1.2),
    "latency": (0, 1),
    "push_interval": (5.0, 10.0),
    "push_velocity": (0.0, 0.5),
}


def run_unilab(
    num_envs: int, steps: int, warmup: int, envs_per_cluster: int | None = None, domain_randomization=None
) -> dict[str, float]:
    from unilab_gym import UniLabVectorEnv

    env = UniLabVectorEnv(
        num_envs,
        domain_randomization=domain_randomization,
        **({"envs_per_cluster": envs_per_cluster} if envs_per_cluster else {}),
    )
    env.reset(seed=0)
    return _timed(env.step, num_envs, steps, warmup)


def _single_env():
    import gymnasium as gym

    import unilab_gym  # noqa: F401

    return gym.make("UniLab/Quadruped-v0")


def run_dummy(num_envs: int, steps: int, warmup: int) -> dict[str, float]:
    from stable_baselines3.common.vec_env import DummyVecEnv

    env = DummyVecEnv([_single_env] * num_envs)
    env.seed(0)
    env.reset()
    return _timed(lambda a: env.step(a), num_envs, steps, warmup)


def run_subproc(num_envs: int, steps: int, warmup: int) -> dict[str, float]:
    from stable_baselines3.common.vec_env import SubprocVecEnv

    env = SubprocVecEnv([_single_env] * num_envs, start_method="forkserver")
    env.seed(0)
    env.reset()
    try:
        return _timed(lambda a: env.step(a), num_envs, steps, warmup)
    finally:
        env.close()


def run_async(num_envs: int, steps: int, warmup: int) -> dict[str, float]:
    import gymnasium as gym

    env = gym.vector.AsyncVectorEnv([_single_env] * num_envs, context="forkserver")
    env.reset(seed=0)
    try:
        return _timed(env.step, num_envs, steps, warmup)
    finally:
        env.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=HelpFormatter)
    parser.add_argument("--quick", action="store_true", help="N=64 only, 1 repeat, fewer steps")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats per configuration")
    parser.add_argument("--steps", type=int, default=100, help="timed control steps per run")
    parser.add_argument("--sweep-cluster", action="store_true", help="benchmark envs_per_cluster at N=64 instead")
    args = parser.parse_args()
    repeats = 1 if args.quick else args.repeats
    steps = 30 if args.quick else args.steps
    warmup = 10

    if args.sweep_cluster:
        configs = {}
        for epc in (1, 4, 8, 16, 32, 64):
            configs[f"envs_per_cluster={epc}"] = (
                run_unilab,
                dict(num_envs=64, steps=steps, warmup=warmup, envs_per_cluster=epc),
            )
        configs["256 envs, envs_per_cluster=16"] = (
            run_unilab,
            dict(num_envs=256, steps=steps // 2, warmup=warmup, envs_per_cluster=16),
        )
        configs["256 envs, envs_per_cluster=32"] = (
            run_unilab,
            dict(num_envs=256, steps=steps // 2, warmup=warmup, envs_per_cluster=32),
        )
        runs = run_interleaved(configs, repeats, desc="envs_per_cluster sweep")
        print("\n| configuration | env-steps/s (median [min, max]) | RSS MB |")
        print("|---|---|---|")
        for name, rs in runs.items():
            med, lo, hi = summarize(rs, "env_steps_per_s")
            print(f"| {name} | {med:,.0f} [{lo:,.0f}, {hi:,.0f}] | {summarize(rs, 'rss_mb')[0]:,.0f} |")
        write_json(os.path.join(RESULTS_DIR, "bench_env_cluster_sweep.json"), {"machine": machine_info(), "runs": runs})
        return

    sizes = [64] if args.quick else [64, 256]
    configs = {}
    for n in sizes:
        common = dict(num_envs=n, steps=steps, warmup=warmup)
        configs[f"N={n} raw pybullet"] = (run_raw, common)
        configs[f"N={n} UniLabVectorEnv"] = (run_unilab, common)
        configs[f"N={n} UniLabVectorEnv, domain randomization"] = (
            run_unilab,
            {**common, "domain_randomization": DOMAIN_RANDOMIZATION},
        )
        configs[f"N={n} DummyVecEnv"] = (run_dummy, common)
    two = dict(num_envs=2, steps=steps * 8, warmup=warmup)
    configs["SubprocVecEnv (2 workers)"] = (run_subproc, two)
    configs["AsyncVectorEnv (2 workers)"] = (run_async, two)
    if not args.quick:
        configs["N=64 SubprocVecEnv (64 procs)"] = (run_subproc, dict(num_envs=64, steps=steps // 2, warmup=warmup))
        configs["N=1024 UniLabVectorEnv"] = (run_unilab, dict(num_envs=1024, steps=10, warmup=2))
    print("N=256 SubprocVecEnv / AsyncVectorEnv with one process per env are not run: 256 processes.")
    runs = run_interleaved(configs, repeats, desc="env stepping")

    def med(name, key="env_steps_per_s"):
        return summarize(runs[name], key)[0]

    print("\n| configuration | env-steps/s (median [min, max]) | RSS MB (process tree) | vs raw | vs DummyVecEnv |")
    print("|---|---|---|---|---|")
    for name, rs in runs.items():
        m, lo, hi = summarize(rs, "env_steps_per_s")
        n = name.split()[0]
        raw = f"N={n[2:]} raw pybullet" if n.startswith("N=") else None
        dummy = f"N={n[2:]} DummyVecEnv" if n.startswith("N=") else "N=64 DummyVecEnv"
        vs_raw = f"{m / med(raw):.2f}×" if raw in runs else "–"
        vs_dummy = f"{m / med(dummy):.2f}×" if dummy in runs else "–"
        print(
            f"| {name} | {m:,.0f} [{lo:,.0f}, {hi:,.0f}] | {summarize(rs, 'rss_mb')[0]:,.0f} | {vs_raw} | {vs_dummy} |"
        )
    write_json(
        os.path.join(RESULTS_DIR, "bench_env.json"),
        {"machine": machine_info(), "steps": steps, "repeats": repeats, "runs": runs},
    )


if __name__ == "__main__":
    main()
