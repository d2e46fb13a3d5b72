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

The other tasks cost differently per env (issue 27; the same measure, (n, c) = (64, 64), (16, 1), (64, 4),
2026-12-02, a busy 2-core machine): the rough-terrain quadruped keeps a heightfield tile per robot (1292.8, 870.0,
1546.5 MB: ~14 MB per robot in small worlds, ~20 MB in a world of 64: 20 MB is used); the Panda arms 134-136,
766-767, 829-830 MB (46.6 MB per world, 1.3 MB per arm); the quadrotor 40.2, 579.4, 580.6 MB (36 MB per world,
0.04 MB per quadrotor). :data:`TASK_BYTES` holds them, rounded up; :func:`task_bytes` finds a task's, and a
user's task may declare its own as a class attribute ``memory_bytes = (bytes_per_world, bytes_per_env)``.
"""

from __future__ import annotations

import resource
from pathlib import Path
from typing import Any

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

#: Measured (bytes per world, bytes per env) of the shipped tasks, by ``"module:class"`` of the task (see the
#: module docstring); a subclass gets its nearest base class's figures, a task not listed the quadruped's.
TASK_BYTES: dict[str, tuple[int, int]] = {
    "unilab_gym.tasks.quadruped:QuadrupedTask": (BYTES_PER_WORLD, BYTES_PER_ROBOT),
    "unilab_gym.tasks.rough:RoughTask": (BYTES_PER_WORLD, 20_000_000),
    "unilab_gym.tasks.panda:_PandaTask": (48_000_000, 1_500_000),
    "unilab_gym.tasks.quadrotor:QuadrotorTask": (BYTES_PER_WORLD, 100_000),
}


def task_bytes(task_type: Any = None) -> tuple[int, int]:
    """``(bytes per world, bytes per env)`` of a task class (a :class:`~unilab_gym.tasks.base.Task` subclass).

    The class's own ``memory_bytes`` attribute if it has one (a pair of ints > 0), else :data:`TASK_BYTES` of the
    nearest class in its MRO, else (and for ``None``) the quadruped's :data:`BYTES_PER_WORLD`, :data:`BYTES_PER_ROBOT`.

    Raises:
        ValueError: a ``memory_bytes`` that is not two ints > 0 (naming the class).
    """
    if task_type is None:
        return BYTES_PER_WORLD, BYTES_PER_ROBOT
    own = getattr(task_type, "memory_bytes", None)
    if own is not None:
        ok = isinstance(own, tuple) and len(own) == 2
        ok = ok and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in own)
        if not ok:
            raise ValueError(
                f"{task_type.__name__}.memory_bytes must be (bytes_per_world, bytes_per_env), two ints > 0, got {own!r}"
            )
        return own[0], own[1]
    for cls in getattr(task_type, "__mro__", ()):
        found = TASK_BYTES.get(f"{cls.__module__}:{cls.__qualname__}")
        if found is not None:
            return found
    return BYTES_PER_WORLD, BYTES_PER_ROBOT


def estimate_env_bytes(
    num_envs: int, envs_per_cluster: int, max_latency: int = 0, trace_max_records: int = 0, *, task_type: Any = None
) -> int:
    """Estimated resident memory, in bytes, that ``UniLabVectorEnv(num_envs, envs_per_cluster=...)`` adds.

    ``ceil(num_envs / envs_per_cluster) * W + num_envs * R`` (``W, R``: :func:`task_bytes` of ``task_type``; the
    quadruped's :data:`BYTES_PER_WORLD` and :data:`BYTES_PER_ROBOT` by default) plus the latency ring
    (``num_envs * (max_latency + 1) * 96``) and a full parameter trace (``trace_max_records * RECORD_BYTES``).

    Args:
        num_envs: robots, >= 1.
        envs_per_cluster: robots per pybullet world, >= 1.
        max_latency: the largest ``latency`` of the domain randomization, control steps.
        trace_max_records: records of the parameter trace kept in memory.
        task_type: the env's task class (``UniLabVectorEnv.task_type``), or ``None`` for the quadruped.

    Returns:
        Bytes (int).
    """
    per_world, per_env = task_bytes(task_type)
    worlds = -(-num_envs // envs_per_cluster)
    latency = num_envs * (max_latency + 1) * _LATENCY_BYTES_PER_STEP if max_latency > 0 else 0
    return worlds * per_world + num_envs * per_env + latency + trace_max_records * RECORD_BYTES


def available_bytes() -> int:
    """Memory this process can still get, in bytes.

    The least of the system's available memory (``psutil.virtual_memory().available``), the headroom under a cgroup
    (container) memory limit, and the headroom under ``RLIMIT_AS`` (``ulimit -v``).
    """
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


def check_memory(
    num_envs: int,
    envs_per_cluster: int,
    max_latency: int = 0,
    trace_max_records: int = 0,
    *,
    task_type: Any = None,
    env_name: str = "UniLabVectorEnv",
) -> None:
    """Raise ``MemoryError`` if :func:`estimate_env_bytes` of these arguments exceeds :func:`available_bytes`.

    Args:
        num_envs: as :func:`estimate_env_bytes`.
        envs_per_cluster: as :func:`estimate_env_bytes`.
        max_latency: as :func:`estimate_env_bytes`.
        trace_max_records: as :func:`estimate_env_bytes`.
        task_type: as :func:`estimate_env_bytes`.
        env_name: the env class the message names (e.g. ``type(env).__name__``).

    Raises:
        MemoryError: naming the env, its task, the estimate, the available memory and the fix.
    """
    need = estimate_env_bytes(num_envs, envs_per_cluster, max_latency, trace_max_records, task_type=task_type)
    available = available_bytes()
    if need > available:
        per_world, per_env = task_bytes(task_type)
        task = f" of task {task_type.__name__}" if task_type is not None else ""
        raise MemoryError(
            f"{env_name}(num_envs={num_envs}, envs_per_cluster={envs_per_cluster}){task} needs an estimated "
            f"{need / 2**30:.2f} GiB ({need} bytes: {per_world / 1e6:.0f} MB per pybullet world, "
            f"{per_env / 1e6:.2f} MB per env), but only {available / 2**30:.2f} GiB is available; "
            "use fewer envs (or more per cluster), or free memory"
        )
