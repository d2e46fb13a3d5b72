"""Checksums of saved replay data: a saved buffer carries one, and loading verifies it.

SHA-256 (``hashlib``) of each part in order: a numpy array contributes its dtype, shape and
bytes (C order), anything else its ``repr``. A flipped byte anywhere in the data, the counters
or the layout changes the checksum, so corrupted input is refused before it is used.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

__all__ = ["data_checksum", "verify_checksum"]

_ALGORITHM = "sha256"


def data_checksum(*parts: Any) -> str:
    """Checksum of ``parts``: ``"sha256:<64 hex digits>"``.

    Args:
        *parts: numeric numpy arrays (hashed as dtype, shape and C-order bytes) and plain values
            (hashed as their ``repr``: ints, strings, tuples of them).

    Returns:
        ``"sha256:"`` followed by the hex digest.
    """
    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, np.ndarray):
            arr = np.ascontiguousarray(part)
            h.update(f"ndarray{arr.dtype.str}{arr.shape}".encode())
            h.update(arr.reshape(-1).view(np.uint8).data)
        else:
            h.update(repr(part).encode())
        h.update(b"\0")
    return f"{_ALGORITHM}:{h.hexdigest()}"


def verify_checksum(what: str, expected: Any, *parts: Any) -> None:
    """Check that ``parts`` hash to ``expected`` (see :func:`data_checksum`).

    Args:
        what: what is being loaded, for the message (e.g. ``"replay storage state"``).
        expected: the checksum saved with the data.
        *parts: the loaded data, in the order it was hashed.

    Raises:
        ValueError: if ``expected`` is not a checksum string, or the data hashes to another
            value (the saved data is corrupted or was edited).
    """
    if not isinstance(expected, str) or not expected.startswith(f"{_ALGORITHM}:"):
        raise ValueError(f"{what} carries no {_ALGORITHM} checksum (got {expected!r}); it cannot be verified")
    actual = data_checksum(*parts)
    if actual != expected:
        raise ValueError(f"{what} is corrupted: its data hashes to {actual}, but it was saved with checksum {expected}")
