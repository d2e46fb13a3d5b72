"""Measure the inputs of the scaling model (``benchmarks/scaling_model.py``) on this machine; write them as JSON.

    python benchmarks/scaling_inputs.py           # ~2 min on 2 idle cores
    python benchmarks/scaling_inputs.py --quick   # fewer answers and gradient steps, ~1 min

Measured here:

- **Ingest cost per answer at each answer size** (32 ... 4,096 transitions): a local Ray, 2 fake collectors
  (actors answering a pre-built answer of the real layout: ``CollectorActor.exchange``'s dict, rows of
  ``UniLab/Quadruped-v0``'s replay layout), and the learner doing per answer what ``RayCollectorPool`` does: the
  answer's ObjectRef arrives in a queue from a callback on Ray's thread (2 requests in flight per collector),
  ``ray.get``, one reservation and copy into a ``ReplayStorage``, the next request (one tuple of plain values, a
  callback registered on it). Learner-thread CPU, split into the Ray part
  and the copy, and the CPU of Ray's own threads in the learner process (the core worker's I/O, which receives the
  replies), interleaved over sizes, median of 3 rounds.
- **Bytes per transition on the wire**: the same answers serialized as Ray does (pickle protocol 5, numpy blocks
  out of band), size = fixed + per transition x n (least squares over the sizes).
- **Learner training rate**: SAC gradient steps/s (batch 256, SB3's default MlpPolicy for this env, one torch
  thread) on a filled replay.

Read from committed results (each entry names its file and date):

- **Per-core env-steps/s**: a collector core with its policy (``compare_sb3.json``: AsyncRunner collectors, 2
  processes on 2 cores, median / 2) and the env alone (``bench_env.json``: N=64 UniLabVectorEnv).
- **Ingest cost in real runs**: per answer in the steady window of a real 2-collector SAC run, with its answer
  size: what a real learner pays per answer beyond the ingest path measured here (``ray.wait`` polls between
  answers, bookkeeping). The newest of ``bench_ray.json`` (learner thread and Ray's I/O threads) and
  ``ray_netns.json``'s ``veth`` SAC run (learner thread and Ray's threads).
- **Weight broadcast per node** and the publish rate (``ray_netns.json``: ``bench_ray_netns.py``'s broadcast
  measurement and SAC runs per link profile).

Writes ``scaling_inputs.json`` to ``--out`` (default ``benchmarks/results``), with the code version it measured.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pickle
import queue
import statistics
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import RESULTS_DIR, busy_warning, machine_info, sample_load, write_json

from unilab_gym.cli import HelpFormatter

ID = "UniLab/Quadruped-v0"
#: Answer sizes measured, in transitions (one vector step of 32 envs to a full stage of 64 steps x 64 envs).
SIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)
OBS, ACT = 48, 12


def fake_answer(n: int, num_collectors: int = 2) -> dict[str, Any]:
    """An answer shaped as ``CollectorActor.exchange`` returns it, with ``n`` transitions of this env's layout."""
    import numpy as np

    from unilab_gym.replay.layout import ReplayLayout
    from unilab_gym.runtime.counters import METRIC_FIELDS, ROW_FIELDS

    width = ReplayLayout(OBS, ACT).width
    rng = np.random.default_rng(n)
    return {
        "data": {"rows": rng.random((n, width), dtype=np.float32)},
        "messages": [("episodes", [12.5] * (n // 250), [250] * (n // 250))],
        "row": np.zeros(ROW_FIELDS, np.int64).tobytes(),
        "metrics": np.zeros(METRIC_FIELDS, np.float64).tobytes(),
        "node_id": "f" * 56,
        "pid": 12345,
        "host": "node-00",
        "finished": False,
        "weights_version": 7,
    }


def wire_bytes(sizes: tuple[int, ...] = SIZES) -> dict[str, Any]:
    """Serialized size of an answer at each size (pickle 5, buffers out of band, as Ray), and its linear fit."""
    import numpy as np

    out = {}
    for n in sizes:
        buffers: list[Any] = []
        head = pickle.dumps(fake_answer(n), protocol=5, buffer_callback=buffers.append)
        out[n] = len(head) + sum(memoryview(b).nbytes for b in buffers)
    per, fixed = np.polyfit(np.array(sizes, float), np.array([out[n] for n in sizes], float), 1)
    return {"bytes_per_answer": out, "fixed_bytes": float(fixed), "bytes_per_transition": float(per)}


def ingest_costs(sizes: tuple[int, ...], answers: int, rounds: int) -> dict[str, Any]:
    """Learner-thread CPU per answer (Ray part, copy) at each size; medians over ``rounds`` interleaved rounds."""
    import ray

    from unilab_gym.replay import ReplayStorage
    from unilab_gym.replay.layout import ReplayLayout
    from unilab_gym.runtime.ray_collector import MAX_IN_FLIGHT

    ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=200 << 20)
    storage = ReplayStorage(ReplayLayout(OBS, ACT), 200_000)
    try:

        @ray.remote(num_cpus=0)
        class FakeCollector:
            def __init__(self, n: int) -> None:
                self.answer = fake_answer(n)

            def exchange(self, request: tuple[Any, ...]) -> dict[str, Any]:
                return self.answer

        per: dict[int, list[tuple[float, float, float, float]]] = {n: [] for n in sizes}
        request = (0, (10**9, 0, 0), (0, 0), None)  # (seq, signals, totals, weights): plain values, one argument
        for _ in range(rounds):
            for n in sizes:
                actors = [FakeCollector.remote(n) for _ in range(2)]
                ray.get([a.exchange.remote(request) for a in actors])  # started
                inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
                in_flight = {}
                for a in actors:
                    for _ in range(MAX_IN_FLIGHT):
                        ref = a.exchange.remote(request)
                        in_flight[ref] = a
                        _on_ready(ref, inbox)
                ray_cpu = copy_cpu = 0.0
                done = 0
                t0, p0, th0 = time.perf_counter(), time.process_time(), time.thread_time()
                while done < answers:
                    ref = inbox.get()  # the learner's wait(): a callback on Ray's thread fills the inbox
                    c0 = time.thread_time()
                    actor = in_flight.pop(ref)
                    rows = ray.get(ref)["data"]["rows"]
                    c1 = time.thread_time()
                    res = storage.reserve(len(rows))
                    for r0, r1, s0, s1 in res.pieces:
                        storage.block[r0:r1] = rows[s0:s1]
                    storage.commit(res)
                    c2 = time.thread_time()
                    nxt = actor.exchange.remote(request)
                    in_flight[nxt] = actor
                    _on_ready(nxt, inbox)
                    done += 1
                    copy_cpu += c2 - c1
                    ray_cpu += (c1 - c0) + (time.thread_time() - c2)
                wall = time.perf_counter() - t0
                io_cpu = (time.process_time() - p0) - (time.thread_time() - th0)  # Ray's threads in this process
                per[n].append((1e6 * ray_cpu / done, 1e6 * copy_cpu / done, 1e6 * wall / done, 1e6 * io_cpu / done))
                for a in actors:
                    ray.kill(a)
        out = {}
        for n, runs in per.items():
            ray_us = statistics.median(r[0] for r in runs)
            copy_us = statistics.median(r[1] for r in runs)
            out[n] = {
                "ray_cpu_us_per_answer": ray_us,
                "copy_cpu_us_per_answer": copy_us,
                "cpu_us_per_answer": ray_us + copy_us,
                "cpu_us_per_transition": (ray_us + copy_us) / n,
                "wall_us_per_answer": statistics.median(r[2] for r in runs),
                "io_threads_cpu_us_per_answer": statistics.median(r[3] for r in runs),
            }
        return out
    finally:
        storage.close()
        ray.shutdown()


def _on_ready(ref: Any, inbox: Any) -> None:
    """Put ``ref`` in ``inbox`` when its object is ready, from Ray's thread (as ``RayCollectorPool`` does)."""
    hook = getattr(ref, "_on_ready", None)
    if callable(hook):
        hook(lambda _error: inbox.put(ref))
    else:
        ref.future().add_done_callback(lambda _future: inbox.put(ref))


def training_rate(grad_steps: int) -> dict[str, Any]:
    """SAC gradient steps/s on a filled replay (batch 256, default MlpPolicy, one torch thread)."""
    import numpy as np
    import torch
    from stable_baselines3 import SAC

    from unilab_gym.sb3.vec_env import make_sb3_env

    torch.set_num_threads(1)
    model = SAC("MlpPolicy", make_sb3_env(ID, 1, seed=0), batch_size=256, buffer_size=20_000, seed=0)
    rng = np.random.default_rng(0)
    rb = model.replay_buffer
    for _ in range(5_000):
        obs = rng.standard_normal((1, OBS)).astype(np.float32)
        act = rng.uniform(-1, 1, (1, ACT)).astype(np.float32)
        rb.add(obs, obs, act, np.zeros(1), np.zeros(1), [{}])
    model._setup_learn(1)  # logger and progress as learn() sets them (train() logs to it)
    model.train(gradient_steps=20, batch_size=256)  # warm-up
    t0, c0 = time.perf_counter(), time.process_time()
    model.train(gradient_steps=grad_steps, batch_size=256)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {
        "grad_steps_per_s": grad_steps / wall,
        "grad_steps_per_cpu_s": grad_steps / cpu,
        "batch_size": 256,
        "grad_steps": grad_steps,
        "torch_threads": 1,
    }


def _median(values: list[float]) -> float:
    return float(statistics.median(values))


def committed_inputs(results: str) -> dict[str, Any]:
    """Per-core rates, real-run ingest and weight broadcast from the committed results (see the module docstring)."""
    out: dict[str, Any] = {}
    with open(os.path.join(results, "compare_sb3.json")) as f:
        cmp = json.load(f)
    runs = cmp["sections"]["env"]["runs"]
    out["per_core"] = {
        "collector_env_steps_per_s": _median(
            [r["env_steps_per_s"] for r in runs["AsyncRunner collectors (2 processes)"]]
        )
        / 2,
        "source": f"compare_sb3.json ({cmp['date']}): 'AsyncRunner collectors (2 processes)' median / 2 cores",
    }
    with open(os.path.join(results, "bench_env.json")) as f:
        env = json.load(f)
    out["per_core"]["env_only_env_steps_per_s"] = _median(
        [r["env_steps_per_s"] for r in env["runs"]["N=64 UniLabVectorEnv"]]
    )
    with open(os.path.join(results, "bench_ray.json")) as f:
        bench = json.load(f)
    real = bench["ingest_in_runs"]
    candidates = [
        {
            "us_per_answer": real["steady_ingest_us_per_answer"],
            "answer_transitions": real["steady_answer_transitions_mean"],
            "us_per_transition": real["steady_ingest_us_per_transition"],
            "io_threads_us_per_transition": real.get("steady_other_threads_us_per_transition"),
            "date": bench["date"],
            "source": f"bench_ray.json ({bench['date']}): steady window of the real 2-collector SAC runs",
        }
    ]
    path = os.path.join(results, "ray_netns.json")
    if os.path.exists(path):
        with open(path) as f:
            net = json.load(f)
        out["broadcast"] = {
            name: {**p["broadcast"], "ping_ms": _median(p["ping_ms"])}
            for name, p in net["profiles"].items()
            if "broadcast" in p
        }
        rates = [
            p["sac"]["weight_versions_per_s"]
            for p in net["profiles"].values()
            if "weight_versions_per_s" in p.get("sac", {})
        ]
        out["publish_versions_per_s"] = max(rates) if rates else None
        out["netns_runs"] = {
            name: {
                algo: {
                    k: p[algo][k]
                    for k in ("steady_env_steps_per_s", "ingest_us_per_transition", "answer_transitions_mean")
                }
                for algo in ("sac", "ppo")
                if algo in p
            }
            for name, p in net["profiles"].items()
        }
        out["broadcast_source"] = f"ray_netns.json ({net['date']})"
        sac = net["profiles"].get("veth", {}).get("sac")
        if sac:  # Ray's threads: measured from run 2 of bench_ray_netns.py on (else taken as in the ingest path)
            candidates.append(
                {
                    "us_per_answer": sac["ingest_us_per_transition"] * sac["answer_transitions_mean"],
                    "answer_transitions": sac["answer_transitions_mean"],
                    "us_per_transition": sac["ingest_us_per_transition"],
                    "io_threads_us_per_transition": sac.get("io_threads_us_per_transition"),
                    "date": net["date"],
                    "source": f"ray_netns.json ({net['date']}, code {net.get('code')}): the veth SAC run's steady "
                    "window",
                }
            )
    #: the newest real run is the one of the code measured here (the older ones are kept for the record)
    out["real_run_ingest_candidates"] = candidates
    out["real_run_ingest"] = max(candidates, key=lambda c: c["date"])
    return out


def code_version() -> str:
    """The commit, and ``+uncommitted`` when ``unilab_gym/`` had changes not committed (the shared working tree)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    head = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--", "unilab_gym"], capture_output=True)
    return head.stdout.strip() + ("+uncommitted" if dirty.stdout.strip() else "")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=HelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer answers and gradient steps (~1 min)")
    parser.add_argument("--out", default=RESULTS_DIR, help="output directory")
    parser.add_argument("--results", default=RESULTS_DIR, help="where the committed results are read")
    args = parser.parse_args(argv)
    load_start = sample_load(1.0)
    t0 = time.perf_counter()
    inputs: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "code": code_version(),
        "machine": machine_info(),
        "env": ID,
        "wire": wire_bytes(),
        "ingest": ingest_costs(SIZES, answers=60 if args.quick else 150, rounds=2 if args.quick else 3),
        "training": training_rate(100 if args.quick else 300),
        **committed_inputs(args.results),
    }
    load_end = sample_load(1.0)
    inputs["load"] = {"start": load_start, "end": load_end, "warning": busy_warning(load_start, load_end)}
    inputs["elapsed_s"] = time.perf_counter() - t0
    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, "scaling_inputs.json"), inputs)
    print(json.dumps({k: inputs[k] for k in ("code", "wire", "ingest", "training")}, indent=1))
    if inputs["load"]["warning"]:
        print(inputs["load"]["warning"], file=sys.stderr)
    return inputs


if __name__ == "__main__":
    main()
