"""Pipeline metrics of an ``AsyncRunner``: one table, served to Prometheus and written to SB3's logger.

Where the figures come from:

- collectors count (transitions, episodes, policy version) and keep latency histograms (the
  env's step latency, physics vs task math; weight-sync latency) in their own rows of the
  pool's :attr:`~unilab_gym.runtime.pool.CollectorPool.counters`, which also holds the
  published weight version and the collector faults and restarts;
- the learner keeps its own timers (waiting for data, training, publishing weights) and
  gradient steps in :class:`RunnerMetrics`, and updates the per-second rates at most once per
  :data:`RATE_WINDOW_S` while ``learn()`` runs;
- off-policy, the replay figures come from the :class:`ReplayInfo` the loop gives.

Nothing here runs in a collector's step loop except the histograms' ``observe`` (a bisect and
two adds). Reading is done by whoever asks: :meth:`RunnerMetrics.record` (SB3 logger, when the
runner dumps its logs) and :class:`MetricsServer` (Prometheus scrapes, on the server's thread).

The names follow Prometheus' conventions (``unilab_`` prefix, unit suffix, ``_total`` for
counters); :data:`METRICS` is the table README documents.
"""

from __future__ import annotations

import errno
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from unilab_gym.latency import LatencyHistogram, StepLatency, mean_latency_us
from unilab_gym.runtime.control import STEP_LATENCY, TERMINATED, TRANSITIONS, TRUNCATED, WEIGHT_SYNC_LATENCY
from unilab_gym.runtime.http_server import BoundedHTTPServer

if TYPE_CHECKING:
    from unilab_gym.replay.storage import ReplayStorage
    from unilab_gym.runtime.pool import CollectorPool

#: Shortest window over which the per-second rates are computed, in s.
RATE_WINDOW_S = 1.0
#: Learner time phases (label ``phase`` of ``unilab_learner_seconds_total``).
LEARNER_PHASES = ("wait_for_data", "train", "publish_weights")
#: Phases of the learner's ingest CPU with ``backend="ray"`` (label ``phase`` of
#: ``unilab_ingest_cpu_seconds_total``; see :class:`IngestStats`).
INGEST_PHASES = ("wait", "poll", "fetch", "deserialize", "copy", "request", "bookkeeping")
#: Upper bounds (``le``) of ``unilab_ingest_answer_transitions``, in transitions per answer (then +Inf):
#: 32 (one vector step of 32 envs) to 4,096 (a full stage of 64 steps x 64 envs).
ANSWER_BUCKETS: tuple[int, ...] = (32, 64, 128, 256, 512, 1024, 2048, 4096)

#: One metric's samples: ``[(label values, value or LatencyHistogram), ...]``.
Samples = list[tuple[tuple[str, ...], Any]]


@dataclass(frozen=True)
class Metric:
    """One metric: Prometheus name (unit in the name), type, labels, and what it measures."""

    name: str
    kind: str  # "counter" | "gauge" | "histogram"
    help: str
    labels: tuple[str, ...] = ()
    off_policy_only: bool = False


METRICS: tuple[Metric, ...] = (
    Metric(
        "unilab_env_steps_total", "counter", "Env steps (transitions) written by each collector.", ("collector", "node")
    ),
    Metric(
        "unilab_env_steps_per_second",
        "gauge",
        "Env steps per second of each collector, over the last >= 1 s.",
        ("collector", "node"),
    ),
    Metric(
        "unilab_step_latency_microseconds",
        "histogram",
        "Wall-clock time of each vector-env step() in a collector, in microseconds: phase=physics (every "
        "cluster's slice of substeps and reading the states back), phase=task (action checks, task math, "
        "infos, resets).",
        ("collector", "node", "phase"),
    ),
    Metric(
        "unilab_weight_sync_latency_microseconds",
        "histogram",
        "From the learner publishing a weight version to a collector acting with it, in microseconds.",
        ("collector", "node"),
    ),
    Metric("unilab_policy_version", "gauge", "Newest weight version published by the learner."),
    Metric(
        "unilab_policy_lag_versions",
        "gauge",
        "Policy lag of the data the learner last took in, in versions: off-policy, published version minus the "
        "oldest version a running collector acts with, plus the training calls not published because of it; "
        "on-policy, learner version minus the last rollout's behaviour version.",
    ),
    Metric(
        "unilab_replay_size_transitions", "gauge", "Transitions held in the shared replay buffer.", off_policy_only=True
    ),
    Metric(
        "unilab_replay_committed_transitions_total",
        "counter",
        "Transitions ever committed to the shared replay buffer.",
        off_policy_only=True,
    ),
    Metric(
        "unilab_replay_write_transitions_per_second",
        "gauge",
        "Transitions committed per second, over the last >= 1 s.",
        off_policy_only=True,
    ),
    Metric(
        "unilab_replay_sample_transitions_per_second",
        "gauge",
        "Transitions sampled per second by the learner (gradient steps x batch size), over the last >= 1 s.",
        off_policy_only=True,
    ),
    Metric(
        "unilab_replay_ratio",
        "gauge",
        "Replay ratio achieved: gradient steps per transition collected, over the last >= 1 s.",
        off_policy_only=True,
    ),
    Metric("unilab_gradient_steps_total", "counter", "Gradient steps run by the learner."),
    Metric(
        "unilab_learner_seconds_total",
        "counter",
        "Learner wall-clock time in seconds, by phase: wait_for_data, train, publish_weights "
        "(the rest is callbacks and bookkeeping).",
        ("phase",),
    ),
    Metric(
        "unilab_collector_restarts_total", "counter", "Collectors restarted after a fault (max_collector_restarts)."
    ),
    Metric(
        "unilab_collector_errors_total",
        "counter",
        "Collector faults: an exception raised in a collector, or a collector that died.",
    ),
    Metric(
        "unilab_collector_seconds_since_progress",
        "gauge",
        "Seconds since each collector's last heartbeat (an iteration of its loop, idle ones included; from its "
        "spawn while it starts). Past collector_timeout_s the collector is hung: restarted or raised.",
        ("collector", "node"),
    ),
    Metric(
        "unilab_episodes_total",
        "counter",
        "Episodes finished, by outcome (terminated or truncated).",
        ("collector", "node", "outcome"),
    ),
    Metric(
        "unilab_ingest_transitions_per_second",
        "gauge",
        "Transitions the learner received into its replay / rollout storage per second (backend='ray': taken from "
        "the object store), over the last >= 1 s.",
    ),
    Metric(
        "unilab_ingest_cpu_seconds_total",
        "counter",
        "backend='ray' (0 with processes, which write the storage themselves): the learner thread's CPU seconds "
        "spent taking collector answers in, by phase: wait "
        "(the CPU of the blocking ray.wait while the learner waits for data), poll (ray.wait without blocking "
        "on the requests in flight and on the actors' loops), fetch (the object from the object store "
        "into this process), deserialize (unpickling it; numpy blocks are zero-copy views), copy (into the "
        "replay's reservation or the rollout storage: reserve, write, commit), request (issuing the next "
        "exchange requests), bookkeeping (counters, episodes, heartbeats, faults).",
        ("phase",),
    ),
    Metric(
        "unilab_ingest_answer_transitions",
        "histogram",
        "backend='ray': transitions carried by each collector answer the learner ingested (0 for an answer "
        "with no data); empty with processes.",
    ),
    Metric(
        "unilab_object_store_bytes_in_flight",
        "gauge",
        "backend='ray': estimated bytes of collector results in the Ray object store on their way to the learner "
        "(at most MAX_IN_FLIGHT stages per collector); 0 with processes.",
    ),
)


@dataclass(frozen=True)
class ReplayInfo:
    """What the replay metrics read (off-policy): the ring collectors write to, and the sample size.

    :ivar storage: the ``ReplayStorage`` collectors commit transitions to.
    :ivar batch_size: transitions sampled per gradient step.
    """

    storage: ReplayStorage
    batch_size: int


class IngestStats:
    """The learner's ingest cost (``backend="ray"``): CPU seconds by phase, and the size of every answer.

    The pool opens a span with :meth:`begin` around each ``poll()`` and ``wait()``, closes each phase inside
    it with :meth:`lap` (the CPU time since the previous mark goes to that phase) and the span with
    :meth:`end`; it counts each ingested answer with :meth:`answer`. Every CPU second between ``begin`` and
    ``end`` goes to exactly one of :data:`INGEST_PHASES`, so ``sum(cpu_seconds.values())`` equals
    :attr:`total_cpu_seconds` (up to float rounding). Spans may run on several threads at once (the
    pool's ingest workers, ``ingest_workers > 1``): each thread has its own open span and its own CPU
    clock, and the sums are added under a lock; the phases then run ahead of the total by the laps of the
    spans still open (equal again once no span is open, e.g. after the pool's ``close()``). Readers on other
    threads (Prometheus scrapes) read plain floats and :meth:`cumulative` / :meth:`quantile`, which copy what they read.

    Args:
        clock: the CPU clock of the calling thread, in s. Default ``time.thread_time``: the ingesting
            thread's own, so other processes on the machine do not inflate it, and Ray's own I/O threads in
            the learner process (which receive the replies) are not counted either.

    :ivar cpu_seconds: ``{phase: CPU seconds}`` over :data:`INGEST_PHASES`.
    :ivar total_cpu_seconds: CPU seconds of every span (``begin`` to ``end``).
    :ivar answers: answers ingested (one per exchange result, with or without data).
    :ivar transitions: transitions those answers carried.
    :ivar spans: spans opened (``poll()`` and ``wait()`` calls with work to do).
    :ivar worker_cpu_seconds: the part of :attr:`total_cpu_seconds` spent in spans opened with
        ``worker=True`` (the pool's ingest worker threads, not the training thread).
    """

    def __init__(self, clock: Callable[[], float] = time.thread_time):
        """Start with every count at zero (arguments: see the class docstring)."""
        self._clock = clock
        self.cpu_seconds = dict.fromkeys(INGEST_PHASES, 0.0)
        self.total_cpu_seconds = 0.0
        self.worker_cpu_seconds = 0.0
        self.answers = 0
        self.transitions = 0
        self.spans = 0
        self._sizes: dict[int, int] = {}  # transitions per answer -> answers (few distinct sizes: bounded)
        self._lock = threading.Lock()  # the sums, written by the learner thread and the ingest workers
        self._span = threading.local()  # this thread's open span: start, last mark, worker or not

    def begin(self, *, worker: bool = False) -> None:
        """Open a span on this thread: its CPU time from now on goes to the phases :meth:`lap` names.

        Args:
            worker: the span runs on an ingest worker thread (it also counts in :attr:`worker_cpu_seconds`).
        """
        span = self._span
        span.start = span.last = self._clock()
        span.worker = worker
        with self._lock:
            self.spans += 1

    def lap(self, phase: str) -> None:
        """Add this thread's CPU time since its last mark (``begin`` or ``lap``) to ``phase``.

        Raises:
            ValueError: ``phase`` is not one of :data:`INGEST_PHASES`.
        """
        if phase not in self.cpu_seconds:
            raise ValueError(f"phase must be one of {INGEST_PHASES}, got {phase!r}")
        span = self._span
        now = self._clock()
        with self._lock:
            self.cpu_seconds[phase] += now - span.last
        span.last = now

    def end(self, phase: str = "bookkeeping") -> None:
        """Close this thread's span: the CPU time since the last mark goes to ``phase``, the span's to the total."""
        self.lap(phase)
        span = self._span
        with self._lock:
            self.total_cpu_seconds += span.last - span.start
            if span.worker:
                self.worker_cpu_seconds += span.last - span.start

    def answer(self, transitions: int) -> None:
        """Count one ingested answer carrying ``transitions`` transitions (0: no data)."""
        n = int(transitions)
        with self._lock:
            self.answers += 1
            self.transitions += n
            self._sizes[n] = self._sizes.get(n, 0) + 1

    @property
    def count(self) -> float:
        """Answers ingested (the histogram's count)."""
        return float(self.answers)

    @property
    def sum(self) -> float:
        """Transitions of all answers (the histogram's sum)."""
        return float(self.transitions)

    def cumulative(self) -> list[tuple[float, float]]:
        """Prometheus buckets of the answer sizes: ``[(le, answers with <= le transitions), ..., (inf, count)]``."""
        sizes = dict(self._sizes)
        out = [(float(le), float(sum(k for n, k in sizes.items() if n <= le))) for le in ANSWER_BUCKETS]
        return [*out, (float("inf"), float(sum(sizes.values())))]

    def quantile(self, q: float) -> float:
        """The ``q`` quantile (0..1) of transitions per answer, exact; NaN before the first answer.

        Exact: the smallest size with >= q of the answers at or below it.

        Raises:
            ValueError: ``q`` is not in [0, 1].
        """
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"q must be in [0, 1], got {q!r}")
        sizes = sorted(dict(self._sizes).items())
        total = sum(k for _, k in sizes)
        seen = 0
        for n, k in sizes:
            seen += k
            if seen >= q * total and seen > 0:
                return float(n)
        return float("nan")

    def snapshot(self) -> tuple[float, dict[str, float], int, int, int]:
        """``(total_cpu_seconds, cpu_seconds copy, answers, transitions, spans)``, for differences over an interval."""
        with self._lock:
            return self.total_cpu_seconds, dict(self.cpu_seconds), self.answers, self.transitions, self.spans


class RunnerMetrics:
    """The learner's view of the pipeline metrics (see the module docstring).

    Args:
        pool: the runner's :class:`~unilab_gym.runtime.pool.CollectorPool` (counters, weight
            version, faults and restarts are read from it).
        replay: off-policy: the replay figures' source; ``None``: no replay metrics.

    The learner-side counters are plain attributes the loop updates: :attr:`gradient_steps`
    and, through :meth:`learner_phase`, :attr:`learner_seconds`.
    """

    def __init__(self, pool: CollectorPool, replay: ReplayInfo | None = None):
        """Start every learner-side figure at zero (arguments: see the class docstring)."""
        self._pool = pool
        self._replay = replay.storage if replay is not None else None
        self._batch_size = replay.batch_size if replay is not None else 0
        # the pool's ingest accounting (backend="ray"); other pools' collectors write the learner's storage
        # themselves: an IngestStats that stays empty (the metrics read 0, the logger gets no ingest keys)
        self._ingest: IngestStats = getattr(pool, "ingest_stats", None) or IngestStats()
        n = pool.num_collectors
        self.gradient_steps = 0
        self.learner_seconds = dict.fromkeys(LEARNER_PHASES, 0.0)
        self.env_steps_per_second = np.zeros(n)
        self.replay_write_per_second = 0.0
        self.replay_sample_per_second = 0.0
        self.replay_ratio = 0.0
        self._lock = threading.Lock()  # readers on other threads vs close()
        self._closed = False
        self._rate_t = time.monotonic()
        self._rate_prev = self._counts()
        self._lag_sum = self._lag_n = self._lag_max = 0
        self.last_policy_lag = 0
        self._logged = self._logger_state()

    @property
    def collector_errors(self) -> int:
        """Collector faults so far: an exception raised in a collector, or a collector that died."""
        return self._pool.faults

    @property
    def collector_restarts(self) -> int:
        """Collectors restarted after a fault so far."""
        return self._pool.restarts

    # ------------------------------------------------------------------ updates (learner thread)
    @contextmanager
    def learner_phase(self, phase: str) -> Iterator[None]:
        """Add the wall-clock time of the ``with`` block to ``learner_seconds[phase]``."""
        t = time.perf_counter()
        try:
            yield
        finally:
            self.learner_seconds[phase] += time.perf_counter() - t

    def observe_policy_lag(self, lag: int) -> None:
        """Count a policy-lag sample (versions) towards the logger's mean and max; the gauge shows the last one."""
        self.last_policy_lag = lag
        self._lag_sum += lag
        self._lag_n += 1
        self._lag_max = max(self._lag_max, lag)

    def tick(self) -> None:
        """Recompute the per-second rates if :data:`RATE_WINDOW_S` has passed since the last time."""
        now = time.monotonic()
        dt = now - self._rate_t
        if dt < RATE_WINDOW_S:
            return
        counts = self._counts()
        transitions, committed, grad = counts
        prev_transitions, prev_committed, prev_grad = self._rate_prev
        self.env_steps_per_second = (transitions - prev_transitions) / dt
        self.replay_write_per_second = (committed - prev_committed) / dt
        self.replay_sample_per_second = (grad - prev_grad) * self._batch_size / dt
        collected = transitions.sum() - prev_transitions.sum()
        self.replay_ratio = (grad - prev_grad) / collected if collected > 0 else 0.0
        self._rate_t, self._rate_prev = now, counts

    def _counts(self) -> tuple[np.ndarray, int, int]:
        return self._pool.counters.rows[:, TRANSITIONS].astype(np.float64), self._committed(), self.gradient_steps

    def _replay_open(self) -> bool:
        return self._replay is not None and not self._replay.closed

    def _committed(self) -> int:
        replay = self._replay
        if replay is None or replay.closed:
            return 0
        try:
            return int(replay.committed)
        except RuntimeError:  # ReplayClosedError: closed meanwhile
            return 0

    def begin(self) -> None:
        """Start the rate window and the logger's interval now.

        ``learn()`` calls it, so idle time between calls is not averaged in.
        """
        self._rate_t, self._rate_prev = time.monotonic(), self._counts()
        self._logged = self._logger_state()

    def close(self) -> None:
        """Stop serving readers (before the shared memory goes away)."""
        with self._lock:
            self._closed = True

    # ------------------------------------------------------------------ reading
    def samples(self) -> list[tuple[Metric, Samples]]:
        """Every metric with its samples ``[(label values, value or LatencyHistogram), ...]``; empty once closed."""
        with self._lock:
            if self._closed:
                return []
            return self._samples()

    def _samples(self) -> list[tuple[Metric, Samples]]:
        counters = self._pool.counters
        rows, hist = counters.rows, counters.metrics
        collectors = range(counters.num_collectors)
        step = [StepLatency(hist[c, STEP_LATENCY].copy()) for c in collectors]
        # every per-collector figure carries the node it runs on (Ray node id, hex; processes: the host name)
        nodes = {s.index: s.node_id for s in self._pool.status()}
        at = [(str(c), nodes.get(c, "")) for c in collectors]
        values: dict[str, Samples] = {
            "unilab_env_steps_total": [(at[c], float(rows[c, TRANSITIONS])) for c in collectors],
            "unilab_env_steps_per_second": [(at[c], float(self.env_steps_per_second[c])) for c in collectors],
            "unilab_step_latency_microseconds": [
                *(((*at[c], "physics"), step[c].physics) for c in collectors),
                *(((*at[c], "task"), step[c].task) for c in collectors),
            ],
            "unilab_weight_sync_latency_microseconds": [
                (at[c], LatencyHistogram(hist[c, WEIGHT_SYNC_LATENCY].copy())) for c in collectors
            ],
            "unilab_policy_version": [((), float(self._pool.weight_version))],
            "unilab_policy_lag_versions": [((), float(self.last_policy_lag))],
            "unilab_gradient_steps_total": [((), float(self.gradient_steps))],
            "unilab_learner_seconds_total": [((phase,), seconds) for phase, seconds in self.learner_seconds.items()],
            "unilab_collector_restarts_total": [((), float(self.collector_restarts))],
            "unilab_collector_errors_total": [((), float(self.collector_errors))],
            "unilab_collector_seconds_since_progress": [
                (at[c], float(age)) for c, age in enumerate(self._pool.seconds_since_progress())
            ],
            "unilab_episodes_total": [
                *(((*at[c], "terminated"), float(rows[c, TERMINATED])) for c in collectors),
                *(((*at[c], "truncated"), float(rows[c, TRUNCATED])) for c in collectors),
            ],
            "unilab_ingest_transitions_per_second": [((), float(self.env_steps_per_second.sum()))],
            "unilab_object_store_bytes_in_flight": [((), float(getattr(self._pool, "bytes_in_flight", 0)))],
        }
        ingest = self._ingest
        values["unilab_ingest_cpu_seconds_total"] = [((p,), s) for p, s in list(ingest.cpu_seconds.items())]
        values["unilab_ingest_answer_transitions"] = [((), ingest)]
        if self._replay_open():
            committed = self._committed()
            values.update(
                {
                    "unilab_replay_size_transitions": [((), float(self._replay_size(committed)))],
                    "unilab_replay_committed_transitions_total": [((), float(committed))],
                    "unilab_replay_write_transitions_per_second": [((), self.replay_write_per_second)],
                    "unilab_replay_sample_transitions_per_second": [((), self.replay_sample_per_second)],
                    "unilab_replay_ratio": [((), self.replay_ratio)],
                }
            )
        return [(m, values[m.name]) for m in METRICS if m.name in values]

    def _replay_size(self, committed: int) -> int:
        """Transitions the ring holds: every committed one, up to its capacity."""
        assert self._replay is not None
        return min(committed, self._replay.capacity)

    # ------------------------------------------------------------------ SB3 logger
    def _logger_state(self) -> dict[str, Any]:
        counters = self._pool.counters
        return {
            "t": time.monotonic(),
            "hist": counters.metrics.copy(),
            "learner": dict(self.learner_seconds),
            "grad": self.gradient_steps,
            "per_collector": counters.rows[:, TRANSITIONS].astype(np.float64),
            "transitions": float(counters.rows[:, TRANSITIONS].sum()),
            "committed": self._committed(),
            "ingest": self._ingest.snapshot(),
        }

    def record(self, logger: Any) -> None:
        """Write the ``unilab/*`` keys to an SB3 logger (means and rates over the time since the last call).

        Keys (README lists them with units): ``env_steps``, ``env_steps_per_s``,
        ``env_steps_per_s/c<i>``, ``step_physics_us``, ``step_task_us``, ``weight_sync_us``,
        ``policy_version``, ``policy_lag_mean``, ``policy_lag_max``, ``grad_steps``,
        ``grad_steps_per_s``, ``learner_<phase>_frac``, ``collector_restarts``,
        ``collector_errors``, ``seconds_since_progress/c<i>``, ``episodes_terminated``,
        ``episodes_truncated``, ``ingest_per_s`` (transitions the learner received per s),
        ``object_store_bytes_in_flight`` (``backend="ray"``; else 0); ``backend="ray"`` also
        ``ingest_us_per_transition`` (learner-thread CPU µs per transition ingested),
        ``ingest_us_per_transition/<phase>`` (the same by :data:`INGEST_PHASES`),
        ``ingest_us_per_answer`` and ``ingest_answer_transitions`` (mean transitions per answer); off-policy also
        ``replay_size``, ``replay_committed``, ``replay_write_per_s``, ``replay_sample_per_s``,
        ``replay_ratio``.
        """
        prev, now = self._logged, self._logger_state()
        dt = max(now["t"] - prev["t"], 1e-9)
        rows = self._pool.counters.rows
        rec = logger.record
        rec("unilab/env_steps", int(now["transitions"]))
        rec("unilab/env_steps_per_s", (now["transitions"] - prev["transitions"]) / dt)
        for c, rate in enumerate((now["per_collector"] - prev["per_collector"]) / dt):
            rec(f"unilab/env_steps_per_s/c{c}", float(rate))
        delta = now["hist"] - prev["hist"]
        step = delta[:, STEP_LATENCY]
        for key, block in (
            ("step_physics_us", step[:, StepLatency.PHYSICS]),
            ("step_task_us", step[:, StepLatency.TASK]),
            ("weight_sync_us", delta[:, WEIGHT_SYNC_LATENCY]),
        ):
            mean = mean_latency_us(block)
            if mean is not None:
                rec(f"unilab/{key}", mean)
        rec("unilab/policy_version", self._pool.weight_version)
        if self._lag_n == 0:
            self.observe_policy_lag(self._pool.policy_lag())
        rec("unilab/policy_lag_mean", self._lag_sum / self._lag_n)
        rec("unilab/policy_lag_max", self._lag_max)
        self._lag_sum = self._lag_n = self._lag_max = 0
        rec("unilab/grad_steps", self.gradient_steps)
        rec("unilab/grad_steps_per_s", (self.gradient_steps - prev["grad"]) / dt)
        for phase in LEARNER_PHASES:
            rec(f"unilab/learner_{phase}_frac", (self.learner_seconds[phase] - prev["learner"][phase]) / dt)
        rec("unilab/collector_restarts", self.collector_restarts)
        rec("unilab/collector_errors", self.collector_errors)
        for c, age in enumerate(self._pool.seconds_since_progress()):
            rec(f"unilab/seconds_since_progress/c{c}", float(age))
        rec("unilab/episodes_terminated", int(rows[:, TERMINATED].sum()))
        rec("unilab/episodes_truncated", int(rows[:, TRUNCATED].sum()))
        rec("unilab/ingest_per_s", (now["transitions"] - prev["transitions"]) / dt)
        rec("unilab/object_store_bytes_in_flight", int(getattr(self._pool, "bytes_in_flight", 0)))
        self._record_ingest(rec, prev["ingest"], now["ingest"])
        if self._replay_open():
            committed = self._committed()
            rec("unilab/replay_size", self._replay_size(committed))
            rec("unilab/replay_committed", committed)
            rec("unilab/replay_write_per_s", (now["committed"] - prev["committed"]) / dt)
            rec("unilab/replay_sample_per_s", (self.gradient_steps - prev["grad"]) * self._batch_size / dt)
            collected = now["transitions"] - prev["transitions"]
            rec("unilab/replay_ratio", (self.gradient_steps - prev["grad"]) / collected if collected > 0 else 0.0)
        self._logged = now

    @staticmethod
    def _record_ingest(rec: Any, prev: tuple[Any, ...], now: tuple[Any, ...]) -> None:
        """The ``unilab/ingest_*`` keys over the interval from snapshot ``prev`` to ``now`` (IngestStats.snapshot)."""
        cpu, answers, transitions = now[0] - prev[0], now[2] - prev[2], now[3] - prev[3]
        phases = {p: now[1][p] - prev[1][p] for p in INGEST_PHASES}
        if transitions > 0:
            rec("unilab/ingest_us_per_transition", 1e6 * cpu / transitions)
            for phase, seconds in phases.items():
                rec(f"unilab/ingest_us_per_transition/{phase}", 1e6 * seconds / transitions)
        if answers > 0:
            rec("unilab/ingest_us_per_answer", 1e6 * cpu / answers)
            rec("unilab/ingest_answer_transitions", transitions / answers)


def prometheus_app(metrics: RunnerMetrics) -> Any:
    """prometheus-client's ASGI app (``make_asgi_app``) over ``metrics``, to mount on another server.

    The control server (:mod:`unilab_gym.sb3.control`) mounts it at ``/metrics`` when a runner has
    both ``control_port`` and ``metrics_port``: one port per runner.

    Raises:
        ImportError: ``prometheus-client`` is not installed (``pip install "unilab-gym[metrics]"``).
    """
    try:
        from prometheus_client import CollectorRegistry, make_asgi_app
    except ImportError as exc:  # pragma: no cover - prometheus-client is in the test extra
        raise ImportError('metrics_port needs prometheus-client: pip install "unilab-gym[metrics]"') from exc
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Exporter(metrics))
    return make_asgi_app(registry)


class MetricsServer:
    """Serve :class:`RunnerMetrics` to Prometheus over HTTP (``GET /metrics``), on one daemon thread.

    A :class:`~unilab_gym.runtime.http_server.BoundedHTTPServer`: slow or idle clients cost no
    thread, at most ``MAX_CONNECTIONS`` (256) are open at once (one more closes the oldest idle
    connection, so held connections cannot lock out a scrape), each is closed after
    ``IDLE_TIMEOUT_S`` (5 s) without a whole request, and :meth:`close` joins everything.

    Args:
        metrics: what to serve (read at every scrape).
        port: TCP port; 0 picks a free one (see :attr:`port`).
        addr: address to bind, ``127.0.0.1`` (loopback only) by default.

    Raises:
        ImportError: ``prometheus-client`` is not installed (``pip install "unilab-gym[metrics]"``).
        OSError: the port is already in use (``errno.EADDRINUSE``, naming address and port), or
            cannot be bound.
    """

    def __init__(self, metrics: RunnerMetrics, port: int, addr: str = "127.0.0.1"):
        """Bind the port and start serving (arguments and errors: see the class docstring)."""
        try:
            from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
        except ImportError as exc:  # pragma: no cover - prometheus-client is in the test extra
            raise ImportError('metrics_port needs prometheus-client: pip install "unilab-gym[metrics]"') from exc
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Exporter(metrics))

        def page() -> tuple[bytes, str]:
            return generate_latest(registry), CONTENT_TYPE_LATEST

        try:
            server = BoundedHTTPServer({"/metrics": page, "/": page}, port, addr, name="unilab-metrics")
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise OSError(
                    errno.EADDRINUSE,
                    f"metrics_port {port} on {addr} is already in use (another runner or program serves it); "
                    "pass another metrics_port, or 0 for a free one",
                ) from exc
            raise
        self._server: BoundedHTTPServer | None = server
        #: the bound port (the free one picked when asked for 0).
        self.port: int = server.port
        self.addr = addr

    @property
    def url(self) -> str:
        """``http://<addr>:<port>/metrics`` (an IPv6 address in brackets)."""
        host = f"[{self.addr}]" if ":" in self.addr else self.addr
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Close every connection, stop serving, join the server's thread and release the port. Idempotent."""
        if self._server is None:
            return
        self._server.close()
        self._server = None


class _Exporter:
    """prometheus-client custom collector over :meth:`RunnerMetrics.samples`."""

    def __init__(self, metrics: RunnerMetrics):
        self._metrics = metrics

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
        from prometheus_client.utils import floatToGoString

        for metric, samples in self._metrics.samples():
            if metric.kind == "histogram":
                histograms = HistogramMetricFamily(metric.name, metric.help, labels=metric.labels)
                for labels, hist in samples:
                    buckets = [(floatToGoString(le), count) for le, count in hist.cumulative()]
                    histograms.add_metric(list(labels), buckets, sum_value=hist.sum)
                yield histograms
            else:
                cls = CounterMetricFamily if metric.kind == "counter" else GaugeMetricFamily
                family = cls(metric.name, metric.help, labels=metric.labels)
                for labels, value in samples:
                    family.add_metric(list(labels), value)
                yield family
