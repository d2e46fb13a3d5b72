"""AsyncRunner SAC with ``backend="process"`` vs ``backend="ray"`` (local Ray, ``ingest_workers`` 1 and 2), in one run.

    python benchmarks/bench_ray.py            # 3 repeats x 64 * 300 env steps: ~3-4 min on 2 idle cores
    python benchmarks/bench_ray.py --quick    # 2 repeats x 64 * 120 env steps: a smoke test (see below)
    python benchmarks/bench_ray.py --replay-ratio 0.001   # collectors at full speed (the learner barely trains)

All configurations run the same SAC as ``compare_sb3.py``'s ``AsyncRunner SAC (2 collectors)`` row:
2 collectors x 32 envs of ``UniLab/Quadruped-v0``, ``batch_size=256``, ``replay_ratio=1/64`` (one
gradient step per 64 transitions; ``--replay-ratio``), one torch thread in the learner. With ``backend="ray"``
the runner starts a local Ray instance (``ray.init``, dashboard off) and shuts it down on ``close()``;
both are inside the timed wall clock, as spawning the collector processes is for ``"process"``. Ray runs
twice: ``ingest_workers=1`` (the training thread ingests the answers in ``poll()``) and ``ingest_workers=2``
(two learner-side threads ingest them; the training thread only counts what they stored).

Figures per run: wall clock of the whole run (start-up included) and env-steps/s over it; *start-up*, the
seconds from building the ``AsyncRunner`` to the first transition the learner counts (Ray: ``ray.init``
and the actors; process: spawning the collectors and their first env steps); and *steady* env-steps/s,
over the window from the moment a quarter of the run's env steps were counted to the end of ``learn``
(its length in seconds, and for Ray the exchanges, answers ingested, in it). Ray only: the learner's
ingest cost per transition (``RayCollectorPool.ingest_cpu_s / ingested``: CPU time of the threads that
ingest, so other processes on the machine do not inflate it), over the run and, by phase of
``RayCollectorPool.ingest_stats`` (wait, poll, fetch, deserialize, copy, request, bookkeeping; see
``docs/metrics.md``), over the steady window, split into the training thread's part and the ingest workers',
with the answers' sizes, the ``poll()``/``wait()`` spans per answer, and the CPU of the learner process's other
threads (Ray's core-worker I/O, and with ``ingest_workers=2`` the workers) per transition. Then the ingest cost
alone (:func:`run_ingest`: blocks of 128 and 2,048 transitions from an actor, 300 each), the figure the
scaling model in ``docs/ray.md`` starts from.

What ``--quick`` shows: that every configuration works, what start-up costs, and the ingest cost by phase
over a steady window of ~100 exchanges or more (the report prints the count). It does not show the steady
env-steps/s ratio: its runs are short enough that Ray's start-up (~10 s here: a local instance and two
actors) is a large part of their wall clock; read the steady column of a default run for that.
Each run is a fresh process; configurations are interleaved (process, ray, ray K=2, process, ...), the
table gives medians and the Ray / process ratios. The load of the machine is sampled before and
after (``common.sample_load``) and a warning is printed when it was busy: on 2 cores shared with other
processes every figure is slower and noisier, and the ratio is what to read.
Writes ``bench_ray.md`` and ``bench_ray.json`` to ``--out`` (default ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import RESULTS_DIR, busy_warning, machine_info, run_interleaved, sample_load, summarize, write_json

from unilab_gym.cli import HelpFormatter
from unilab_gym.runtime.metrics import INGEST_PHASES

ID = "UniLab/Quadruped-v0"
NUM_ENVS = 64
#: name -> (backend, ingest_workers).
CONFIGS = {"process": ("process", 1), "ray (local)": ("ray", 1), "ray (local), 2 ingest workers": ("ray", 2)}
#: Fewest exchanges a steady window should hold for its per-answer figures to be read (the report says when not).
MIN_WINDOW_EXCHANGES = 100
#: Block sizes of the ingest-alone measurement: 4 vector steps of 32 envs (an exchange's usual), a full stage.
INGEST_ROWS = (128, 2048)
#: Bytes of one stored transition of this env: obs 48 + next_obs 48 + action 12 + reward, terminated, truncated.
ROW_BYTES = 4 * (48 + 48 + 12 + 3)


def run(
    backend: str, total_steps: int, seed: int, ingest_workers: int = 1, replay_ratio: float = 1.0 / NUM_ENVS
) -> dict[str, Any]:
    """One AsyncRunner SAC run with ``backend`` (and ``ingest_workers``, Ray); returns its figures (see the module
    docstring)."""
    import torch
    from stable_baselines3 import SAC
    from stable_baselines3.common.callbacks import BaseCallback

    from unilab_gym import AsyncRunner, SharedReplayBuffer
    from unilab_gym.sb3.vec_env import make_sb3_env

    class Clock(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.points: list[tuple[float, int]] = []
            self.stats: Any = None  # Ray: the pool's IngestStats, snapshot when the steady window opens
            self.steady_from: Any = None

        def _on_step(self) -> bool:
            self.points.append((time.perf_counter(), self.num_timesteps))
            if self.stats is not None and self.steady_from is None and self.num_timesteps >= total_steps // 4:
                self.steady_from = (self.stats.snapshot(), _other_threads_cpu_s(), self.stats.worker_cpu_seconds)
            return True

    torch.set_num_threads(1)
    env = make_sb3_env(ID, NUM_ENVS, seed=seed, max_episode_steps=250)
    model = SAC(
        "MlpPolicy",
        env,
        batch_size=256,
        learning_starts=10 * NUM_ENVS,
        buffer_size=max(total_steps, 1000),
        replay_buffer_class=SharedReplayBuffer,
        seed=seed,
        verbose=0,
    )
    clock = Clock()
    t0 = time.perf_counter()
    with AsyncRunner(
        model,
        env_id=ID,
        num_collectors=2,
        envs_per_collector=NUM_ENVS // 2,
        env_kwargs=dict(max_episode_steps=250),
        seed=seed,
        replay_ratio=replay_ratio,
        backend=backend,
        **({"ingest_workers": ingest_workers} if ingest_workers != 1 else {}),
    ) as runner:
        pool = runner._pool
        clock.stats = getattr(pool, "ingest_stats", None)
        runner.learn(total_steps, callback=clock)
        ingest = getattr(pool, "ingest_cpu_s", None), getattr(pool, "ingested", None)
        steady_ingest = (
            (clock.stats.snapshot(), _other_threads_cpu_s(), clock.stats.worker_cpu_seconds)
            if clock.steady_from is not None
            else None
        )
    wall = time.perf_counter() - t0
    model.replay_buffer.close()
    points = clock.points
    first = next(i for i, (_, n) in enumerate(points) if n > 0)
    start = next(i for i, (_, n) in enumerate(points) if n >= total_steps // 4)
    start = min(start, len(points) - 2)
    (ta, sa), (tb, sb) = points[start], points[-1]
    out = {
        "wall_s": wall,
        "env_steps_per_s": model.num_timesteps / wall,
        "startup_s": points[first][0] - t0,
        "steady_env_steps_per_s": (sb - sa) / (tb - ta),
        "steady_window_s": tb - ta,
        "steady_window_on_steps": len(points) - 1 - start,
        "grad_steps": model._n_updates,
    }
    if ingest[0] is not None and ingest[1]:
        out["ingest_us_per_transition"] = 1e6 * ingest[0] / ingest[1]
        out["ingest_answer_transitions_median"] = clock.stats.quantile(0.5)
        out["ingest_answers"] = clock.stats.answers
    if steady_ingest is not None:
        (cpu0, phases0, answers0, n0, spans0), threads0, workers0 = clock.steady_from
        (cpu1, phases1, answers1, n1, spans1), threads1, workers1 = steady_ingest
        out["steady_window_exchanges"] = answers1 - answers0
        if n1 > n0 and answers1 > answers0:
            out["steady_ingest_us_per_transition"] = 1e6 * (cpu1 - cpu0) / (n1 - n0)
            out["steady_workers_us_per_transition"] = 1e6 * (workers1 - workers0) / (n1 - n0)
            out["steady_training_thread_us_per_transition"] = 1e6 * (cpu1 - cpu0 - workers1 + workers0) / (n1 - n0)
            out["steady_ingest_us_per_answer"] = 1e6 * (cpu1 - cpu0) / (answers1 - answers0)
            out["steady_answer_transitions_mean"] = (n1 - n0) / (answers1 - answers0)
            out["steady_spans_per_answer"] = (spans1 - spans0) / (answers1 - answers0)
            for phase in phases1:
                out[f"steady_ingest_us_per_transition/{phase}"] = 1e6 * (phases1[phase] - phases0[phase]) / (n1 - n0)
            # the workers' CPU is in the ingest figure already: the other threads' column leaves it out
            other = threads1 - threads0 - (workers1 - workers0)
            out["steady_other_threads_us_per_transition"] = 1e6 * other / (n1 - n0)
    return out


def _other_threads_cpu_s() -> float:
    """CPU seconds of this process's threads other than the main one (with Ray: its core worker's I/O threads,
    which receive the answers; threads that ended are not counted)."""
    import threading

    import psutil

    main = threading.main_thread().native_id
    return sum(t.user_time + t.system_time for t in psutil.Process().threads() if t.id != main)


def run_ingest(rows_per_result: int, results: int) -> dict[str, Any]:
    """The learner's ingest cost alone: ``results`` answers of ``rows_per_result`` transitions from a remote actor.

    A local Ray (1 CPU) and one actor that returns a staged block as ``CollectorActor.exchange`` does; the
    learner keeps ``MAX_IN_FLIGHT`` requests in flight and copies every block into a 100k-row replay of this
    env's layout (``RayCollectorPool._ingest_rows``: one reservation, one copy). Returns the learner thread's CPU
    and wall time per transition (``ray.get`` + copy).
    """
    import numpy as np
    import ray

    from unilab_gym.replay import ReplayStorage
    from unilab_gym.replay.layout import ReplayLayout
    from unilab_gym.runtime.ray_collector import MAX_IN_FLIGHT

    ray.init(num_cpus=1, include_dashboard=False, object_store_memory=80 << 20, configure_logging=False)
    storage = ReplayStorage(ReplayLayout(48, 12), 100_000)
    try:

        @ray.remote(num_cpus=1)
        class Stage:
            def __init__(self, n: int) -> None:
                self.block = {"data": {"rows": np.random.default_rng(0).random((n, 111), np.float32)}}

            def exchange(self) -> dict[str, Any]:
                return self.block

        actor = Stage.remote(rows_per_result)
        ray.get(actor.exchange.remote())  # started
        in_flight = [actor.exchange.remote() for _ in range(MAX_IN_FLIGHT)]
        cpu = wall = 0.0
        for i in range(results):
            ready, in_flight = ray.wait(in_flight, num_returns=1)
            t0, c0 = time.perf_counter(), time.thread_time()
            rows = ray.get(ready[0])["data"]["rows"]
            res = storage.reserve(len(rows))
            for r0, r1, s0, s1 in res.pieces:
                storage.block[r0:r1] = rows[s0:s1]
            storage.commit(res)
            wall += time.perf_counter() - t0
            cpu += time.thread_time() - c0
            if i + MAX_IN_FLIGHT < results:
                in_flight.append(actor.exchange.remote())
        n = results * rows_per_result
        return {"cpu_us_per_transition": 1e6 * cpu / n, "wall_us_per_transition": 1e6 * wall / n}
    finally:
        storage.close()
        ray.shutdown()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=HelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 repeats of 64 * 120 env steps")
    parser.add_argument("--repeats", type=int, default=None, help="interleaved repeats (default 3; quick 2)")
    parser.add_argument("--steps", type=int, default=None, help="env steps per run (default 64 * 300; quick 64 * 120)")
    parser.add_argument(
        "--replay-ratio", type=float, default=1.0 / NUM_ENVS, help="gradient steps per transition (default 1/64)"
    )
    parser.add_argument("--out", default=RESULTS_DIR, help="output directory")
    args = parser.parse_args(argv)
    repeats = args.repeats or (2 if args.quick else 3)
    quick = args.quick
    steps = args.steps or NUM_ENVS * (120 if args.quick else 300)
    load_start = sample_load(1.0)
    configs = {
        name: (run, dict(backend=backend, total_steps=steps, seed=0, ingest_workers=k, replay_ratio=args.replay_ratio))
        for name, (backend, k) in CONFIGS.items()
    }
    runs = run_interleaved(configs, repeats, desc="process vs ray")
    ingest_configs = {f"{n} rows per result": (run_ingest, dict(rows_per_result=n, results=300)) for n in INGEST_ROWS}
    ingest_runs = run_interleaved(ingest_configs, repeats, desc="ingest alone")
    load_end = sample_load(1.0)
    ingest_alone = {
        name: {k: summarize(rs, k)[0] for k in ("cpu_us_per_transition", "wall_us_per_transition")}
        for name, rs in ingest_runs.items()
    }
    med = {name: {k: summarize(rs, k)[0] for k in runs["process"][0]} for name, rs in runs.items()}
    by_workers: dict[int, dict[str, float]] = {}
    for name, (backend, k) in CONFIGS.items():
        if backend == "ray":
            ray_runs = runs[name]
            keys = sorted({key for r in ray_runs for key in r} - set(runs["process"][0]))  # steady: where measured
            by_workers[k] = {key: summarize([r for r in ray_runs if key in r], key)[0] for key in keys}
    ray_ingest = by_workers[1]
    ingest_us = ray_ingest["ingest_us_per_transition"]
    ratios = {
        name: {
            "env_steps_per_s": med[name]["env_steps_per_s"] / med["process"]["env_steps_per_s"],
            "steady_env_steps_per_s": med[name]["steady_env_steps_per_s"] / med["process"]["steady_env_steps_per_s"],
            "startup_s": med[name]["startup_s"] / med["process"]["startup_s"],
            "wall_s": med[name]["wall_s"] / med["process"]["wall_s"],
        }
        for name in med
        if name != "process"
    }
    warning = busy_warning(load_start, load_end)
    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "config": {
            "num_envs": NUM_ENVS,
            "env_steps": steps,
            "repeats": repeats,
            "row_bytes": ROW_BYTES,
            "quick": quick,
            "replay_ratio": args.replay_ratio,
        },
        "load": {"start": load_start, "end": load_end, "warning": warning},
        "runs": runs,
        "medians": med,
        "ratios_ray_over_process": ratios,
        "ingest_us_per_transition": ingest_us,
        "ingest_in_runs": ray_ingest,
        "ingest_in_runs_by_workers": by_workers,
        "ingest_alone": ingest_alone,
        "ingest_mb_per_s_at_that_cost": ROW_BYTES / ingest_us,
    }
    few = [k for k, v in by_workers.items() if v.get("steady_window_exchanges", 0) < MIN_WINDOW_EXCHANGES]
    lines = [
        "# AsyncRunner SAC: process vs Ray backend (2 collectors x 32 envs)",
        "",
        f"{report['date']}, {steps} env steps per run, replay ratio {args.replay_ratio:g}, {repeats} interleaved "
        f"repeats, medians. Load: start {load_start['busy_cores']} busy cores of {load_start['cores']:g} "
        f"(load average {load_start['load_average']}), end {load_end['busy_cores']}.",
        "",
        "| backend | wall clock (s) | env-steps/s | start-up (s) | steady env-steps/s | steady window |",
        "|---|---:|---:|---:|---:|---:|",
        *(
            f"| {name} | {m['wall_s']:.1f} | {m['env_steps_per_s']:.0f} | {m['startup_s']:.1f} "
            f"| {m['steady_env_steps_per_s']:.0f} | {m['steady_window_s']:.0f} s"
            + (f", {m['steady_window_exchanges']:.0f} exchanges |" if "steady_window_exchanges" in m else " |")
            for name, m in med.items()
        ),
        *(
            f"| **{name} / process** | {r['wall_s']:.2f}x | {r['env_steps_per_s']:.2f}x "
            f"| {r['startup_s']:.2f}x | {r['steady_env_steps_per_s']:.2f}x | |"
            for name, r in ratios.items()
        ),
        "",
        "Start-up: from building the AsyncRunner to the first counted transition. Steady: from a quarter of the "
        "run's env steps to the end of learn()."
        + (
            " Quick mode: a smoke test of every configuration and of the ingest cost by phase; its runs are short, "
            "so read a default run for the steady env-steps/s ratio."
            if quick
            else ""
        ),
        "",
        f"Learner ingest cost in these runs (Ray, ingest_workers=1): {ingest_us:.2f} us/transition of CPU over the "
        f"whole run (every phase of RayCollectorPool.ingest_stats), answers of median "
        f"{ray_ingest.get('ingest_answer_transitions_median', float('nan')):.0f} transitions. In the steady window, "
        "by phase (unilab_ingest_cpu_seconds_total{phase}; µs of ingest CPU per transition, all ingesting threads):",
        "",
        "| ingest_workers | "
        + " | ".join(INGEST_PHASES)
        + " | total | training thread | workers | per answer | transitions per answer (mean) | spans per answer "
        "| exchanges | Ray's threads in the learner process |",
        "|---|" + "---:|" * (len(INGEST_PHASES) + 8),
        *(
            f"| {k} | "
            + " | ".join(f"{v.get(f'steady_ingest_us_per_transition/{p}', float('nan')):.2f}" for p in INGEST_PHASES)
            + f" | {v.get('steady_ingest_us_per_transition', float('nan')):.2f} "
            f"| {v.get('steady_training_thread_us_per_transition', float('nan')):.2f} "
            f"| {v.get('steady_workers_us_per_transition', float('nan')):.2f} "
            f"| {v.get('steady_ingest_us_per_answer', float('nan')):.0f} "
            f"| {v.get('steady_answer_transitions_mean', float('nan')):.0f} "
            f"| {v.get('steady_spans_per_answer', float('nan')):.1f} "
            f"| {v.get('steady_window_exchanges', float('nan')):.0f} "
            f"| {v.get('steady_other_threads_us_per_transition', float('nan')):.2f} |"
            for k, v in by_workers.items()
        ),
        "",
        "Phases: wait (the CPU of the blocking wait() while the learner waits for data), poll (taking the ready "
        "answers off the queue Ray's callbacks fill), fetch (the object into this process), deserialize "
        "(unpickling), copy (reserve, write, commit into the replay), request (issuing the next exchanges), "
        "bookkeeping (counters, episodes, heartbeats). Training thread: the part spent in poll()/wait() on the "
        "thread that trains; workers: the ingest workers' part (ingest_workers=2: fetch, deserialize, copy, "
        "request). Spans: poll() and wait() calls (and worker passes) per answer. The last column is CPU of the "
        "learner process's other threads (Ray's core-worker I/O, which receives the replies and runs the "
        "callbacks): not in the ingest figure.",
        *(
            [
                "",
                f"Few exchanges in the steady window (ingest_workers {few}: fewer than {MIN_WINDOW_EXCHANGES}): "
                "read its per-answer figures as rough.",
            ]
            if few
            else []
        ),
        "",
        "Ingest alone (an actor answering with a staged block, 2 requests in flight, copy into a 100k-row replay):",
        "",
        "| block | CPU us/transition | wall us/transition | transitions/s per learner core |",
        "|---|---:|---:|---:|",
        *(
            f"| {name} | {v['cpu_us_per_transition']:.3f} | {v['wall_us_per_transition']:.3f} "
            f"| {1e6 / v['cpu_us_per_transition']:,.0f} |"
            for name, v in ingest_alone.items()
        ),
    ]
    if warning:
        lines += ["", warning]
        print(warning, file=sys.stderr)
    md = "\n".join(lines) + "\n"
    print(md)
    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, "bench_ray.json"), report)
    with open(os.path.join(args.out, "bench_ray.md"), "w") as f:
        f.write(md)
    return report


if __name__ == "__main__":
    main()
