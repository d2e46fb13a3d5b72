"""The seam between the learner loops and the collectors: the :class:`CollectorPool` interface.

Who owns what in :mod:`unilab_gym.runtime`::

    runner.py       AsyncRunner: checks the arguments, picks the family's loop, builds the pool
                    and the metrics, hands the pool to the loop; learn() / close() plumbing
    loop.py         LearnerLoop: what both loops share (publish weights, poll, wait, episodes)
    off_policy.py   OffPolicyLoop (learner side) + ReplayWriter (collector side)  SAC, TD3, DDPG
    on_policy.py    OnPolicyLoop (learner side) + RolloutWriter (collector side)  PPO, A2C
    pool.py         this seam: CollectorPool, CollectorSetup, Counters, CollectorStatus
    process_pool.py ProcessCollectorPool, the first implementation: spawned processes
    inline_pool.py  InlineCollectorPool: the collectors stepped in the learner's process, in turns (debugging)
    collector.py    the collector side of the process pool (Collector, collector_main)
    counters.py     the counter table: learner signals, collectors' counters and metrics (numpy or shared memory)
    weights.py      the weight vector format and SharedWeights (versioned, in shared memory)
    rollout.py      RolloutStorage, the shared rollout slots of the on-policy family
    metrics.py      RunnerMetrics (reads the counters through the pool), the Prometheus server
    http_server.py  BoundedHTTPServer, the metrics server's HTTP (one thread, bounded connections)
    errors.py       CollectorError, what poll() raises for a collector fault

The loops talk to collectors only through :class:`CollectorPool`: :meth:`~CollectorPool.start`,
:meth:`~CollectorPool.poll` (faults, :class:`Reports` such as finished episodes), :meth:`~CollectorPool.wait`,
:meth:`~CollectorPool.publish_weights` (one flat float32 vector per version),
:attr:`~CollectorPool.counters`, and the learner signals (transition budget, ``learning_starts``,
granted rollouts). What a collector *does* with its env is the family's *writer*, a picklable
object the pool ships to each collector and runs there (:class:`~unilab_gym.runtime.collector.Writer`).

A second backend (e.g. Ray actors) implements the same class: it keeps a learner-side
:class:`Counters` table that it updates from what collectors report, ingests the batches or
rollout blocks they ship in :meth:`~CollectorPool.poll` into the same replay / rollout storage
(whose handles the writers carry), and ships the weight vector it is given, which may carry
more than the policy's parameters (e.g. observation-normalization statistics) under the same
version. Hyperparameters stay with the loops, which apply them between iterations; the pool
owns none.
"""

from __future__ import annotations

import copy
import io
import time
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from unilab_gym.runtime.collector import CollectorSpec
from unilab_gym.runtime.counters import (
    BUDGET,
    GRANTED,
    LEARNING_STARTS,
    PROGRESS_NS,
    READY,
    TRANSITIONS,
    VERSION,
    CounterTable,
)
from unilab_gym.runtime.errors import CollectorError

if TYPE_CHECKING:
    import torch
    from gymnasium.vector import VectorEnv

    from unilab_gym.runtime.collector import Writer
    from unilab_gym.runtime.normalization import Moments

#: Least time a collector still starting (spawn or scheduling, imports, building its env) gets before it counts
#: as hung, in s (``collector_timeout_s`` if larger): start-up took up to ~10 s on a loaded 2-core machine.
START_TIMEOUT_S = 60.0


class Counters(Protocol):
    """The collectors' counters as the learner reads them (a :class:`~unilab_gym.runtime.counters.CounterTable`).

    :ivar num_collectors: rows of the table.
    :ivar rows: int64 ``(num_collectors, ...)``: collector ``c``'s counters, fields as in
        :mod:`unilab_gym.runtime.counters` (``TRANSITIONS``, ``VERSION``, ``TERMINATED``,
        ``TRUNCATED``, ``STEP_CALLS``, ``ROLLOUTS``, ``READY``, and the heartbeat ``PROGRESS``,
        ``PROGRESS_NS``: loop iterations and the ``time.monotonic_ns()`` of the last one).
    :ivar metrics: float64 ``(num_collectors, ...)``: collector ``c``'s latency histograms
        (``STEP_LATENCY``, ``WEIGHT_SYNC_LATENCY`` of :mod:`unilab_gym.runtime.counters`).
    """

    num_collectors: int
    rows: np.ndarray
    metrics: np.ndarray

    def total_transitions(self) -> int:
        """Transitions written by all collectors together."""
        ...


@dataclass
class Reports:
    """What the collectors reported since the last :meth:`CollectorPool.poll`.

    A dataclass, so that a later kind of report (e.g. observation statistics) is one more field
    and loops that do not use it stay as they are.

    :ivar episode_returns: returns of the episodes that finished, in the order reported.
    :ivar episode_lengths: their lengths.
    :ivar moments: with ``VecNormalize``: one (observation, return) pair of
        :class:`~unilab_gym.runtime.normalization.Moments` per report, to merge into the learner's statistics.
    """

    episode_returns: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)
    moments: list[tuple[Moments, Moments]] = field(default_factory=list)


@dataclass(frozen=True)
class CollectorStatus:
    """One collector as :meth:`CollectorPool.status` reports it.

    :ivar index: its index (env ``j`` of it is env ``index * envs_per_collector + j`` of the run).
    :ivar node_id: where it runs (the host name for processes).
    :ivar pid: its process id (``None`` before it started).
    :ivar env_steps: transitions it wrote.
    :ivar weight_version: the weight version it acts with (0: none loaded yet).
    :ivar restarts: how many times it was replaced after a fault.
    """

    index: int
    node_id: str
    pid: int | None
    env_steps: int
    weight_version: int
    restarts: int


@dataclass(frozen=True)
class CollectorSetup:
    """What any pool needs to make its collectors.

    Collector ``c`` makes its env with ``gym.make_vec(env_id, num_envs=envs_per_collector,
    **env_kwargs)`` or ``env_fn(envs_per_collector)``, resets it with seed
    ``seed + c * envs_per_collector`` (env ``j`` of all collectors gets ``seed + j``), seeds
    torch and numpy with ``seed + c``, loads a CPU copy of ``policy`` and runs ``writers[c]``.
    Its ``k``-th replacement shifts both seeds by ``k * num_collectors`` collectors.

    :ivar num_collectors: collectors in the pool.
    :ivar envs_per_collector: envs of each collector.
    :ivar seed: base seed (above).
    :ivar policy: the torch module collectors run; copied when the pool starts, its weights then
        follow :meth:`CollectorPool.publish_weights`.
    :ivar weights_size: float32 values of one published weight vector.
    :ivar writers: the family's collector part for each collector (picklable).
    :ivar env_id: a registered gymnasium id, or ``None`` with ``env_fn``.
    :ivar env_fn: a picklable ``env_fn(num_envs) -> VectorEnv``, or ``None`` with ``env_id``.
    :ivar env_kwargs: keyword arguments for ``gym.make_vec``.
    :ivar max_restarts: faults the pool survives over its life by replacing the collector.
    :ivar collector_timeout_s: a collector whose heartbeat does not move for this many seconds
        (from its spawn while it starts) is hung: a fault, as if it had died.
    :ivar ingest_workers: learner-side workers that pull the collectors' answers and write them into
        the replay or rollout storage (``AsyncRunner(ingest_workers=...)``, checked there: >= 1, and
        > 1 only for the Ray pool, whose collectors ship their data; the process and inline pools'
        collectors write it themselves and ignore this).
    """

    num_collectors: int
    envs_per_collector: int
    seed: int
    policy: torch.nn.Module
    weights_size: int
    writers: tuple[Writer, ...]
    env_id: str | None = None
    env_fn: Callable[[int], VectorEnv] | None = None
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    max_restarts: int = 0
    collector_timeout_s: float = 60.0
    ingest_workers: int = 1

    def env_seed(self, index: int, restarts: int) -> int:
        """Env seed of collector ``index`` after ``restarts`` replacements."""
        return self.seed + (index + restarts * self.num_collectors) * self.envs_per_collector

    def collector_env_kwargs(self, index: int, restarts: int) -> dict[str, Any]:
        """``env_kwargs`` of collector ``index`` after ``restarts`` replacements.

        A ``trace_path`` (the env's parameter-trace file, which one env at a time may write) becomes
        one file per collector process: ``<stem>.collector<index><suffix>``, with ``.restart<restarts>``
        before the suffix for a replacement.
        """
        kwargs = dict(self.env_kwargs)
        if kwargs.get("trace_path") is not None:
            path = Path(kwargs["trace_path"])
            tag = f".collector{index}" + (f".restart{restarts}" if restarts else "")
            kwargs["trace_path"] = path.with_name(f"{path.stem}{tag}{path.suffix}")
        return kwargs

    def policy_bytes(self) -> bytes:
        """A CPU copy of :attr:`policy`, saved with ``torch.save``: what every collector loads (the pool ships it)."""
        import torch

        buffer = io.BytesIO()
        torch.save(copy.deepcopy(self.policy).to("cpu"), buffer)
        return buffer.getvalue()

    def torch_seed(self, index: int, restarts: int) -> int:
        """Torch / numpy seed of collector ``index`` after ``restarts`` replacements."""
        return self.seed + index + restarts * self.num_collectors

    def collector_spec(
        self, index: int, restarts: int, *, policy: tuple[str, int] = ("", 0), parent_pid: int = 0
    ) -> CollectorSpec:
        """The spec of collector ``index`` after ``restarts`` replacements.

        A :class:`~unilab_gym.runtime.collector.CollectorSpec`: its seeds, writer and env arguments as above;
        ``policy`` and ``parent_pid`` as the pool gives them (a process pool: its policy segment and its pid).
        """
        return CollectorSpec(
            index=index,
            num_envs=self.envs_per_collector,
            env_seed=self.env_seed(index, restarts),
            seed=self.torch_seed(index, restarts),
            policy=policy,
            writer=self.writers[index],
            env_id=self.env_id,
            env_fn=self.env_fn,
            env_kwargs=self.collector_env_kwargs(index, restarts),
            parent_pid=parent_pid,
        )


def check_env_count(n_envs: int, num_collectors: int, envs_per_collector: int, *, off_policy: bool) -> None:
    """Check that a model whose env has ``n_envs`` envs can be driven by ``num_collectors * envs_per_collector``.

    On-policy (PPO, A2C), a rollout is ``n_steps x n_envs`` transitions, so ``n_envs`` must equal
    the collectors' envs. Off-policy (SAC, TD3, DDPG), ``n_envs`` sets the default replay ratio
    (``gradient_steps / (train_freq * n_envs)``) and how often ``on_step`` is called (once per
    ``n_envs`` transitions): it must equal the collectors' envs, or be 1 (an env that only gives
    SB3 the spaces, e.g. ``make_sb3_env(env_id, 1)``; the default ratio is then per transition).

    Raises:
        ValueError: the counts do not match; the message names the three numbers and the fix.
    """
    total = num_collectors * envs_per_collector
    if n_envs == total or (off_policy and n_envs == 1):
        return
    counts = f"num_collectors * envs_per_collector = {num_collectors} * {envs_per_collector} = {total}"
    if off_policy:
        raise ValueError(
            f"the model's env has {n_envs} envs but the runner collects with {counts}; off-policy, the model's "
            "n_envs sets the default replay ratio (gradient_steps / (train_freq * n_envs)) and the on_step rate, "
            f"so build the model with an env of {total} envs, or of 1 env that only gives the spaces (e.g. "
            "make_sb3_env(env_id, 1)), or change the counts"
        )
    raise ValueError(
        f"the model's env has {n_envs} envs but the runner collects with {counts}; a rollout is n_steps x "
        f"n_envs transitions, so build the model with an env of {total} envs (e.g. make_sb3_env(env_id, "
        f"{total})) or change the counts"
    )


def check_env_source(env_id: Any, env_fn: Any, *, pickled: bool) -> None:
    """Check, in the learner before any collector starts, what collectors make their env from.

    ``env_id`` must be a registered Gymnasium id (``"module:Id-v0"`` imports ``module`` first, as
    ``gym.make`` does); ``env_fn`` must be callable and, if ``pickled`` (collectors spawned by
    ``multiprocessing``), picklable: defined at module level, not a lambda or a local function.
    Exactly one of them is given.

    Raises:
        ValueError: both or neither given, ``env_id`` not a non-empty ``str``, or ``env_fn`` not
            callable or not picklable (the message names the argument).
        gymnasium.error.Error: ``env_id`` is not registered, e.g. ``NameNotFound`` with Gymnasium's
            "Did you mean" on the first line of the message, after the ``env_id``.
        ModuleNotFoundError: the ``module`` of a ``"module:Id"`` does not import.
    """
    if (env_id is None) == (env_fn is None):
        raise ValueError("pass exactly one of env_id or env_fn")
    if env_id is not None:
        if not isinstance(env_id, str) or not env_id:
            raise ValueError(f"env_id must be a registered gymnasium id (a str), got {env_id!r}")
        import importlib

        import gymnasium as gym

        module, _, name = env_id.rpartition(":")
        if module:
            importlib.import_module(module)  # registers its ids, as gym.make does
        try:
            gym.spec(name)
        except gym.error.Error as error:  # NameNotFound, VersionNotFound, ...: keep the type, name the argument
            try:
                named = type(error)(f"env_id={env_id!r} is not registered: {error}")
            except Exception:  # an error type that takes other arguments: raise it as it is
                raise error from None
            raise named from None
        return
    if not callable(env_fn):
        raise ValueError(f"env_fn must be a callable env_fn(num_envs) -> VectorEnv, got {env_fn!r}")
    if pickled:
        import pickle

        try:
            pickle.dumps(env_fn)
        except Exception as error:
            raise ValueError(
                f"env_fn={env_fn!r} cannot be pickled ({type(error).__name__}: {error}); collectors are spawned "
                "processes that unpickle it: define it at module level (not a lambda or a local function), or "
                "wrap a module-level function in functools.partial"
            ) from None


class CollectorPool(ABC):
    """The collectors of one runner, as its learner loop sees them.

    Created with a :class:`CollectorSetup`; nothing runs until :meth:`start`. Every method is
    called from the learner's thread, except :attr:`counters`, :attr:`weight_version`,
    :attr:`faults` and :attr:`restarts`, which the metrics server also reads from its thread.

    What every pool shares lives here (RLlib's ``FaultTolerantActorManager`` pattern): the learner signals
    (written into :attr:`counters`), the fault and restart counts, :meth:`status`, hang detection
    (:meth:`hung_collectors`) and the supervision of faults (:meth:`_supervise`: count each, raise it when no
    restart is left, else replace the collector with a ``RuntimeWarning``). An implementation says how to
    start, stop and locate one collector (:meth:`_locations`, :meth:`_retire`, :meth:`_respawn`).

    Args:
        setup: what the collectors run.
    """

    setup: CollectorSetup
    #: whether collectors run while the learner trains (processes, actors). ``False`` (the inline pool):
    #: they run only inside :meth:`wait`, so no fault can arise during a ``train()`` call and the
    #: off-policy loop trains what is due in one call instead of ~50 ms chunks (no timing in the schedule).
    runs_concurrently: bool = True
    #: counter fields zeroed when a collector is replaced (it starts not ready and without weights).
    replaced_fields: tuple[int, ...] = (READY, VERSION)

    def __init__(self, setup: CollectorSetup):
        """Hold ``setup``, with no fault or restart yet; nothing runs (arguments: see the class docstring)."""
        self.setup = setup
        self._closed = True  # until the implementation is fully constructed
        self._restarts_of = [0] * setup.num_collectors  # per collector: how many times it was replaced
        self._faults = self._restarts = 0

    @property
    def num_collectors(self) -> int:
        """The number of collectors (``setup.num_collectors``)."""
        return self.setup.num_collectors

    # ------------------------------------------------------------------ lifecycle
    @abstractmethod
    def start(self) -> None:
        """Start the collectors (once; later calls do nothing)."""

    @abstractmethod
    def close(self) -> None:
        """Stop every collector and free what the pool holds. Idempotent."""

    # ------------------------------------------------------------------ weights
    @abstractmethod
    def publish_weights(self, weights: np.ndarray) -> int:
        """Publish ``weights`` ((setup.weights_size,) float32) as the next version; return that version.

        Collectors load the newest version before their next step; a collector started or
        restarted later loads it before its first.
        """

    @property
    @abstractmethod
    def weight_version(self) -> int:
        """Newest published version (0 before the first :meth:`publish_weights`)."""

    def policy_lag(self) -> int:
        """Published version minus the oldest version a collector acts with (0 if none acts yet).

        Collectors that have not loaded weights yet (starting, restarted: version 0) do not act, so
        they do not count; they load the newest version before their first step.
        """
        versions = self.counters.rows[:, VERSION]
        acting = versions[versions > 0]
        return max(0, self.weight_version - int(acting.min())) if acting.size else 0

    def seconds_since_progress(self) -> np.ndarray:
        """float64 ``(num_collectors,)``: seconds since each collector's last heartbeat (its spawn if none yet).

        0 for a collector never started.
        """
        beats = self.counters.rows[:, PROGRESS_NS]
        return np.where(beats > 0, (time.monotonic_ns() - beats) / 1e9, 0.0)

    # ------------------------------------------------------------------ learner signals
    def set_budget(self, transitions: int) -> None:
        """Off-policy backpressure: collectors write transitions while their total is below ``transitions``."""
        self.counters.globals[BUDGET] = transitions

    def set_learning_starts(self, transitions: int) -> None:
        """Off-policy: collectors act uniformly at random while their total is below ``transitions``."""
        self.counters.globals[LEARNING_STARTS] = transitions

    def grant_rollouts(self, count: int) -> None:
        """On-policy: collectors may collect rollouts ``0 .. count - 1`` (a grant never shrinks)."""
        self.counters.globals[GRANTED] = max(int(self.counters.globals[GRANTED]), count)

    # ------------------------------------------------------------------ faults, waiting, counters
    @abstractmethod
    def poll(self) -> Reports:
        """Take in what collectors reported (see :class:`Reports`) and handle faults.

        A fault (a collector raised, died, or made no progress for ``setup.collector_timeout_s``:
        hung, and then killed) counts in :attr:`faults`; while
        ``setup.max_restarts`` allows, the collector is replaced (with a ``RuntimeWarning``
        naming the fault), otherwise the fault is raised.

        Raises:
            CollectorError: a collector failed and no restart is left.
        """

    @abstractmethod
    def wait(self, timeout: float) -> None:
        """Block until a collector reports something or fails, at most ``timeout`` s."""

    @property
    @abstractmethod
    def counters(self) -> CounterTable:
        """The collectors' counters and the learner's signals (live: read them again to see progress)."""

    @property
    def faults(self) -> int:
        """Collector faults so far (raised or restarted)."""
        return self._faults

    @property
    def restarts(self) -> int:
        """Collectors replaced after a fault so far."""
        return self._restarts

    def status(self) -> list[CollectorStatus]:
        """One :class:`CollectorStatus` per collector (empty once closed)."""
        if self._closed:
            return []
        rows = self.counters.rows.copy()
        return [
            CollectorStatus(
                index=c,
                node_id=node,
                pid=pid,
                env_steps=int(rows[c, TRANSITIONS]),
                weight_version=int(rows[c, VERSION]),
                restarts=self._restarts_of[c],
            )
            for c, (node, pid) in enumerate(self._locations())
        ]

    @abstractmethod
    def _locations(self) -> list[tuple[str, int | None]]:
        """``(node_id, pid)`` of each collector, for :meth:`status` (``pid`` ``None`` before it started)."""

    # ------------------------------------------------------------------ supervision
    def hung_collectors(self) -> dict[int, float]:
        """The hung collectors: ``{index: seconds since its last heartbeat}`` of those past their limit.

        The limit is ``setup.collector_timeout_s`` once a collector is ``READY`` (in its loop), and at least
        :data:`START_TIMEOUT_S` while it starts.
        """
        since = self.seconds_since_progress()
        timeout = self.setup.collector_timeout_s
        limits = np.where(self.counters.rows[:, READY] > 0, timeout, max(timeout, START_TIMEOUT_S))
        return {int(c): float(since[c]) for c in np.flatnonzero(since > limits)}

    def _supervise(self, faults: dict[int, CollectorError]) -> None:
        """Handle ``faults`` (collector index -> its error), in index order.

        Each counts in :attr:`faults`; the first one for which no restart is left (``setup.max_restarts``) is
        raised, the others replace their collector (:meth:`_restart`).

        Raises:
            CollectorError: a collector failed and no restart is left.
        """
        for c, fault in sorted(faults.items()):
            self._faults += 1
            if self._restarts >= self.setup.max_restarts:
                raise fault
            self._restart(c, fault)

    def _restart(self, c: int, fault: CollectorError) -> None:
        """Replace collector ``c`` after ``fault``: stop what is left of it, warn, start a new one in its row.

        The replacement gets the seeds of its restart count (see :class:`CollectorSetup`); its row's
        :attr:`replaced_fields` are zeroed first.
        """
        self._retire(c)
        self._restarts += 1
        self._restarts_of[c] += 1
        warnings.warn(
            f"{self._restart_head(fault)}; restarting it ({self._restarts} of "
            f"max_collector_restarts={self.setup.max_restarts})",
            RuntimeWarning,
            stacklevel=4,  # the caller of poll()
        )
        self.counters.reset_row(c, *self.replaced_fields)
        self._respawn(c)

    def _restart_head(self, fault: CollectorError) -> str:
        """The first part of the restart warning: the fault's first line (it names the root cause)."""
        return str(fault).split("\n\n--- collector")[0]

    def _retire(self, c: int) -> None:
        """Stop what is left of collector ``c`` before its replacement (a pool that restarts implements it)."""
        raise NotImplementedError(f"{type(self).__name__} does not restart collectors")

    def _respawn(self, c: int) -> None:
        """Start collector ``c``'s replacement (a pool that restarts implements it)."""
        raise NotImplementedError(f"{type(self).__name__} does not restart collectors")
