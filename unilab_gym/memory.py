"""The memory a :class:`~unilab_gym.vector_env.UniLabVectorEnv` needs, estimated before it is built.

``UniLabVectorEnv(num_envs=10**6)`` would otherwise allocate pybullet worlds until ``malloc`` fails
inside pybullet, which then crashes the process (a segfault, no Python exception). The env
checks :func:`estimate_env_bytes` against :func:`available_bytes` first and raises ``MemoryError``.

The two constants are measured: RSS (``psutil``) of a fresh process after ``UniLabVectorEnv(n,
envs_per_cluster=c)``, ``reset`` and 60 steps, minus its RSS before (pybullet 3.2.7, Python 3.11,
Linux x86-64, issue 19). For (n, c) = (64, 64), (256, 256), (16, 1), (64, 4), (256, 32) it added
62.9, 148.4, 635.5, 656.0 and 421.3 MB; the least-squares fit of ``worlds * W + n * R`` gives
W = 39.3 MB per world and R = 0.42 MB per robot (residuals under 3.4 MB). So at the default 32 robots
per world a robot costs ~1.7 MB, and ``num_envs=10**6`` would need ~1.7 TB.
"""

from __future__ import annotations

import resource
from pathlib import Path

import psutil

from unilab_gym.trace import RECORD_BYTES

#: Resident memory of one pybullet world (``ClusterWorld``: a DIRECT client and its ground plane), bytes.
#: Measured (see the module docstring): 39.3 MB, rounded up.
BYTES_PER_WORLD = 40_000_000
#: Resident memory per robot, bytes: its bodies in pybullet plus the env's per-env numpy arrays (states,
#: observations, gains, episode bookkeeping). Measured: 0.42 MB, rounded up.
BYTES_PER_ROBOT = 450_000
#: Bytes per env and step of latency in the latency ring (12 float64 actions).
_LATENCY_BYTES_PER_STEP = 12 * 8


def estimate_env_bytes(num_envs: int, envs_per_cluster: int, max_latency: int = 0, trace_max_records: int = 0) -> int:
    """Estimated resident memory, in bytes, that ``UniLabVectorEnv(num_envs, envs_per_cluster=...)`` adds.

    ``ceil(num_envs / envs_per_cluster) * BYTES_PER_WORLD + num_envs * BYTES_PER_ROBOT`` plus the latency ring
    (``num_envs * (max_latency + 1) * 96``) and a full parameter trace (``trace_max_records * RECORD_BYTES``).

    Args:
        num_envs: robots, >= 1.
        envs_per_cluster: robots per pybullet world, >= 1.
        max_latency: the largest ``latency`` of the domain randomization, control steps.
        trace_max_records: records of the parameter trace kept in memory.

    Returns:
        Bytes (int).
    """
    worlds = -(-num_envs // envs_per_cluster)
    latency = num_envs * (max_latency + 1) * _LATENCY_BYTES_PER_STEP if max_latency > 0 else 0
    return worlds * BYTES_PER_WORLD + num_envs * BYTES_PER_ROBOT + latency + trace_max_records * RECORD_BYTES


def available_bytes() -> int:
    """Memory this process can still get, in bytes: the least of the system's available memory
    (``psutil.virtual_memory().available``), the headroom under a cgroup (container) memory limit, and
    the headroom under ``RLIMIT_AS`` (``ulimit -v``)."""
    out = psutil.virtual_memory().available
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),  # cgroup v2
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),  # v1
    ):
        try:
            limit, usage = Path(limit_file).read_text().strip(), Path(usage_file).read_text().strip()
        except OSError:
            continue
        if limit.isdigit() and usage.isdigit():
            out = min(out, max(0, int(limit) - int(usage)))
        break
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        out = min(out, max(0, soft - psutil.Process().memory_info().vms))
    return out


def check_memory(num_envs: int, envs_per_cluster: int, max_latency: int = 0, trace_max_records: int = 0) -> None:
    """Raise ``MemoryError`` if :func:`estimate_env_bytes` of these arguments exceeds :func:`available_bytes`.

    Raises:
        MemoryError: naming the estimate, the available memory and the fix.
    """
    need = estimate_env_bytes(num_envs, envs_per_cluster, max_latency, trace_max_records)
    available = available_bytes()
    if need > available:
        raise MemoryError(
            f"UniLabVectorEnv(num_envs={num_envs}, envs_per_cluster={envs_per_cluster}) needs an estimated "
            f"{need / 2**30:.2f} GiB ({need} bytes: {BYTES_PER_WORLD / 1e6:.0f} MB per pybullet world, "
            f"{BYTES_PER_ROBOT / 1e6:.2f} MB per robot), but only {available / 2**30:.2f} GiB is available; "
            "use fewer envs (or more per cluster), or free memory"
        )
