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

**Per task** (``--task ID [--robot NAME]``, any registered ``UniLab/*`` id): three configurations at
``--num-envs`` (default 64) envs, in fresh processes, interleaved, median of ``--repeats``:

- ``raw pybullet``: the task's own cluster worlds (its robot and scene: plane, heightfield, objects),
  stepped through the physics layer with no task math: random PD targets ``nominal + action_scale * a``
  (``a`` uniform in [-1, 1] per joint) for ``"joint_pd"`` actuation; for ``"external"`` actuation (the
  quadrotor) the task's own actuation hook ``Task.forces`` gives the wrench (``ClusterWorld.step_external``);
  a task with neither gets ``null`` (n/a) in this column (:func:`raw_stepper`).
- ``UniLabVectorEnv``: ``gym.make_vec(ID, num_envs=N)``.
- ``DummyVecEnv``: SB3's DummyVecEnv over N single ``gym.make(ID)`` envs.

It prints a table row and merges one entry per (task, robot) into ``--out`` (default
``benchmarks/results/bench_tasks.json``; rerunning a task replaces its entry only): ``task``, ``robot``,
``num_envs``, ``steps``, ``repeats``, ``raw_actuation``, ``env_steps_per_s_{raw,unilab,dummy}``,
``rss_mb_{raw,unilab,dummy}`` (process tree, MB), ``unilab_vs_raw``, ``unilab_vs_dummy`` (ratios of
env-steps/s) and ``runs`` (every repeat). ``--smoke``: 4 envs, 3 steps, 1 repeat, in this process (tests).

``--out`` names the JSON file of any mode; the defaults are ``benchmarks/results/bench_env.json``,
``bench_env_cluster_sweep.json`` (``--sweep-cluster``) and ``bench_tasks.json`` (``--task``).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (
    RESULTS_DIR,
    machine_info,
    merge_task_results,
    peak_rss_mb,
    probe_task,
    run_interleaved,
    summarize,
    task_label,
    tree_rss_mb,
    warn_if_busy,
    write_json,
)

from unilab_gym.cli import HelpFormatter


def _timed(step, n_envs: int, steps: int, warmup: int, act_dim: int = 12) -> dict[str, float]:
    rng = np.random.default_rng(0)
    actions = rng.uniform(-1, 1, (warmup + steps, n_envs, act_dim)).astype(np.float32)
    for a in actions[:warmup]:
        step(a)
    t0 = time.perf_counter()
    for a in actions[warmup:]:
        step(a)
    elapsed = time.perf_counter() - t0
    return {"env_steps_per_s": steps * n_envs / elapsed, "rss_mb": tree_rss_mb(), "peak_rss_mb": peak_rss_mb()}


def raw_stepper(env: Any) -> tuple[Callable[[np.ndarray], None], int, str] | None:
    """The raw physics loop of ``env``'s scene: a step function over its cluster worlds, with no task math.

    Args:
        env: a reset :class:`~unilab_gym.vector_env.UniLabVectorEnv` (its worlds hold the task's robot and scene).

    Returns:
        ``(step, width, actuation)``: ``step(a)`` advances every world one control step (``env.substeps``
        physics steps) and reads the states back, for ``a`` (N, width) in [-1, 1]. ``"joint_pd"`` actuation:
        PD targets ``nominal_joint_pos + action_scale * a``, one per joint (width: the robot's joints).
        ``"external"``: the wrench of the task's actuation hook ``task.forces(robot_state, a)`` (width: the
        action's). ``None`` where the task has another actuation or no ``forces`` hook (the raw column is n/a).
    """
    from unilab_gym.tasks.base import Task

    task = env.task
    clusters = env._clusters  # the env's own worlds and settings; only the physics
    actuation = getattr(task, "actuation", None)
    if actuation == "joint_pd":
        nominal, scale = env.nominal_joint_pos, env.action_scale

        def step(a: np.ndarray) -> None:
            targets = nominal + scale * a
            for rows, world in clusters:
                world.step(targets[rows], env.kp[rows], env.kd[rows], env.torque_limits[rows], env.substeps)
                world.read_state()

        return step, int(nominal.shape[1]), actuation
    forces = getattr(type(task), "forces", None)
    if actuation == "external" and forces is not None and forces is not Task.forces:

        def step_external(a: np.ndarray) -> None:
            wrench = task.forces(env.robot_state, a)
            for rows, world in clusters:
                world.step_external(wrench[rows], env.substeps)
                world.read_state()

        return step_external, int(task.act_dim), actuation
    return None


def _vector_env(task: str | None, num_envs: int, env_kwargs: dict[str, Any]) -> Any:
    """``UniLabVectorEnv(num_envs, **env_kwargs)`` (``task`` ``None``), else ``gym.make_vec(task, ...)``."""
    if task is None:
        from unilab_gym import UniLabVectorEnv

        return UniLabVectorEnv(num_envs, **env_kwargs)
    import gymnasium as gym

    import unilab_gym  # noqa: F401

    return gym.make_vec(task, num_envs=num_envs, **env_kwargs)


def run_raw(
    num_envs: int,
    steps: int,
    warmup: int,
    envs_per_cluster: int | None = None,
    task: str | None = None,
    env_kwargs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The raw physics loop (:func:`raw_stepper`) of ``task``'s scene (``None``: the default quadruped).

    Returns:
        ``env_steps_per_s``, ``rss_mb``, ``peak_rss_mb`` (``None`` where the task has no raw loop) and
        ``raw_actuation`` (``"joint_pd"``, ``"external"`` or ``None``).
    """
    kwargs = {**(env_kwargs or {}), **({"envs_per_cluster": envs_per_cluster} if envs_per_cluster else {})}
    env = _vector_env(task, num_envs, kwargs)
    try:
        env.reset(seed=0)
        raw = raw_stepper(env)
        if raw is None:
            return {"env_steps_per_s": None, "rss_mb": None, "peak_rss_mb": None, "raw_actuation": None}
        step, width, actuation = raw
        return {**_timed(step, num_envs, steps, warmup, width), "raw_actuation": actuation}
    finally:
        env.close()


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
    env = _vector_env(
        None,
        num_envs,
        dict(
            domain_randomization=domain_randomization,
            **({"envs_per_cluster": envs_per_cluster} if envs_per_cluster else {}),
        ),
    )
    env.reset(seed=0)
    return _timed(env.step, num_envs, steps, warmup)


def run_task_unilab(num_envs: int, steps: int, warmup: int, task: str, env_kwargs: dict[str, Any]) -> dict[str, Any]:
    """``gym.make_vec(task, num_envs)`` stepped with random actions: env-steps/s, RSS and the robot's name."""
    env = _vector_env(task, num_envs, env_kwargs)
    try:
        env.reset(seed=0)
        result: dict[str, Any] = _timed(env.step, num_envs, steps, warmup, env.single_action_space.shape[0])
        return {**result, "robot": str(env.robot.name)}
    finally:
        env.close()


def _single_env(task: str = "UniLab/Quadruped-v0", env_kwargs: dict[str, Any] | None = None):
    import gymnasium as gym

    import unilab_gym  # noqa: F401

    return gym.make(task, **(env_kwargs or {}))


def run_dummy(
    num_envs: int, steps: int, warmup: int, task: str | None = None, env_kwargs: dict[str, Any] | None = None
) -> dict[str, float]:
    """SB3's ``DummyVecEnv`` over ``num_envs`` single envs of ``task`` (``None``: the default quadruped)."""
    from stable_baselines3.common.vec_env import DummyVecEnv

    make = _single_env if task is None else functools.partial(_single_env, task, env_kwargs)
    env = DummyVecEnv([make] * num_envs)
    try:
        env.seed(0)
        env.reset()
        (act_dim,) = env.action_space.shape or (12,)
        return _timed(lambda a: env.step(a), num_envs, steps, warmup, act_dim)
    finally:
        env.close()


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


#: ``--smoke`` (tests): envs, timed steps, warm-up steps; one repeat, in this process.
SMOKE = dict(num_envs=4, steps=3, warmup=1)


def task_entry(task: str, robot: str, runs: dict[str, list[dict[str, Any]]], **settings: Any) -> dict[str, Any]:
    """One ``bench_tasks.json`` entry from the ``raw`` / ``unilab`` / ``dummy`` runs of (task, robot).

    Medians over repeats; ``None`` for the raw figures (and ``unilab_vs_raw``) where the task has no raw loop.
    """
    entry: dict[str, Any] = {"task": task, "robot": robot, **settings}
    entry["raw_actuation"] = runs["raw"][0]["raw_actuation"]
    for name, rs in runs.items():
        for key, field in (("env_steps_per_s", "env_steps_per_s"), ("rss_mb", "rss_mb")):
            entry[f"{field}_{name}"] = None if rs[0][key] is None else summarize(rs, key)[0]
    raw, unilab, dummy = (entry[f"env_steps_per_s_{n}"] for n in ("raw", "unilab", "dummy"))
    entry["unilab_vs_raw"] = None if raw is None else unilab / raw
    entry["unilab_vs_dummy"] = unilab / dummy
    entry["runs"] = runs
    return entry


def task_row(entry: dict[str, Any]) -> str:
    """The markdown row of a ``bench_tasks.json`` entry (the tasks table of ``docs/benchmarks.md``)."""

    def rate(x: float | None) -> str:
        return "n/a" if x is None else f"{x:,.0f}"

    def ratio(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.2f}×"

    def mb(x: float | None) -> str:
        return "n/a" if x is None else f"{x:,.0f}"

    return (
        f"| {entry['task']} | {entry['robot']} | {entry['num_envs']} | {rate(entry['env_steps_per_s_unilab'])} | "
        f"{mb(entry['rss_mb_unilab'])} | {rate(entry['env_steps_per_s_raw'])} | {mb(entry['rss_mb_raw'])} | "
        f"{ratio(entry['unilab_vs_raw'])} | {rate(entry['env_steps_per_s_dummy'])} | {mb(entry['rss_mb_dummy'])} | "
        f"{ratio(entry['unilab_vs_dummy'])} |"
    )


TASK_TABLE_HEADER = (
    "| task | robot | envs | UniLabVectorEnv env-steps/s | RSS MB | raw pybullet env-steps/s | RSS MB | vs raw | "
    "DummyVecEnv env-steps/s | RSS MB | vs DummyVecEnv |\n|---|---|---|---|---|---|---|---|---|---|---|"
)


def bench_task(
    task: str, robot: str | None, num_envs: int, steps: int, warmup: int, repeats: int, out: str, smoke: bool = False
) -> dict[str, Any]:
    """``--task``: raw loop, UniLabVectorEnv and DummyVecEnv of ``task`` interleaved; merge the entry into ``out``.

    Raises:
        ValueError: ``task`` is not a registered ``UniLab/*`` id, the env refused ``robot``, or ``out`` is not a
            per-task results file (nothing is written then).
    """
    robot_name, env_kwargs = probe_task(task, robot)
    busy = warn_if_busy(seconds=0.2 if smoke else 2.0)
    common: dict[str, Any] = dict(num_envs=num_envs, steps=steps, warmup=warmup, task=task, env_kwargs=env_kwargs)
    configs: dict[str, tuple[Callable[..., Any], dict[str, Any]]] = {
        "raw": (run_raw, common),
        "unilab": (run_task_unilab, common),
        "dummy": (run_dummy, common),
    }
    runs = run_interleaved(configs, repeats, desc=f"env stepping: {task}", fresh_process=not smoke)
    entry = task_entry(task, robot_name, runs, num_envs=num_envs, steps=steps, repeats=repeats)
    load = {"start": busy, "load_average_end": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}
    date = datetime.date.today().isoformat()
    merge_task_results(
        out,
        [entry],
        machine=machine_info(),
        load=load,
        date=date,
        details={task_label(task, robot_name): {"date": date, "load": load, "smoke": smoke}},
    )
    print("\n" + TASK_TABLE_HEADER)
    print(task_row(entry))
    print(f"merged the entry of {task_label(task, robot_name)} into {out}")
    return entry


def _parse_args(argv: list[str] | None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """The parser and the checked arguments (``parser.error`` exits on a bad combination)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0], formatter_class=HelpFormatter)
    parser.add_argument("--quick", action="store_true", help="N=64 only, 1 repeat, fewer steps")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats per configuration")
    parser.add_argument("--steps", type=int, default=100, help="timed control steps per run")
    parser.add_argument("--sweep-cluster", action="store_true", help="benchmark envs_per_cluster at N=64 instead")
    parser.add_argument("--task", default=None, help="a registered UniLab/* id: raw loop vs vector env vs DummyVecEnv")
    parser.add_argument("--robot", default=None, help="with --task: the robot= of the task (default: the task's)")
    parser.add_argument("--num-envs", type=int, default=64, help="with --task: envs per configuration")
    parser.add_argument("--smoke", action="store_true", help="with --task: 4 envs, 3 steps, 1 repeat, in-process")
    parser.add_argument(
        "--out",
        default=None,
        help="JSON file to write (default benchmarks/results/bench_env.json, bench_env_cluster_sweep.json with "
        "--sweep-cluster, bench_tasks.json with --task, where the entry of (task, robot) is merged)",
    )
    args = parser.parse_args(argv)
    for name, value in (("--repeats", args.repeats), ("--steps", args.steps), ("--num-envs", args.num_envs)):
        if value < 1:
            parser.error(f"{name} must be a positive integer, got {value}")
    if args.task is None:
        for name, given in (("--robot", args.robot is not None), ("--smoke", args.smoke)):
            if given:
                parser.error(f"{name} needs --task")
    elif args.sweep_cluster:
        parser.error("--task and --sweep-cluster are separate modes: give one")
    return parser, args


def sweep_cluster(steps: int, warmup: int, repeats: int, out: str) -> None:
    """``--sweep-cluster``: UniLabVectorEnv over ``envs_per_cluster`` at N=64 (and two at N=256); write ``out``."""
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
    write_json(out, {"machine": machine_info(), "runs": runs})


def main(argv: list[str] | None = None) -> None:
    """Run the mode the arguments pick (the default comparison, ``--sweep-cluster`` or ``--task``)."""
    parser, args = _parse_args(argv)
    repeats = 1 if args.quick else args.repeats
    steps = 30 if args.quick else args.steps
    warmup = 10

    if args.task is not None:
        shape = SMOKE if args.smoke else dict(num_envs=args.num_envs, steps=steps, warmup=warmup)
        try:
            bench_task(
                args.task,
                args.robot,
                repeats=1 if args.smoke else repeats,
                out=args.out or os.path.join(RESULTS_DIR, "bench_tasks.json"),
                smoke=args.smoke,
                **shape,
            )
        except ValueError as e:
            parser.error(str(e))
        return

    if args.sweep_cluster:
        sweep_cluster(steps, warmup, repeats, args.out or os.path.join(RESULTS_DIR, "bench_env_cluster_sweep.json"))
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
        args.out or os.path.join(RESULTS_DIR, "bench_env.json"),
        {"machine": machine_info(), "steps": steps, "repeats": repeats, "runs": runs},
    )


if __name__ == "__main__":
    main()
