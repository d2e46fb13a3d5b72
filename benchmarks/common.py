"""Shared benchmark machinery: interleaved repeats in fresh processes, medians, ratios, machine info.

Every configuration runs in a fresh spawned process (so peak RSS is its own), and the
configurations are interleaved (A B C A B C ...) so machine noise hits them alike.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import platform
import resource
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from importlib import metadata
from typing import Any

import psutil
from tqdm import tqdm

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


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


def _run_one(fn: Callable[..., dict[str, float]], kwargs: dict[str, Any]) -> dict[str, float]:
    return fn(**kwargs)


def run_interleaved(
    configs: dict[str, tuple[Callable[..., dict[str, float]], dict[str, Any]]],
    repeats: int,
    desc: str = "benchmark",
    fresh_process: bool = True,
) -> dict[str, list[dict[str, float]]]:
    """Run every config ``repeats`` times, interleaved, each run in a fresh spawned process.

    Args:
        configs: name -> (module-level function, kwargs); the function returns a dict of metrics.
        repeats: runs per config.
        fresh_process: ``False`` runs in this process (smoke tests: no start-up cost, but RSS
            figures are then not per configuration).

    Returns:
        name -> list of per-repeat metric dicts (a failed run raises).
    """
    ctx = mp.get_context("spawn")
    out: dict[str, list[dict[str, float]]] = {name: [] for name in configs}
    order = [name for _ in range(repeats) for name in configs]
    with tqdm(total=len(order), desc=desc, unit="run") as bar:
        for name in order:
            bar.set_postfix_str(name)
            fn, kwargs = configs[name]
            if not fresh_process:
                out[name].append(fn(**kwargs))
                bar.update()
                continue
            with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
                out[name].append(pool.submit(_run_one, fn, kwargs).result())
            bar.update()
    return out


def summarize(runs: list[dict[str, float]], key: str) -> tuple[float, float, float]:
    """(median, min, max) of metric ``key`` over repeats."""
    values = [r[key] for r in runs]
    return statistics.median(values), min(values), max(values)


def machine_info() -> dict[str, Any]:
    """CPU model, cores, RAM and the versions of the packages that matter here."""
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    versions: dict[str, str | None] = {}
    for pkg in ("unilab-gym", "numpy", "gymnasium", "pybullet", "stable-baselines3", "torch", "tianshou"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    return {
        "cpu": cpu,
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
