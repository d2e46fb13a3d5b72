"""Cost of the pipeline metrics: env-steps/s with metrics on vs off, side by side in one run.

    python benchmarks/bench_metrics.py            # 64 envs, 5 repeats
    python benchmarks/bench_metrics.py --quick    # fewer steps and repeats

Two comparisons (ratios: on / off; the target is a cost under 2 %):
- ``env``: one ``UniLabVectorEnv`` (64 envs) stepped in blocks of 10 steps, alternating step
  timing on (``env.step_latency``, what every collector records) and off (``None``), CPU time
  per env step, median over pairs of adjacent blocks; and the timing code alone (clock reads and
  histogram updates, timed in a loop) over the CPU time of one step: the exact cost, which the
  A/B comparison bounds within its noise.
- ``runner``: SAC training under ``AsyncRunner`` (2 collectors x 32 envs, replay ratio 1/64 as in
  ``compare_sb3.py``: collectors, weight sync and learner all busy) with everything on (env timing
  into shared memory, weight-sync latency, learner timers, the Prometheus endpoint scraped once
  per second) vs everything off (no env timing, no endpoint); env-steps/s of each run in a fresh
  process, interleaved, median of repeats.

Writes ``bench_metrics.json`` and ``bench_metrics.md`` to ``benchmarks/results``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import threading
import time
import urllib.request

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import RESULTS_DIR, machine_info, run_interleaved, summarize, write_json

from unilab_gym.cli import HelpFormatter

ID = "UniLab/Quadruped-v0"


def run_env_blocks(num_envs: int, blocks: int, block_steps: int = 10) -> dict[str, float]:
    """CPU µs per env step with step timing on and off, alternating blocks in one env.

    ``cost``: median over pairs of adjacent blocks of on / off - 1. ``cost_exact``: the timing
    code alone (4 clock reads and 2 histogram observations, timed in a loop) over the CPU time
    of one vector step.
    """
    import timeit

    from unilab_gym import UniLabVectorEnv
    from unilab_gym.latency import StepLatency

    env = UniLabVectorEnv(num_envs)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    actions = rng.uniform(-1, 1, (block_steps, num_envs, 12)).astype(np.float32)
    timing = StepLatency()
    per_step: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(3):  # warm-up
        env.step(actions[0])
    for b in range(2 * blocks):
        on = b % 2 == 0
        env.step_latency = timing if on else None
        t0 = time.process_time()
        for a in actions:
            env.step(a)
        per_step[on].append((time.process_time() - t0) / (block_steps * num_envs) * 1e6)
    env.close()
    clock = time.perf_counter_ns
    probe = StepLatency()

    def timing_code() -> None:
        clock(), clock(), clock(), clock()
        probe.physics.observe(3000.0)
        probe.task.observe(300.0)

    timing_us = min(timeit.repeat(timing_code, number=20_000, repeat=5)) / 20_000 * 1e6
    off = statistics.median(per_step[False])
    return {
        "cpu_us_per_env_step_on": statistics.median(per_step[True]),
        "cpu_us_per_env_step_off": off,
        "cost": statistics.median(a / b - 1.0 for a, b in zip(per_step[True], per_step[False])),
        "timing_us_per_step": timing_us,
        "cost_exact": timing_us / (off * num_envs),
    }


def untimed_env(num_envs: int):
    """A collector env with step timing off (module level: spawned collectors unpickle it)."""
    from unilab_gym import UniLabVectorEnv

    env = UniLabVectorEnv(num_envs)
    env.step_latency = None
    return env


def run_runner(num_envs: int, steps: int, metrics: bool) -> dict[str, float]:
    """Env-steps/s of SAC training with 2 AsyncRunner collectors, metrics on or off.

    Metrics on: step timing plus the Prometheus endpoint scraped at 1 Hz.
    """
    import torch
    from stable_baselines3 import SAC

    from unilab_gym import AsyncRunner, SharedReplayBuffer
    from unilab_gym.sb3.vec_env import make_sb3_env

    torch.set_num_threads(1)
    warmup = 20 * num_envs  # spawn, imports and the random-action phase (learning_starts) are not timed
    total = steps * num_envs
    model = SAC(
        "MlpPolicy",
        make_sb3_env(ID, 1),
        replay_buffer_class=SharedReplayBuffer,
        batch_size=256,
        buffer_size=total + warmup,
        learning_starts=10 * num_envs,
        seed=0,
    )
    env = dict(env_id=ID) if metrics else dict(env_fn=untimed_env)
    stop = threading.Event()
    scrapes = []
    with AsyncRunner(
        model,
        num_collectors=2,
        envs_per_collector=num_envs // 2,
        replay_ratio=1.0 / num_envs,
        seed=0,
        metrics_port=0 if metrics else None,
        **env,
    ) as runner:
        runner.learn(warmup)  # start-up (spawn, imports) is not timed

        def scrape() -> None:
            while not stop.wait(1.0):
                scrapes.append(len(urllib.request.urlopen(runner.metrics_url, timeout=5).read()))

        scraper = threading.Thread(target=scrape, daemon=True)
        if metrics:
            scraper.start()
        t0 = time.perf_counter()
        runner.learn(total, reset_num_timesteps=False)
        elapsed = time.perf_counter() - t0
        stop.set()
        if metrics:
            scraper.join()
    model.replay_buffer.close()
    return {"env_steps_per_s": total / elapsed, "scrapes": len(scrapes)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer steps and repeats")
    parser.add_argument("--num-envs", type=int, default=64, help="envs per configuration")
    parser.add_argument("--out", default=RESULTS_DIR, help="output directory")
    args = parser.parse_args()
    repeats, steps, blocks = (2, 200, 25) if args.quick else (5, 800, 100)
    n = args.num_envs

    env_runs = run_interleaved({"env": (run_env_blocks, dict(num_envs=n, blocks=blocks))}, repeats, desc="env blocks")[
        "env"
    ]
    runner_runs = run_interleaved(
        {
            "metrics on": (run_runner, dict(num_envs=n, steps=steps, metrics=True)),
            "metrics off": (run_runner, dict(num_envs=n, steps=steps, metrics=False)),
        },
        repeats,
        desc="runner",
    )
    env_cost = summarize(env_runs, "cost")
    exact = summarize(env_runs, "cost_exact")
    timing_us = statistics.median(r["timing_us_per_step"] for r in env_runs)
    on, off = (
        summarize(runner_runs["metrics on"], "env_steps_per_s"),
        summarize(runner_runs["metrics off"], "env_steps_per_s"),
    )
    runner_cost = 1.0 - on[0] / off[0]
    date = datetime.datetime.now().isoformat(timespec="seconds")
    lines = [
        f"# Metrics overhead ({date}, {n} envs, {repeats} repeats)",
        "",
        "| comparison | metrics on | metrics off | cost of metrics |",
        "|---|---|---|---|",
        f"| UniLabVectorEnv step timing, CPU µs per env step (median of {blocks} alternating blocks, median of runs) "
        f"| {statistics.median(r['cpu_us_per_env_step_on'] for r in env_runs):.1f} "
        f"| {statistics.median(r['cpu_us_per_env_step_off'] for r in env_runs):.1f} "
        f"| {100 * env_cost[0]:+.2f} % [{100 * env_cost[1]:+.2f}, {100 * env_cost[2]:+.2f}] |",
        f"| the timing code alone: {timing_us:.2f} µs per vector step, over the CPU time of a {n}-env step | | "
        f"| {100 * exact[0]:+.4f} % |",
        "| SAC under AsyncRunner, 2 collectors, env-steps/s (endpoint scraped at 1 Hz) "
        f"| {on[0]:,.0f} [{on[1]:,.0f}, {on[2]:,.0f}] "
        f"| {off[0]:,.0f} [{off[1]:,.0f}, {off[2]:,.0f}] | {100 * runner_cost:+.2f} % |",
    ]
    table = "\n".join(lines)
    print(table)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_metrics.md"), "w") as f:
        f.write(table + "\n")
    write_json(
        os.path.join(args.out, "bench_metrics.json"),
        {
            "date": date,
            "num_envs": n,
            "repeats": repeats,
            "machine": machine_info(),
            "env": env_runs,
            "runner": runner_runs,
            "cost": {"env": env_cost[0], "env_timing_code": exact[0], "runner": runner_cost},
        },
    )


if __name__ == "__main__":
    main()
