"""The shared replay ring: one packed block of rows in POSIX shared memory.

Segment layout (one segment per storage)::

    [ header: 144 int64 (1152 bytes) | block: capacity x layout.row_nbytes bytes, C order | layout record ]

Each row holds every field of one transition at its byte offset, in its own dtype
(:class:`~unilab_gym.replay.layout.ReplayLayout`); an all-float32 layout is a
``(capacity, width)`` float32 array. A memory-optimized layout (``final_obs > 0``) stores each
observation once and keeps a side table of ``final_obs`` next observations after the block:
each writer links a row to its successor (the same stream's next row) under the lock once that
successor is committed, and :meth:`ReplayStorage.sample_fields` assembles next observations and
never returns a row whose next observation is unknown, overwritten or torn (see the layout's
docstring). ``ReplayStorage.attach(handle, read_only=True)`` maps the segment read-only for
samplers (several learners on one replay).

The layout record (JSON: capacity and :attr:`ReplayLayout.fields`, a few hundred bytes) lets
:meth:`ReplayStorage.attach` check the whole layout, not just the row width.

Every transition ever reserved gets a *sequence number* ``seq`` (0, 1, 2, ...); it lives in
row ``seq % capacity`` of the block. The header holds the shared counters:

- ``head``: the number of rows ever reserved (the next ``seq``);
- ``committed``: the number of rows ever committed;
- ``closed``: set by the owner before it unlinks the segment;
- ``owner pid`` (and its pid namespace): attachers check every 64th add / reserve / sample that
  the owner is alive and the name still resolves to their segment, else they raise
  :class:`ReplayOwnerGoneError` (a SIGKILLed owner cannot set ``closed``);
- a table of 32 *slots*, each ``(state, start, stop, pid)``: a range ``[start, stop)`` of
  sequence numbers that is being written (``WRITING``) or was abandoned (``ABORTED``: its
  writer died, or gave up).

Protocol (every header read and write happens under one lock, see below):

1. **Reserve** ``n`` rows: take ``[head, head + n)``, record it in a free slot as ``WRITING``
   (slot first, then ``head``, so a writer killed halfway leaves no unrecorded rows). These
   rows overwrite rows ``[head - capacity, head + n - capacity)``; if a live writer is still
   writing any of those, the reservation waits (up to ``timeout``): two writers never write
   the same row.
2. **Write** the rows: nobody else writes them, and no reader returns them.
3. **Commit**: free the slot and add ``n`` to ``committed``. The rows become visible at once,
   even if an earlier reservation of another writer is still being written.

:meth:`ReplayStorage.add` of at most 1024 rows does the three steps in one lock hold (one
``flock`` pair; the slot is still recorded before the write, for the crash and reader cases
below). Larger adds, and :meth:`~ReplayStorage.reserve` / :meth:`~ReplayStorage.commit` used
directly, write outside the lock.

A reader's *valid set* is ``[max(0, head - capacity), head)`` minus every slot range: rows
that are committed and not being overwritten. :meth:`ReplayStorage.sample` draws sequence
numbers uniformly from the valid set (seeded ``numpy.random.Generator``), gathers the rows
with one ``numpy.take`` from the packed block outside the lock, then re-reads ``head``: a
drawn row whose ``seq < head - capacity`` may have been overwritten during the copy, so it is
drawn again (optimistic concurrency: writers never wait for readers). Torn rows are never
returned.

Lock: ``fcntl.flock`` on the segment's file descriptor (each :class:`ReplayStorage` opens its
own), plus a ``threading.Lock`` for threads sharing one object. We chose it over a
``multiprocessing.Lock`` because (a) the kernel releases it when the holder dies, so a
SIGKILLed collector can never deadlock the others, and (b) it needs nothing but the segment
name, so :class:`ReplayHandle` stays a small frozen dataclass that pickles through any
``Queue``/``Pipe`` (a ``multiprocessing.Lock`` only travels through process-spawn arguments).
Its cost is two system calls per hold (about 1.5 us). The lock syscalls are also the memory
barriers that make rows written before a commit visible to readers after it.
A writer that died holding rows leaves a ``WRITING`` slot whose pid is gone: the next writer
that needs the slot or its rows marks it ``ABORTED`` (its rows are never sampled and are
recycled when overwritten). A storage object inherited through ``fork`` refuses to work
(its ``flock`` would be shared with the parent): attach again in the child.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import threading
import time
import warnings
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, NoReturn

import numpy as np

from unilab_gym.replay.integrity import data_checksum, verify_checksum
from unilab_gym.replay.layout import ReplayLayout
from unilab_gym.replay.status import status_of
from unilab_gym.shm import DEFAULT_PREFIX, Segment, SegmentNotFoundError
from unilab_gym.validation import check_int, check_positive_int, check_real, check_real_array

__all__ = [
    "MAX_SLOTS",
    "ReplayClosedError",
    "ReplayHandle",
    "ReplayOwnerGoneError",
    "ReplayStorage",
    "Reservation",
    "SegmentNotFoundError",
    "final_obs_capacity_for",
]

# ---- header layout (int64 indices) --------------------------------------------------------
_MAGIC_VALUE = 0x554E494C41425250  # "UNILABRP"
_VERSION_VALUE = 2  # 2: owner pid and layout record
_STATE_VERSION = 2  # of to_state(): 2 carries a checksum
_MAGIC, _VERSION, _CAPACITY, _WIDTH, _HEAD, _COMMITTED, _GENERATION, _CLOSED = range(8)
_OWNER_PID, _OWNER_PIDNS, _RECORD_BYTES, _FINAL_HEAD = range(8, 12)
# optimized layouts: rows below _FLOOR are retired (an episode end of theirs left the side table);
# _EVICTED counts the side entries overwritten while their row was still in the ring
_FLOOR, _EVICTED = 12, 13
_PREAMBLE = 16
MAX_SLOTS = 32  #: reservations that may be in flight at once (writers x threads)
_FREE, _WRITING, _ABORTED = 0, 1, 2
# slot table: four contiguous int64[MAX_SLOTS] columns after the preamble
_STATE, _START, _STOP, _PID = (_PREAMBLE + k * MAX_SLOTS for k in range(4))  # + slot index
_ALL_FREE = bytes(8 * MAX_SLOTS)
_HEADER_INTS = _PREAMBLE + 4 * MAX_SLOTS
_HEADER_BYTES = 8 * _HEADER_INTS  # 1152, a multiple of 64: the block is cache-line aligned

_MAX_SAMPLE_ROUNDS = 100
_OWNER_CHECK_EVERY = 64  # attachers check the owner's liveness every this many adds / samples
_LOCKED_WRITE_ROWS = 1024  # adds up to this many rows are written while holding the lock


class ReplayClosedError(RuntimeError):
    """The storage (or the segment behind it) has been closed."""


class ReplayOwnerGoneError(ReplayClosedError):
    """The process that owns the replay is gone (killed or exited without closing it).

    Raised to attached writers and readers: rows added now would never be read.
    """


@dataclass(frozen=True)
class ReplayHandle:
    """Everything another process needs to attach: picklable, a few hundred bytes.

    :ivar name: shared-memory segment name (``/dev/shm/<name>`` on Linux).
    :ivar layout: column layout of the block.
    :ivar capacity: number of rows (transitions) of the ring.
    """

    name: str
    layout: ReplayLayout
    capacity: int


class Reservation(NamedTuple):
    """Rows ``[start, start + n)`` (sequence numbers) reserved for one writer.

    :ivar start: first sequence number; row of ``seq`` is ``seq % capacity``.
    :ivar n: number of rows.
    :ivar slot: header slot that records the reservation.
    :ivar pieces: ``((row_lo, row_hi, src_lo, src_hi), ...)``: block rows ``[row_lo, row_hi)``
        receive input rows ``[src_lo, src_hi)``; two pieces when the range wraps.
    """

    start: int
    n: int
    slot: int
    pieces: tuple[tuple[int, int, int, int], ...]


def _pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] != b"Z"
    except (OSError, ValueError):  # no /proc (macOS): trust kill(0)
        return True


def _pid_namespace() -> int:
    """Inode of this process's pid namespace (0 where there is no ``/proc``)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _layout_record(layout: ReplayLayout, capacity: int) -> bytes:
    """The JSON record of ``capacity`` and ``layout.fields`` stored at the end of the segment."""
    fields = [[name, list(shape), dtype] for name, shape, dtype in layout.fields]
    record: dict[str, Any] = {"capacity": capacity, "fields": fields}
    if layout.final_obs:
        record["final_obs"] = layout.final_obs
    return json.dumps(record, separators=(",", ":")).encode()


def _describe(field: Any) -> str:
    if field is None:
        return "no field"
    try:
        name, shape, dtype = field
        return f"{name!r} of shape {tuple(shape)} {dtype}"
    except (TypeError, ValueError):
        return repr(field)


def _layout_mismatch(record: Mapping[str, Any], layout: ReplayLayout, capacity: int) -> str | None:
    """The first difference between a segment's layout record and a handle, or ``None``."""
    fields = record.get("fields")
    if not isinstance(fields, list):
        return "the segment has no field list"
    wanted = [[name, list(shape), dtype] for name, shape, dtype in layout.fields]
    for i, (got, want) in enumerate(itertools.zip_longest(fields, wanted)):
        if got != want:
            parts = zip(("name", "shape", "dtype"), got or [None] * 3, want or [None] * 3)
            what = next((part for part, a, b in parts if a != b), "entry")
            return f"field {i} {what}: the segment has {_describe(got)}, the handle {_describe(want)}"
    if record.get("final_obs", 0) != layout.final_obs:
        return f"final_obs: the segment has {record.get('final_obs', 0)!r} side entries, the handle {layout.final_obs}"
    if record.get("capacity") != capacity:
        return f"capacity: the segment has {record.get('capacity')!r} rows, the handle {capacity}"
    return None


def _checked_state(state: Any) -> tuple[ReplayLayout, int, int, int, np.ndarray, np.ndarray]:
    """Validate a :meth:`ReplayStorage.to_state` copy: ``(layout, capacity, head, committed, holes, rows)``.

    :raises ValueError: naming the first missing key, broken invariant or checksum mismatch.
    """
    what = "replay storage state"
    if not isinstance(state, Mapping):
        raise ValueError(f"a {what} must be a mapping, got {type(state).__name__}")
    missing = [k for k in ("version", "layout", "capacity", "head", "committed", "holes", "rows") if k not in state]
    if missing:
        raise ValueError(f"not a {what}: missing {missing}")
    if state["version"] != _STATE_VERSION:
        raise ValueError(
            f"{what} version {state['version']!r} is not {_STATE_VERSION} (version 1 copies carry no checksum: "
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
    parts: list[Any] = [layout.fields, capacity, head, committed, holes, rows]
    if layout.final_obs:
        side, final_head = state.get("side"), state.get("final_head")
        if not isinstance(side, np.ndarray) or side.dtype != np.uint8 or side.shape != (layout.side_nbytes,):
            raise ValueError(f"{what}: side must be a uint8 array of {layout.side_nbytes} bytes (optimized layout)")
        parts += [side, check_int(f"{what} final_head", final_head, minimum=0)]
        if "floor" in state:
            parts.append(check_int(f"{what} floor", state["floor"], minimum=0, maximum=head))
    verify_checksum(what, state.get("checksum"), *parts)
    return layout, capacity, head, committed, holes, rows


def final_obs_capacity_for(capacity: int, min_episode_length: int, streams: int) -> int:
    """Side-table size that never evicts an episode end whose row is still in the ring.

    ``ceil(capacity / min_episode_length) + 2 * streams``. Proof sketch: the entries written
    after row ``s``'s entry, before its slot is reused, belong to distinct rows: episode ends of
    rows newer than ``s`` (with ``s`` still in the ring they lie in ``capacity`` consecutive rows,
    in which each of the ``streams`` envs ends at most ``rows / min_episode_length + 1``
    episodes), plus at most one older row per stream that was still waiting for its successor.
    A next observation that is not its successor's (a reset without an episode end) counts as
    an episode end. The worst case, every row an episode end, is ``min_episode_length = 1``.

    Args:
        capacity: rows of the ring, ``>= 1``.
        min_episode_length: the shortest episode, in steps (transitions), ``>= 1``.
        streams: envs writing into the ring, all writers together (``n_envs`` of an SB3 buffer;
            every collector's envs under ``AsyncRunner``), ``>= 1``.

    Returns:
        The ``final_obs`` / ``final_obs_capacity`` that keeps every episode end of the ring.

    Raises:
        ValueError: if an argument is not a positive int (the message names it).
    """
    capacity = check_positive_int("capacity", capacity)
    length = check_positive_int("min_episode_length", min_episode_length)
    streams = check_positive_int("streams", streams)
    return -(-capacity // length) + 2 * streams


def _as_rows(name: str, value: Any, n: int, dim: int, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """Validate a ``(n, dim)`` real-valued array (``(n,)`` accepted when ``dim == 1``, and
    ``(n, *shape)`` when the field has that shape); returned as ``(n, dim)``."""
    arr = check_real_array(name, value)
    if arr.shape != (n, dim):
        if (dim == 1 and arr.shape == (n,)) or (shape is not None and arr.shape == (n, *shape)):
            return arr.reshape(n, dim)
        want = f"({n}, {dim})" if shape is None or shape == (dim,) else f"({n}, {dim}) or {(n, *shape)}"
        raise ValueError(f"{name} must have shape {want}, got {arr.shape}")
    return arr


def _as_column(name: str, value: Any, n: int) -> np.ndarray:
    """Validate a length-``n`` real-valued vector (``(n,)`` or ``(n, 1)``)."""
    arr = check_real_array(name, value)
    if arr.shape != (n,):
        if arr.shape == (n, 1):
            return arr.reshape(n)
        raise ValueError(f"{name} must have shape ({n},), got {arr.shape}")
    return arr


_LIVE_LOCKS: weakref.WeakSet = weakref.WeakSet()


def _mark_forked() -> None:
    for lock in list(_LIVE_LOCKS):
        lock.forked = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_mark_forked)


def _flag_closed(header: memoryview, owner_pid: int) -> None:
    """Owner going away (close, garbage collection or exit): tell attached writers."""
    try:
        if os.getpid() == owner_pid:
            header[_CLOSED] = 1
    finally:
        header.release()


class _SegmentLock:
    """``flock`` on the segment's own descriptor + a thread lock: the header lock.

    Holds no reference to the storage (so the storage is freed, and unlinked, by refcount).
    A lock inherited through ``fork`` refuses to work: its descriptor's ``flock`` would be
    shared with the parent.
    """

    __slots__ = ("__weakref__", "closed", "fd", "forked", "name", "thread_lock")

    def __init__(self, segment: Segment) -> None:
        self.name, self.fd, self.closed, self.forked = segment.name, segment.fd, False, False
        self.thread_lock = threading.Lock()
        _LIVE_LOCKS.add(self)

    def check(self) -> None:
        if self.closed:
            raise ReplayClosedError(f"replay storage {self.name!r} is closed")
        if self.forked:
            raise ReplayClosedError(
                f"replay storage {self.name!r} was inherited through fork; attach a new one "
                "in this process with ReplayStorage.attach(handle)"
            )

    def __enter__(self) -> None:
        if self.closed or self.forked:
            self.check()
        self.thread_lock.acquire()
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except BaseException:
            self.thread_lock.release()
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        finally:
            self.thread_lock.release()


class ReplayStorage:
    """A shared-memory ring of packed transitions; the framework-neutral core of the replay.

    ``ReplayStorage(layout, capacity)`` creates and **owns** a new segment; other processes
    call :meth:`attach` with :attr:`handle`. Only the owner unlinks the segment (on
    :meth:`close`, garbage collection or interpreter exit); attachers never do. See the module
    docstring for the commit / wrap-around protocol.

    :param layout: column layout (see :class:`~unilab_gym.replay.layout.ReplayLayout`).
    :param capacity: number of rows (transitions), ``>= 1``.
    :param prefix: segment name prefix (the name is ``prefix`` + 16 hex digits).
    :raises ValueError: on a bad capacity.
    :raises ~unilab_gym.shm.SharedMemoryFullError: (an ``OSError`` and a ``MemoryError``) if
        ``/dev/shm`` cannot back the segment; the message names the size, the free space and the
        fix (``docker run --shm-size=...`` or a smaller capacity / ``buffer_size``).
    :raises OSError: if the segment cannot be created for another reason.
    """

    def __init__(self, layout: ReplayLayout, capacity: int, *, prefix: str = DEFAULT_PREFIX) -> None:
        capacity = check_positive_int("capacity", capacity)
        if not isinstance(layout, ReplayLayout):
            raise ValueError(f"layout must be a ReplayLayout, got {type(layout).__name__}")
        record = _layout_record(layout, capacity)
        size = _HEADER_BYTES + capacity * layout.row_nbytes + layout.side_nbytes + len(record)
        segment = Segment.create(size, prefix=prefix)
        try:
            segment.buf[segment.size - len(record) :] = record
            header = np.frombuffer(segment.buf, dtype=np.int64, count=_HEADER_INTS)
            header[_CAPACITY], header[_WIDTH], header[_RECORD_BYTES] = capacity, layout.width, len(record)
            header[_OWNER_PID], header[_OWNER_PIDNS] = os.getpid(), _pid_namespace()
            header[_VERSION] = _VERSION_VALUE
            header[_MAGIC] = _MAGIC_VALUE
            del header
        except BaseException:
            segment.close()
            raise
        self._setup(segment, layout, capacity)
        if self._side is not None:
            self._side["tag"][:] = -1

    @classmethod
    def attach(cls, handle: ReplayHandle, *, read_only: bool = False) -> ReplayStorage:
        """Map the storage behind ``handle`` (zero copy) as a non-owner.

        The attacher may add and sample; it never unlinks the segment, and is not registered
        with a resource tracker (cpython #82300). It checks every 64th add / reserve / sample
        (and at once) that the owner process is alive and the name still resolves to the segment.

        With ``read_only=True`` the segment is opened and mapped read-only: the attacher may
        sample (several learners on one replay), and every write (``add``, ``reserve``,
        ``commit``, ``abort``, ``reset``, ``fill``) raises ``PermissionError``. It takes the
        header lock only to read; killed (even by SIGKILL), it leaves nothing behind: the kernel
        drops its ``flock`` and mapping, and the segment stays its owner's.

        :raises SegmentNotFoundError: if the segment does not exist (closed or never created).
        :raises ReplayClosedError: if its owner has closed it.
        :raises ReplayOwnerGoneError: if its owner process is gone.
        :raises ValueError: if ``handle`` is not a :class:`ReplayHandle` or does not match the
            segment: the message names the first mismatch of the full layout (field names,
            shapes, dtypes in :attr:`ReplayLayout.fields` order, then the capacity).
        """
        if not isinstance(handle, ReplayHandle):
            raise ValueError(f"attach needs a ReplayHandle, got {type(handle).__name__}")
        segment = Segment.attach(handle.name, read_only=read_only)
        try:
            prefix = f"shared replay segment {handle.name!r} does not match its handle"
            if segment.size < _HEADER_BYTES:
                raise ValueError(f"{prefix}: it has {segment.size} bytes, less than a replay header")
            header = np.frombuffer(segment.buf, dtype=np.int64, count=_HEADER_INTS)
            magic, version, nrecord = int(header[_MAGIC]), int(header[_VERSION]), int(header[_RECORD_BYTES])
            closed = bool(header[_CLOSED])
            del header
            if magic != _MAGIC_VALUE:
                raise ValueError(f"{prefix}: it is not a unilab-gym replay segment")
            if version != _VERSION_VALUE:
                raise ValueError(f"{prefix}: format version {version}, this unilab-gym reads {_VERSION_VALUE}")
            if not 0 < nrecord <= segment.size - _HEADER_BYTES:
                raise ValueError(f"{prefix}: its layout record is missing")
            try:
                record = json.loads(bytes(segment.buf[segment.size - nrecord :]))
            except ValueError:
                raise ValueError(f"{prefix}: its layout record is corrupted") from None
            mismatch = _layout_mismatch(record, handle.layout, handle.capacity)
            if mismatch is not None:
                raise ValueError(f"{prefix}: {mismatch}")
            expected = _HEADER_BYTES + handle.capacity * handle.layout.row_nbytes + handle.layout.side_nbytes + nrecord
            if segment.size != expected:
                raise ValueError(f"{prefix}: it has {segment.size} bytes, its layout needs {expected}")
            if closed:
                raise ReplayClosedError(f"shared replay segment {handle.name!r} was closed by its owner")
        except BaseException:
            segment.close()
            raise
        self = cls.__new__(cls)
        self._setup(segment, handle.layout, handle.capacity)
        try:
            self._check_owner()
        except BaseException:
            self.close()
            raise
        return self

    def _setup(self, segment: Segment, layout: ReplayLayout, capacity: int) -> None:
        self._segment = segment
        self._read_only = segment.buf.readonly
        self._layout = layout
        self._capacity = capacity
        self._handle = ReplayHandle(segment.name, layout, capacity)
        self._header = np.frombuffer(segment.buf, dtype=np.int64, count=_HEADER_INTS)
        table = self._header[_PREAMBLE:].reshape(4, MAX_SLOTS)
        self._state, self._start, self._stop, self._spid = table  # numpy views: vector ops
        self._h = segment.buf[:_HEADER_BYTES].cast("q")  # same ints, fast scalar access
        # the owner flags the segment closed before it is unlinked, however it goes away
        self._closer = (
            weakref.finalize(self, _flag_closed, segment.buf[:_HEADER_BYTES].cast("q"), os.getpid())
            if segment.owner
            else None
        )
        self._block = np.frombuffer(
            segment.buf, dtype=layout.word_dtype, count=capacity * layout.width, offset=_HEADER_BYTES
        ).reshape(capacity, layout.width)
        self._pid = os.getpid()
        self._side: np.ndarray | None = None
        self._evicted_seen = False  # this object's writes evicted a live side entry (warn once)
        self._evicted_warned = False
        if layout.final_obs:  # memory-optimized layout: the side table of next observations
            offset = _HEADER_BYTES + capacity * layout.row_nbytes
            self._side = np.frombuffer(segment.buf, dtype=layout.side_dtype, count=layout.final_obs, offset=offset)
            # per writer: its rows waiting for a successor, by stream id (see _pending_rows)
            self._pending: dict[str, np.ndarray] = {}
        self._owner_pid = int(self._header[_OWNER_PID])
        self._owner_pid_visible = int(self._header[_OWNER_PIDNS]) == _pid_namespace()
        # attachers check the owner at their first add / sample, then every _OWNER_CHECK_EVERY
        self._owner_countdown = 2**62 if segment.owner else 1
        self._lock = _SegmentLock(segment)
        # per-field views of the whole block (flattened to (capacity, size) / (capacity,)): a write is
        # then one slice + one copy per field
        records = self._block.view(layout.dtype)[:, 0]
        self._fields = {name: records[name] for name, _, _ in layout.fields}
        scalars = ("reward", "terminated", "truncated")
        self._writes = {
            name: view if name in scalars else view.reshape(capacity, -1) for name, view in self._fields.items()
        }
        obs_names = [layout.obs_field(k) for k, _, _ in layout.obs_spec]
        next_names = [layout.obs_field(k, next_obs=True) for k, _, _ in layout.obs_spec]
        extras = None
        if layout.extras:  # the extra groups are contiguous float32 columns
            start = layout.offset(layout.extras[0][0])
            raw = self._block.view(np.uint8)[:, start : start + 4 * layout.extra_dim]
            extras = raw.view(np.float32)
        w = self._writes
        self._cols = (
            w[obs_names[0]] if len(obs_names) == 1 else None,
            w[next_names[0]] if len(next_names) == 1 and next_names[0] in w else None,
            w["action"],
            w["reward"],
            w["terminated"],
            w["truncated"],
            extras,
        )

    # ---- properties -----------------------------------------------------------------------
    @property
    def handle(self) -> ReplayHandle:
        """Picklable handle for :meth:`attach` (send it through any Queue or Pipe)."""
        return self._handle

    @property
    def name(self) -> str:
        """Segment name (``/dev/shm/<name>`` on Linux)."""
        return self._handle.name

    @property
    def layout(self) -> ReplayLayout:
        """Column layout of the block."""
        return self._layout

    @property
    def capacity(self) -> int:
        """Number of rows (transitions) of the ring."""
        return self._capacity

    @property
    def is_owner(self) -> bool:
        """Whether this object created the segment (and unlinks it on close)."""
        return self._segment.owner

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has run on this object."""
        return self._segment.closed

    @property
    def read_only(self) -> bool:
        """Whether this object was attached with ``read_only=True`` (it may only sample)."""
        return self._read_only

    def _check_writable(self) -> None:
        if self._read_only:
            raise PermissionError(
                f"replay {self.name!r} is attached read-only: it may sample, not write; attach with "
                "read_only=False to add transitions"
            )

    @property
    def nbytes(self) -> int:
        """Bytes of shared memory: 1152-byte header + ``capacity * layout.width * 4`` + layout record."""
        return self._segment.size

    def field(self, name: str) -> np.ndarray:
        """Zero-copy view of one field of every row: ``(capacity, *shape)`` in the field's dtype.

        Row ``seq % capacity`` holds transition ``seq``. For reading and debugging (rows may be
        mid-write; use :meth:`sample` for consistent rows), and for SB3's public storage arrays.

        Raises:
            KeyError: if the layout has no field ``name`` (see :attr:`ReplayLayout.fields`).
        """
        self._check_open()
        if name not in self._fields:
            raise KeyError(f"no field {name!r}; layout has {list(self._fields)}")
        return self._fields[name]

    @property
    def block(self) -> np.ndarray:
        """The packed block itself, ``(capacity, width)`` of :attr:`ReplayLayout.word_dtype`
        (float32 for an all-float32 layout, else bytes), a zero-copy view.

        For reading and debugging: rows may be mid-write; use :meth:`sample` / :meth:`gather`
        for consistent rows. Drop every view before :meth:`close` so the mapping can be freed.
        """
        self._check_open()
        return self._block

    @property
    def reserved(self) -> int:
        """Rows ever reserved (``head``, the next sequence number)."""
        self._check_open()
        return self._h[_HEAD]

    @property
    def oldest(self) -> int:
        """The oldest sequence number that may be sampled: ``max(0, head - capacity, floor)``.

        ``floor`` is 0 unless the side table of a memory-optimized layout had to reuse an entry
        whose row was still in the ring. That row, and every older one, are then retired (never
        sampled again), so no episode end is ever dropped while transitions around it stay
        sampleable: terminal and truncated transitions keep their share of the samples, and the
        ring holds fewer rows (see :attr:`final_obs_evictions` and :func:`final_obs_capacity_for`).
        """
        with self._lock:
            return max(0, self._h[_HEAD] - self._capacity, self._h[_FLOOR])

    @property
    def final_obs_evictions(self) -> int:
        """Side-table entries (episode ends) reused while their row was still in the ring.

        0 when the side table is large enough (:func:`final_obs_capacity_for`). Each such
        eviction retired its row and all older ones (:attr:`oldest`); a ``RuntimeWarning``
        naming ``final_obs_capacity`` is raised once per storage object, by the writer that
        evicted and by the first sampler that meets retired rows. Always 0 for a plain layout;
        reset to 0 by :meth:`reset`.
        """
        self._check_open()
        return self._h[_EVICTED]

    @property
    def committed(self) -> int:
        """Rows ever committed (a monotonic count; reset by :meth:`reset`)."""
        self._check_open()
        return self._h[_COMMITTED]

    def __len__(self) -> int:
        """Number of rows that :meth:`sample` may return right now."""
        with self._lock:
            _, _, _, lengths = self._valid_intervals()
        return int(lengths.sum())

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"reserved={self.reserved}, committed={self.committed}"
        role = "owner" if self.is_owner else "attached"
        return f"ReplayStorage({self.name!r}, {role}, capacity={self.capacity}, width={self.layout.width}, {state})"

    def __getstate__(self) -> NoReturn:
        raise TypeError(
            "a ReplayStorage cannot be pickled: send `storage.handle` and call "
            "`ReplayStorage.attach(handle)` in the other process (or `to_state()` for a copy)"
        )

    # ---- locking ------------------------------------------------------------------------------
    def _check_open(self) -> None:
        self._lock.check()

    def _check_owner(self) -> None:
        """Attachers: raise :class:`ReplayOwnerGoneError` if the owner process is gone.

        Gone means: its pid no longer runs (or is a zombie), when it lives in our pid namespace,
        or the segment name no longer resolves to our segment (unlinked by the owner's resource
        tracker, or re-created). About 10 us; called every ``_OWNER_CHECK_EVERY`` operations.
        """
        self._owner_countdown = _OWNER_CHECK_EVERY
        pid = self._owner_pid
        if self._owner_pid_visible and not _pid_alive(pid):
            why = f"its process (pid {pid}) has exited"
        elif not self._segment.is_linked():
            why = "its segment was unlinked"
        else:
            return
        raise ReplayOwnerGoneError(
            f"the owner of shared replay {self.name!r} is gone: {why} without closing it (killed?). "
            "Nothing reads this replay any more: stop adding to it, and attach to a new replay's handle."
        )

    # ---- writing -------------------------------------------------------------------------------
    def reserve(self, n: int, *, timeout: float = 10.0) -> Reservation:
        """Reserve ``n`` rows for writing; pair with :meth:`commit` (or :meth:`abort`).

        Rows of live writers are never overwritten: if the ``n`` oldest rows are still being
        written, this waits up to ``timeout`` seconds. Reservations of dead writers are
        abandoned (their rows are never sampled).

        :param n: rows to reserve, ``1 <= n <= capacity``.
        :param timeout: seconds to wait for a conflicting live writer (or a free slot).
        :raises ValueError: if ``n`` is out of range, or ``timeout`` is negative, NaN or infinite.
        :raises TimeoutError: if a live writer held the rows (or all slots) for ``timeout`` s;
            the message names its pid.
        :raises ReplayClosedError: if this object or the segment's owner has closed it.
        :raises ReplayOwnerGoneError: (attachers) if the owner process is gone.
        """
        self._check_writable()
        n = check_positive_int("number of rows to reserve", n)
        timeout = check_real("timeout", timeout, minimum=0.0)
        if n > self._capacity:
            raise ValueError(f"cannot add {n} rows at once to a replay of capacity {self._capacity}")
        deadline = time.monotonic() + timeout
        pause = 5e-5
        while True:
            with self._lock:
                got = self._try_reserve(n)
            if isinstance(got, Reservation):
                return got
            if time.monotonic() >= deadline:
                raise TimeoutError(f"replay {self.name!r}: could not reserve {n} rows within {timeout} s: {got}")
            time.sleep(pause)  # another process must make progress; back off up to 1 ms
            pause = min(2 * pause, 1e-3)

    def _try_reserve(self, n: int) -> Reservation | str:
        """Under the lock: make the reservation, or return why it must wait."""
        slot = self._claim(n)
        if isinstance(slot, str):
            return slot
        head = self._h[_START + slot]
        return Reservation(head, n, slot, self._pieces(head % self._capacity, n))

    def _pieces(self, lo: int, n: int) -> tuple[tuple[int, int, int, int], ...]:
        cap = self._capacity
        if lo + n <= cap:
            return ((lo, lo + n, 0, n),)
        first = cap - lo
        return ((lo, cap, 0, first), (0, n - first, first, n))

    def _claim(self, n: int) -> int | str:
        """Under the lock: record ``[head, head + n)`` in a slot and advance head; return the
        slot, or a string saying why the rows cannot be taken yet."""
        h = self._h
        if h[_CLOSED]:
            raise ReplayClosedError(f"shared replay segment {self.name!r} was closed by its owner")
        self._owner_countdown -= 1
        if self._owner_countdown <= 0:
            self._check_owner()
        head = h[_HEAD]
        if self._state.tobytes() == _ALL_FREE:
            slot = 0  # fast path: no reservation in flight, no abandoned range
        else:
            got = self._reserve_slow(head, n)
            if isinstance(got, str):
                return got
            slot = got
        h[_START + slot], h[_STOP + slot], h[_PID + slot] = head, head + n, self._pid
        h[_STATE + slot] = _WRITING  # recorded before head moves (see module docstring)
        h[_HEAD] = head + n
        return slot

    def _reserve_slow(self, head: int, n: int) -> int | str:
        """Under the lock, with slots in use: check conflicts, recycle slots, pick a free one."""
        state, start, stop, spid = self._state, self._start, self._stop, self._spid
        # A WRITING slot at or beyond head belongs to a writer killed inside reserve (it holds
        # the lock while doing so): nothing was written there.
        state[(state == _WRITING) & (start >= head)] = _FREE
        overwritten_below = head + n - self._capacity  # rows with seq < this get overwritten
        for i in np.flatnonzero((state == _WRITING) & (start < overwritten_below)):
            if _pid_alive(int(spid[i])):
                return f"rows [{start[i]}, {stop[i]}) are still being written by pid {spid[i]}"
            state[i] = _ABORTED
        # ABORTED ranges that leave the window with this reservation are recycled.
        state[(state == _ABORTED) & (stop <= overwritten_below)] = _FREE
        free = np.flatnonzero(state == _FREE)
        if free.size:
            return int(free[0])
        for i in np.flatnonzero(state == _WRITING):
            if not _pid_alive(int(spid[i])):
                state[i] = _ABORTED
        aborted = np.flatnonzero(state == _ABORTED)
        if aborted.size >= 2:
            # Merge the two closest abandoned ranges into one hole: the committed rows between
            # them are hidden until overwritten (fewer rows to sample, never a bad one).
            aborted = aborted[np.argsort(start[aborted], kind="stable")]
            k = int(np.argmin(start[aborted[1:]] - stop[aborted[:-1]]))
            keep, drop = aborted[k], aborted[k + 1]
            stop[keep] = max(stop[keep], stop[drop])
            state[drop] = _FREE
            return int(drop)
        return f"all {MAX_SLOTS} reservation slots are in use (too many concurrent writers)"

    def _check_in_flight(self, res: Reservation) -> None:
        h, i = self._h, res.slot
        if h[_STATE + i] != _WRITING or h[_START + i] != res.start or h[_STOP + i] != res.start + res.n:
            raise RuntimeError(
                f"reservation of rows [{res.start}, {res.start + res.n}) in replay {self.name!r} is not "
                "in flight (already committed or aborted, abandoned as dead, or the replay was reset)"
            )

    def commit(self, res: Reservation) -> None:
        """Publish the rows of ``res``: :meth:`sample` may return them from now on.

        :raises RuntimeError: if ``res`` is not in flight any more.
        """
        self._check_writable()
        with self._lock:
            self._check_in_flight(res)
            self._h[_STATE + res.slot] = _FREE
            self._h[_COMMITTED] += res.n

    def abort(self, res: Reservation) -> None:
        """Give up ``res``: its rows are never sampled (until overwritten by later adds).

        :raises RuntimeError: if ``res`` is not in flight any more.
        """
        self._check_writable()
        with self._lock:
            self._check_in_flight(res)
            self._h[_STATE + res.slot] = _ABORTED

    def add(
        self,
        obs: Any,
        next_obs: Any,
        action: Any,
        reward: Any,
        terminated: Any,
        truncated: Any,
        extra: Any = None,
        *,
        timeout: float = 10.0,
        validate: bool = True,
        streams: Any = None,
    ) -> int:
        """Append ``n`` transitions: validate, reserve, write, commit.

        :param obs: ``(n, obs_dim)`` or ``(n, *shape)`` real numbers (cast to the field's dtype);
            for a Dict observation, a mapping ``{key: (n, *shape of the key)}`` with every key.
        :param next_obs: same as ``obs``: the observation after the action; at an episode end
            the last observation of the episode (not the reset one).
        :param action: ``(n, act_dim)`` or ``(n, *shape)`` (or ``(n,)`` if ``act_dim == 1``).
        :param reward: ``(n,)``.
        :param terminated: ``(n,)`` bool/0-1: true terminal state, cuts the bootstrap.
        :param truncated: ``(n,)`` bool/0-1: episode cut here (time limit), bootstrap kept.
        :param extra: ``None`` (extra columns set to 0), a ``(n, extra_dim)`` array, or a mapping
            ``{group name: (n, dim)}`` covering every extra group of the layout.
        :param timeout: see :meth:`reserve`.
        :param validate: ``False`` skips the shape and dtype checks, for callers that made them
            already (numpy arrays of exactly the shapes above, ``extra=None``). Bad input then
            fails inside the write; its rows are abandoned, never sampled. Ignored (always
            checked) for Dict and memory-optimized layouts.
        :param streams: memory-optimized layouts only: ``(n,)`` int ids of the env each row comes
            from, unique within the call (default ``0..n-1``). The row of stream ``s`` becomes the
            successor of this writer's previous row of stream ``s``: its ``obs`` is that row's
            next observation, if equal (else that next observation goes to the side table).
        :return: sequence number of the first row (rows are ``seq % capacity``).
        :raises ValueError: on a wrong shape or dtype (nothing is written), or
            ``n > capacity``.
        :raises ReplayClosedError: if this object or the segment's owner has closed it.
        :raises ReplayOwnerGoneError: (attachers, checked every 64th add) if the owner process
            is gone: the rows would never be read.
        """
        self._lock.check()
        self._check_writable()
        if not validate and self._cols[0] is not None and self._side is None:
            c = self._cols
            cols = [
                (c[0], obs),
                (c[1], next_obs),
                (c[2], action),
                (c[3], reward),
                (c[4], terminated),
                (c[5], truncated),
            ]
            if self._layout.extras:
                cols.append((c[6], 0.0))
            return self._append(cols, len(obs), timeout)
        L, w = self._layout, self._writes
        c_act, c_rew, c_term, c_trunc, c_extra = self._cols[2:]
        n = self._batch_size(obs)
        obs_cols, next_cols = self._obs_cols("obs", obs, n), self._obs_cols("next_obs", next_obs, n)
        links = None
        if self._side is not None:
            links = self._links(obs_cols, next_cols, terminated, truncated, streams, n)
            next_cols = []
        elif streams is not None:
            raise ValueError("streams is for memory-optimized layouts (final_obs > 0) only")
        cols = [*obs_cols, *next_cols] + ([(w["next"], 0.0)] if links is not None else [])
        cols += [
            (c_act, _as_rows("action", action, n, L.act_dim, L.act_spec[0])),
            (c_rew, _as_column("reward", reward, n)),
            (c_term, _as_column("terminated", terminated, n)),
            (c_trunc, _as_column("truncated", truncated, n)),
        ]
        if L.extras:
            if extra is None:
                cols.append((c_extra, 0.0))
            elif isinstance(extra, Mapping):
                names = [name for name, _ in L.extras]
                if set(extra) != set(names):
                    raise ValueError(f"extra must have exactly the groups {names}, got {sorted(extra)}")
                for name, dim in L.extras:
                    cols.append((w[name], _as_rows(f"extra[{name!r}]", extra[name], n, dim)))
            else:
                cols.append((c_extra, _as_rows("extra", extra, n, L.extra_dim)))
        elif extra is not None:
            raise ValueError("extra given, but the layout has no extra columns")
        start = self._append(cols, n, timeout, links)
        if self._evicted_seen and not self._evicted_warned:
            self._warn_evicted()
        return start

    def _warn_evicted(self) -> None:
        """Warn once per object that the side table retired rows early (see :attr:`oldest`)."""
        self._evicted_warned = True
        with self._lock:
            head, floor, evicted = self._h[_HEAD], self._h[_FLOOR], self._h[_EVICTED]
        F, cap = self._layout.final_obs, self._capacity
        window = max(0, head - max(head - cap, floor))
        warnings.warn(
            f"replay {self.name!r}: its side table (final_obs_capacity={F}) is full of episode ends whose rows "
            f"are still in the ring; so that no episode end is dropped, the oldest rows are retired with them "
            f"({evicted} ends so far; the ring samples {window} of its {cap} rows now). Episodes are shorter than "
            f"capacity / final_obs_capacity = {cap / F:.1f} steps: raise final_obs_capacity to at least "
            "final_obs_capacity_for(capacity, shortest episode length, envs) to keep the whole ring",
            RuntimeWarning,
            stacklevel=3,
        )

    def _batch_size(self, obs: Any) -> int:
        """``n`` of an ``add``: the leading size of ``obs`` (of its first key for a Dict layout)."""
        L = self._layout
        if L.is_dict:
            if not isinstance(obs, Mapping):
                raise ValueError(f"obs must be a mapping {{key: array}} for this Dict layout, got {type(obs).__name__}")
            obs = obs.get(L.obs_spec[0][0])
        arr = obs if type(obs) is np.ndarray else np.asarray(obs)
        if arr.ndim < 2 and not (arr.ndim == 1 and L.obs_dim == 1):
            raise ValueError(f"obs must have shape (n, {L.obs_dim}), got {arr.shape}")
        return arr.shape[0]

    def _obs_cols(self, base: str, value: Any, n: int) -> list[tuple[Any, np.ndarray]]:
        """Validated ``(write view, (n, size) array)`` pairs of the observation fields ``base``
        (``(obs field name, array)`` for ``next_obs`` of an optimized layout: it has no row field)."""
        L = self._layout
        if not L.is_dict:
            _, shape, _ = L.obs_spec[0]
            return [(self._writes.get(base, "obs"), _as_rows(base, value, n, L.obs_dim, shape))]
        keys = [k for k, _, _ in L.obs_spec]
        if not isinstance(value, Mapping) or set(value) != set(keys):
            got = sorted(value) if isinstance(value, Mapping) else type(value).__name__
            raise ValueError(f"{base} must be a mapping with exactly the keys {keys}, got {got}")
        out = []
        for key, shape, _ in L.obs_spec:
            name = f"{base}.{key}"
            arr = _as_rows(f"{base}[{key!r}]", value[key], n, int(np.prod(shape)), shape)
            out.append((self._writes.get(name, f"obs.{key}"), arr))
        return out

    def _write(self, res: Reservation, cols: list[tuple[np.ndarray, Any]]) -> None:
        n = res.n
        for r0, r1, s0, s1 in res.pieces:
            whole = s0 == 0 and s1 == n
            for view, src in cols:
                view[r0:r1] = src if whole or isinstance(src, float) else src[s0:s1]

    def _links(
        self, obs_cols: list[Any], next_cols: list[Any], terminated: Any, truncated: Any, streams: Any, n: int
    ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Optimized layouts: what :meth:`_link` needs, validated before anything is written."""
        L = self._layout
        names = [L.obs_field(k) for k, _, _ in L.obs_spec]
        dtypes = {L.obs_field(k): np.dtype(dt) for k, _, dt in L.obs_spec}
        obs = {name: np.asarray(arr, dtypes[name]) for name, (_, arr) in zip(names, obs_cols)}
        nxt = {name: np.asarray(arr, dtypes[name]) for name, (_, arr) in zip(names, next_cols)}
        done = (_as_column("terminated", terminated, n) != 0) | (_as_column("truncated", truncated, n) != 0)
        if streams is None:
            ids = np.arange(n, dtype=np.int64)
        else:
            ids = np.asarray(streams)
            if ids.shape != (n,) or ids.dtype.kind not in "iu" or (n and ids.min() < 0):
                raise ValueError(f"streams must be ({n},) integers >= 0, got {ids.dtype} {ids.shape}")
            ids = ids.astype(np.int64)
            if np.unique(ids).shape[0] != n:
                raise ValueError(f"streams must be unique within one add, got {ids.tolist()}")
        return ids, done, obs, nxt

    def _put_side(self, seqs: np.ndarray, values: Mapping[str, np.ndarray]) -> None:
        """Under the lock: store the next observations ``values[name][i]`` of rows ``seqs[i]`` in
        the next side entries (if more than the table holds, only the newest are kept).

        An entry is never lost while its row may still be sampled: when an overwritten entry
        (or a dropped one of this call) belongs to a row at or above the floor, the floor moves
        past that row, which retires it and every older row (see :attr:`ReplayStorage.oldest`).
        """
        side, h, F = self._side, self._h, self._layout.final_obs
        assert side is not None
        m = int(seqs.shape[0])
        if m == 0:
            return
        k0 = h[_FINAL_HEAD]
        h[_FINAL_HEAD] = k0 + m
        keep = slice(max(0, m - F), m)  # older ones would be overwritten at once
        slots = (k0 + np.arange(m, dtype=np.int64)[keep]) % F
        lost = np.concatenate([seqs[: keep.start], side["tag"][slots]])
        lost = lost[lost >= max(h[_HEAD] - self._capacity, h[_FLOOR])]
        if lost.shape[0]:  # episode ends whose rows are still in the ring: retire those rows
            h[_FLOOR] = int(lost.max()) + 1
            h[_EVICTED] += int(lost.shape[0])
            self._evicted_seen = True
        side["tag"][slots] = -1  # readers re-check the tag after copying: a torn entry is rejected
        for name, value in values.items():
            side[name][slots] = value[keep].reshape(-1, *side[name].shape[1:])
        side["tag"][slots] = seqs[keep]
        self._fields["next"][seqs[keep] % self._capacity] = -(slots + 1)

    def _link(self, start: int, links: tuple[np.ndarray, np.ndarray, dict[str, Any], dict[str, Any]]) -> None:
        """Under the lock, after rows ``[start, start + n)`` are written: point each stream's
        previous row at its successor (or at a side entry), and keep this add's rows pending."""
        ids, done, obs, nxt = links
        h, cap = self._h, self._capacity
        generation, oldest = h[_GENERATION], max(h[_HEAD] - cap, h[_FLOOR])
        seqs = start + np.arange(ids.shape[0], dtype=np.int64)
        pend = self._pending_rows(int(ids.max()) + 1)
        p = pend["seq"][ids]
        live = (p >= oldest) & (pend["generation"][ids] == generation) & (p >= 0)
        same = live.copy()
        for name, value in obs.items():
            same &= (pend[name][ids] == value.reshape(value.shape[0], -1)).all(axis=1)
        self._fields["next"][p[same] % cap] = (seqs - p)[same]
        other = live & ~same  # not the successor's observation (e.g. a reset in between): keep it aside
        if other.any():
            self._put_side(p[other], {name: pend[name][ids[other]] for name in obs})
        if done.any():
            self._put_side(seqs[done], {name: value[done] for name, value in nxt.items()})
        pend["seq"][ids] = np.where(done, -1, seqs)
        pend["generation"][ids] = generation
        for name, value in nxt.items():
            pend[name][ids] = value.reshape(value.shape[0], -1)

    def _pending_rows(self, streams: int) -> dict[str, np.ndarray]:
        """This writer's rows waiting for a successor, by stream id: ``seq`` (-1: none),
        ``generation``, and each observation field's next observation (grown on demand)."""
        pend = self._pending
        if pend and pend["seq"].shape[0] >= streams:
            return pend
        size = max(streams, 2 * pend["seq"].shape[0] if pend else 0)
        grown: dict[str, np.ndarray] = {
            "seq": np.full(size, -1, np.int64),
            "generation": np.zeros(size, np.int64),
        }
        for key, shape, dt in self._layout.obs_spec:
            grown[self._layout.obs_field(key)] = np.zeros((size, int(np.prod(shape))), dt)
        for name, value in pend.items():
            grown[name][: value.shape[0]] = value
        self._pending = grown
        return grown

    def _append(self, cols: list[tuple[Any, Any]], n: int, timeout: float, links: Any = None) -> int:
        """Reserve, write ``cols`` (``[(column view of the block, (n, ...) array or 0.0)]``), commit
        (and, for an optimized layout, link the rows to their predecessors)."""
        if n == 0:
            return self.reserved
        if n > self._capacity:
            raise ValueError(f"cannot add {n} rows at once to a replay of capacity {self._capacity}")
        if n <= _LOCKED_WRITE_ROWS:
            # Small adds: reserve, write and commit in one lock hold (one flock pair). The slot
            # is recorded and head advanced before the write, so a writer killed mid-write still
            # leaves an abandoned range, and lock-free readers still see their rows overwritten.
            h = self._h
            with self._lock:
                slot = self._claim(n)
                if isinstance(slot, int):
                    start = h[_START + slot]
                    lo = start % self._capacity
                    try:
                        if lo + n <= self._capacity:
                            for view, src in cols:
                                view[lo : lo + n] = src
                        else:
                            self._write(Reservation(start, n, slot, self._pieces(lo, n)), cols)
                    except BaseException:
                        h[_STATE + slot] = _ABORTED
                        raise
                    h[_STATE + slot] = _FREE
                    h[_COMMITTED] += n
                    if links is not None:
                        self._link(start, links)
                    return start
            # a live writer holds rows we would overwrite: wait for it outside the lock
        res = self.reserve(n, timeout=timeout)
        try:
            self._write(res, cols)
        except BaseException:
            self.abort(res)
            raise
        self.commit(res)
        if links is not None:
            with self._lock:
                self._link(res.start, links)
        return res.start

    # ---- reading -------------------------------------------------------------------------------
    def _valid_intervals(self) -> tuple[int, int, np.ndarray, np.ndarray]:
        """Under the lock: ``(generation, head, starts, lengths)`` of the valid set."""
        h = self._h
        head = h[_HEAD]
        lo = max(0, head - self._capacity, h[_FLOOR])
        if self._state.tobytes() == _ALL_FREE:
            return h[_GENERATION], head, np.array([lo], np.int64), np.array([head - lo], np.int64)
        busy = self._state != _FREE
        holes = np.stack([self._start[busy], self._stop[busy]], axis=1)
        np.clip(holes, lo, head, out=holes)
        holes = holes[np.argsort(holes[:, 0], kind="stable")]
        starts, lengths = [], []
        cursor = lo
        for s, e in holes:
            if s > cursor:
                starts.append(cursor)
                lengths.append(s - cursor)
            cursor = max(cursor, e)
        if head > cursor:
            starts.append(cursor)
            lengths.append(head - cursor)
        return (
            h[_GENERATION],
            head,
            np.asarray(starts, np.int64).reshape(-1),
            np.asarray(lengths, np.int64).reshape(-1),
        )

    def sample_indices(self, batch_size: int, rng: np.random.Generator) -> np.ndarray:
        """Draw ``batch_size`` sequence numbers uniformly (with replacement) from the valid set.

        The rows ``seq % capacity`` are committed at the time of the call; gather them with
        :meth:`gather`, then check :meth:`overwritten` (or use :meth:`sample`, which does both).

        :param batch_size: number of draws, ``>= 1``.
        :param rng: the generator to draw from (e.g. ``np.random.default_rng(seed)``).
        :return: ``(batch_size,)`` int64 sequence numbers.
        :raises ValueError: if ``batch_size < 1`` or no row is committed.
        """
        return self._draw(batch_size, rng)[1]

    def _draw(self, batch_size: int, rng: np.random.Generator) -> tuple[int, np.ndarray]:
        batch_size = check_positive_int("batch_size", batch_size)
        if not isinstance(rng, np.random.Generator):
            raise ValueError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
        with self._lock:
            self._owner_countdown -= 1
            if self._owner_countdown <= 0:
                self._check_owner()
            generation, head, starts, lengths = self._valid_intervals()
        total = int(lengths.sum())
        if total == 0:
            raise ValueError(
                f"cannot sample from replay {self.name!r}: no committed transition yet "
                f"({head} reserved, none committed and not being overwritten)"
            )
        u = rng.integers(0, total, size=batch_size, dtype=np.int64)
        if starts.size == 1:
            return generation, u + starts[0]
        ends = np.cumsum(lengths)
        k = np.searchsorted(ends, u, side="right")
        return generation, u - (ends[k] - lengths[k]) + starts[k]

    def gather(self, seq: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Copy the rows of sequence numbers ``seq`` out of the block (one ``numpy.take``).

        :param seq: ``(B,)`` int sequence numbers (from :meth:`sample_indices`).
        :param out: optional ``(B, width)`` C-contiguous array of :attr:`ReplayLayout.word_dtype`
            to fill.
        :return: ``(B, width)`` rows (``out`` if given; split them with
            :meth:`ReplayLayout.unpack`). Rows whose sequence number is flagged by
            :meth:`overwritten` right after this call may be torn.
        """
        self._check_open()
        rows = np.asarray(seq, dtype=np.int64) % self._capacity
        if out is None:
            return self._block.take(rows, axis=0)
        if out.shape != (rows.shape[0], self._layout.width) or out.dtype != self._block.dtype:
            raise ValueError(
                f"out must be a ({rows.shape[0]}, {self._layout.width}) {self._block.dtype} array, "
                f"got {out.shape} {out.dtype}"
            )
        # rows are in range by construction: mode="clip" skips numpy's buffered bounds check
        return np.take(self._block, rows, axis=0, out=out, mode="clip")

    def overwritten(self, seq: np.ndarray, generation: int | None = None) -> np.ndarray:
        """Which of ``seq`` have been (or are being) overwritten since they were drawn.

        Call it after :meth:`gather`: a row is safe iff its sequence number is still inside
        the ring (``seq >= head - capacity``) and the replay was not reset.

        :return: ``(B,)`` bool mask.
        """
        seq = np.asarray(seq, dtype=np.int64)
        with self._lock:
            head = self._h[_HEAD]
            current = self._h[_GENERATION]
        if generation is not None and generation != current:
            return np.ones(seq.shape, dtype=bool)
        return seq < head - self._capacity

    def sample(
        self, batch_size: int, rng: np.random.Generator, out: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Uniformly sample committed transitions; never returns a torn or half-written row.

        :param batch_size: ``B >= 1``.
        :param rng: seeded generator (``np.random.default_rng(seed)``).
        :param out: optional ``(B, width)`` array of :attr:`ReplayLayout.word_dtype` to gather
            into (e.g. the numpy view of a torch tensor, see
            :class:`~unilab_gym.replay.torch_sampler.TorchSampler`).
        :return: ``(seq, rows)``: ``(B,)`` int64 sequence numbers and ``(B, width)`` rows; use
            :attr:`layout` slices (float32 layouts) or :meth:`ReplayLayout.unpack` to split them.
        :raises ValueError: if ``batch_size < 1`` or nothing is committed yet.
        :raises ReplayOwnerGoneError: (attachers, checked every 64th sample) if the owner
            process is gone.
        :raises RuntimeError: if writers overwrote the drawn rows 100 times in a row (a ring far
            too small for its write rate).
        """
        generation, seq = self._draw(batch_size, rng)
        out = self.gather(seq, out)
        for _ in range(_MAX_SAMPLE_ROUNDS):
            bad = self.overwritten(seq, generation)
            if not bad.any():
                return seq, out
            # redraw the rows that may be torn, from the current valid set
            generation, fresh = self._draw(int(bad.sum()), rng)
            seq = seq.copy()
            seq[bad] = fresh
            if bad.all():
                self.gather(seq, out)
            else:
                out[bad] = self._block.take(fresh % self._capacity, axis=0)
                # rows drawn before may have aged meanwhile: the loop re-checks all of them
        raise RuntimeError(
            f"replay {self.name!r}: rows were overwritten during {_MAX_SAMPLE_ROUNDS} sampling rounds; "
            "the capacity is far too small for the write rate"
        )

    def sample_fields(
        self, batch_size: int, rng: np.random.Generator, *, status_weights: np.ndarray | None = None
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Sample complete transitions, split into fields; never returns a torn row.

        Works for every layout. For a memory-optimized layout it also assembles each next
        observation (from the successor row or the side table) and draws only rows whose next
        observation is known: rows whose successor is not committed yet are redrawn.

        Args:
            batch_size: ``B >= 1``.
            rng: seeded generator.
            status_weights: ``None`` (uniform), or ``(3,)`` weights of the statuses normal,
                terminated, truncated (:func:`~unilab_gym.replay.status.check_status_weights`):
                each transition is drawn with probability proportional to its status's weight
                (rejection sampling, :mod:`unilab_gym.replay.status`).

        Returns:
            ``(seq, fields)``: ``(B,)`` int64 sequence numbers and ``{field name: (B, *shape)}``
            arrays in the fields' dtypes, with ``next_obs`` (``next_obs.<key>``) fields for every
            layout.

        Raises:
            ValueError: if ``batch_size < 1`` or nothing is committed yet.
            RuntimeError: after 100 rounds of redraws (no complete transition yet, or a ring far
                too small for its write rate), or 1000 rounds of status rejections (the weighted
                statuses are absent).
        """
        if status_weights is not None:
            return self._sample_weighted(batch_size, rng, np.asarray(status_weights, np.float64))
        if self._side is None:
            seq, rows = self.sample(batch_size, rng)
            return seq, self._layout.unpack(rows)
        generation, seq = self._draw(batch_size, rng)
        fields, check = self._transitions(seq)
        for _ in range(_MAX_SAMPLE_ROUNDS):
            bad = self._incomplete(seq, check, generation)
            if not bad.any():
                return seq, fields
            generation, fresh = self._draw(int(bad.sum()), rng)
            seq = seq.copy()
            seq[bad] = fresh
            again, check_again = self._transitions(fresh)
            for name, value in again.items():
                fields[name][bad] = value
            for part, value in zip(check, check_again):
                part[bad] = value
        raise RuntimeError(
            f"replay {self.name!r}: no complete transition in {_MAX_SAMPLE_ROUNDS} sampling rounds: the "
            "successors of the drawn rows are not committed yet (add more steps), or the ring is far too small"
        )

    def _sample_weighted(
        self, batch_size: int, rng: np.random.Generator, weights: np.ndarray
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Rejection sampling: uniform draws, each kept with probability ``weights[status] / max``."""
        accept = weights / weights.max()
        seqs: list[np.ndarray] = []
        parts: list[dict[str, np.ndarray]] = []
        need = check_positive_int("batch_size", batch_size)
        for _ in range(1000):
            seq, fields = self.sample_fields(max(need, 2 * need), rng)
            keep = rng.random(seq.shape[0]) < accept[status_of(fields["terminated"], fields["truncated"])]
            keep &= np.cumsum(keep) <= need  # the first `need` accepted draws: i.i.d. from the target
            seqs.append(seq[keep])
            parts.append({name: value[keep] for name, value in fields.items()})
            need -= int(keep.sum())
            if need == 0:
                return np.concatenate(seqs), {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
        raise RuntimeError(
            f"replay {self.name!r}: status_weights {weights.tolist()} rejected nearly every draw: the statuses "
            "with weight > 0 are (almost) absent from the replay"
        )

    def gather_fields(self, seq: Any) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """The transitions ``seq`` split into fields (next observations included), and which are usable.

        Args:
            seq: ``(B,)`` int sequence numbers (e.g. from :meth:`seq_of_rows`).

        Returns:
            ``(fields, ok)``: as :meth:`sample_fields`, and a ``(B,)`` bool mask, False where a
            transition was overwritten during the copy or (optimized layout) its next observation
            is not known yet or was evicted from the side table.
        """
        seq = np.asarray(seq, dtype=np.int64)
        with self._lock:
            generation = self._h[_GENERATION]
        if self._side is None:
            fields = self._layout.unpack(self.gather(seq))
            return fields, ~self.overwritten(seq, generation)
        fields, check = self._transitions(seq)
        return fields, ~self._incomplete(seq, check, generation)

    def _transitions(self, seq: np.ndarray) -> tuple[dict[str, np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Optimized layouts: copy rows ``seq`` and their next observations, lock-free.

        Returns the fields and ``(delta, slot, tag)``: the ``next`` values read, the side slots
        and the side tags read before the copy, for :meth:`_incomplete`.
        """
        L, cap, side = self._layout, self._capacity, self._side
        assert side is not None
        fields = dict(L.unpack(self._block.take(seq % cap, axis=0)))
        delta = fields.pop("next").astype(np.int64)
        succ, aside = delta > 0, delta < 0
        slot = np.where(aside, -delta - 1, 0)
        tag = side["tag"][slot]
        succ_rows = ((seq + delta) % cap)[succ]
        for key, shape, dt in L.obs_spec:
            name = L.obs_field(key)
            out = np.zeros((seq.shape[0], *shape), dt)
            out[succ] = self._fields[name][succ_rows]
            out[aside] = side[name][slot[aside]]
            fields[L.obs_field(key, next_obs=True)] = out
        return fields, (delta, slot, tag)

    def _incomplete(
        self, seq: np.ndarray, check: tuple[np.ndarray, np.ndarray, np.ndarray], generation: int
    ) -> np.ndarray:
        """Optimized layouts, after :meth:`_transitions`: which of ``seq`` must not be used."""
        delta, slot, tag = check
        side = self._side
        assert side is not None
        with self._lock:
            head, current, floor = self._h[_HEAD], self._h[_GENERATION], self._h[_FLOOR]
            now = self._fields["next"][seq % self._capacity]
            tag_now = side["tag"][slot]
        if current != generation:
            return np.ones(seq.shape, dtype=bool)
        if floor and not self._evicted_warned:
            self._warn_evicted()
        aside = delta < 0
        bad = (seq < max(head - self._capacity, floor)) | (delta == 0) | (now != delta)
        return bad | (aside & ((tag != seq) | (tag_now != seq)))

    def seq_of_rows(self, rows: Any) -> np.ndarray:
        """Sequence numbers of the committed transitions now stored in block rows ``rows``.

        :param rows: int row indices in ``[0, capacity)``.
        :return: int64 sequence numbers, same shape.
        :raises ValueError: if a row is out of range or holds no committed transition
            (never written, being written, or abandoned); the message names the first one.
        """
        rows = np.asarray(rows)
        if rows.dtype.kind not in "iu":
            raise ValueError(f"rows must be integers, got dtype {rows.dtype}")
        rows = rows.astype(np.int64)
        bad = (rows < 0) | (rows >= self._capacity)
        if bad.any():
            raise ValueError(f"row {int(rows[bad][0])} is out of range [0, {self._capacity})")
        with self._lock:
            _, head, starts, lengths = self._valid_intervals()
        cap = self._capacity
        # the newest seq stored in row r is the largest seq < head with seq % cap == r
        seq = rows + cap * ((head - 1 - rows) // cap)
        valid = np.zeros(seq.shape, dtype=bool)
        for s, n in zip(starts, lengths):
            valid |= (seq >= s) & (seq < s + n)
        if not valid.all():
            raise ValueError(f"row {int(rows[~valid].flat[0])} of replay {self.name!r} holds no committed transition")
        return seq

    # ---- state -------------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget every transition (counters to 0). Attached writers may keep adding.

        :raises RuntimeError: if a live writer has rows in flight.
        :raises PermissionError: if attached read-only.
        """
        self._check_writable()
        with self._lock:
            for i in np.flatnonzero(self._state == _WRITING):
                if _pid_alive(int(self._spid[i])):
                    raise RuntimeError(
                        f"cannot reset replay {self.name!r}: pid {self._spid[i]} is writing rows "
                        f"[{self._start[i]}, {self._stop[i]})"
                    )
            self._header[_PREAMBLE:] = 0
            self._header[_HEAD] = 0
            self._header[_COMMITTED] = 0
            self._header[_GENERATION] += 1
            self._header[_FINAL_HEAD] = 0
            self._header[_FLOOR] = self._header[_EVICTED] = 0
            if self._side is not None:
                self._side["tag"][:] = -1

    def fill(self) -> None:
        """Declare every row of the ring committed, as SB3's ``buffer.full = True`` does.

        Rows never written hold zeros (a new segment is zero-filled). The next add goes to
        sequence number ``capacity`` (row 0). A ring that has wrapped already is left as is.

        Raises:
            RuntimeError: if a reservation is in flight or was abandoned (its rows must not
                become valid).
            PermissionError: if attached read-only.
        """
        self._check_writable()
        with self._lock:
            h = self._h
            if h[_HEAD] >= self._capacity:
                return
            if self._state.tobytes() != _ALL_FREE:
                raise RuntimeError(f"cannot fill replay {self.name!r}: reservations are in flight or abandoned")
            h[_HEAD] = self._capacity
            h[_COMMITTED] = self._capacity

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Replace this storage's transitions, in place, with a copy made by :meth:`to_state`.

        Unlike :meth:`from_state` no new segment is made: handles stay valid, so attached writers
        (collectors) and readers keep working on the restored contents, as after :meth:`reset`
        (the generation counter moves on, so a reader's rows from before are seen as overwritten).
        The copy is checked as :meth:`from_state` checks it, and must have this storage's layout
        and capacity.

        :raises ValueError: if ``state`` is not such a copy, is corrupted, or has another layout or
            capacity; nothing changes.
        :raises RuntimeError: if a live writer has rows in flight (nothing changes; try again).
        :raises PermissionError: if attached read-only.
        """
        layout, capacity, head, committed, holes, rows = _checked_state(state)
        if layout != self._layout or capacity != self._capacity:
            raise ValueError(
                f"cannot load a replay state of layout {layout} and capacity {capacity} into replay {self.name!r} "
                f"(layout {self._layout}, capacity {self._capacity})"
            )
        self._check_writable()
        with self._lock:
            for i in np.flatnonzero(self._state == _WRITING):
                if _pid_alive(int(self._spid[i])):
                    raise RuntimeError(
                        f"cannot load into replay {self.name!r}: pid {self._spid[i]} is writing rows "
                        f"[{self._start[i]}, {self._stop[i]})"
                    )
            self._header[_PREAMBLE:] = 0  # the slot table: every slot free, then the copy's holes
            for slot, (lo, hi) in enumerate(holes):
                self._state[slot], self._start[slot], self._stop[slot], self._spid[slot] = _ABORTED, lo, hi, 0
            self._block[: rows.shape[0]] = rows
            self._header[_HEAD] = head
            self._header[_COMMITTED] = committed
            self._header[_GENERATION] += 1
            if self._side is not None:
                self._side.view(np.uint8)[:] = state["side"]
                self._header[_FINAL_HEAD] = int(state["final_head"])
                self._header[_FLOOR] = int(state.get("floor", 0))

    def to_state(self) -> dict[str, Any]:
        """A plain, picklable copy (no shared memory): layout, counters, holes, used rows, checksum.

        Taken under the lock (writers wait for the copy). Rows being written become holes of
        the copy. ``"checksum"`` is the SHA-256 of everything else
        (:func:`~unilab_gym.replay.integrity.data_checksum`); :meth:`from_state` verifies it.
        Restore with :meth:`from_state`.
        """
        with self._lock:
            head = int(self._header[_HEAD])
            committed = int(self._header[_COMMITTED])
            busy = self._state != _FREE
            holes = np.stack([self._start[busy], self._stop[busy]], axis=1)
            rows = self._block[: min(head, self._capacity)].copy()
            parts: list[Any] = [self._layout.fields, self._capacity, head, committed, holes, rows]
            state: dict[str, Any] = {}
            if self._side is not None:  # optimized layout: the side table of next observations too
                state["side"] = self._side.view(np.uint8).copy()
                state["final_head"] = int(self._header[_FINAL_HEAD])
                parts += [state["side"], state["final_head"]]
                if self._header[_FLOOR]:  # rows retired for the side table (absent: none)
                    state["floor"] = int(self._header[_FLOOR])
                    parts.append(state["floor"])
        return {
            "version": _STATE_VERSION,
            "layout": self._layout,
            "capacity": self._capacity,
            "head": head,
            "committed": committed,
            "holes": holes,
            "rows": rows,
            **state,
            "checksum": data_checksum(*parts),
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any], *, prefix: str = DEFAULT_PREFIX) -> ReplayStorage:
        """Create a new owned storage holding a copy made by :meth:`to_state`.

        Everything is checked before the segment is created: the keys and version, the layout,
        ``0 <= committed <= head``, ``rows`` an array of shape ``(min(head, capacity), layout.width)``
        and dtype ``layout.word_dtype`` (and the side table of an optimized layout), ``holes`` an
        int64 ``(k, 2)`` table of at most 32 ranges ``0 <= start < stop <= head``, and the checksum of all of it.

        :raises ValueError: if ``state`` is not such a copy, is inconsistent, or its checksum does
            not match (corrupted); the message names the first problem. Nothing is created.
        """
        layout, capacity, head, committed, holes, rows = _checked_state(state)
        self = cls(layout, capacity, prefix=prefix)
        try:
            self._block[: rows.shape[0]] = rows
            for i, (lo, hi) in enumerate(holes):
                self._state[i], self._start[i], self._stop[i], self._spid[i] = _ABORTED, lo, hi, 0
            self._header[_HEAD] = head
            self._header[_COMMITTED] = committed
            if self._side is not None:
                self._side.view(np.uint8)[:] = state["side"]
                self._header[_FINAL_HEAD] = int(state["final_head"])
                self._header[_FLOOR] = int(state.get("floor", 0))
        except BaseException:
            self.close()
            raise
        return self

    # ---- life cycle ------------------------------------------------------------------------------
    def close(self) -> None:
        """Unmap. The owner first marks the segment closed and unlinks it; idempotent.

        After the owner's close, attachers' adds raise :class:`ReplayClosedError` and new
        attaches raise :class:`SegmentNotFoundError`.
        """
        if self._segment.closed:
            return
        if self._closer is not None:
            self._closer()
        self._lock.closed = True
        # release our views of the mapping
        self._h.release()
        del self._h, self._header, self._state, self._start, self._stop, self._spid, self._block, self._cols
        del self._fields, self._writes
        self._side = None
        self._segment.close()

    def __enter__(self) -> ReplayStorage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
