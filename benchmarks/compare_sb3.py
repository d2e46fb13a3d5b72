"""UniLab vs stock Stable-Baselines3, side by side, on this machine, in one run.

    python benchmarks/compare_sb3.py --quick      # 2-3 minutes on 2 idle cores (137 s on 2026-12-05)
    python benchmarks/compare_sb3.py              # the real numbers, under 30 minutes
    python benchmarks/compare_sb3.py --smoke      # well under a minute, for CI
    python benchmarks/compare_sb3.py --only env,replay --num-envs 64 --seeds 3

Sections (``--only``):
- ``env``: env-steps/s and RSS (process tree) of the raw pybullet loop (same worlds, PD and
  solver settings, no task code), ``UniLabVectorEnv``, ``AsyncRunner`` collectors (2 processes,
  random actions, writing to the shared replay), SB3 ``DummyVecEnv`` over single envs, and SB3
  ``SubprocVecEnv`` / gymnasium ``AsyncVectorEnv`` with 2 workers (one env per process, as they
  are built: their env-steps/s is per 2 envs).
- ``replay``: add throughput, sample latency and bytes of ``SharedReplayBuffer`` vs SB3
  ``ReplayBuffer`` vs Tianshou ``VectorReplayBuffer`` (``benchmarks/bench_replay.py``).
- ``sac``: stock SB3 SAC on ``SB3VecEnv`` (train_freq=1, gradient_steps=1, batch 256), the same
  with ``SharedReplayBuffer``, and ``AsyncRunner`` with 2 collectors; equal replay ratio
  (1 gradient step per ``--num-envs`` transitions) and equal env steps.
- ``ppo``: stock SB3 PPO on ``SB3VecEnv`` (one process) and on ``SubprocVecEnv`` (8 worker
  processes of one env each, ``n_steps`` scaled so the rollout has the same size), and
  ``AsyncRunner`` PPO with 2 collectors at ``max_policy_lag`` 0 and 1 (same rollouts, same
  ``batch_size`` / ``n_epochs``; ``benchmarks/bench_ppo_async.py`` is the dedicated comparison).

Every configuration runs in a fresh process; configurations are interleaved (A B C A B C ...)
and repeated (``--seeds``); the tables give medians, [min, max] and ratios against stock SB3.
Training episodes are cut at 250 steps (5 s), or at a third of the env steps each env takes in a
run if that is shorter (``--quick``: 80), so that every run finishes episodes and draws a curve;
the final return is a deterministic evaluation of the trained policy on 16 envs.

Writes ``compare_sb3.md`` (tables), ``compare_sb3.json`` (raw per-repeat numbers, machine,
versions, load) and ``compare_sb3.png`` (throughput bars, return vs wall clock) to ``--out``:
by default a fresh ``runs/compare_sb3/<UTC timestamp>/`` (its path is printed). The committed
results are rewritten only when asked: ``--out benchmarks/results``.

The load is sampled before the run starts and after it ends (``common.sample_load``: load
average, cores busy with other processes, cores available); on a busy machine a warning is
printed next to the tables and written into them, and the figures go into the JSON (``load``).

Ctrl-C or SIGTERM stops the whole run: the configuration process that is running and every
process it started are stopped before the script exits (code 130 or 143), and nothing is written.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import importlib.util
import itertools
import json
import os
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_env
from common import (
    busy_warning,
    exit_on_sigterm,
    machine_info,
    publish_figure,
    run_interleaved,
    sample_load,
    summarize,
    tree_rss_mb,
    write_json,
)

from unilab_gym.cli import HelpFormatter

ID = "UniLab/Quadruped-v0"
EPISODE_STEPS = 250


def episode_steps(num_envs: int, total_steps: int) -> int:
    """Episode length for a run: EPISODE_STEPS, or a third of each env's steps if shorter (at least 5)."""
    return max(5, min(EPISODE_STEPS, total_steps // num_envs // 3))


EVAL_ENVS = 16

MODES = {
    #          env steps/run, env repeats, replay capacity, sac/ppo env steps, sac/ppo seeds
    "smoke": dict(num_envs=8, env_steps=5, env_repeats=1, replay_capacity=20_000, rl_steps=128, seeds=1),
    "quick": dict(num_envs=64, env_steps=30, env_repeats=2, replay_capacity=200_000, rl_steps=64 * 240, seeds=1),
    "default": dict(num_envs=64, env_steps=100, env_repeats=3, replay_capacity=1_000_000, rl_steps=64 * 800, seeds=3),
}


# ----------------------------------------------------------------------------- env section
def run_collectors(num_envs: int, steps: int, warmup: int, backend: str = "process") -> dict[str, float]:
    """Env-steps/s of 2 AsyncRunner collectors (random actions: before learning_starts); ``backend`` of the runner."""
    from stable_baselines3 import SAC

    from unilab_gym import AsyncRunner, SharedReplayBuffer
    from unilab_gym.sb3.vec_env import make_sb3_env

    total = steps * num_envs
    capacity = 2 * (total + warmup * num_envs)  # learning never starts: collectors act at random
    model = SAC(
        "MlpPolicy",
        make_sb3_env(ID, 1),
        replay_buffer_class=SharedReplayBuffer,
        buffer_size=capacity,
        learning_starts=capacity,
    )
    with AsyncRunner(
        model,
        env_id=ID,
        num_collectors=2,
        envs_per_collector=max(1, num_envs // 2),
        replay_ratio=0.0,
        backend=backend,
    ) as runner:
        runner.learn(warmup * num_envs)  # start-up (spawn, imports) is not timed
        t0 = time.perf_counter()
        runner.learn(total, reset_num_timesteps=False)
        elapsed = time.perf_counter() - t0
        rss = tree_rss_mb()
    model.replay_buffer.close()
    return {"env_steps_per_s": total / elapsed, "rss_mb": rss}


def env_configs(num_envs: int, steps: int) -> dict[str, tuple[Any, dict[str, Any]]]:
    common = dict(num_envs=num_envs, steps=steps, warmup=3)
    two = dict(num_envs=2, steps=steps * 8, warmup=3)
    return {
        "raw pybullet (physics limit)": (bench_env.run_raw, common),
        "UniLabVectorEnv (1 process)": (bench_env.run_unilab, common),
        "AsyncRunner collectors (2 processes)": (run_collectors, common),
        "AsyncRunner collectors (2 Ray actors, local)": (run_collectors, {**common, "backend": "ray"}),
        "SB3 DummyVecEnv": (bench_env.run_dummy, common),
        "SB3 SubprocVecEnv (2 workers)": (bench_env.run_subproc, two),
        "gymnasium AsyncVectorEnv (2 workers)": (bench_env.run_async, two),
    }


# ----------------------------------------------------------------------------- RL sections
class _Curve:
    """SB3 callback factory: records (wall s, env steps, mean return of the last ``window`` episodes).

    A point every ``every`` env steps once an episode has finished (stock PPO never counts
    ``_episode_num``, so progress is measured in env steps, the same for every configuration).
    The runs pass ``window = num_envs``: the envs' episodes end together, in blocks (one block per
    collector under ``AsyncRunner``), and a shorter window held only the last block's envs, so the
    curve jumped between the two collectors' envs (the saw teeth of the 2026-11-30 ``sac_async`` plot).
    """

    @staticmethod
    def make(every: int, window: int = 20):
        from stable_baselines3.common.callbacks import BaseCallback

        class Curve(BaseCallback):
            def __init__(self):
                super().__init__()
                self.points: list[tuple[float, int, float]] = []
                self.t0 = time.perf_counter()
                self._next = every

            def _on_step(self) -> bool:
                buf = self.model.ep_info_buffer
                if buf and self.num_timesteps >= self._next:
                    self._next = (self.num_timesteps // every + 1) * every
                    recent = [e["r"] for e in list(buf)[-window:]]
                    self.points.append((time.perf_counter() - self.t0, int(self.num_timesteps), float(np.mean(recent))))
                return True

        return Curve()


def curve_window(num_envs: int) -> int:
    """Episodes averaged per curve point: one per env, at most the 100 that SB3's ``ep_info_buffer`` keeps."""
    return min(num_envs, 100)


def evaluate(model: Any, seed: int, max_episode_steps: int) -> float:
    """Mean return of one deterministic episode on each of EVAL_ENVS envs."""
    from unilab_gym import UniLabVectorEnv

    env = UniLabVectorEnv(EVAL_ENVS, max_episode_steps=max_episode_steps)
    obs, _ = env.reset(seed=10_000 + seed)
    returns = np.zeros(EVAL_ENVS)
    running = np.ones(EVAL_ENVS, bool)
    while running.any():
        action, _ = model.predict(obs, deterministic=True)
        obs, reward, terminated, truncated, _ = env.step(action)
        returns += reward * running
        running &= ~(terminated | truncated)
    env.close()
    return float(returns.mean())


def run_sac(kind: str, num_envs: int, total_steps: int, seed: int) -> dict[str, Any]:
    """One SAC run: ``kind`` is ``stock``, ``shared`` (SB3 + SharedReplayBuffer), ``async`` or ``async-ray``
    (AsyncRunner with ``backend="ray"``: a local Ray instance, started and stopped inside the timing)."""
    import torch
    from stable_baselines3 import SAC

    from unilab_gym import AsyncRunner, SharedReplayBuffer
    from unilab_gym.sb3.vec_env import make_sb3_env

    episode = episode_steps(num_envs, total_steps)
    env = make_sb3_env(ID, num_envs, seed=seed, max_episode_steps=episode)
    kwargs = dict(
        batch_size=256,
        train_freq=1,
        gradient_steps=1,
        learning_starts=min(10 * num_envs, total_steps // 4),
        buffer_size=max(total_steps, 1000),
        seed=seed,
        verbose=0,
    )
    if kind != "stock":
        kwargs["replay_buffer_class"] = SharedReplayBuffer
    torch.set_num_threads(1)  # fastest for these small networks on 2 shared cores, for every config
    model = SAC("MlpPolicy", env, **kwargs)
    curve = _Curve.make(every=max(num_envs, total_steps // 40), window=curve_window(num_envs))
    t0 = time.perf_counter()
    if kind.startswith("async"):
        with AsyncRunner(
            model,
            env_id=ID,
            num_collectors=2,
            envs_per_collector=max(1, num_envs // 2),
            env_kwargs=dict(max_episode_steps=episode),
            seed=seed,
            replay_ratio=1.0 / num_envs,
            backend="ray" if kind == "async-ray" else "process",
        ) as runner:
            runner.learn(total_steps, callback=curve)
    else:
        model.learn(total_steps, callback=curve)
    wall = time.perf_counter() - t0
    out = {
        "wall_s": wall,
        "env_steps_per_s": model.num_timesteps / wall,
        "grad_steps_per_s": model._n_updates / wall,
        "grad_steps": model._n_updates,
        "env_steps": model.num_timesteps,
        "final_return": evaluate(model, seed, episode),
        "curve": curve.points,
        "curve_window": curve_window(num_envs),
        "rss_mb": tree_rss_mb(),
    }
    if kind != "stock":
        model.replay_buffer.close()
    return out


def run_ppo(
    kind: str,
    num_envs: int,
    total_steps: int,
    seed: int,
    n_steps: int | None = None,
    workers: int | None = None,
    lag: int = 0,
) -> dict[str, Any]:
    """One PPO run: ``kind`` is ``stock`` (SB3VecEnv, one process), ``subproc`` (SubprocVecEnv of ``workers``
    single-env processes) or ``async`` (AsyncRunner, 2 collectors of ``num_envs / 2`` envs, ``max_policy_lag=lag``).

    ``n_steps`` is per env (default: 4 rollouts per run); ``subproc`` scales it by ``num_envs / workers`` so
    that every configuration trains on rollouts of the same size (``n_steps * num_envs`` transitions).
    """
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import SubprocVecEnv, VecMonitor

    from unilab_gym import AsyncRunner
    from unilab_gym.sb3.vec_env import make_sb3_env

    torch.set_num_threads(1)  # fastest for these small networks on 2 shared cores, for every config
    n_steps = n_steps or max(8, total_steps // (num_envs * 4))  # 4 rollouts per run
    episode = episode_steps(num_envs, total_steps)
    if kind == "subproc":
        workers = workers or min(num_envs, 8, max(2, num_envs // 8))
        single = functools.partial(_make_single, max_episode_steps=episode)
        env = VecMonitor(SubprocVecEnv([single] * workers, start_method="forkserver"))
        env.seed(seed)
        n_steps *= num_envs // workers  # the same rollout size with fewer envs
    else:  # async: the model's env only gives the spaces and n_envs (= 2 collectors x num_envs / 2)
        env = make_sb3_env(ID, num_envs, seed=seed, max_episode_steps=episode)
    model = PPO("MlpPolicy", env, n_steps=n_steps, batch_size=256, n_epochs=5, seed=seed, verbose=0)
    curve, clock = _Curve.make(every=max(num_envs, total_steps // 40), window=curve_window(num_envs)), _rollout_clock()
    t0 = time.perf_counter()
    if kind == "async":
        with AsyncRunner(
            model,
            env_id=ID,
            num_collectors=2,
            envs_per_collector=num_envs // 2,
            env_kwargs=dict(max_episode_steps=episode),
            seed=seed,
            max_policy_lag=lag,
        ) as runner:
            runner.learn(total_steps, callback=[curve, clock])
    else:
        model.learn(total_steps, callback=[curve, clock])
    wall = time.perf_counter() - t0
    grad = model._n_updates * max(1, (model.n_steps * model.n_envs) // model.batch_size)
    ends = clock.ends
    out = {
        "wall_s": wall,
        "env_steps_per_s": model.num_timesteps / wall,
        "grad_steps_per_s": grad / wall,
        "grad_steps": grad,
        "env_steps": model.num_timesteps,
        "final_return": evaluate(model, seed, episode),
        "curve": curve.points,
        "curve_window": curve_window(num_envs),
        "rss_mb": tree_rss_mb(),
        # from the end of the first rollout on: without start-up (spawning collectors, the first rollout)
        "steady_env_steps_per_s": (ends[-1][1] - ends[0][1]) / (ends[-1][0] - ends[0][0])
        if len(ends) > 1
        else float("nan"),
        "first_rollout_s": ends[0][0] - t0 if ends else float("nan"),
    }
    env.close()
    return out


def _rollout_clock():
    """SB3 callback: ``ends`` lists (perf_counter, num_timesteps) at every rollout end."""
    from stable_baselines3.common.callbacks import BaseCallback

    class RolloutClock(BaseCallback):
        def __init__(self):
            super().__init__()
            self.ends: list[tuple[float, int]] = []

        def _on_rollout_end(self) -> None:
            self.ends.append((time.perf_counter(), int(self.model.num_timesteps)))

        def _on_step(self) -> bool:
            return True

    return RolloutClock()


def rl_configs(algo: str, num_envs: int, steps: int, seed: int) -> dict[str, tuple[Any, dict[str, Any]]]:
    if algo == "sac":
        kinds = {
            "stock SB3 SAC": "stock",
            "SB3 SAC + SharedReplayBuffer": "shared",
            "AsyncRunner SAC (2 collectors)": "async",
            "AsyncRunner SAC (2 Ray actors, local)": "async-ray",
        }
        fn = run_sac
    else:
        runs = {
            "stock SB3 PPO (1 process)": dict(kind="stock"),
            "stock SB3 PPO (SubprocVecEnv)": dict(kind="subproc"),
            "AsyncRunner PPO (lag 0)": dict(kind="async", lag=0),
            "AsyncRunner PPO (lag 1)": dict(kind="async", lag=1),
        }
        return {
            name: (run_ppo, dict(num_envs=num_envs, total_steps=steps, seed=seed, **kw)) for name, kw in runs.items()
        }
    return {
        name: (fn, dict(kind=kind, num_envs=num_envs, total_steps=steps, seed=seed)) for name, kind in kinds.items()
    }


# ----------------------------------------------------------------------------- reporting
def _fmt(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:,.3g}"


def table(title: str, runs: dict[str, list[dict[str, Any]]], keys: list[tuple[str, str]], base: str | None) -> str:
    lines = [
        f"### {title}",
        "",
        "| configuration | " + " | ".join(label for _, label in keys) + (" | vs stock SB3 |" if base else " |"),
        "|---" * (len(keys) + 1 + bool(base)) + "|",
    ]
    for name, rs in runs.items():
        cells = []
        for key, _ in keys:
            m, lo, hi = summarize(rs, key)
            cells.append(_fmt(m) if lo == hi else f"{_fmt(m)} [{_fmt(lo)}, {_fmt(hi)}]")
        ratio = ""
        if base:
            k = keys[0][0]
            b = summarize(runs[base], k)[0]
            ratio = f" | {summarize(rs, k)[0] / b:.2f}×" if b else " | –"
        lines.append(f"| {name} | " + " | ".join(cells) + ratio + " |")
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: str) -> None:
    """Write :func:`figure` of ``report`` to ``path`` (PNG, 110 dpi)."""
    import matplotlib.pyplot as plt

    fig = figure(report)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def figure(report: dict[str, Any]) -> Any:
    """The report's picture: env-steps/s bars per section (top) and training return against wall clock (bottom).

    In the lower panels every repeat (seed) of every configuration is its own line, its points in
    time order: colour = configuration, marker and line style = seed.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sections = report["sections"]
    panels = [s for s in ("env", "sac", "ppo") if s in sections]
    curves = [s for s in ("sac", "ppo") if s in sections]
    cols = max(len(panels), len(curves), 1)
    fig, grid = plt.subplots(2, cols, figsize=(6.0 * cols, 9.0), squeeze=False)
    for ax in grid.flat[len(panels) : cols]:
        ax.axis("off")
    for ax in grid[1][len(curves) :]:
        ax.axis("off")
    for ax, section in zip(grid[0], panels):
        runs = sections[section]["runs"]
        names = list(runs)
        meds = [summarize(runs[n], "env_steps_per_s")[0] for n in names]
        los = [m - summarize(runs[n], "env_steps_per_s")[1] for n, m in zip(names, meds)]
        his = [summarize(runs[n], "env_steps_per_s")[2] - m for n, m in zip(names, meds)]
        ax.barh(range(len(names)), meds, xerr=[los, his], color="tab:blue")
        ax.set_yticks(range(len(names)), [n.replace(" (", "\n(") for n in names], fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("env-steps/s (median, min-max)")
        ax.set_title(f"{section}: throughput")
    markers, styles = "os^vDP*X", ["-", "--", ":", "-."]
    for ax, section in zip(grid[1], curves):
        windows = set()
        for k, (name, rs) in enumerate(sections[section]["runs"].items()):
            for i, r in enumerate(rs):
                if not r.get("curve"):
                    continue
                # one line per repeat (seed), in time order; colour = configuration, marker and line style = seed
                t, _, ret = zip(*sorted(r["curve"]))
                ax.plot(
                    t,
                    ret,
                    color=f"C{k}",
                    marker=markers[i % len(markers)],
                    ls=styles[i % len(styles)],
                    markevery=max(1, len(t) // 8),  # a few markers per line: enough to tell the seeds apart
                    markersize=4,
                    lw=1.2,
                    alpha=0.8,
                    label=name if i == 0 else None,
                )
                windows.add(r.get("curve_window", 20))  # runs before the window was recorded: the last 20
        for i in range(max((len(rs) for rs in sections[section]["runs"].values()), default=0)):
            ax.plot(
                [], [], color="gray", marker=markers[i % len(markers)], ls=styles[i % len(styles)], label=f"seed {i}"
            )
        window = "/".join(str(w) for w in sorted(windows)) or "20"
        ax.set_xlabel("wall clock (s)")
        ax.set_ylabel(f"mean training return (last {window} episodes)")
        ax.set_title(f"{section}: return vs wall clock")
        ax.legend(fontsize=7)
    fig.suptitle(
        f"unilab-gym vs stock SB3 — {report['machine']['cpu']}, {report['machine']['cores']} cores, {report['date']}",
        fontsize=9,
    )
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=HelpFormatter)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="2-3 minutes on 2 idle cores")
    mode.add_argument("--smoke", action="store_true", help="well under a minute: every configuration, tiny sizes")
    parser.add_argument("--only", default="env,replay,sac,ppo", help="comma-separated sections: env,replay,sac,ppo")
    parser.add_argument("--num-envs", type=int, default=None, help="envs per configuration (default 64; smoke 8)")
    parser.add_argument("--seeds", type=int, default=None, help="repeats (seeds) of the SAC / PPO runs")
    parser.add_argument(
        "--out",
        default=None,
        help="output folder (default: a fresh runs/compare_sb3/<UTC timestamp>/; "
        "the committed results: benchmarks/results)",
    )
    parser.add_argument(
        "--plot-only",
        metavar="JSON",
        default=None,
        help="redraw the picture of a saved report (e.g. benchmarks/results/sac_async/sac_async.json) next to it, "
        "as <JSON stem>.png, without running anything",
    )
    args = parser.parse_args(argv)
    if args.plot_only:
        return replot(args.plot_only)
    name = "smoke" if args.smoke else "quick" if args.quick else "default"
    cfg = dict(MODES[name])
    if args.num_envs:
        cfg["num_envs"] = args.num_envs
    if args.seeds:
        cfg["seeds"] = args.seeds
    sections = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(sections) - {"env", "replay", "sac", "ppo"})
    if unknown:
        parser.error(f"unknown section(s) {unknown}; choose from env, replay, sac, ppo")
    out = args.out or fresh_run_dir()
    print(f"compare_sb3 ({name} mode): results go to {out}", flush=True)
    try:
        return _run(args, name, cfg, sections, out)
    except BaseException:  # interrupted or failed: do not leave an empty run folder behind
        if not args.out:
            with contextlib.suppress(OSError):
                os.rmdir(out)
        raise


def _run(args: argparse.Namespace, name: str, cfg: dict[str, Any], sections: list[str], out: str) -> dict[str, Any]:
    """Run the sections, then write the outputs to ``out``; return the report."""
    n = cfg["num_envs"]
    load_start = sample_load(0.2 if args.smoke else 1.0)  # before any process of this run starts
    report: dict[str, Any] = {
        "mode": name,
        "config": cfg,
        "date": datetime.date.today().isoformat(),
        "machine": machine_info(),
        "sections": {},
        "skipped": {},
    }
    md = [
        f"## unilab-gym vs stock SB3 ({name} mode, {report['date']})",
        "",
        f"Machine: {report['machine']['cpu']}, {report['machine']['cores']} cores, "
        f"{report['machine']['ram_gb']} GB RAM. "
        "Versions: " + ", ".join(f"{k} {v}" for k, v in report["machine"]["versions"].items()) + ".",
        "",
    ]
    t_start = time.perf_counter()

    if "env" in sections:
        runs = run_interleaved(
            env_configs(n, cfg["env_steps"]), cfg["env_repeats"], desc="env stepping", fresh_process=not args.smoke
        )
        report["sections"]["env"] = {"runs": runs}
        md.append(
            table(
                f"Env stepping, {n} envs",
                runs,
                [("env_steps_per_s", "env-steps/s"), ("rss_mb", "RSS MB")],
                "SB3 DummyVecEnv",
            )
        )
    if "replay" in sections:
        if importlib.util.find_spec("tianshou") is None:
            report["skipped"]["replay tianshou"] = "Tianshou is not installed (pip install -e '.[tianshou]')"
            print("replay: Tianshou VectorReplayBuffer skipped: " + report["skipped"]["replay tianshou"])
        import bench_replay

        rep = bench_replay.run(_replay_args(cfg["replay_capacity"], name))
        report["sections"]["replay"] = rep
        md.append("### Replay (obs 48, act 12, batch 256, adds of 64 rows)\n\n" + bench_replay.table(rep))
    for algo in ("sac", "ppo"):
        if algo not in sections:
            continue
        if importlib.util.find_spec("stable_baselines3") is None:
            report["skipped"][algo] = "stable-baselines3 is not installed (pip install -e '.[sb3]')"
            print(f"{algo}: skipped: {report['skipped'][algo]}")
            continue
        configs = rl_configs(algo, n, cfg["rl_steps"], seed=0)
        runs = {k: [] for k in configs}
        for seed in range(cfg["seeds"]):
            seeded = {
                k: (fn, {**kw, "seed": seed}) for k, (fn, kw) in rl_configs(algo, n, cfg["rl_steps"], seed).items()
            }
            for k, v in run_interleaved(seeded, 1, desc=f"{algo} seed {seed}", fresh_process=not args.smoke).items():
                runs[k].extend(v)
        report["sections"][algo] = {"runs": runs}
        base = next(iter(runs))
        md.append(
            table(
                f"{algo.upper()}, {n} envs, {cfg['rl_steps']:,} env steps, {cfg['seeds']} seed(s)",
                runs,
                [
                    ("wall_s", "wall clock s"),
                    ("env_steps_per_s", "env-steps/s"),
                    ("grad_steps_per_s", "gradient steps/s"),
                    ("final_return", "final return"),
                ],
                None,
            )
        )
        walls = {k: summarize(v, "wall_s")[0] for k, v in runs.items()}
        md.append(
            "Wall-clock speed-up vs "
            + base
            + ": "
            + ", ".join(f"{k} {walls[base] / w:.2f}×" for k, w in walls.items())
            + "\n"
        )
    report["elapsed_s"] = time.perf_counter() - t_start
    load_end = sample_load(0.2 if args.smoke else 1.0)  # every process of this run has ended
    warning = busy_warning(load_start, load_end)
    report["load"] = {"start": load_start, "end": load_end, "busy": warning is not None, "warning": warning}
    md.insert(3, _load_line(report["load"]) + "\n")
    os.makedirs(out, exist_ok=True)
    text = "\n".join(md)
    with open(os.path.join(out, "compare_sb3.md"), "w") as f:
        f.write(text)
    write_json(os.path.join(out, "compare_sb3.json"), report)
    plot(report, os.path.join(out, "compare_sb3.png"))
    publish_figure(os.path.join(out, "compare_sb3.png"))  # the docs site's copy, for --out benchmarks/results
    print()
    print(text)
    if warning:
        print(warning, flush=True)
    print(f"wrote {out}/compare_sb3.{{md,json,png}} in {report['elapsed_s']:.0f} s")
    return report


def replot(json_path: str) -> dict[str, Any]:
    """Redraw ``<json stem>.png`` next to a saved report (and the docs site's copy if it has one); return it."""
    with open(json_path) as f:
        report = json.load(f)
    png = os.path.splitext(json_path)[0] + ".png"
    plot(report, png)
    copy = publish_figure(png)
    print(f"wrote {png}" + (f" and {copy}" if copy else ""))
    return report


def fresh_run_dir(root: str = os.path.join("runs", "compare_sb3")) -> str:
    """Create and return a new, empty ``<root>/<UTC timestamp>`` (``-2``, ``-3``, ... if taken): one folder per run."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H-%M-%SZ")
    os.makedirs(root, exist_ok=True)
    for k in itertools.count(1):
        path = os.path.join(root, stamp if k == 1 else f"{stamp}-{k}")
        with contextlib.suppress(FileExistsError):
            os.mkdir(path)
            return path
    raise AssertionError("unreachable")


def _load_line(load: dict[str, Any]) -> str:
    """The tables' line on the load: the warning on a busy machine, else the figures."""
    if load["warning"]:
        return f"> **{load['warning']}**"

    def figures(s: dict[str, Any]) -> str:
        busy = "?" if s["busy_cores"] is None else f"{s['busy_cores']:.1f}"
        avg = "?" if s["load_average"] is None else f"{s['load_average'][0]:.1f}"
        return f"{busy} of {s['cores']:g} cores busy, load average {avg}"

    return f"Load: idle machine (start: {figures(load['start'])}; end: {figures(load['end'])})."


def _replay_args(capacity: int, mode: str) -> argparse.Namespace:
    """bench_replay's settings for this mode: SharedReplayBuffer, SB3 and Tianshou at ``capacity``."""
    small = mode != "default"
    only = ["sb3", "shared"] + (["tianshou"] if importlib.util.find_spec("tianshou") else [])
    return argparse.Namespace(
        capacity=capacity,
        batch=256,
        rows_per_add=64,
        rounds=3 if small else 15,
        adds_per_round=20 if small else 200,
        samples_per_round=20 if small else 200,
        only=only,
    )


def _make_single(max_episode_steps: int = EPISODE_STEPS):
    """A single Quadruped-v0 env (a SubprocVecEnv worker's env)."""
    from unilab_gym import QuadrupedEnv

    return QuadrupedEnv(max_episode_steps=max_episode_steps)


if __name__ == "__main__":
    exit_on_sigterm()
    try:
        main()
    except KeyboardInterrupt:
        print("\ninterrupted: the run stopped (no configuration process left); nothing written", file=sys.stderr)
        sys.exit(130)
    except SystemExit as stop:
        if stop.code == 143:
            print("\nterminated: the run stopped (no configuration process left); nothing written", file=sys.stderr)
        raise
