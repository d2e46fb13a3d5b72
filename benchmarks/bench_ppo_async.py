"""PPO: AsyncRunner (2 collectors x 32 envs, lag 0 and 1) vs stock SB3, side by side, in one run.

    python benchmarks/bench_ppo_async.py             # 3 seeds x 20 rollouts of 4,096 steps: ~7-10 min on 2 idle cores
    python benchmarks/bench_ppo_async.py --quick     # 1 seed x 4 rollouts: ~1 min
    python benchmarks/bench_ppo_async.py --rollouts 40 --seeds 5

Configurations, all with ``n_steps=64`` per env of 64 envs (rollouts of 4,096 transitions),
``batch_size=256``, ``n_epochs=5``, the default ``MlpPolicy``, one torch thread in the learner,
episodes cut at 250 steps, and the same total env steps:

- ``stock SB3 PPO, SB3VecEnv (64 envs, 1 process)``: ``make_sb3_env(id, 64)``;
- ``stock SB3 PPO, SubprocVecEnv (2 workers)``: SB3's ``SubprocVecEnv`` of 2 single-env
  processes; SB3 builds one env per process, so to train on rollouts of the same size it runs
  ``n_steps = 64 * 32`` per env (equal ``n_steps * n_envs``, hence equal gradient steps);
- ``AsyncRunner PPO (2 x 32, lag 0)`` and ``(lag 1)``.

Each run is a fresh process, configurations are interleaved per seed (``common.run_interleaved``).
Wall clock counts everything inside ``learn`` (AsyncRunner: spawning the collectors too, about
4 s here: each collector imports torch and SB3); *env-steps/s* is total env steps / wall clock;
*steady env-steps/s* counts from the end of the first rollout on (one-time start-up excluded).
Other users' processes take cores that the 2 collectors would use, so every run first waits
(up to 10 min) until the machine is quiet (other processes under 0.2 cores), and the table shows
the cores busy on the whole machine during each run (~1 for stock SB3, ~2 for AsyncRunner when
nothing else runs).
The final return is a deterministic evaluation of the trained policy on 16 envs (250 steps).
Writes ``bench_ppo_async.md`` and ``bench_ppo_async.json`` to ``--out`` (default ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import RESULTS_DIR, busy_cores, cpu_jiffies, machine_info, run_interleaved, summarize, write_json
from compare_sb3 import run_ppo, table

from unilab_gym.cli import HelpFormatter

NUM_ENVS = 64
N_STEPS = 64
CONFIGS = {
    "stock SB3 PPO, SB3VecEnv (64 envs, 1 process)": dict(kind="stock"),
    "stock SB3 PPO, SubprocVecEnv (2 workers)": dict(kind="subproc", workers=2),
    "AsyncRunner PPO (2 x 32, lag 0)": dict(kind="async", lag=0),
    "AsyncRunner PPO (2 x 32, lag 1)": dict(kind="async", lag=1),
}
STOCK = [name for name, kw in CONFIGS.items() if kw["kind"] != "async"]


def wait_for_quiet(max_busy: float = 0.2, timeout_s: float = 600.0) -> float:
    """Wait (at most ``timeout_s``) until other processes use under ``max_busy`` cores; return the seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s and (busy_cores(2.0) or 0.0) > max_busy:
        pass
    return time.monotonic() - t0


def run_on_quiet_machine(**kwargs: Any) -> dict[str, Any]:
    """``run_ppo(**kwargs)`` once the machine is quiet, with the machine's busy cores during the run.

    ``machine_busy_cores`` counts every process (this run's too: ideally ~1 for the stock
    configurations and ~2 for AsyncRunner); more than that means other users took cores.
    """
    waited = wait_for_quiet()
    total0, idle0 = cpu_jiffies()
    out = run_ppo(**kwargs)
    total1, idle1 = cpu_jiffies()
    out["machine_busy_cores"] = (os.cpu_count() or 1) * (1 - (idle1 - idle0) / max(total1 - total0, 1))
    out["waited_for_quiet_s"] = waited
    return out


def configs(total_steps: int, seed: int) -> dict[str, tuple[Any, dict[str, Any]]]:
    return {
        name: (run_on_quiet_machine, dict(num_envs=NUM_ENVS, total_steps=total_steps, seed=seed, n_steps=N_STEPS, **kw))
        for name, kw in CONFIGS.items()
    }


def report(runs: dict[str, list[dict[str, Any]]], total_steps: int, seeds: int) -> str:
    keys = [
        ("env_steps_per_s", "env-steps/s"),
        ("steady_env_steps_per_s", "steady env-steps/s"),
        ("wall_s", "wall clock s"),
        ("first_rollout_s", "first rollout s"),
        ("final_return", "final return"),
        ("machine_busy_cores", "machine busy cores"),
    ]
    best = max(STOCK, key=lambda name: summarize(runs[name], "env_steps_per_s")[0])
    lines = [
        table(
            f"PPO, {NUM_ENVS} envs, n_steps {N_STEPS}, batch 256, 5 epochs, {total_steps:,} env steps, {seeds} seed(s)",
            runs,
            keys,
            None,
        )
    ]
    for key, label in (("env_steps_per_s", "Env-steps/s"), ("steady_env_steps_per_s", "Steady env-steps/s")):
        base = summarize(runs[best], key)[0]
        lines.append(
            f"{label} vs the best stock configuration ({best}): "
            + ", ".join(f"{name} {summarize(rs, key)[0] / base:.2f}×" for name, rs in runs.items())
            + "\n"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=HelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 seed, 4 rollouts")
    parser.add_argument("--rollouts", type=int, default=None, help="rollouts of 4,096 env steps per run (default 20)")
    parser.add_argument("--seeds", type=int, default=None, help="seeds (default 3)")
    parser.add_argument("--out", default=RESULTS_DIR, help="output directory")
    args = parser.parse_args(argv)
    rollouts = args.rollouts or (4 if args.quick else 20)
    seeds = args.seeds or (1 if args.quick else 3)
    total_steps = rollouts * NUM_ENVS * N_STEPS
    t0 = time.perf_counter()
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in CONFIGS}
    for seed in range(seeds):
        for name, rs in run_interleaved(configs(total_steps, seed), 1, desc=f"ppo seed {seed}").items():
            runs[name].extend(rs)
    load = {"before": load_before, "after": os.getloadavg()}  # other users of the machine skew the ratios
    machine = machine_info()
    text = (
        f"## AsyncRunner PPO vs stock SB3 ({datetime.date.today().isoformat()})\n\n"
        f"Machine: {machine['cpu']}, {machine['cores']} cores; load average (1, 5, 15 min) before "
        f"{', '.join(f'{x:.1f}' for x in load['before'])}, after {', '.join(f'{x:.1f}' for x in load['after'])}.\n\n"
        + report(runs, total_steps, seeds)
    )
    payload = {
        "date": datetime.date.today().isoformat(),
        "machine": machine,
        "load_average": load,
        "total_steps": total_steps,
        "seeds": seeds,
        "runs": runs,
        "elapsed_s": time.perf_counter() - t0,
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_ppo_async.md"), "w") as f:
        f.write(text)
    write_json(os.path.join(args.out, "bench_ppo_async.json"), payload)
    print(text)
    print(f"wrote {args.out}/bench_ppo_async.{{md,json}} in {payload['elapsed_s']:.0f} s")
    return payload


if __name__ == "__main__":
    main()
