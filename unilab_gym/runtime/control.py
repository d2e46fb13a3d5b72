"""Shared counters between the learner and its collector processes (one small int64 segment).

The :class:`~unilab_gym.runtime.process_pool.ProcessCollectorPool`'s table of
:class:`~unilab_gym.runtime.pool.Counters` and its channel for the learner's signals. The
learner writes the global fields (through the pool's ``set_budget``, ``grant_rollouts``, ...);
collector ``c`` writes only its own row of counters and its own row of metrics. Every field is
one aligned 8-byte value with a single writer, so no lock is needed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from unilab_gym.latency import LatencyHistogram, StepLatency
from unilab_gym.shm import Segment

# learner-written fields
STOP, BUDGET, LEARNING_STARTS, GRANTED = 0, 1, 2, 3
_GLOBAL = 8
# per-collector row fields
TRANSITIONS, VERSION, TERMINATED, TRUNCATED, STEP_CALLS, ROLLOUTS, READY = 0, 1, 2, 3, 4, 5, 6
# heartbeat: loop iterations so far, and ``time.monotonic_ns()`` of the last one (the learner sets it at spawn)
PROGRESS, PROGRESS_NS = 7, 8
_ROW = 9
# per-collector float64 metrics row: the env's step latency (physics, task), then weight-sync latency
STEP_LATENCY = slice(0, StepLatency.SIZE)
WEIGHT_SYNC_LATENCY = slice(StepLatency.SIZE, StepLatency.SIZE + LatencyHistogram.SIZE)
_METRICS = StepLatency.SIZE + LatencyHistogram.SIZE


@dataclass(frozen=True)
class ControlHandle:
    name: str
    num_collectors: int


class Control:
    """Counters shared by the learner (owner) and ``num_collectors`` collectors (attachers).

    Learner fields: ``stop`` (1 = collectors exit); off-policy: ``budget`` (collectors may
    commit transitions while the total is below it: backpressure), ``learning_starts`` (total
    transitions before which collectors act uniformly at random, as SB3 does); on-policy:
    ``granted`` (collectors may collect rollouts ``0 .. granted - 1``).
    Collector ``c`` fields: ``transitions`` written, policy ``version`` in use, episodes
    ``terminated`` / ``truncated``, ``step_calls`` (vector-env steps), ``rollouts`` completed
    (on-policy), ``ready`` (1 once it is in its loop, where it notices ``stop`` within one step),
    and its heartbeat: ``progress`` (loop iterations, idle ones included) and ``progress_ns``
    (``time.monotonic_ns()``, a clock every process of the machine shares, at the last one; the
    learner sets it when it spawns the collector, so start-up counts too).
    :attr:`metrics` row ``c`` (float64) holds collector ``c``'s latency histograms
    (:data:`STEP_LATENCY`, :data:`WEIGHT_SYNC_LATENCY`).
    """

    def __init__(self, num_collectors: int, _segment: Segment | None = None):
        if _segment is None:
            _segment = Segment.create(8 * (_GLOBAL + (_ROW + _METRICS) * num_collectors))
        self._segment = _segment
        self.num_collectors = num_collectors
        ints = _GLOBAL + _ROW * num_collectors
        self._array = np.frombuffer(_segment.buf, np.int64, ints)
        self.globals = self._array[:_GLOBAL]
        self.rows = self._array[_GLOBAL:].reshape(num_collectors, _ROW)
        self.metrics = np.frombuffer(_segment.buf, np.float64, _METRICS * num_collectors, 8 * ints).reshape(
            num_collectors, _METRICS
        )

    @classmethod
    def attach(cls, handle: ControlHandle) -> Control:
        return cls(handle.num_collectors, Segment.attach(handle.name))

    @property
    def handle(self) -> ControlHandle:
        return ControlHandle(self._segment.name, self.num_collectors)

    @property
    def stopped(self) -> bool:
        return bool(self.globals[STOP])

    def total_transitions(self) -> int:
        return int(self.rows[:, TRANSITIONS].sum())

    def close(self) -> None:
        self.globals = self.rows = self._array = self.metrics = None  # type: ignore[assignment]
        self._segment.close()
