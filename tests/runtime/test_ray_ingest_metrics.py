"""The learner's ingest accounting (issue 30, item 1): :class:`IngestStats` alone, on a fake CPU clock, and
its export through :class:`RunnerMetrics` (Prometheus samples and SB3 logger keys) over a stand-in pool.

The real run (2 collectors over Ray, every phase measured) is in ``tests/runtime/test_ray_backend.py``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from unilab_gym.runtime.metrics import ANSWER_BUCKETS, INGEST_PHASES, IngestStats, RunnerMetrics
from unilab_gym.runtime.ray_collector import LocalControl


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_every_cpu_second_of_a_span_goes_to_the_phase_that_closes_it():
    clock = FakeClock()
    stats = IngestStats(clock)
    stats.begin()
    clock.now = 1.0
    stats.lap("wait")
    clock.now = 3.0
    stats.lap("fetch")
    clock.now = 3.5
    stats.lap("copy")
    clock.now = 4.0
    stats.end()  # the rest: bookkeeping
    clock.now = 10.0  # between spans: not ingest
    stats.begin()
    clock.now = 10.25
    stats.end("wait")
    assert stats.cpu_seconds == {
        "wait": 1.25,
        "poll": 0.0,
        "fetch": 2.0,
        "deserialize": 0.0,
        "copy": 0.5,
        "request": 0.0,
        "bookkeeping": 0.5,
    }
    assert stats.total_cpu_seconds == 4.25 == sum(stats.cpu_seconds.values())
    assert stats.spans == 2


def test_an_unknown_phase_is_refused_and_changes_nothing():
    clock = FakeClock()
    stats = IngestStats(clock)
    stats.begin()
    clock.now = 1.0
    with pytest.raises(ValueError, match="'unpickle'"):
        stats.lap("unpickle")
    assert sum(stats.cpu_seconds.values()) == 0.0
    stats.end()
    assert stats.cpu_seconds["bookkeeping"] == 1.0  # the time stays for the next phase


def test_answer_sizes_make_a_prometheus_histogram_and_exact_quantiles():
    stats = IngestStats(FakeClock())
    assert math.isnan(stats.quantile(0.5))
    for n in (0, 32, 32, 128, 5000):
        stats.answer(n)
    assert (stats.count, stats.sum) == (5.0, 5192.0)
    cumulative = dict(stats.cumulative())
    assert list(cumulative) == [float(b) for b in ANSWER_BUCKETS] + [math.inf]
    assert cumulative[32.0] == 3 and cumulative[64.0] == 3 and cumulative[128.0] == 4 and cumulative[4096.0] == 4
    assert cumulative[math.inf] == 5
    assert stats.quantile(0.5) == 32.0 and stats.quantile(0.0) == 0.0 and stats.quantile(1.0) == 5000.0
    with pytest.raises(ValueError, match="q must be"):
        stats.quantile(1.5)


class StubPool:
    """What RunnerMetrics reads of a Ray pool, with a hand-driven IngestStats."""

    num_collectors = 1
    weight_version = faults = restarts = 0

    def __init__(self, clock):
        self.counters = LocalControl(1)  # the Ray pool's own counters table (no Ray needed)
        self.ingest_stats = IngestStats(clock)

    def status(self):
        return []

    def seconds_since_progress(self):
        return np.zeros(1)

    def policy_lag(self):
        return 0


class Logger:
    def __init__(self):
        self.values = {}

    def record(self, key, value, exclude=None):
        self.values[key] = value


def test_runner_metrics_export_the_ingest_phases_and_per_transition_keys():
    clock = FakeClock()
    pool = StubPool(clock)
    metrics = RunnerMetrics(pool)
    stats = pool.ingest_stats
    stats.begin()
    clock.now = 0.002
    stats.lap("fetch")
    clock.now = 0.003
    stats.lap("copy")
    stats.answer(100)
    stats.answer(300)
    clock.now = 0.004
    stats.end()
    samples = {m.name: s for m, s in metrics.samples()}
    assert dict(samples["unilab_ingest_cpu_seconds_total"]) == {(p,): stats.cpu_seconds[p] for p in INGEST_PHASES}
    ((labels, hist),) = samples["unilab_ingest_answer_transitions"]
    assert labels == () and hist.count == 2 and hist.sum == 400
    logger = Logger()
    metrics.record(logger)
    v = logger.values
    assert v["unilab/ingest_us_per_transition"] == pytest.approx(1e6 * 0.004 / 400)
    assert v["unilab/ingest_us_per_transition/fetch"] == pytest.approx(1e6 * 0.002 / 400)
    assert v["unilab/ingest_us_per_transition/copy"] == pytest.approx(1e6 * 0.001 / 400)
    assert v["unilab/ingest_us_per_answer"] == pytest.approx(1e6 * 0.004 / 2)
    assert v["unilab/ingest_answer_transitions"] == 200
    # the next interval holds nothing: no per-transition figure rather than a division by zero
    logger2 = Logger()
    metrics.record(logger2)
    assert not [k for k in logger2.values if k.startswith("unilab/ingest_us")]


def test_a_pool_without_ingest_stats_exports_zeros_and_no_logger_keys():
    pool = StubPool(FakeClock())
    del pool.ingest_stats  # as the process pool: collectors write the learner's storage themselves
    metrics = RunnerMetrics(pool)
    samples = {m.name: s for m, s in metrics.samples()}
    assert dict(samples["unilab_ingest_cpu_seconds_total"]) == {(p,): 0.0 for p in INGEST_PHASES}
    ((_, hist),) = samples["unilab_ingest_answer_transitions"]
    assert hist.count == 0 and hist.cumulative()[-1] == (math.inf, 0.0)
    logger = Logger()
    metrics.record(logger)
    assert "unilab/env_steps" in logger.values
    assert not [k for k in logger.values if k.startswith("unilab/ingest_") and k != "unilab/ingest_per_s"]
