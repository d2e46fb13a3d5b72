"""Check the scaling model's ingest column: replay the measured per-answer costs at 100 nodes' answer rate.

    python benchmarks/ingest_replay.py            # ~1 min
    python benchmarks/ingest_replay.py --seconds 3

For each answer size of the model's two tables (today's answers, big answers) and K = 1, 2, 4 ingest
workers: K processes share the offered answer rate of 100 nodes x 48 collectors (``scaling_model.Model``: raw
env-steps/s / answer size), each taking its share on schedule (or at once when behind). Per answer a worker

1. spends the measured CPU of the answer's Ray part (``ray.wait``, ``ray.get``, deserialization, the next request,
   Ray's I/O threads, and the real-run extra per answer: ``Model.us_per_answer`` minus the measured copy) on a
   busy loop of its own thread's CPU clock: a replay of the cost, not of Ray itself;
2. copies a pre-built block of that many transitions (``UniLab/Quadruped-v0``'s layout) into one real
   ``ReplayStorage``, shared by the K workers, through the writer protocol (``reserve``, copy, ``commit``), as
   ``RayCollectorPool._ingest_rows`` does.

Achieved transitions/s (over ``--seconds``) is compared with the model's ingest capacity K x 10^6 / c(n), and, as
a machine shared with other work gives the workers less than K cores, with the model at the CPU the workers did get
(their CPU seconds / wall seconds); the workers' CPU per answer is compared with the model's c(n) x n. What this
checks: that the copy cost measured by one writer holds with K concurrent writers on one storage, and that ingest
scales with the CPU it gets as the model assumes, on this machine (K beyond its cores cannot scale: the ``cores``
column). What it does not: Ray's own behaviour at 100 nodes' answer rate (its per-answer cost is replayed, not run),
nor the GIL: the runner's ingest workers (``ingest_workers=K``) are threads of the learner process, parallel only
where Ray and numpy release the GIL, while the replay's workers are processes, the K cores the model assumes.
Reads ``scaling_inputs.json``; writes ``ingest_replay.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import RESULTS_DIR, busy_warning, machine_info, sample_load, write_json
from scaling_model import CORES, KS, Model

from unilab_gym.cli import HelpFormatter

NODES = 100


def _spin(cpu_s: float) -> None:
    """Busy-loop until this thread has used ``cpu_s`` more seconds of CPU."""
    end = time.thread_time() + cpu_s
    while time.thread_time() < end:
        pass


def worker(handle: Any, n: int, spin_s: float, interval_s: float, start: Any, seconds: float, out: Any) -> None:
    """One ingest worker: every ``interval_s`` (or at once when behind) an answer of ``n`` rows, until ``seconds``."""
    import numpy as np

    from unilab_gym.replay import ReplayStorage

    storage = ReplayStorage.attach(handle)
    rows = np.random.default_rng(os.getpid()).random((n, storage.block.shape[1]), dtype=np.float32)
    try:
        start.wait()
        t0 = time.perf_counter()
        c0 = time.thread_time()
        answers = 0
        while True:
            now = time.perf_counter()
            if now - t0 >= seconds:
                break
            due = t0 + answers * interval_s
            if due > now:
                time.sleep(due - now)
            _spin(spin_s)
            res = storage.reserve(n)
            for r0, r1, s0, s1 in res.pieces:
                storage.block[r0:r1] = rows[s0:s1]
            storage.commit(res)
            answers += 1
        out.put((answers, time.perf_counter() - t0, time.thread_time() - c0))
    finally:
        storage.close()


def replay(model: Model, n: float, k: int, seconds: float) -> dict[str, Any]:
    """K workers at 100 nodes' answer rate for answers of ``n`` transitions; the achieved ingest rate."""
    from unilab_gym.replay import ReplayStorage
    from unilab_gym.replay.layout import ReplayLayout

    n_int = round(n)
    offered_answers = NODES * CORES * model.per_core / n
    copy_us = _copy_us(model, n)
    spin_s = max(0.0, model.us_per_answer(n) - copy_us) / 1e6
    storage = ReplayStorage(ReplayLayout(48, 12), 200_000)
    ctx = mp.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    args = (storage.handle, n_int, spin_s, k / offered_answers, start, seconds, out)
    procs = [ctx.Process(target=worker, args=args) for _ in range(k)]
    try:
        for p in procs:
            p.start()
        time.sleep(2.0)  # the workers import numpy and attach before the clock starts
        start.set()
        results = [out.get(timeout=seconds + 60) for _ in procs]
        for p in procs:
            p.join(10)
        committed = storage.committed
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        storage.close()
    answers = sum(r[0] for r in results)
    wall = max(r[1] for r in results)
    return {
        "answer": n,
        "k": k,
        "offered_transitions_per_s": offered_answers * n,
        "achieved_transitions_per_s": answers * n_int / wall,
        "committed": committed,
        "spin_us_per_answer": spin_s * 1e6,
        "copy_us_per_answer_measured": copy_us,
        "worker_cpu_us_per_answer": 1e6 * sum(r[2] for r in results) / max(answers, 1),
        "model_us_per_answer": model.us_per_answer(n),
        "cpu_obtained_cores": sum(r[2] for r in results) / wall,  # what the workers got of the machine
        "cores": float(min(k, len(os.sched_getaffinity(0)))),
    }


def _copy_us(model: Model, n: float) -> float:
    from scaling_model import _interp

    return _interp(model.sizes, model.copy_us, n)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=HelpFormatter)
    parser.add_argument(
        "--inputs", default=os.path.join(RESULTS_DIR, "scaling_inputs.json"), help="measured inputs (scaling_inputs.py)"
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each replay")
    parser.add_argument("--out", default=RESULTS_DIR, help="output directory")
    args = parser.parse_args(argv)
    with open(args.inputs) as f:
        model = Model(json.load(f))
    load_start = sample_load(1.0)
    runs = [replay(model, n, k, args.seconds) for n in (model.answer_size(False), model.answer_size(True)) for k in KS]
    load_end = sample_load(1.0)
    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "description": (
            f"K worker processes replay the measured per-answer CPU (busy loop) and copy real blocks into one "
            f"shared ReplayStorage at {NODES} nodes' answer rate, {args.seconds:g} s per run"
        ),
        "runs": runs,
        "load": {"start": load_start, "end": load_end, "warning": busy_warning(load_start, load_end)},
    }
    for r in runs:
        cap = r["k"] * 1e6 / model.us_per_transition(r["answer"])
        print(
            f"answer {r['answer']:.0f}, K={r['k']}: offered {r['offered_transitions_per_s']:,.0f}/s, "
            f"model {cap:,.0f}/s, achieved {r['achieved_transitions_per_s']:,.0f}/s "
            f"({r['achieved_transitions_per_s'] / cap:.2f}x)"
        )
    if report["load"]["warning"]:
        print(report["load"]["warning"], file=sys.stderr)
    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, "ingest_replay.json"), report)
    return report


if __name__ == "__main__":
    main()
