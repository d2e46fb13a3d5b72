"""Asymmetric vs symmetric critic: PPO under domain randomization, same wall clock, robustness report.

    python benchmarks/asymmetric_check.py                  # 3 seeds x 2 critics x 5 min + evaluation, ~45 min
    python benchmarks/asymmetric_check.py --minutes 2 --parallel 2  # the committed run (results/asymmetric/)
    python benchmarks/asymmetric_check.py --quick          # smoke: 1 seed, 20 s of training, a 2 x 2 grid

**Configurations.** Both train stock SB3 PPO with :class:`~unilab_gym.sb3.vec_env.AsymmetricActorCriticPolicy`
on the same env, ``VecNormalize(make_sb3_env(id, --num-envs, privileged_obs=True, domain_randomization=DR))``,
with the same hyperparameters (those of ``examples/train_ppo_sb3.py``) and networks; they differ only
in what the value net reads:

- ``asymmetric``: ``critic_key="critic"``, the 68 values of ``CRITIC_OBS_LAYOUT`` (the episode's
  physics parameters, base height, foot contacts, feet air times, and the policy's 48);
- ``symmetric``: ``critic_key="policy"``, the actor's 48 values.

The actor reads the 48 policy values in both. DR (:data:`DR`) draws friction and added mass over
the evaluation grid's ranges, and motor strength and PD gains within +-20 %.

**Timing.** Each (configuration, seed) trains for ``--minutes`` in a fresh spawned process (torch on
one thread), interleaved (seed 0: A S, seed 1: S A, seed 2: A S, ...), so machine noise hits both
alike. The budget is the CPU time of the training process: on an idle machine a run has its core to
itself, so this is its wall clock; on a shared machine, where the same wall clock can be twice the
compute for one run as for the next, it keeps both configurations at the same compute.
``--wall-clock`` makes it wall-clock time instead. The report gives both times of every run.
``--parallel N`` runs N runs at once, each in its own process, in the same interleaved order (the two
configurations of a seed side by side): on a machine that other jobs oversubscribe, each process gets
its share of the cores, so N at once finish sooner, at the same CPU budget each.

**Evaluation.** The robustness report's machinery (:mod:`unilab_gym.cli.robustness`, ``unilab-gym
robustness``): ``--episodes`` deterministic episodes over the friction x added-mass grid
(``--grid``), episodes of ``--eval-steps`` control steps, the same episode seeds in every cell;
success = no fall before the time limit. The policy is the actor alone: ``model.predict`` on the
48-value observation, normalized with the run's frozen ``VecNormalize`` statistics.

Writes ``results.json`` (every run: settings, env steps, wall and CPU seconds, per-cell summary),
``results.md`` (the table) and ``heatmap_<config>.png`` (success over the grid, the seeds pooled)
to ``--out`` (default ``benchmarks/results/asymmetric/``), with the machine's load at start and end.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (
    RESULTS_DIR,
    _child_main,
    busy_warning,
    machine_info,
    run_in_fresh_process,
    sample_load,
    stop_process_tree,
    write_json,
)

from unilab_gym.cli import HelpFormatter
from unilab_gym.validation import check_positive, check_positive_int

ID = "UniLab/Quadruped-v0"
#: Training domain randomization: friction and added mass over the evaluation grid, motor and PD gains +-20 %.
DR = {
    "friction": (0.3, 1.2),
    "added_mass": (-1.0, 3.0),
    "motor_strength": (0.8, 1.2),
    "kp_factor": (0.8, 1.2),
    "kd_factor": (0.8, 1.2),
}
#: The evaluation grid (``unilab-gym robustness --grid``), as in ``benchmarks/results/robustness/``.
GRID = "friction=0.3:1.2:4,mass=-1:3:4"
#: The keys of each evaluation episode kept in ``results.json`` (:func:`unilab_gym.cli.robustness.evaluate`'s records).
RECORD_KEYS = ("cell", "return", "length", "termination", "fall_conditions")
#: Configuration -> the key the value net reads.
CONFIGS = {"asymmetric": "critic", "symmetric": "policy"}
EVAL_SEED = 10_000


def ppo_kwargs(num_envs: int, critic_key: str) -> dict[str, Any]:
    """``learning_check.ppo_kwargs`` (``examples/train_ppo_sb3.py``'s PPO settings), with the critic's key."""
    from learning_check import ppo_kwargs as learning_check_ppo_kwargs

    kwargs = learning_check_ppo_kwargs(num_envs)
    kwargs["policy_kwargs"]["critic_key"] = critic_key
    return kwargs


def train_and_evaluate(
    config: str,
    seed: int,
    seconds: float,
    num_envs: int,
    episodes: int,
    grid: str,
    eval_steps: int,
    models: str,
    wall_clock: bool = False,
) -> dict[str, Any]:
    """One run (in its own process): train ``config`` for ``seconds``, save it in ``models``, evaluate it."""
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.vec_env import VecNormalize

    from unilab_gym.cli.robustness import evaluate, parse_grid, summarize
    from unilab_gym.sb3.vec_env import AsymmetricActorCriticPolicy, make_sb3_env

    torch.set_num_threads(1)
    env = VecNormalize(make_sb3_env(ID, num_envs, seed=seed, privileged_obs=True, domain_randomization=DR), gamma=0.99)
    model = PPO(
        AsymmetricActorCriticPolicy, env, seed=seed, device="cpu", verbose=0, **ppo_kwargs(num_envs, CONFIGS[config])
    )

    clock = time.perf_counter if wall_clock else time.process_time

    class Deadline(BaseCallback):
        def _on_step(self) -> bool:
            return clock() - budget_start < seconds

    cpu0, start = time.process_time(), time.perf_counter()
    budget_start = clock()
    model.learn(10**9, callback=Deadline())
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu0
    train_return = float(np.mean([e["r"] for e in model.ep_info_buffer])) if model.ep_info_buffer else float("nan")
    run_dir = Path(models) / f"{config}_seed{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    model.save(run_dir / "model.zip")
    env.save(str(run_dir / "vecnormalize.pkl"))
    env.training = False
    critic_shape = env.observation_space["critic"].shape

    def policy(obs: np.ndarray) -> np.ndarray:  # the actor alone: the critic key is zeros, which it never reads
        full = {"policy": obs, "critic": np.zeros((len(obs), *critic_shape), np.float32)}
        return model.predict(env.normalize_obs(full), deterministic=True)[0]

    axes = parse_grid(grid)
    t_eval = time.perf_counter()
    records = evaluate(
        policy, axes, episodes, env_kwargs={"max_episode_steps": eval_steps}, seed=EVAL_SEED, progress=False
    )
    summary = summarize(records, axes)
    env.close()
    successes = [r["termination"] != "fall" for r in records]
    return {
        "config": config,
        "seed": seed,
        "critic_key": CONFIGS[config],
        "train_wall_s": wall,
        "train_cpu_s": cpu,
        "env_steps": int(model.num_timesteps),
        "updates": int(model._n_updates),
        "train_ep_return": train_return,
        "eval_s": time.perf_counter() - t_eval,
        "episodes": len(records),
        "success_rate": float(np.mean(successes)),
        "mean_return": float(np.mean([r["return"] for r in records])),
        "cells": summary,
        # what the robustness summary reads back in report(): a fall's conditions too (a run with falls failed there)
        "records": [{k: r[k] for k in RECORD_KEYS if k in r} for r in records],
    }


def run_parallel(jobs: list[dict[str, Any]], parallel: int) -> list[dict[str, Any]]:
    """``train_and_evaluate(**job)`` for every job, ``parallel`` fresh spawned processes at a time; results in order.

    Raises:
        RuntimeError: a run failed (its traceback) or died; the other runs are stopped (their process trees).
    """
    from multiprocessing.connection import wait

    ctx = mp.get_context("spawn")
    pending, running, results = list(enumerate(jobs)), {}, {}
    try:
        while pending or running:
            while pending and len(running) < parallel:
                k, job = pending.pop(0)
                receiver, sender = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_child_main, args=(sender, train_and_evaluate, job), name=f"asymmetric {k}")
                proc.start()
                sender.close()
                running[k] = (proc, receiver)
                print(f"  started {job['config']}, seed {job['seed']} (pid {proc.pid})", flush=True)
            wait([r for _, r in running.values()] + [p.sentinel for p, _ in running.values()])
            for k, (proc, receiver) in list(running.items()):
                if not receiver.poll() and proc.is_alive():
                    continue
                del running[k]
                if not receiver.poll():
                    proc.join()
                    raise RuntimeError(f"run {k} exited with code {proc.exitcode} without a result")
                status, payload = receiver.recv()
                proc.join()
                receiver.close()
                if status != "ok":
                    raise RuntimeError(f"run {k} failed:\n{payload}")
                results[k] = payload
                _print_run(payload)
    except BaseException:
        for proc, _ in running.values():
            stop_process_tree(proc)
        raise
    return [results[k] for k in range(len(jobs))]


def _print_run(run: dict[str, Any]) -> None:
    print(
        f"  {run['config']} seed {run['seed']}: {run['env_steps']:,} env steps ({run['train_cpu_s']:.0f} CPU s, "
        f"{run['train_wall_s']:.0f} s), success {run['success_rate']:.1%}, eval return {run['mean_return']:.2f}",
        flush=True,
    )


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in runs))


def markdown(payload: dict[str, Any]) -> str:
    """The results table (one row per run, then the per-configuration medians)."""
    s = payload["settings"]
    lines = [
        "# Asymmetric vs symmetric critic (PPO under domain randomization)",
        "",
        f"- `python benchmarks/asymmetric_check.py --minutes {s['minutes']:g} --seeds {s['seeds']} "
        f"--num-envs {s['num_envs']} --episodes {s['episodes']} --eval-steps {s['eval_steps']}"
        + (" --wall-clock" if s["wall_clock"] else "")
        + (f" --parallel {s['parallel']}" if s.get("parallel", 1) > 1 else "")
        + (" --quick" if s["quick"] else "")
        + "`",
        f"- Training: {s['minutes']:g} min of {'wall-clock' if s['wall_clock'] else 'CPU'} time per run, "
        f"{s['num_envs']} envs, DR {s['dr']}.",
        f"- Evaluation: grid `{s['grid']}`, {s['episodes']} episodes per run (the same seeds in every cell), "
        f"{s['eval_steps']} control steps ({s['eval_steps'] * 0.02:g} s) per episode; success = no fall.",
        f"- Machine: load average {payload['load_start']['load_average']} at start, "
        f"{payload['load_end']['load_average']} at end; busy cores (other processes) "
        f"{payload['load_start']['busy_cores']} / {payload['load_end']['busy_cores']} "
        f"of {payload['load_start']['cores']}.",
    ]
    if payload.get("warning"):
        lines.append(f"- **Warning:** {payload['warning']}")
    lines += [
        "",
        "| critic | seed | env steps | train wall s | train CPU s | train return | success | eval return |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in payload["runs"]:
        lines.append(
            f"| {r['config']} | {r['seed']} | {r['env_steps']:,} | {r['train_wall_s']:.0f} | {r['train_cpu_s']:.0f} "
            f"| {r['train_ep_return']:.2f} | {r['success_rate']:.1%} | {r['mean_return']:.2f} |"
        )
    lines += ["", "| critic | runs | median env steps | median success | median eval return | success per seed |"]
    lines.append("|---|---:|---:|---:|---:|---|")
    for config in CONFIGS:
        runs = [r for r in payload["runs"] if r["config"] == config]
        if runs:
            per_seed = ", ".join(f"{r['success_rate']:.0%}" for r in sorted(runs, key=lambda r: r["seed"]))
            lines.append(
                f"| {config} | {len(runs)} | {_median(runs, 'env_steps'):,.0f} | {_median(runs, 'success_rate'):.1%} "
                f"| {_median(runs, 'mean_return'):.2f} | {per_seed} |"
            )
    for config in CONFIGS:
        lines += ["", f"![{config}: success over the grid, seeds pooled](heatmap_{config}.png)"]
    return "\n".join(lines) + "\n"


def report(payload: dict[str, Any], out: Path) -> None:
    """Write ``results.json``, ``results.md`` and one heat map per configuration (the seeds' episodes pooled).

    The JSON is written first, so a run's figures survive a failure in the plotting.
    """
    from unilab_gym.cli.robustness import parse_grid, summarize, write_heatmap

    out.mkdir(parents=True, exist_ok=True)
    write_json(str(out / "results.json"), payload)
    (out / "results.md").write_text(markdown(payload))
    axes = parse_grid(payload["settings"]["grid"])
    for config in CONFIGS:
        records = [rec for r in payload["runs"] if r["config"] == config for rec in r["records"]]
        if records:
            write_heatmap(out / f"heatmap_{config}.png", summarize(records, axes), axes)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--minutes", type=float, default=5.0, help="training budget per run, in minutes")
    parser.add_argument("--wall-clock", action="store_true", help="budget in wall-clock time, not process CPU time")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per configuration")
    parser.add_argument("--num-envs", type=int, default=64, help="training envs")
    parser.add_argument("--episodes", type=int, default=64, help="evaluation episodes per run over the grid")
    parser.add_argument("--eval-steps", type=int, default=500, help="control steps per evaluation episode")
    parser.add_argument("--grid", default=GRID, help="evaluation grid, as unilab-gym robustness --grid")
    parser.add_argument("--parallel", type=int, default=1, help="runs at once (1: one after the other)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 seed, 20 s, 8 envs, a 2 x 2 grid")
    parser.add_argument("--out", default=os.path.join(RESULTS_DIR, "asymmetric"), help="output directory")
    parser.add_argument("--models", default="runs/asymmetric_check", help="where each run's model.zip goes")
    args = parser.parse_args(argv)
    if args.quick:
        args.minutes, args.seeds, args.num_envs, args.episodes, args.eval_steps = 1 / 3, 1, 8, 8, 50
        args.grid = "friction=0.3:1.2:2,mass=-1:3:2"
    minutes = check_positive("--minutes", args.minutes)
    seeds = check_positive_int("--seeds", args.seeds)
    out = Path(args.out)
    load_start = sample_load()
    print(f"machine: {load_start}; {2 * seeds} runs of {minutes:g} min + evaluation", flush=True)
    jobs = [
        dict(
            config=config,
            seed=seed,
            seconds=minutes * 60.0,
            num_envs=check_positive_int("--num-envs", args.num_envs),
            episodes=check_positive_int("--episodes", args.episodes),
            grid=args.grid,
            eval_steps=check_positive_int("--eval-steps", args.eval_steps),
            models=args.models,
            wall_clock=bool(args.wall_clock),
        )
        for seed in range(seeds)
        for config in (list(CONFIGS) if seed % 2 == 0 else list(reversed(CONFIGS)))
    ]
    parallel = check_positive_int("--parallel", args.parallel)
    if parallel > 1:
        runs = run_parallel(jobs, parallel)
    else:
        runs = []
        for job in jobs:
            runs.append(run_in_fresh_process(train_and_evaluate, job, f"{job['config']}, seed {job['seed']}"))
            _print_run(runs[-1])
    load_end = sample_load()
    payload = {
        "settings": {
            "minutes": minutes,
            "seeds": seeds,
            "num_envs": args.num_envs,
            "episodes": args.episodes,
            "eval_steps": args.eval_steps,
            "grid": args.grid,
            "dr": {k: list(v) for k, v in DR.items()},
            "quick": bool(args.quick),
            "wall_clock": bool(args.wall_clock),
            "parallel": parallel,
        },
        "machine": machine_info(),
        "load_start": load_start,
        "load_end": load_end,
        "warning": busy_warning(load_start, load_end),
        "runs": runs,
    }
    report(payload, out)
    print((out / "results.md").read_text())
    return payload


if __name__ == "__main__":
    main()
