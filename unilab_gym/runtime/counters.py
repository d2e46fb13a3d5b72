"""The collectors' counter table: the learner's signals, each collector's counters and latency metrics.

One table per pool, with one writer per field, so no lock is needed:

- ``globals`` (int64, :data:`GLOBAL_FIELDS`): the learner's signals, written through the pool
  (``set_budget``, ``set_learning_starts``, ``grant_rollouts``, ``close``): :data:`STOP`, :data:`BUDGET`,
  :data:`LEARNING_STARTS`, :data:`GRANTED`.
- ``rows`` (int64, ``(num_collectors, ROW_FIELDS)``): collector ``c``'s counters, which it alone writes:
  :data:`TRANSITIONS`, :data:`VERSION`, :data:`TERMINATED`, :data:`TRUNCATED`, :data:`STEP_CALLS`,
  :data:`ROLLOUTS`, :data:`READY`, and its heartbeat :data:`PROGRESS`, :data:`PROGRESS_NS`.
- ``metrics`` (float64, ``(num_collectors, METRIC_FIELDS)``): collector ``c``'s latency histograms,
  :data:`STEP_LATENCY` and :data:`WEIGHT_SYNC_LATENCY`.

Two storages, one interface: :class:`CounterTable` on plain numpy arrays (one process: the inline pool,
the Ray pool's learner-side table and each Ray actor's), and :class:`SharedCounters`, the same table in one
shared-memory segment (the process pool and its collector processes; every field one aligned 8-byte value).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from unilab_gym.latency import LatencyHistogram, StepLatency
from unilab_gym.shm import Segment

# learner-written fields of ``globals``
#: 1: collectors exit (they notice within one loop iteration once ``READY``).
STOP = 0
#: off-policy backpressure: collectors commit transitions while the total is below it.
BUDGET = 1
#: off-policy: collectors act uniformly at random while the total is below it (as SB3 does).
LEARNING_STARTS = 2
#: on-policy: collectors may collect rollouts ``0 .. GRANTED - 1``.
GRANTED = 3
#: int64 values of ``globals`` (room for later signals).
GLOBAL_FIELDS = 8

# per-collector fields of ``rows``
#: transitions written (or, Ray, ingested by the learner).
TRANSITIONS = 0
#: weight version the collector acts with (0: none loaded yet).
VERSION = 1
#: episodes that terminated / were truncated.
TERMINATED, TRUNCATED = 2, 3
#: vector-env ``step`` calls.
STEP_CALLS = 4
#: on-policy rollouts completed.
ROLLOUTS = 5
#: 1 once the collector is in its loop.
READY = 6
#: heartbeat: loop iterations so far (idle ones included), and ``time.monotonic_ns()`` of the last one (the
#: learner sets it when it starts the collector, so start-up counts).
PROGRESS, PROGRESS_NS = 7, 8
#: int64 values of one row.
ROW_FIELDS = 9

# per-collector float64 ``metrics`` row: the env's step latency (physics, task), then weight-sync latency
STEP_LATENCY = slice(0, StepLatency.SIZE)
WEIGHT_SYNC_LATENCY = slice(StepLatency.SIZE, StepLatency.SIZE + LatencyHistogram.SIZE)
#: float64 values of one metrics row.
METRIC_FIELDS = StepLatency.SIZE + LatencyHistogram.SIZE


class CounterTable:
    """The counter table of ``num_collectors`` collectors on plain numpy arrays (zeros), in one process.

    Args:
        num_collectors: rows of the table (>= 1).

    :ivar num_collectors: rows of the table.
    :ivar globals: int64 ``(GLOBAL_FIELDS,)``: the learner's signals.
    :ivar rows: int64 ``(num_collectors, ROW_FIELDS)``: the collectors' counters.
    :ivar metrics: float64 ``(num_collectors, METRIC_FIELDS)``: the collectors' latency histograms.
    """

    def __init__(self, num_collectors: int):
        """Zero every counter (arguments: see the class docstring)."""
        self.num_collectors = num_collectors
        self.globals: np.ndarray = np.zeros(GLOBAL_FIELDS, np.int64)
        self.rows: np.ndarray = np.zeros((num_collectors, ROW_FIELDS), np.int64)
        self.metrics: np.ndarray = np.zeros((num_collectors, METRIC_FIELDS), np.float64)

    @property
    def stopped(self) -> bool:
        """Whether the learner set :data:`STOP`."""
        return bool(self.globals[STOP])

    def stop(self) -> None:
        """Set :data:`STOP`: collectors return from their loop at their next iteration."""
        self.globals[STOP] = 1

    def total_transitions(self) -> int:
        """Transitions written by all collectors together (the sum of the :data:`TRANSITIONS` column)."""
        return int(self.rows[:, TRANSITIONS].sum())

    def signals(self) -> tuple[int, int, int]:
        """``(budget, learning_starts, granted)``, the learner's signals as a collector obeys them."""
        return int(self.globals[BUDGET]), int(self.globals[LEARNING_STARTS]), int(self.globals[GRANTED])

    def set_signals(self, budget: int, learning_starts: int, granted: int) -> None:
        """Write the three signals of :meth:`signals` (a Ray actor, from the learner's request)."""
        self.globals[BUDGET], self.globals[LEARNING_STARTS], self.globals[GRANTED] = budget, learning_starts, granted

    def reset_row(self, index: int, *fields: int) -> None:
        """Zero ``fields`` of collector ``index``'s row (a replaced collector starts not ready, without weights)."""
        self.rows[index, list(fields)] = 0

    def close(self) -> None:
        """Nothing to free (the interface of :class:`SharedCounters`)."""


@dataclass(frozen=True)
class CountersHandle:
    """What a collector process needs to attach a :class:`SharedCounters` (picklable).

    :ivar name: the shared-memory segment's name.
    :ivar num_collectors: rows of the table.
    """

    name: str
    num_collectors: int


class SharedCounters(CounterTable):
    """A :class:`CounterTable` in one shared-memory segment: the learner owns it, collector processes attach.

    Args:
        num_collectors: rows of the table.
        segment: an attached segment (:meth:`attach`), or ``None`` to create one (the owner, who unlinks it).

    Raises:
        OSError: the system refused the segment.
    """

    def __init__(self, num_collectors: int, segment: Segment | None = None):
        """Create the segment (or map ``segment``) and view the table in it (arguments: see the class docstring)."""
        if segment is None:
            segment = Segment.create(8 * (GLOBAL_FIELDS + (ROW_FIELDS + METRIC_FIELDS) * num_collectors))
        self._segment = segment
        self.num_collectors = num_collectors
        ints = GLOBAL_FIELDS + ROW_FIELDS * num_collectors
        array = np.frombuffer(segment.buf, np.int64, ints)
        self.globals = array[:GLOBAL_FIELDS]
        self.rows = array[GLOBAL_FIELDS:].reshape(num_collectors, ROW_FIELDS)
        self.metrics = np.frombuffer(segment.buf, np.float64, METRIC_FIELDS * num_collectors, 8 * ints).reshape(
            num_collectors, METRIC_FIELDS
        )

    @classmethod
    def attach(cls, handle: CountersHandle) -> SharedCounters:
        """Attach the table of ``handle`` (a collector process; it never unlinks the segment)."""
        return cls(handle.num_collectors, Segment.attach(handle.name))

    @property
    def handle(self) -> CountersHandle:
        """The picklable :class:`CountersHandle` of this table."""
        return CountersHandle(self._segment.name, self.num_collectors)

    def close(self) -> None:
        """Drop the array views, then close the segment (the owner also unlinks it)."""
        self.globals = self.rows = self.metrics = None  # type: ignore[assignment]
        self._segment.close()
