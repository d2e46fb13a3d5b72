"""Moved to :mod:`unilab_gym.runtime.counters` (issue 28: ``Control`` clashed with the live-control ``Controller``).

The old names stay importable from here for one release: ``Control`` is
:class:`~unilab_gym.runtime.counters.SharedCounters`, ``ControlHandle`` is
:class:`~unilab_gym.runtime.counters.CountersHandle`, and the field constants are those of
:mod:`~unilab_gym.runtime.counters` (``_GLOBAL``, ``_ROW``, ``_METRICS``: ``GLOBAL_FIELDS``,
``ROW_FIELDS``, ``METRIC_FIELDS``). New code imports :mod:`unilab_gym.runtime.counters`.
"""

from __future__ import annotations

from unilab_gym.runtime.counters import (
    BUDGET,
    GLOBAL_FIELDS,
    GRANTED,
    LEARNING_STARTS,
    METRIC_FIELDS,
    PROGRESS,
    PROGRESS_NS,
    READY,
    ROLLOUTS,
    ROW_FIELDS,
    STEP_CALLS,
    STEP_LATENCY,
    STOP,
    TERMINATED,
    TRANSITIONS,
    TRUNCATED,
    VERSION,
    WEIGHT_SYNC_LATENCY,
    CountersHandle,
    CounterTable,
    SharedCounters,
)

Control = SharedCounters
ControlHandle = CountersHandle
_GLOBAL, _ROW, _METRICS = GLOBAL_FIELDS, ROW_FIELDS, METRIC_FIELDS

__all__ = [
    "BUDGET",
    "GLOBAL_FIELDS",
    "GRANTED",
    "LEARNING_STARTS",
    "METRIC_FIELDS",
    "PROGRESS",
    "PROGRESS_NS",
    "READY",
    "ROLLOUTS",
    "ROW_FIELDS",
    "STEP_CALLS",
    "STEP_LATENCY",
    "STOP",
    "TERMINATED",
    "TRANSITIONS",
    "TRUNCATED",
    "VERSION",
    "WEIGHT_SYNC_LATENCY",
    "Control",
    "ControlHandle",
    "CounterTable",
    "CountersHandle",
    "SharedCounters",
]
