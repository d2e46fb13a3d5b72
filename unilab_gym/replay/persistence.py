"""Saved copies of a replay ring: the plain, picklable state and its checksum.

:meth:`~unilab_gym.replay.storage.ReplayStorage.to_state` takes a :class:`RingState` under the
lock and turns it into a dict with :func:`state_dict`; :meth:`~unilab_gym.replay.storage.ReplayStorage.from_state`
and :meth:`~unilab_gym.replay.storage.ReplayStorage.load_state` read one back with
:func:`checked_state`, which checks every key, invariant and the SHA-256 checksum
(:mod:`unilab_gym.replay.integrity`) before anything is written. Nothing here is unpickled: the
state is whatever mapping the caller holds.

The dict (version 2)::

    {"version": 2, "layout": ReplayLayout, "capacity": int, "head": int, "committed": int,
     "holes": int64 (k, 2), "rows": (min(head, capacity), width) of layout.word_dtype,
     ["side": uint8 (layout.side_nbytes,), "final_head": int, ["floor": int]],   # optimized layouts
     "checksum": "sha256:..."}

``floor`` is present only when rows were retired for the side table (see
:attr:`~unilab_gym.replay.ring.ReplayRing.oldest`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from unilab_gym.replay.header import MAX_SLOTS
from unilab_gym.replay.integrity import data_checksum, verify_checksum
from unilab_gym.replay.layout import ReplayLayout
from unilab_gym.validation import check_int, check_positive_int

__all__ = ["STATE_VERSION", "RingState", "checked_state", "state_dict"]

STATE_VERSION = 2  #: version of the saved state; 2 carries a checksum


class RingState(NamedTuple):
    """The contents of a ring: what a saved copy holds.

    Attributes:
        layout: the ring's layout.
        capacity: rows of the ring.
        head: rows ever reserved (the next sequence number).
        committed: rows ever committed, ``<= head``.
        holes: int64 ``(k, 2)`` ranges ``[start, stop)`` of sequence numbers never to be sampled
            (rows that were being written, or abandoned, when the copy was taken), ``k <= 32``.
        rows: the used rows of the block, ``(min(head, capacity), layout.width)`` of
            :attr:`~unilab_gym.replay.layout.ReplayLayout.word_dtype`.
        side: optimized layouts: the side table's bytes, uint8 ``(layout.side_nbytes,)``; else ``None``.
        final_head: optimized layouts: side entries ever written.
        floor: optimized layouts: rows below it are retired (0: none).
    """

    layout: ReplayLayout
    capacity: int
    head: int
    committed: int
    holes: np.ndarray
    rows: np.ndarray
    side: np.ndarray | None = None
    final_head: int = 0
    floor: int = 0


def _checksum_parts(saved: RingState, *, with_floor: bool) -> list[Any]:
    parts: list[Any] = [saved.layout.fields, saved.capacity, saved.head, saved.committed, saved.holes, saved.rows]
    if saved.side is not None:
        parts += [saved.side, saved.final_head]
        if with_floor:
            parts.append(saved.floor)
    return parts


def state_dict(saved: RingState) -> dict[str, Any]:
    """The plain, picklable copy of ``saved``, with its checksum (see the module docstring).

    Args:
        saved: the ring's contents, copied under its lock.

    Returns:
        The state dict: ``"checksum"`` is :func:`~unilab_gym.replay.integrity.data_checksum` of
        everything else; ``"side"``, ``"final_head"`` only for an optimized layout, ``"floor"``
        only when it is not 0.
    """
    extra: dict[str, Any] = {}
    if saved.side is not None:  # optimized layout: the side table of next observations too
        extra["side"], extra["final_head"] = saved.side, saved.final_head
        if saved.floor:  # rows retired for the side table (absent: none)
            extra["floor"] = saved.floor
    return {
        "version": STATE_VERSION,
        "layout": saved.layout,
        "capacity": saved.capacity,
        "head": saved.head,
        "committed": saved.committed,
        "holes": saved.holes,
        "rows": saved.rows,
        **extra,
        "checksum": data_checksum(*_checksum_parts(saved, with_floor=bool(saved.floor))),
    }


def checked_state(state: Any) -> RingState:
    """Validate a copy made by :func:`state_dict` (``ReplayStorage.to_state``).

    Args:
        state: the mapping to check.

    Returns:
        Its contents (the arrays are ``state``'s own, not copies).

    Raises:
        ValueError: naming the first missing key, wrong type, broken invariant
            (``0 <= committed <= head``, rows and holes shapes, at most 32 holes inside
            ``[0, head)``), or a checksum mismatch (the copy is corrupted or was edited).
    """
    what = "replay storage state"
    if not isinstance(state, Mapping):
        raise ValueError(f"a {what} must be a mapping, got {type(state).__name__}")
    missing = [k for k in ("version", "layout", "capacity", "head", "committed", "holes", "rows") if k not in state]
    if missing:
        raise ValueError(f"not a {what}: missing {missing}")
    if state["version"] != STATE_VERSION:
        raise ValueError(
            f"{what} version {state['version']!r} is not {STATE_VERSION} (version 1 copies carry no checksum: "
            "re-save them with this unilab-gym)"
        )
    layout = state["layout"]
    if not isinstance(layout, ReplayLayout):
        raise ValueError(f"{what}: layout must be a ReplayLayout, got {type(layout).__name__}")
    capacity = check_positive_int(f"{what} capacity", state["capacity"])
    head = check_int(f"{what} head", state["head"], minimum=0)
    committed = check_int(f"{what} committed", state["committed"], minimum=0)
    if committed > head:
        raise ValueError(f"{what} is inconsistent: committed = {committed} > head = {head} (rows ever reserved)")
    rows, holes = state["rows"], state["holes"]
    shape, word = (min(head, capacity), layout.width), layout.word_dtype
    if not isinstance(rows, np.ndarray) or rows.dtype != word or rows.shape != shape:
        got = f"{rows.dtype} {rows.shape}" if isinstance(rows, np.ndarray) else type(rows).__name__
        raise ValueError(f"{what}: rows must be a {word} array of shape {shape} (head {head}), got {got}")
    if not isinstance(holes, np.ndarray) or holes.dtype != np.int64 or holes.ndim != 2 or holes.shape[1] != 2:
        got = f"{holes.dtype} {holes.shape}" if isinstance(holes, np.ndarray) else type(holes).__name__
        raise ValueError(f"{what}: holes must be an int64 array of shape (k, 2), got {got}")
    if len(holes) > MAX_SLOTS:
        raise ValueError(f"{what} has {len(holes)} holes, at most {MAX_SLOTS} are supported")
    bad = (holes[:, 0] < 0) | (holes[:, 0] >= holes[:, 1]) | (holes[:, 1] > head)
    if bad.any():
        lo, hi = holes[bad][0]
        raise ValueError(f"{what}: hole [{lo}, {hi}) is not a range 0 <= start < stop <= head = {head}")
    saved = RingState(layout, capacity, head, committed, holes, rows)
    if layout.final_obs:
        side, final_head = state.get("side"), state.get("final_head")
        if not isinstance(side, np.ndarray) or side.dtype != np.uint8 or side.shape != (layout.side_nbytes,):
            raise ValueError(f"{what}: side must be a uint8 array of {layout.side_nbytes} bytes (optimized layout)")
        final_head = check_int(f"{what} final_head", final_head, minimum=0)
        floor = check_int(f"{what} floor", state["floor"], minimum=0, maximum=head) if "floor" in state else 0
        saved = saved._replace(side=side, final_head=final_head, floor=floor)
    verify_checksum(what, state.get("checksum"), *_checksum_parts(saved, with_floor="floor" in state))
    return saved
