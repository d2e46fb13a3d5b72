"""Transition status (HybridReplay): normal, terminated or truncated, and status-weighted draws.

Every row carries its status through its two flag fields: ``truncated`` (an episode cut by a time
limit) wins, then ``terminated`` (a true terminal state), else ``normal``. With status weights
``w``, a batch draws each committed transition with probability proportional to ``w[status]``, so
a status is drawn in proportion to ``w[status] * count[status]``. We draw by rejection: uniform
draws from the ring, each kept with probability ``w[status] / max(w)`` (von Neumann's acceptance-
rejection method), which needs no per-status index and so no extra bookkeeping in the writers.

Any weighting other than uniform changes the distribution the learner averages over, so it
biases the learning target (e.g. the Q-function fits a replay where falls are more frequent than
the policy makes them). Use it knowingly, e.g. to see rare falls more often early in training.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from unilab_gym.validation import check_real

__all__ = ["NORMAL", "STATUSES", "TERMINATED", "TRUNCATED", "check_status_weights", "status_of"]

#: status names, in the order of their codes
STATUSES = ("normal", "terminated", "truncated")
NORMAL, TERMINATED, TRUNCATED = 0, 1, 2


def status_of(terminated: np.ndarray, truncated: np.ndarray) -> np.ndarray:
    """Status codes of transitions from their flags.

    Args:
        terminated: ``(B,)`` 0/1 flags (any real dtype).
        truncated: ``(B,)`` 0/1 flags.

    Returns:
        ``(B,)`` int8: :data:`TRUNCATED` where ``truncated``, else :data:`TERMINATED` where
        ``terminated``, else :data:`NORMAL`.
    """
    out = np.where(np.asarray(terminated) != 0, TERMINATED, NORMAL).astype(np.int8)
    out[np.asarray(truncated) != 0] = TRUNCATED
    return out


def check_status_weights(weights: Any) -> np.ndarray | None:
    """Validate ``{"normal": w0, "terminated": w1, "truncated": w2}`` (missing keys weigh 1.0).

    Args:
        weights: ``None`` (uniform) or a mapping from status names to finite weights ``>= 0``.

    Returns:
        ``None`` for uniform weights, else a ``(3,)`` float64 array in :data:`STATUSES` order.

    Raises:
        ValueError: naming the key or value: not a mapping, an unknown status, a negative,
            NaN or infinite weight, or all weights zero.
    """
    if weights is None:
        return None
    if not isinstance(weights, Mapping):
        raise ValueError(f"status_weights must be None or a mapping {{status: weight}}, got {type(weights).__name__}")
    unknown = sorted(set(weights) - set(STATUSES))
    if unknown:
        raise ValueError(f"status_weights has unknown statuses {unknown}; the statuses are {list(STATUSES)}")
    out = np.array([check_real(f"status_weights[{s!r}]", weights.get(s, 1.0), minimum=0.0) for s in STATUSES])
    if not out.any():
        raise ValueError(f"status_weights are all zero: {dict(weights)}; nothing could be drawn")
    return None if (out == out[0]).all() else out
