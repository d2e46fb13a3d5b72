"""Latency histograms in a flat float64 array, so that they can live in shared memory.

A :class:`LatencyHistogram` counts observations per bucket (Prometheus' ``le`` upper bounds
:data:`LATENCY_BUCKETS_US`, then +Inf) and keeps their sum. Its state is one float64 array
``[count per bucket ... | sum]`` owned by whoever created it: a private array, or a row of a
shared-memory segment that another process reads (an ``AsyncRunner`` collector binds its env's
histograms to its row so the learner can serve them). Counts in float64 are exact up to 2**53.

:class:`StepLatency` is what :class:`~unilab_gym.UniLabVectorEnv` records on every ``step()``:
the wall-clock time of the physics (the lockstep slice of every cluster and reading the robot
states back from pybullet) and of the task math (everything else: action checks, observations,
rewards, terminations, infos, resets), in µs.
"""

from __future__ import annotations

import math
from bisect import bisect_left

import numpy as np

#: Upper bounds (Prometheus ``le``) of the latency buckets, in µs; a last +Inf bucket follows.
LATENCY_BUCKETS_US: tuple[float, ...] = (
    10,
    25,
    50,
    100,
    250,
    500,
    1_000,
    2_500,
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    1_000_000,
)


def _state_array(out: np.ndarray | None, size: int) -> np.ndarray:
    """``out`` checked to be a float64 array of shape ``(size,)``, or a new zeroed one if ``None``."""
    if out is None:
        return np.zeros(size)
    if out.dtype != np.float64 or out.shape != (size,):
        raise ValueError(f"out must be a float64 array of shape ({size},), got {out.dtype} {out.shape}")
    return out


class LatencyHistogram:
    """Latencies in µs, bucketed by :data:`LATENCY_BUCKETS_US`, with their sum.

    Args:
        out: a float64 array of shape ``(LatencyHistogram.SIZE,)`` to keep the state in (e.g. a
            view into shared memory); its current contents are kept, so a histogram re-bound
            to the same memory continues counting. Default: a new zeroed array.

    Raises:
        ValueError: ``out`` is not a float64 array of shape ``(SIZE,)``.
    """

    #: float64 values of the state: one count per bucket (+Inf included), then the sum in µs.
    SIZE = len(LATENCY_BUCKETS_US) + 2

    def __init__(self, out: np.ndarray | None = None) -> None:
        """Bind the state to ``out`` or a new zeroed array (arguments: see the class docstring)."""
        self.data = _state_array(out, self.SIZE)

    def observe(self, microseconds: float) -> None:
        """Count one latency, in µs."""
        self.data[bisect_left(LATENCY_BUCKETS_US, microseconds)] += 1.0
        self.data[-1] += microseconds

    @property
    def count(self) -> float:
        """Number of observations."""
        return float(self.data[:-1].sum())

    @property
    def sum(self) -> float:
        """Sum of the observations, in µs."""
        return float(self.data[-1])

    def cumulative(self) -> list[tuple[float, float]]:
        """Prometheus buckets: ``[(le, observations <= le), ..., (inf, count)]``, ``le`` in µs."""
        counts = np.cumsum(self.data[:-1])
        return [(float(b), float(n)) for b, n in zip(LATENCY_BUCKETS_US, counts)] + [(math.inf, float(counts[-1]))]


def mean_latency_us(data: np.ndarray) -> float | None:
    """Mean latency in µs of histogram states ``data``; ``None`` if empty.

    ``data`` has shape ``(..., LatencyHistogram.SIZE)``; all its states are summed (e.g. the
    difference of two snapshots gives the mean over that interval).
    """
    count = data[..., :-1].sum()
    return float(data[..., -1].sum() / count) if count > 0 else None


class StepLatency:
    """Per-``step()`` latency of a vector env, physics vs task math, in µs.

    Args:
        out: float64 array of shape ``(2 * LatencyHistogram.SIZE,)`` holding both histograms
            (physics first); see :class:`LatencyHistogram`. Default: a new zeroed array.

    Raises:
        ValueError: ``out`` is not a float64 array of shape ``(SIZE,)``.
    """

    SIZE = 2 * LatencyHistogram.SIZE
    #: where each histogram lies in :attr:`data`.
    PHYSICS = slice(0, LatencyHistogram.SIZE)
    TASK = slice(LatencyHistogram.SIZE, SIZE)

    def __init__(self, out: np.ndarray | None = None) -> None:
        """Bind both histograms to ``out`` or a new zeroed array (arguments: see the class docstring)."""
        self.data = _state_array(out, self.SIZE)
        self.physics = LatencyHistogram(self.data[self.PHYSICS])
        self.task = LatencyHistogram(self.data[self.TASK])
