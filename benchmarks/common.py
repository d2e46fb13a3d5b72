"""Shared benchmark machinery: interleaved repeats in fresh processes, medians, ratios, machine info.

Every configuration runs in a fresh spawned process (so peak RSS is its own), and the
configurations are interleaved (A B C A B C ...) so machine noise hits them alike.

Interrupts stop the whole run: Ctrl-C (SIGINT) or SIGTERM in the benchmark process stops the
configuration process that is running, and every process it started, before the benchmark
exits (:func:`run_in_fresh_process`). A configuration process ignores SIGINT (the benchmark
process decides) and turns its first SIGTERM into ``SystemExit``, so its ``with`` blocks close
what they opened (an ``AsyncRunner``'s collectors and shared memory).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import platform
import resource
import shutil
import signal
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from importlib import metadata
from multiprocessing.connection import Connection, wait
from typing import Any

import psutil
from tqdm import tqdm

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
#: The docs site serves only docs/: the committed figures it shows are copied into docs/assets.
DOCS_ASSETS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "assets")
#: Figures of the committed results shown on the docs site: path under RESULTS_DIR -> file name in DOCS_ASSETS.
#: ``tests/tools/test_docs.py`` checks that each copy equals its source and that a docs page shows it.
DOCS_FIGURES = {
    "compare_sb3.png": "compare_sb3.png",
    "sac_async/sac_async.png": "sac_async.png",
    "learning_check.png": "learning_check.png",
    "learning_curves.png": "learning_curves.png",  # the first learning check's curves (no longer written)
    "robustness/heatmap.png": "robustness_heatmap.png",  # unilab-gym robustness --out benchmarks/results/robustness
}


def publish_figure(path: str, results_dir: str = RESULTS_DIR, assets_dir: str = DOCS_ASSETS) -> str | None:
    """Copy ``path`` into ``assets_dir`` if it is one of :data:`DOCS_FIGURES` under ``results_dir``.

    A benchmark calls this after writing a figure, so that a rerun into the committed results
    (``--out benchmarks/results``) also updates the docs site's copy; a run elsewhere (the default
    ``runs/...`` folders) copies nothing.

    Returns:
        The path of the copy, or ``None`` (not a published figure).
    """
    relative = os.path.relpath(os.path.abspath(path), os.path.abspath(results_dir)).replace(os.sep, "/")
    name = DOCS_FIGURES.get(relative)
    if name is None:
        return None
    os.makedirs(assets_dir, exist_ok=True)
    target = os.path.join(assets_dir, name)
    shutil.copyfile(path, target)
    return target


def tree_rss_mb() -> float:
    """Current RSS in MB of this process plus all its descendants."""
    me = psutil.Process()
    total = me.memory_info().rss
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            total += child.memory_info().rss
    return total / 2**20


def peak_rss_mb() -> float:
    """Peak RSS in MB of this process (``ru_maxrss``, Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


#: Seconds a configuration process gets to close what it opened after SIGTERM, before SIGKILL.
STOP_GRACE_S = 10.0


def exit_on_sigterm() -> None:
    """Turn SIGTERM into ``SystemExit(143)`` (128 + 15, the shell's code), so ``finally`` and ``with`` blocks run.

    Only the first SIGTERM raises: later ones are ignored, so they cannot cut the clean-up short.
    """

    def handler(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


def _child_main(conn: Connection, fn: Callable[..., dict[str, float]], kwargs: dict[str, Any]) -> None:
    """A configuration process: run ``fn(**kwargs)`` and send ``("ok", result)`` or ``("error", traceback)``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the benchmark process's to handle
    exit_on_sigterm()
    try:
        result = fn(**kwargs)
    except BaseException as exc:
        with contextlib.suppress(Exception):
            conn.send(("error", traceback.format_exc()))
        if isinstance(exc, Exception):
            sys.exit(1)  # the benchmark process prints the traceback
        raise
    conn.send(("ok", result))


def stop_process_tree(proc: Any, grace_s: float = STOP_GRACE_S) -> None:
    """Stop ``proc`` (a ``multiprocessing`` child) and every process under it; return when all are gone.

    SIGTERM first (the configuration closes what it opened), SIGKILL for whatever is left after
    ``grace_s`` seconds. SIGINT and SIGTERM to this process are ignored meanwhile, so a second
    Ctrl-C cannot leave orphans behind.
    """
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            procs = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            procs = []
        proc.terminate()
        proc.join(grace_s)
        if proc.is_alive():
            with contextlib.suppress(psutil.NoSuchProcess):
                procs += psutil.Process(proc.pid).children(recursive=True)
            proc.kill()
            proc.join()
        _, alive = psutil.wait_procs(procs, timeout=grace_s)
        for p in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        psutil.wait_procs(alive, timeout=grace_s)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_in_fresh_process(
    fn: Callable[..., dict[str, float]], kwargs: dict[str, Any], label: str = ""
) -> dict[str, float]:
    """``fn(**kwargs)`` in a fresh spawned process; return its result.

    An exception here (Ctrl-C's ``KeyboardInterrupt``, SIGTERM's ``SystemExit`` after
    :func:`exit_on_sigterm`) stops the process and everything it started
    (:func:`stop_process_tree`), then propagates: the run stops.

    Args:
        fn: a module-level function (it is pickled by reference) returning a dict of metrics.
        kwargs: its keyword arguments (picklable).
        label: printed with the process id when the process starts.

    Raises:
        RuntimeError: ``fn`` raised in its process (the message holds its traceback), or the
            process died without a result (the message gives its exit code).
    """
    ctx = mp.get_context("spawn")
    receiver, sender = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child_main, args=(sender, fn, kwargs), name=f"benchmark: {label}")
    try:
        ignored = signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited: the child starts up ignoring Ctrl-C
        try:
            proc.start()
        finally:
            signal.signal(signal.SIGINT, ignored)
        sender.close()
        tqdm.write(f"  {label} (pid {proc.pid})", file=sys.stdout)
        sys.stdout.flush()
        wait([receiver, proc.sentinel])
        if not receiver.poll():
            proc.join()
            raise RuntimeError(f"{label}: its process exited with code {proc.exitcode} without a result")
        status, payload = receiver.recv()
        proc.join()
    except BaseException:
        if proc.pid is not None:
            stop_process_tree(proc)
        raise
    finally:
        receiver.close()
    if status != "ok":
        raise RuntimeError(f"{label} failed in its process:\n{payload}")
    return payload


def run_interleaved(
    configs: dict[str, tuple[Callable[..., dict[str, float]], dict[str, Any]]],
    repeats: int,
    desc: str = "benchmark",
    fresh_process: bool = True,
    on_result: Callable[[str, dict[str, Any]], None] | None = None,
) -> dict[str, list[dict[str, float]]]:
    """Run every config ``repeats`` times, interleaved, each run in a fresh spawned process.

    Args:
        configs: name -> (module-level function, kwargs); the function returns a dict of metrics.
        repeats: runs per config.
        fresh_process: ``False`` runs in this process (smoke tests: no start-up cost, but RSS
            figures are then not per configuration).
        on_result: called with (name, metrics) after each run, e.g. to save partial results of a long benchmark.

    Returns:
        name -> list of per-repeat metric dicts (a failed run raises).

    Raises:
        RuntimeError: a run failed. ``KeyboardInterrupt`` / ``SystemExit``: the run was
            interrupted; the configuration process and its children are gone
            (:func:`run_in_fresh_process`).
    """
    out: dict[str, list[dict[str, float]]] = {name: [] for name in configs}
    order = [name for _ in range(repeats) for name in configs]
    with tqdm(total=len(order), desc=desc, unit="run") as bar:
        for i, name in enumerate(order):
            bar.set_postfix_str(name)
            fn, kwargs = configs[name]
            if fresh_process:
                label = f"{desc}: {name}, repeat {i // len(configs) + 1}/{repeats}"
                out[name].append(run_in_fresh_process(fn, kwargs, label))
            else:
                out[name].append(fn(**kwargs))
            if on_result is not None:
                on_result(name, out[name][-1])
            bar.update()
    return out


def summarize(runs: list[dict[str, float]], key: str) -> tuple[float, float, float]:
    """(median, min, max) of metric ``key`` over repeats."""
    values = [r[key] for r in runs]
    return statistics.median(values), min(values), max(values)


def machine_info() -> dict[str, Any]:
    """CPU model, cores, RAM and the versions of the packages that matter here.

    ``cpu_family`` / ``cpu_model`` (``/proc/cpuinfo``) tell CPU generations apart where the model name does
    not (a virtual machine may report only "AMD EPYC": family 25 is Zen 3/4, 26 is Zen 5; absolute
    env-steps/s differ between them, so compare figures from one run); ``avx512`` whether the CPU has
    AVX-512F (numpy and torch dispatch on it).
    """
    cpu = platform.processor()
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor's block is enough
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
        cpu = fields.get("model name", cpu)
    except OSError:
        pass
    versions: dict[str, str | None] = {}
    for pkg in ("unilab-gym", "numpy", "gymnasium", "pybullet", "stable-baselines3", "torch", "tianshou"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    return {
        "cpu": cpu,
        "cpu_family": fields.get("cpu family"),
        "cpu_model": fields.get("model"),
        "avx512": "avx512f" in fields.get("flags", "").split() if fields else None,
        "cores": psutil.cpu_count(logical=True),
        "ram_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "versions": versions,
    }


def write_json(path: str, payload: dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(payload, f, indent=2)


def cpu_jiffies() -> tuple[int, int]:
    """(total, idle) CPU time of the machine in jiffies, from the first line of ``/proc/stat`` (Linux)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:9]]
    return sum(fields), fields[3] + fields[4]  # idle + iowait


def busy_cores(seconds: float = 1.0) -> float | None:
    """Cores busy on the whole machine (every process), averaged over the next ``seconds``.

    Returns:
        Busy cores in ``[0, cores]``, or ``None`` where ``/proc/stat`` does not exist (not Linux).
    """
    try:
        total0, idle0 = cpu_jiffies()
        time.sleep(seconds)
        total1, idle1 = cpu_jiffies()
    except OSError:
        return None
    return (os.cpu_count() or 1) * (1 - (idle1 - idle0) / max(total1 - total0, 1))


def warn_if_busy(max_busy_cores: float = 0.25, seconds: float = 2.0) -> dict[str, Any]:
    """Measure how busy the machine is before a benchmark starts; print a warning to stderr if it is.

    Call it before the benchmark starts anything: every busy core then belongs to another
    process, and takes CPU time the configurations under test would use (the multi-process ones
    most). Busy means more than ``max_busy_cores`` busy cores over the next ``seconds``, or a
    1-minute load average above half the cores.

    Returns:
        ``{"busy_cores": float | None, "load_average": [1, 5, 15 min] | None, "busy": bool}``,
        to store with the results.
    """
    busy = busy_cores(seconds)
    load = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    cores = os.cpu_count() or 1
    is_busy = (busy is not None and busy > max_busy_cores) or (load is not None and load[0] > cores / 2)
    if is_busy:
        used = f"other processes use {busy:.1f} of {cores} cores" if busy is not None else f"{cores} cores"
        avg = f"load average {', '.join(f'{x:.1f}' for x in load)}" if load is not None else "no load average"
        print(
            f"WARNING: the machine is busy ({used}; {avg}): wall-clock results will be slower and noisier "
            "than on an idle machine, and multi-process configurations lose the most",
            file=sys.stderr,
            flush=True,
        )
    return {"busy_cores": busy, "load_average": load, "busy": is_busy}


def cpu_quota_cores() -> float | None:
    """Cores the cgroup (v2 ``cpu.max``, as docker ``--cpus`` sets) allows this process, or ``None`` if unlimited."""
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
    except (OSError, ValueError):
        return None
    return None if quota == "max" else int(quota) / int(period)


def sample_load(seconds: float = 1.0) -> dict[str, Any]:
    """How much CPU this machine has free now: call it when none of the benchmark's own processes run.

    Args:
        seconds: the busy cores are averaged over this long (``/proc/stat``).

    Returns:
        ``{"time": ISO 8601 UTC, "load_average": [1, 5, 15 min] | None, "cores": cores this process
        may use (affinity, cgroup quota), "busy_cores": cores busy with other processes | None,
        "available_cores": cores - busy_cores | None}``.
    """
    cores = float(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    quota = cpu_quota_cores()
    if quota is not None:
        cores = min(cores, quota)
    busy = busy_cores(seconds)
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "cores": cores,
        "busy_cores": busy,
        "available_cores": None if busy is None else max(0.0, cores - busy),
    }


def busy_warning(start: dict[str, Any], end: dict[str, Any], max_busy_cores: float = 0.25) -> str | None:
    """A warning if the machine was busy at the start or the end of a run (:func:`sample_load` figures), else ``None``.

    Busy: other processes used more than ``max_busy_cores`` cores at the start or at the end, or
    the 1-minute load average at the start was above half the cores (at the end it counts the
    run's own processes, so it is only reported).
    """
    cores = start["cores"]
    busy = [s["busy_cores"] for s in (start, end) if s["busy_cores"] is not None]
    load = start["load_average"]
    if not any(b > max_busy_cores for b in busy) and not (load is not None and load[0] > cores / 2):
        return None

    def describe(s: dict[str, Any]) -> str:
        used = "?" if s["busy_cores"] is None else f"{s['busy_cores']:.1f}"
        avg = "?" if s["load_average"] is None else f"{s['load_average'][0]:.1f}"
        return f"other processes used {used} of {s['cores']:g} cores, load average {avg}"

    return (
        f"WARNING: the machine was busy (start: {describe(start)}; end: {describe(end)}): wall-clock figures "
        "are slower and noisier than on an idle machine, and multi-process configurations (AsyncRunner, "
        "SubprocVecEnv) lose the most: they need free cores"
    )


#: The fields that name one entry of a per-task results file (``tasks.json``, ``bench_tasks.json``).
TASK_KEY = ("task", "robot")


def read_task_results(path: str) -> dict[str, Any]:
    """The per-task results file at ``path``: ``{"tasks": [entry, ...], ...}``; an empty one if there is no file.

    JSON only (nothing is unpickled). Each entry is a dict with (at least) the :data:`TASK_KEY` fields.

    Raises:
        ValueError: ``path`` exists but is not JSON, or has no ``"tasks"`` list of entries with ``task`` and
            ``robot`` (the message names the path; the file is left as it is).
    """
    if not os.path.exists(path):
        return {"tasks": []}
    try:
        with open(path) as f:
            payload = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a per-task results file (JSON with a 'tasks' list): {e}") from None
    entries = payload.get("tasks") if isinstance(payload, dict) else None
    if not isinstance(entries, list) or not all(isinstance(e, dict) and set(TASK_KEY) <= set(e) for e in entries):
        raise ValueError(
            f"{path}: not a per-task results file: need a top-level 'tasks' list of objects with keys {list(TASK_KEY)}"
        )
    return payload


def merge_task_results(path: str, entries: list[dict[str, Any]], **top_level: Any) -> dict[str, Any]:
    """Merge ``entries`` into the per-task results file at ``path`` and write it; return what was written.

    An entry replaces the file's entry with the same (``task``, ``robot``) (:data:`TASK_KEY`); the others stay
    as they are. Entries are sorted by (task, robot). ``top_level`` items (e.g. ``machine``, ``load``, ``date``
    of this run) replace the file's top-level items of the same name; a dict under ``details`` is merged key by
    key instead (per-entry details, keyed by :func:`task_label`).

    Raises:
        ValueError: an entry lacks ``task`` or ``robot``, or the existing file is not a per-task results file
            (:func:`read_task_results`); nothing is written then.
    """
    for entry in entries:
        missing = [k for k in TASK_KEY if k not in entry]
        if missing:
            raise ValueError(f"entry {entry!r} lacks {missing}")
    payload = read_task_results(path)
    new = {tuple(e[k] for k in TASK_KEY): e for e in entries}
    kept = [e for e in payload["tasks"] if tuple(e[k] for k in TASK_KEY) not in new]
    merged = sorted([*kept, *new.values()], key=lambda e: tuple(str(e[k]) for k in TASK_KEY))
    details = {**payload.get("details", {}), **top_level.pop("details", {})}
    payload = {**payload, **top_level, "tasks": merged}
    if details:
        payload["details"] = details
    write_json(path, payload)
    return payload


def task_label(task: str, robot: str) -> str:
    """``"UniLab/Quadruped-v0 (aliengo)"``: the key of one (task, robot) in a results file's ``details``."""
    return f"{task} ({robot})"


def unilab_ids() -> list[str]:
    """The registered ``UniLab/*`` Gymnasium ids, sorted (``import unilab_gym`` registers them)."""
    import gymnasium as gym

    import unilab_gym  # noqa: F401

    return sorted(i for i in gym.registry if i.startswith("UniLab/"))


def probe_task(task: str, robot: str | None = None) -> tuple[str, dict[str, Any]]:
    """Check ``--task`` / ``--robot`` at the boundary by building one env; return (robot name, env kwargs).

    Args:
        task: a registered ``UniLab/*`` id (:func:`unilab_ids`).
        robot: a robot name the task takes (``robot=``), or ``None`` for the task's default.

    Returns:
        The name of the robot the env holds (e.g. ``"a1"`` for the quadruped's default), and the env kwargs to
        pass on (``{"robot": robot}`` or ``{}``).

    Raises:
        ValueError: ``task`` is not a registered ``UniLab/*`` id, or the env refused ``robot`` (the message
            names ``--task`` or ``--robot`` and the value).
    """
    import gymnasium as gym

    ids = unilab_ids()
    if task not in ids:
        raise ValueError(f"--task: {task!r} is not a registered UniLab id; registered: {ids}")
    env_kwargs: dict[str, Any] = {} if robot is None else {"robot": robot}
    try:
        env = gym.make_vec(task, num_envs=1, **env_kwargs)
    except (ValueError, TypeError, KeyError) as e:
        where = f"--task {task!r}" if robot is None else f"--robot {robot!r} for {task}"
        raise ValueError(f"{where}: {e}") from None
    try:
        name = str(env.unwrapped.robot.name)  # type: ignore[attr-defined]  # a UniLabVectorEnv
    finally:
        env.close()
    return name, env_kwargs
