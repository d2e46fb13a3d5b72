"""Shared counters between the learner and its collectors (one small int64 segment).

The learner writes the global fields; collector ``c`` writes only its own row.
Every field is one aligned int64 with a single writer, so no lock is needed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from unilab_gym.replay.segment import Segment

# learner-written fields
STOP, BUDGET, LEARNING_STARTS, GRANTED = 0, 1, 2, 3
_GLOBAL = 8
# per-collector row fields
TRANSITIONS, VERSION, EPISODES, STEP_CALLS, ROLLOUTS, READY = 0, 1, 2, 3, 4, 5
_ROW = 6


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
    Collector ``c`` fields: ``transitions`` written, policy ``version`` in use, ``episodes``
    finished, ``step_calls`` (vector-env steps), ``rollouts`` completed (on-policy), ``ready``
    (1 once it is in its loop, where it notices ``stop`` within one step).
    """

    def __init__(self, num_collectors: int, _segment: Segment | None = None):
        if _segment is None:
            _segment = Segment.create(8 * (_GLOBAL + _ROW * num_collectors))
        self._segment = _segment
        self.num_collectors = num_collectors
        self._array = np.frombuffer(_segment.buf, np.int64, _GLOBAL + _ROW * num_collectors)
        self.globals = self._array[:_GLOBAL]
        self.rows = self._array[_GLOBAL:].reshape(num_collectors, _ROW)

    @classmethod
    def attach(cls, handle: ControlHandle) -> "Control":
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
        self.globals = self.rows = self._array = None  # type: ignore[assignment]
        self._segment.close()
