"""The replay segment's header table: the int64 fields every process reads and writes under the header lock.

The ring (:mod:`~unilab_gym.replay.ring`) and its subclasses (:mod:`~unilab_gym.replay.sampling`,
:mod:`~unilab_gym.replay.storage`, :mod:`~unilab_gym.replay.linking`) address the header through these names, as
the protocol in :mod:`~unilab_gym.replay.ring` describes; the layout record (:func:`layout_record`) is the JSON
that lets :meth:`~unilab_gym.replay.ring.ReplayRing.attach` check the whole layout. A table of names, as
:mod:`unilab_gym.runtime.counters` is for the collectors' counters.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping
from typing import Any

from unilab_gym.replay.layout import ReplayLayout

__all__ = [
    "CAPACITY",
    "CLOSED",
    "COMMITTED",
    "EVICTED",
    "FINAL_HEAD",
    "FLOOR",
    "FORMAT_VERSION",
    "GENERATION",
    "HEAD",
    "HEADER_BYTES",
    "HEADER_INTS",
    "MAGIC",
    "MAGIC_NUMBER",
    "MAX_SLOTS",
    "OWNER_CHECK_EVERY",
    "OWNER_PID",
    "OWNER_PIDNS",
    "PREAMBLE",
    "RECORD_BYTES",
    "SLOT_ABORTED",
    "SLOT_FREE",
    "SLOT_PID",
    "SLOT_START",
    "SLOT_STATE",
    "SLOT_STOP",
    "SLOT_WRITING",
    "VERSION",
    "WIDTH",
    "describe_field",
    "layout_mismatch",
    "layout_record",
]

# ---- the header table: int64 indices into the segment's header -------------------------------------------------
# The ring's subclasses (sampling.py, storage.py, linking.py) read and write the header through these names, under
# the header lock, as the protocol above says. Layout: a preamble of PREAMBLE int64 fields, then the slot table.
#: the segment's magic number: "UNILABRP" in ASCII.
MAGIC_NUMBER = 0x554E494C41425250
#: the segment format's version (2: owner pid and layout record).
FORMAT_VERSION = 2
#: preamble fields: the magic number, the format version, the ring's capacity (rows) and row width (bytes).
MAGIC, VERSION, CAPACITY, WIDTH = range(4)
#: rows ever reserved (the next sequence number), rows ever committed, the generation (bumped when the ring's
#: contents are replaced by a restore: samplers in flight redraw), and the owner's closed flag.
HEAD, COMMITTED, GENERATION, CLOSED = range(4, 8)
#: the owner's pid and pid namespace (attachers check its liveness), and the layout record's length in bytes.
OWNER_PID, OWNER_PIDNS, RECORD_BYTES = range(8, 11)
#: optimized layouts (:mod:`~unilab_gym.replay.linking`): side-table entries ever written (the next one), the
#: retirement floor (rows below it are retired: an episode end of theirs left the side table) and the side
#: entries overwritten while their row was still in the ring.
FINAL_HEAD, FLOOR, EVICTED = 11, 12, 13
#: int64 fields before the slot table (14 and 15 are free).
PREAMBLE = 16
MAX_SLOTS = 32  #: reservations that may be in flight at once (writers x threads)
#: a slot's state: free, being written by a live writer, abandoned (its rows are never sampled).
SLOT_FREE, SLOT_WRITING, SLOT_ABORTED = 0, 1, 2
#: the slot table: four contiguous int64[MAX_SLOTS] columns after the preamble; slot ``i``'s state is at
#: ``SLOT_STATE + i``, its range ``[start, stop)`` of sequence numbers at ``SLOT_START + i`` / ``SLOT_STOP + i``,
#: its writer's pid at ``SLOT_PID + i``.
SLOT_STATE, SLOT_START, SLOT_STOP, SLOT_PID = (PREAMBLE + k * MAX_SLOTS for k in range(4))
#: int64 values of the header.
HEADER_INTS = PREAMBLE + 4 * MAX_SLOTS
#: bytes of the header: 1152, a multiple of 64 (the block after it is cache-line aligned).
HEADER_BYTES = 8 * HEADER_INTS

#: attachers check the owner's liveness every this many adds / reserves / samples.
OWNER_CHECK_EVERY = 64


def layout_record(layout: ReplayLayout, capacity: int) -> bytes:
    """The JSON record of ``capacity`` and ``layout.fields`` stored at the end of the segment."""
    fields = [[name, list(shape), dtype] for name, shape, dtype in layout.fields]
    record: dict[str, Any] = {"capacity": capacity, "fields": fields}
    if layout.final_obs:
        record["final_obs"] = layout.final_obs
    return json.dumps(record, separators=(",", ":")).encode()


def describe_field(field: Any) -> str:
    """A layout record's field ``[name, shape, dtype]`` in words, for error messages."""
    if field is None:
        return "no field"
    try:
        name, shape, dtype = field
        return f"{name!r} of shape {tuple(shape)} {dtype}"
    except (TypeError, ValueError):
        return repr(field)


def layout_mismatch(record: Mapping[str, Any], layout: ReplayLayout, capacity: int) -> str | None:
    """The first difference between a segment's layout record and a handle, or ``None``."""
    fields = record.get("fields")
    if not isinstance(fields, list):
        return "the segment has no field list"
    wanted = [[name, list(shape), dtype] for name, shape, dtype in layout.fields]
    for i, (got, want) in enumerate(itertools.zip_longest(fields, wanted)):
        if got != want:
            parts = zip(("name", "shape", "dtype"), got or [None] * 3, want or [None] * 3)
            what = next((part for part, a, b in parts if a != b), "entry")
            return f"field {i} {what}: the segment has {describe_field(got)}, the handle {describe_field(want)}"
    if record.get("final_obs", 0) != layout.final_obs:
        return f"final_obs: the segment has {record.get('final_obs', 0)!r} side entries, the handle {layout.final_obs}"
    if record.get("capacity") != capacity:
        return f"capacity: the segment has {record.get('capacity')!r} rows, the handle {capacity}"
    return None
