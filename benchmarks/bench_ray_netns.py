"""AsyncRunner over a real network: a Ray head and a worker node in two network namespaces joined by a shaped link.

    sudo python benchmarks/bench_ray_netns.py          # 3 link profiles x (SAC, PPO, weight broadcast), kills
    sudo python benchmarks/bench_ray_netns.py --quick   # the 100 Mbit/s, 5 ms profile only, shorter runs

Needs root and ``ip`` / ``tc`` (iproute2). Layout (``benchmarks/netns.py`` builds the link)::

    head namespace, 10.231.0.1                         worker namespace, 10.231.0.2
    ray start --head (1 CPU, no collector)     ray start --address=10.231.0.1:6379 --resources='{"collector": 2}'
    the learner: AsyncRunner(backend="ray",    the 2 collector actors (collector_resources={"collector": 1})
      ray_address="10.231.0.1:6379")
                       └──────── veth, rate limit and one-way delay per profile ────────┘

Link profiles (``netns.PROFILES``): ``veth`` (no shaping: the baseline), ``1gbit-0.2ms`` and ``100mbit-5ms`` (rate
per direction, one-way delay: a ping's round trip is twice it). Each profile gets a fresh link and cluster; in it,
one process per measurement runs inside the head's namespace (``ip netns exec``):

- **SAC** (the ``bench_ray.py`` configuration: 2 collectors x 32 envs of ``UniLab/Quadruped-v0``, batch 256,
  replay ratio 1/64), the same with ``ingest_workers=2``, and **PPO** (2 x 32 envs, ``n_steps=64``, batch 1,024,
  4 epochs): env-steps/s reaching the learner over the steady window (from a quarter of the run's env steps to the
  end of ``learn``); the learner's ingest CPU per transition over that window (``RayCollectorPool.ingest_stats``,
  the source of the SB3 key ``unilab/ingest_us_per_transition``: the training thread's and the ingest workers'),
  and the CPU of the learner process's other threads (Ray's core-worker I/O, which receives the replies);
  object-store bytes in flight, sampled every 0.5 s: the runner's gauge (``unilab_object_store_bytes_in_flight``)
  and Ray's plasma usage over all nodes (what ``ray memory --stats-only`` prints; MiB resolution; answers under
  100 KB are inlined in Ray's replies and never reach plasma); weight-sync latency, as the collectors' histogram
  has it (``unilab_weight_sync_latency_microseconds``: a version's arrival in the actor to its first use) and as
  the learner sees it (``publish_weights`` to the first answer of each collector that reports acting with that
  version: the request's trip, the actor's fetch of the
  weights over the link, and the answer's trip).
- **Weight broadcast**: the SAC policy's weight vector ``ray.put`` by the learner, then fetched by an actor on the
  worker node (a call that carries the new ref, minus the same call without one): the per-node cost the scaling
  model in ``docs/ray.md`` uses, and the learner's CPU for the ``ray.put``.

Then, on the last profile of the first round, two **node kills** over the link (the raylet of the node hosting
collector 0, SIGKILL, a third of the way into a SAC run): with ``max_collector_restarts=2`` and a second worker node
up (the collectors restart there and the run completes: seconds from the kill to the restart warning and to the
replacements' first transitions), and with restarts off (seconds from the kill to ``CollectorError``). Ray's node
health check is shortened for the cluster (``RAY_health_check_*``, as ``tests/runtime/test_ray_backend.py`` does).

Two rounds over the profiles, interleaved (veth, 1gbit, 100mbit, veth, ...; ``--repeats``), medians per profile and
measurement (the node kills run once, at the end of the first round): ~6-7 min on 2 idle cores in default mode (365 s
on 2026-12-05), and no round starts that would end past ``--max-minutes`` (12) on a slower machine; ~3 min with
``--quick`` (one round); the load is sampled before and after and a warning printed when the machine was busy (the
learner, the collectors, Ray's daemons and the delay line share the 2 cores: read the ratios to the ``veth`` baseline
more than the absolute figures). Everything started runs in the link's namespaces, and the link's tear-down kills it
all (also on error, Ctrl-C or SIGTERM). Ray runs with its own temp dir (``RAY_TMPDIR``) and token
(``RAY_AUTH_MODE=token``), so nothing of another Ray on the machine is touched. Writes ``ray_netns.json`` to ``--out``
(default ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netns
from common import RESULTS_DIR, busy_warning, machine_info, sample_load, write_json

from unilab_gym.cli import HelpFormatter

ID = "UniLab/Quadruped-v0"
NUM_ENVS = 64
COLLECTORS = 2
#: Ray's node health check, shortened so a killed node is declared dead in a few seconds (read by the GCS at start).
HEALTH_CHECK = {
    "RAY_health_check_initial_delay_ms": "0",
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "4",
}
HEAD_PORT = 6379
#: Object-store memory of each node (Ray's minimum is 75 MiB).
OBJECT_STORE = 150 << 20
#: Longest one measurement process may run, in s.
CHILD_TIMEOUT_S = 240
RESULT_TAG = "RESULT "
#: The runs of each profile: name -> (algorithm, ingest_workers).
MEASUREMENTS = {"sac": ("sac", 1), "sac K=2": ("sac", 2), "ppo": ("ppo", 1)}


# ---------------------------------------------------------------------- the cluster (parent side)
class Cluster:
    """A Ray head in the link's head namespace and worker nodes in its worker namespace."""

    def __init__(self, link: netns.Link, tmp: str):
        self.link = link
        self.env = dict(
            os.environ,
            RAY_TMPDIR=tmp,  # session dirs and ray_current_cluster: not /tmp/ray, which other Ray users read
            RAY_AUTH_MODE="token",
            RAY_AUTH_TOKEN=secrets.token_hex(32),
            RAY_USAGE_STATS_ENABLED="0",
            **HEALTH_CHECK,
        )
        self.address = f"{netns.HEAD_ADDR}:{HEAD_PORT}"

    def _start(self, side: str, *args: str) -> None:
        cmd = self.link.in_ns(side, "ray", "start", "--disable-usage-stats", f"--object-store-memory={OBJECT_STORE}")
        proc = subprocess.run([*cmd, *args], capture_output=True, text=True, env=self.env, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"ray start ({side}) failed: {proc.stderr[-2000:]}")

    def start(self) -> None:
        head = ["--head", f"--node-ip-address={netns.HEAD_ADDR}", f"--port={HEAD_PORT}", "--num-cpus=1"]
        self._start("head", *head, "--include-dashboard=false")
        self.add_worker()

    def add_worker(self) -> None:
        self._start(
            "worker",
            f"--address={self.address}",
            f"--node-ip-address={netns.WORKER_ADDR}",
            f"--num-cpus={COLLECTORS}",
            f'--resources={{"collector": {COLLECTORS}}}',
        )

    def child(self, kind: str, **kwargs: Any) -> dict[str, Any]:
        """Run ``child_<kind>(**kwargs)`` in a process in the head's namespace; return its result."""
        args = [sys.executable, os.path.abspath(__file__), "--child", kind, json.dumps(kwargs)]
        cmd = ["nice", "-n", str(os.nice(0)), *self.link.in_ns("head", *args)]
        log = os.path.join(self.env["RAY_TMPDIR"], f"child-{kind}-{time.monotonic_ns()}.log")
        with open(log, "w") as err:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=self.env)
            try:
                out, _ = proc.communicate(timeout=CHILD_TIMEOUT_S)
            except BaseException:
                proc.kill()
                proc.wait()
                raise
        lines = [line for line in out.splitlines() if line.startswith(RESULT_TAG)]
        if proc.returncode != 0 or not lines:
            with open(log) as f:
                tail = f.read()[-3000:]
            raise RuntimeError(f"{kind} {kwargs} failed (exit {proc.returncode}):\n{tail}")
        return json.loads(lines[-1][len(RESULT_TAG) :])


# ---------------------------------------------------------------------- measurements (child side, head namespace)
def _plasma_bytes() -> float | None:
    """Plasma memory in use over all nodes, in bytes (``ray memory --stats-only``'s aggregate line; MiB steps)."""
    import re

    from ray._private.internal_api import memory_summary  # the function behind `ray memory` (no dashboard needed)

    m = re.search(r"Plasma memory usage (\d+) MiB", memory_summary(stats_only=True))
    return float(m.group(1)) * (1 << 20) if m else None


def _other_threads_cpu_s() -> float:
    """CPU seconds of this process's threads other than the main one (Ray's core-worker threads, ingest workers)."""
    import psutil

    main = threading.main_thread().native_id
    return sum(t.user_time + t.system_time for t in psutil.Process().threads() if t.id != main)


#: CPU seconds of the run's sampler thread so far (it calls Ray's memory summary: not ingest).
_SAMPLER_CPU = [0.0]


def _ray_threads_cpu_s(pool: Any) -> float:
    """CPU seconds of Ray's threads in this process: the threads but the main one, the ingest workers, the sampler."""
    return _other_threads_cpu_s() - pool.ingest_stats.worker_cpu_seconds - _SAMPLER_CPU[0]


def _raylet_pid(node_id: str) -> int:
    """The pid of the raylet of Ray node ``node_id`` (same machine, another network namespace)."""
    import psutil

    for proc in psutil.process_iter(["name", "cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if cmdline and "raylet" in cmdline[0] and f"--node_id={node_id}" in cmdline:
            return proc.pid
    raise RuntimeError(f"no raylet of node {node_id}")


def _make_model(algo: str, steps: int, seed: int) -> Any:
    from stable_baselines3 import PPO, SAC

    from unilab_gym import SharedReplayBuffer
    from unilab_gym.sb3.vec_env import make_sb3_env

    env = make_sb3_env(ID, NUM_ENVS, seed=seed, max_episode_steps=250)
    if algo == "sac":
        return SAC(
            "MlpPolicy",
            env,
            batch_size=256,
            learning_starts=10 * NUM_ENVS,
            buffer_size=max(steps, 1000),
            replay_buffer_class=SharedReplayBuffer,
            seed=seed,
        )
    return PPO("MlpPolicy", env, n_steps=64, batch_size=1024, n_epochs=4, seed=seed)


def _clock(
    steps: int, kill: str | None, published: dict[int, float], acked: dict[Any, float], events: dict[str, float]
) -> Any:
    """The run's callback: progress points, the steady window's start, weight acknowledgements, the node kill."""
    from stable_baselines3.common.callbacks import BaseCallback

    class Clock(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.points: list[tuple[float, int]] = []
            self.steady: Any = None
            self.last_status = 0.0
            self.killed_node = ""
            self.at_restart: dict[int, int] = {}
            self.runner: Any = None
            self.pool: Any = None

        def _on_step(self) -> bool:
            now = time.perf_counter()
            self.points.append((now, self.num_timesteps))
            if self.steady is None and self.num_timesteps >= steps // 4:
                self.steady = (
                    now,
                    self.num_timesteps,
                    self.pool.ingest_stats.snapshot(),
                    self.pool.counters.metrics.copy(),
                    _ray_threads_cpu_s(self.pool),
                )
            if now - self.last_status > 0.005:  # the learner's view of weight sync (throttled)
                self.last_status = now
                for s in self.runner.collector_status():
                    v = s["weight_version"]
                    if v in published and (s["index"], v) not in acked:
                        acked[s["index"], v] = now
                    if kill and "restart_warned" in events and s["restarts"] > 0:
                        c = s["index"]
                        self.at_restart.setdefault(c, s["env_steps"])
                        if s["env_steps"] > self.at_restart[c] and f"resumed/{c}" not in events:
                            events[f"resumed/{c}"] = now
            if kill and "kill" not in events and self.num_timesteps >= steps // 3:
                node = self.runner.collector_status()[0]["node_id"]
                self.killed_node = node
                events["kill"] = time.perf_counter()
                os.kill(_raylet_pid(node), signal.SIGKILL)
            return True

    return Clock()


def child_learn(
    algo: str, steps: int, address: str, kill: str | None = None, ingest_workers: int = 1, seed: int = 0
) -> dict[str, Any]:
    """One AsyncRunner run over the link; with ``kill`` (``"restart"`` / ``"raise"``), a node kill a third in."""
    import warnings

    import torch

    from unilab_gym import AsyncRunner, CollectorError

    torch.set_num_threads(1)
    model = _make_model(algo, steps, seed)
    published: dict[int, float] = {}
    acked: dict[tuple[int, int], float] = {}
    samples: list[tuple[float, float | None]] = []
    events: dict[str, float] = {}

    def showwarning(message: Any, category: Any, *args: Any) -> None:
        if "restarting" in str(message):
            events.setdefault("restart_warned", time.perf_counter())

    clock = _clock(steps, kill, published, acked, events)
    restarts = 2 if kill == "restart" else 0
    t0 = time.perf_counter()
    runner = AsyncRunner(
        model,
        env_id=ID,
        num_collectors=COLLECTORS,
        envs_per_collector=NUM_ENVS // COLLECTORS,
        env_kwargs=dict(max_episode_steps=250),
        seed=seed,
        replay_ratio=1.0 / NUM_ENVS if algo == "sac" else None,
        backend="ray",
        ray_address=address,
        collector_resources={"collector": 1},
        max_collector_restarts=restarts,
        ingest_workers=ingest_workers,
    )
    pool: Any = runner._pool  # the RayCollectorPool (as bench_ray.py reads it)
    clock.runner, clock.pool = runner, pool
    publish = pool.publish_weights

    def timed_publish(weights: Any) -> int:
        version = publish(weights)
        published[version] = time.perf_counter()
        return version

    pool.publish_weights = timed_publish
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.5):
            with contextlib.suppress(Exception):  # the cluster going down under a kill
                samples.append((float(pool.bytes_in_flight), _plasma_bytes()))
            _SAMPLER_CPU[0] = time.thread_time()  # this thread's CPU: not Ray's (see _ray_threads_cpu_s)

    sampler = threading.Thread(target=sample, daemon=True)
    error = ""
    old_showwarning = warnings.showwarning
    warnings.showwarning = showwarning
    try:
        sampler.start()
        with runner:
            runner.learn(steps if kill != "raise" else 10**9, callback=clock)
            stats = pool.ingest_stats
            io = _ray_threads_cpu_s(pool)
            end = (time.perf_counter(), clock.num_timesteps, stats.snapshot(), pool.counters.metrics.copy(), io)
            status = runner.collector_status()
    except CollectorError as exc:
        events["error"] = time.perf_counter()
        error = str(exc).splitlines()[0]
        end, status = None, []
    finally:
        warnings.showwarning = old_showwarning
        stop.set()
        sampler.join()
        if getattr(model, "replay_buffer", None) is not None and hasattr(model.replay_buffer, "close"):
            model.replay_buffer.close()
    out: dict[str, Any] = {
        "algo": algo,
        "steps": steps,
        "kill": kill,
        "ingest_workers": ingest_workers,
        "wall_s": time.perf_counter() - t0,
    }
    if kill:
        return {**out, **_kill_summary(events, clock.killed_node, error, status, end is not None)}
    assert end is not None and clock.steady is not None
    return {**out, **_steady_summary(clock, t0, end, published, acked, samples), "grad_steps": int(model._n_updates)}


def _kill_summary(
    events: dict[str, float], node: str, error: str, status: list[dict[str, Any]], completed: bool
) -> dict[str, Any]:
    """Seconds from the node kill to the error / the restart warning / every replacement's first transitions."""
    k = events.get("kill")

    def since_kill(key: str) -> float | None:
        return events[key] - k if k is not None and key in events else None

    resumed = [v for key, v in events.items() if key.startswith("resumed/")]
    return {
        "killed_node": node,
        "error": error,
        "kill_to_error_s": since_kill("error"),
        "kill_to_restart_warning_s": since_kill("restart_warned"),
        "kill_to_collection_resumed_s": max(resumed) - k if k is not None and resumed else None,
        "restarts": sum(s["restarts"] for s in status),
        "nodes_after": sorted({s["node_id"] for s in status}),
        "completed": completed,
    }


def _steady_summary(
    clock: Any, t0: float, end: Any, published: dict[int, float], acked: dict[Any, float], samples: list[Any]
) -> dict[str, Any]:
    """The steady window's figures (see the module docstring)."""
    import numpy as np

    from unilab_gym.latency import mean_latency_us
    from unilab_gym.runtime.counters import WEIGHT_SYNC_LATENCY

    (ta, na, (cpu0, _, answers0, n0, _), hist0, io0), (tb, nb, (cpu1, _, answers1, n1, _), hist1, io1) = (
        clock.steady,
        end,
    )
    lags = [t - published[v] for (_, v), t in acked.items() if v in published]
    in_flight = [b for b, _ in samples]
    plasma = [p for _, p in samples if p is not None]
    return {
        "startup_s": next(t for t, n in clock.points if n > 0) - t0,
        "steady_env_steps_per_s": (nb - na) / (tb - ta),
        "steady_window_s": tb - ta,
        "steady_answers": answers1 - answers0,
        "ingest_us_per_transition": 1e6 * (cpu1 - cpu0) / max(n1 - n0, 1),
        "io_threads_us_per_transition": 1e6 * (io1 - io0) / max(n1 - n0, 1),
        "answer_transitions_mean": (n1 - n0) / max(answers1 - answers0, 1),
        "bytes_in_flight_mean": float(np.mean(in_flight)) if in_flight else 0.0,
        "bytes_in_flight_max": float(np.max(in_flight)) if in_flight else 0.0,
        "plasma_bytes_max": float(np.max(plasma)) if plasma else None,
        "weight_sync_us_collectors": mean_latency_us((hist1 - hist0)[:, WEIGHT_SYNC_LATENCY]),
        "weight_sync_ms_learner_median": 1e3 * float(np.median(lags)) if lags else None,
        "weight_sync_ms_learner_p90": 1e3 * float(np.percentile(lags, 90)) if lags else None,
        "weight_versions": len(published),
        "weight_versions_per_s": len(published) / max(end[0] - t0, 1e-9),
    }


def child_broadcast(address: str, versions: int = 20) -> dict[str, Any]:
    """Weight-broadcast cost per node: ``ray.put`` of the SAC policy's weights, then one fetch on the worker node."""
    import numpy as np
    import ray
    import torch
    from stable_baselines3 import SAC

    from unilab_gym.sb3.vec_env import make_sb3_env

    torch.set_num_threads(1)
    model = SAC("MlpPolicy", make_sb3_env(ID, 1, seed=0))
    size = sum(p.numel() for p in model.policy.actor.parameters())  # what the collectors' policy needs
    ray.init(address=address, configure_logging=False)
    try:

        @ray.remote(resources={"collector": 1}, num_cpus=0)
        class Node:
            def fetch(self, refs: list[Any] | None) -> int:
                return 0 if refs is None else int(ray.get(refs[0]).nbytes)

        actor = Node.remote()
        ray.get(actor.fetch.remote(None))
        put_cpu, with_ref, without = [], [], []
        rng = np.random.default_rng(0)
        for _ in range(versions):
            weights = rng.random(size, dtype=np.float32)
            c0 = time.thread_time()
            ref = ray.put(weights)
            put_cpu.append(time.thread_time() - c0)
            t0 = time.perf_counter()
            ray.get(actor.fetch.remote([ref]))  # inside a list: the actor fetches it (as CollectorActor.exchange)
            with_ref.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            ray.get(actor.fetch.remote(None))
            without.append(time.perf_counter() - t0)
            del ref
        fetch = float(np.median(np.subtract(with_ref, without)))
        return {
            "weights_bytes": int(size * 4),
            "put_cpu_ms": 1e3 * float(np.median(put_cpu)),
            "call_ms": 1e3 * float(np.median(without)),
            "fetch_ms": 1e3 * fetch,
            "fetch_mb_per_s": size * 4 / max(fetch, 1e-9) / 1e6,
        }
    finally:
        ray.shutdown()


# ---------------------------------------------------------------------- the run (parent side)
def measure_profile(
    profile: netns.Profile, steps: dict[str, int], kills: bool, broadcast: bool, log: Any
) -> dict[str, Any]:
    """Bring the link and the cluster up, run the measurements in it, tear everything down."""
    tmp = f"/tmp/{netns.PREFIX}{os.getpid()}ray"
    out: dict[str, Any] = {"profile": profile.__dict__}
    with netns.Link(profile) as link:
        try:
            os.makedirs(tmp, exist_ok=True)
            out["link_mode"] = link.mode
            out["ping_ms"] = link.ping(count=5, interval_s=0.1)[1:]  # the first one includes ARP
            cluster = Cluster(link, tmp)
            t = time.perf_counter()
            cluster.start()
            out["cluster_start_s"] = time.perf_counter() - t
            for name, (algo, k) in MEASUREMENTS.items():
                log(f"  {profile.name}: {name} ({steps[algo]} env steps)")
                out[name] = cluster.child(
                    "learn", algo=algo, steps=steps[algo], address=cluster.address, ingest_workers=k
                )
            if broadcast:
                log(f"  {profile.name}: weight broadcast")
                out["broadcast"] = cluster.child("broadcast", address=cluster.address)
            if kills:
                log(f"  {profile.name}: node kill, restarts on (a second worker node joins first)")
                cluster.add_worker()
                out["kill_restart"] = cluster.child(
                    "learn", algo="sac", steps=steps["sac"], address=cluster.address, kill="restart"
                )
                log(f"  {profile.name}: node kill, restarts off")
                out["kill_raise"] = cluster.child(
                    "learn", algo="sac", steps=steps["sac"], address=cluster.address, kill="raise"
                )
        finally:
            link.down()
            shutil.rmtree(tmp, ignore_errors=True)
    out["leftovers"] = link.leftovers()
    return out


def table(results: dict[str, Any]) -> str:
    """The markdown table of the results (one row per profile and algorithm)."""
    rows = [
        "| link | ping RTT (median) | run | steady env-steps/s | vs veth | ingest µs/transition "
        "| Ray's threads µs/transition | transitions per answer (mean) | bytes in flight (mean / max) "
        "| Ray plasma (max) | weight sync: collectors / learner (median, p90) |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base = results["profiles"].get("veth", {})
    for name, r in results["profiles"].items():
        rtt = statistics.median(r["ping_ms"]) if r.get("ping_ms") else float("nan")
        for algo in MEASUREMENTS:
            m = r.get(algo)
            if not m:
                continue
            b = base.get(algo)
            ratio = f"{m['steady_env_steps_per_s'] / b['steady_env_steps_per_s']:.2f}x" if b else "-"
            plasma = m["plasma_bytes_max"]
            rows.append(
                f"| {name} | {rtt:.2f} ms | {algo.upper().replace('K=', 'ingest_workers=')} "
                f"| {m['steady_env_steps_per_s']:,.0f} | {ratio} | {m['ingest_us_per_transition']:.1f} "
                f"| {m.get('io_threads_us_per_transition', float('nan')):.1f} | {m['answer_transitions_mean']:.0f} "
                f"| {m['bytes_in_flight_mean'] / 1e3:,.0f} kB / {m['bytes_in_flight_max'] / 1e3:,.0f} kB "
                f"| {'-' if plasma is None else f'{plasma / 2**20:.0f} MiB'} "
                f"| {_ms(m['weight_sync_us_collectors'], 1e-3)} / {_ms(m['weight_sync_ms_learner_median'])}, "
                f"{_ms(m['weight_sync_ms_learner_p90'])} |"
            )
    return "\n".join(rows)


def _ms(value: float | None, scale: float = 1.0) -> str:
    return "-" if value is None else f"{value * scale:.1f} ms"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=HelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the 100mbit-5ms profile only, shorter runs (~3 min)")
    parser.add_argument(
        "--profiles", nargs="*", choices=list(netns.PROFILES), default=None, help="link profiles to run (default: all)"
    )
    parser.add_argument("--repeats", type=int, default=None, help="rounds over the profiles (default 2; quick 1)")
    parser.add_argument(
        "--max-minutes", type=float, default=12.0, help="start no further round once one more would end past this"
    )
    parser.add_argument("--out", default=RESULTS_DIR, help="output directory")
    parser.add_argument("--child", nargs=2, metavar=("KIND", "JSON"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:  # a measurement process, inside the head's namespace
        kind, kwargs = args.child
        fn = {"learn": child_learn, "broadcast": child_broadcast}[kind]
        print(RESULT_TAG + json.dumps(fn(**json.loads(kwargs))), flush=True)
        return {}
    reason = netns.unavailable()
    if reason:
        sys.exit(f"bench_ray_netns.py cannot run here: {reason}")
    removed = netns.sweep_stale()
    if removed:
        print(f"removed what an earlier run killed with SIGKILL left: {removed}")
    quick = args.quick
    profiles = args.profiles or (["100mbit-5ms"] if quick else list(netns.PROFILES))
    steps = {"sac": NUM_ENVS * (100 if quick else 200), "ppo": NUM_ENVS * 64 * (4 if quick else 6)}
    repeats = args.repeats or (1 if quick else 2)
    load_start = sample_load(1.0)
    t0 = time.perf_counter()
    results: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "code": _code_version(),
        "config": {"quick": quick, "steps": steps, "collectors": COLLECTORS, "num_envs": NUM_ENVS, "repeats": repeats},
        "rounds": [],
    }
    for round_ in range(repeats):  # profiles interleaved: veth, 1gbit, 100mbit, veth, ...
        elapsed = time.perf_counter() - t0
        if round_ and elapsed * (round_ + 1) / round_ > 60 * args.max_minutes:
            print(f"stopping after {round_} rounds: one more would end past --max-minutes {args.max_minutes:g}")
            break
        runs: dict[str, Any] = {}
        for i, name in enumerate(profiles):
            print(f"round {round_ + 1}/{repeats}, profile {name}", flush=True)
            kills = round_ == 0 and i == len(profiles) - 1  # once, in the first round (later ones may not run)
            runs[name] = measure_profile(netns.PROFILES[name], steps, kills=kills, broadcast=True, log=print)
        results["rounds"].append(runs)
    results["profiles"] = {name: _medians([r[name] for r in results["rounds"]]) for name in profiles}
    load_end = sample_load(1.0)
    results["load"] = {"start": load_start, "end": load_end, "warning": busy_warning(load_start, load_end)}
    results["total_s"] = time.perf_counter() - t0
    results["table"] = table(results)
    print(results["table"])
    for name, r in results["profiles"].items():
        for key in ("broadcast", "kill_restart", "kill_raise"):
            if key in r:
                print(name, key, json.dumps(r[key]))
    if results["load"]["warning"]:
        print(results["load"]["warning"], file=sys.stderr)
    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, "ray_netns.json"), results)
    return results


def _medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One profile's figures over the rounds: the median of every number, per measurement; the rest from the first."""
    out: dict[str, Any] = dict(runs[0])
    for key, value in runs[0].items():
        if isinstance(value, dict) and all(isinstance(r.get(key), dict) for r in runs):
            out[key] = {
                k: statistics.median(r[key][k] for r in runs)
                if isinstance(v, (int, float))
                and not isinstance(v, bool)
                and all(r[key].get(k) is not None for r in runs)
                else v
                for k, v in value.items()
            }
    out["ping_ms"] = [p for r in runs for p in r["ping_ms"]]
    out["leftovers"] = sorted({name for r in runs for name in r["leftovers"]})
    return out


def _code_version() -> str:
    """The commit of the working tree this runs in, ``+uncommitted`` if ``unilab_gym/`` had changes."""
    try:
        import unilab_gym

        root = os.path.dirname(os.path.dirname(os.path.abspath(unilab_gym.__file__)))
        head = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--", "unilab_gym"], capture_output=True)
        return head.stdout.strip() + ("+uncommitted" if dirty.stdout.strip() else "")
    except (OSError, ImportError):
        return "unknown"


if __name__ == "__main__":
    main()
