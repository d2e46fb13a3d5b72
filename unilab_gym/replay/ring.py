"""The shared replay ring: one packed block of rows in POSIX shared memory, and its protocol.

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

This module is the base of the replay storage, in the pattern of SB3's ``buffers.py`` (a base
class and one subclass per variant):

- :class:`ReplayRing` (here): the segment, the header, and the reservation / commit protocol:
  which rows a writer may write, which rows a reader may take (the header lock and the pid
  checks are in :mod:`unilab_gym.replay.lock`);
- :class:`~unilab_gym.replay.sampling.SamplingRing`: uniform and status-weighted sampling of
  the valid set (optimistic concurrency, redraws);
- :class:`~unilab_gym.replay.storage.ReplayStorage`: typed, validated ``add`` of transitions, and
  the saved copy (:mod:`unilab_gym.replay.persistence` checks it);
- :class:`~unilab_gym.replay.linking.OptimizedReplayStorage`: the memory-optimized layout's
  next-observation links and side table. ``ReplayStorage(layout, capacity)`` (and
  ``ReplayStorage.attach``) return it for a layout with ``final_obs > 0``.
"""

from __future__ import annotations

import json
import os
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, NoReturn, Self

import numpy as np

from unilab_gym.replay.header import (
    CAPACITY,
    CLOSED,
    COMMITTED,
    EVICTED,
    FINAL_HEAD,
    FLOOR,
    FORMAT_VERSION,
    GENERATION,
    HEAD,
    HEADER_BYTES,
    HEADER_INTS,
    MAGIC,
    MAGIC_NUMBER,
    MAX_SLOTS,
    OWNER_CHECK_EVERY,
    OWNER_PID,
    OWNER_PIDNS,
    PREAMBLE,
    RECORD_BYTES,
    SLOT_ABORTED,
    SLOT_FREE,
    SLOT_PID,
    SLOT_START,
    SLOT_STATE,
    SLOT_STOP,
    SLOT_WRITING,
    VERSION,
    WIDTH,
    layout_mismatch,
    layout_record,
)
from unilab_gym.replay.layout import ReplayLayout
from unilab_gym.replay.lock import ReplayClosedError, ReplayOwnerGoneError, SegmentLock, pid_alive, pid_namespace
from unilab_gym.shm import DEFAULT_PREFIX, Segment
from unilab_gym.validation import check_positive_int, check_real

__all__ = ["ReplayClosedError", "ReplayHandle", "ReplayOwnerGoneError", "ReplayRing", "Reservation"]

_ALL_FREE = bytes(8 * MAX_SLOTS)  # the slot table's state column when no reservation is in flight
_LOCKED_WRITE_ROWS = 1024  # adds up to this many rows are written while holding the lock


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


def _flag_closed(header: memoryview, owner_pid: int) -> None:
    """Owner going away (close, garbage collection or exit): tell attached writers."""
    try:
        if os.getpid() == owner_pid:
            header[CLOSED] = 1
    finally:
        header.release()


class ReplayRing:
    """The ring of packed rows in one shared-memory segment, and its reserve / commit protocol.

    The base of the replay storage (see the module docstring for the protocol): it creates or
    attaches the segment, owns the header and its lock, hands out reservations
    (:meth:`reserve`, :meth:`commit`, :meth:`abort`), writes prepared columns in one lock hold
    (``_append``, for the subclasses' ``add``), and knows the valid set of rows that readers may
    take. It does not interpret rows: :class:`~unilab_gym.replay.storage.ReplayStorage` writes
    typed transitions, :class:`~unilab_gym.replay.sampling.SamplingRing` samples them.

    ``ReplayRing(layout, capacity)`` creates and **owns** a new segment; other processes call
    :meth:`attach` with :attr:`handle`. Only the owner unlinks the segment (on :meth:`close`,
    garbage collection or interpreter exit); attachers never do.

    Args:
        layout: column layout (see :class:`~unilab_gym.replay.layout.ReplayLayout`).
        capacity: number of rows (transitions), ``>= 1``.
        prefix: segment name prefix (the name is ``prefix`` + 16 hex digits).

    Raises:
        ValueError: on a bad capacity or layout.
        ~unilab_gym.shm.SharedMemoryFullError: (an ``OSError`` and a ``MemoryError``) if
            ``/dev/shm`` cannot back the segment; the message names the size, the free space and
            the fix (``docker run --shm-size=...`` or a smaller capacity / ``buffer_size``).
        OSError: if the segment cannot be created for another reason.
    """

    def __new__(cls, layout: ReplayLayout, capacity: int, *, prefix: str = DEFAULT_PREFIX) -> Self:
        """An object of the class that serves ``layout`` (see :meth:`_class_for`)."""
        return object.__new__(cls._class_for(layout))

    @classmethod
    def _class_for(cls, layout: Any) -> type[Self]:
        """The class whose objects serve ``layout``: ``cls`` here; a subclass may pick a variant."""
        return cls

    def __init__(self, layout: ReplayLayout, capacity: int, *, prefix: str = DEFAULT_PREFIX) -> None:
        """Create and own a new segment (arguments: see the class docstring)."""
        capacity = check_positive_int("capacity", capacity)
        if not isinstance(layout, ReplayLayout):
            raise ValueError(f"layout must be a ReplayLayout, got {type(layout).__name__}")
        record = layout_record(layout, capacity)
        size = HEADER_BYTES + capacity * layout.row_nbytes + layout.side_nbytes + len(record)
        segment = Segment.create(size, prefix=prefix)
        try:
            segment.buf[segment.size - len(record) :] = record
            header = np.frombuffer(segment.buf, dtype=np.int64, count=HEADER_INTS)
            header[CAPACITY], header[WIDTH], header[RECORD_BYTES] = capacity, layout.width, len(record)
            header[OWNER_PID], header[OWNER_PIDNS] = os.getpid(), pid_namespace()
            header[VERSION] = FORMAT_VERSION
            header[MAGIC] = MAGIC_NUMBER
            del header
        except BaseException:
            segment.close()
            raise
        self._setup(segment, layout, capacity)
        self._on_reset()

    @classmethod
    def attach(cls, handle: ReplayHandle, *, read_only: bool = False) -> Self:
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
            if segment.size < HEADER_BYTES:
                raise ValueError(f"{prefix}: it has {segment.size} bytes, less than a replay header")
            header = np.frombuffer(segment.buf, dtype=np.int64, count=HEADER_INTS)
            magic, version, nrecord = int(header[MAGIC]), int(header[VERSION]), int(header[RECORD_BYTES])
            closed = bool(header[CLOSED])
            del header
            if magic != MAGIC_NUMBER:
                raise ValueError(f"{prefix}: it is not a unilab-gym replay segment")
            if version != FORMAT_VERSION:
                raise ValueError(f"{prefix}: format version {version}, this unilab-gym reads {FORMAT_VERSION}")
            if not 0 < nrecord <= segment.size - HEADER_BYTES:
                raise ValueError(f"{prefix}: its layout record is missing")
            try:
                record = json.loads(bytes(segment.buf[segment.size - nrecord :]))
            except ValueError:
                raise ValueError(f"{prefix}: its layout record is corrupted") from None
            mismatch = layout_mismatch(record, handle.layout, handle.capacity)
            if mismatch is not None:
                raise ValueError(f"{prefix}: {mismatch}")
            expected = HEADER_BYTES + handle.capacity * handle.layout.row_nbytes + handle.layout.side_nbytes + nrecord
            if segment.size != expected:
                raise ValueError(f"{prefix}: it has {segment.size} bytes, its layout needs {expected}")
            if closed:
                raise ReplayClosedError(f"shared replay segment {handle.name!r} was closed by its owner")
        except BaseException:
            segment.close()
            raise
        self = object.__new__(cls._class_for(handle.layout))
        self._setup(segment, handle.layout, handle.capacity)
        try:
            self._check_owner()
        except BaseException:
            self.close()
            raise
        return self

    def _setup(self, segment: Segment, layout: ReplayLayout, capacity: int) -> None:
        """Map the views of ``segment`` this object works through (subclasses add theirs)."""
        self._segment = segment
        self._read_only = segment.buf.readonly
        self._layout = layout
        self._capacity = capacity
        self._handle = ReplayHandle(segment.name, layout, capacity)
        self._header = np.frombuffer(segment.buf, dtype=np.int64, count=HEADER_INTS)
        table = self._header[PREAMBLE:].reshape(4, MAX_SLOTS)
        self._state, self._start, self._stop, self._spid = table  # numpy views: vector ops
        self._h = segment.buf[:HEADER_BYTES].cast("q")  # same ints, fast scalar access
        # the owner flags the segment closed before it is unlinked, however it goes away
        self._closer = (
            weakref.finalize(self, _flag_closed, segment.buf[:HEADER_BYTES].cast("q"), os.getpid())
            if segment.owner
            else None
        )
        self._block = np.frombuffer(
            segment.buf, dtype=layout.word_dtype, count=capacity * layout.width, offset=HEADER_BYTES
        ).reshape(capacity, layout.width)
        self._pid = os.getpid()
        self._owner_pid = int(self._header[OWNER_PID])
        self._owner_pid_visible = int(self._header[OWNER_PIDNS]) == pid_namespace()
        # attachers check the owner at their first add / sample, then every OWNER_CHECK_EVERY
        self._owner_countdown = 2**62 if segment.owner else 1
        self._lock = SegmentLock(segment)
        # per-field views of the whole block (flattened to (capacity, size) / (capacity,)): a write is
        # then one slice + one copy per field
        records = self._block.view(layout.dtype)[:, 0]
        self._fields = {name: records[name] for name, _, _ in layout.fields}
        scalars = ("reward", "terminated", "truncated")
        self._writes = {
            name: view if name in scalars else view.reshape(capacity, -1) for name, view in self._fields.items()
        }

    def _on_reset(self) -> None:
        """A new segment, or :meth:`reset` under the lock: subclasses clear their own header state."""

    def _release_views(self) -> None:
        """:meth:`close`: drop every view of the mapping (subclasses drop theirs, then call this)."""
        self._h.release()
        del self._h, self._header, self._state, self._start, self._stop, self._spid, self._block
        del self._fields, self._writes

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
        """The packed block itself, a zero-copy view.

        Shape ``(capacity, width)`` of :attr:`ReplayLayout.word_dtype` (float32 for an all-float32
        layout, else bytes).

        For reading and debugging: rows may be mid-write; use :meth:`sample` / :meth:`gather`
        for consistent rows. Drop every view before :meth:`close` so the mapping can be freed.
        """
        self._check_open()
        return self._block

    @property
    def reserved(self) -> int:
        """Rows ever reserved (``head``, the next sequence number)."""
        self._check_open()
        return self._h[HEAD]

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
            return max(0, self._h[HEAD] - self._capacity, self._h[FLOOR])

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
        return self._h[EVICTED]

    @property
    def committed(self) -> int:
        """Rows ever committed (a monotonic count; reset by :meth:`reset`)."""
        self._check_open()
        return self._h[COMMITTED]

    def __len__(self) -> int:
        """Number of rows that :meth:`sample` may return right now."""
        with self._lock:
            _, _, _, lengths = self._valid_intervals()
        return int(lengths.sum())

    def __repr__(self) -> str:
        """Class, name, role (owner / attached), capacity, width and reserved / committed counts."""
        state = "closed" if self.closed else f"reserved={self.reserved}, committed={self.committed}"
        role = "owner" if self.is_owner else "attached"
        kind = type(self).__name__
        return f"{kind}({self.name!r}, {role}, capacity={self.capacity}, width={self.layout.width}, {state})"

    def __getstate__(self) -> NoReturn:
        """Refuse pickling: send :attr:`handle` instead.

        Raises:
            TypeError: always.
        """
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
        tracker, or re-created). About 10 us; called every ``OWNER_CHECK_EVERY`` operations.
        """
        self._owner_countdown = OWNER_CHECK_EVERY
        pid = self._owner_pid
        if self._owner_pid_visible and not pid_alive(pid):
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
        head = self._h[SLOT_START + slot]
        return Reservation(head, n, slot, self._pieces(head % self._capacity, n))

    def _pieces(self, lo: int, n: int) -> tuple[tuple[int, int, int, int], ...]:
        cap = self._capacity
        if lo + n <= cap:
            return ((lo, lo + n, 0, n),)
        first = cap - lo
        return ((lo, cap, 0, first), (0, n - first, first, n))

    def _claim(self, n: int) -> int | str:
        """Under the lock: record ``[head, head + n)`` in a slot and advance head.

        Returns the slot, or a string saying why the rows cannot be taken yet.
        """
        h = self._h
        if h[CLOSED]:
            raise ReplayClosedError(f"shared replay segment {self.name!r} was closed by its owner")
        self._owner_countdown -= 1
        if self._owner_countdown <= 0:
            self._check_owner()
        head = h[HEAD]
        if self._state.tobytes() == _ALL_FREE:
            slot = 0  # fast path: no reservation in flight, no abandoned range
        else:
            got = self._reserve_slow(head, n)
            if isinstance(got, str):
                return got
            slot = got
        h[SLOT_START + slot], h[SLOT_STOP + slot], h[SLOT_PID + slot] = head, head + n, self._pid
        h[SLOT_STATE + slot] = SLOT_WRITING  # recorded before head moves (see module docstring)
        h[HEAD] = head + n
        return slot

    def _reserve_slow(self, head: int, n: int) -> int | str:
        """Under the lock, with slots in use: check conflicts, recycle slots, pick a free one."""
        state, start, stop, spid = self._state, self._start, self._stop, self._spid
        # A WRITING slot at or beyond head belongs to a writer killed inside reserve (it holds
        # the lock while doing so): nothing was written there.
        state[(state == SLOT_WRITING) & (start >= head)] = SLOT_FREE
        overwritten_below = head + n - self._capacity  # rows with seq < this get overwritten
        for i in np.flatnonzero((state == SLOT_WRITING) & (start < overwritten_below)):
            if pid_alive(int(spid[i])):
                return f"rows [{start[i]}, {stop[i]}) are still being written by pid {spid[i]}"
            state[i] = SLOT_ABORTED
        # ABORTED ranges that leave the window with this reservation are recycled.
        state[(state == SLOT_ABORTED) & (stop <= overwritten_below)] = SLOT_FREE
        free = np.flatnonzero(state == SLOT_FREE)
        if free.size:
            return int(free[0])
        for i in np.flatnonzero(state == SLOT_WRITING):
            if not pid_alive(int(spid[i])):
                state[i] = SLOT_ABORTED
        aborted = np.flatnonzero(state == SLOT_ABORTED)
        if aborted.size >= 2:
            # Merge the two closest abandoned ranges into one hole: the committed rows between
            # them are hidden until overwritten (fewer rows to sample, never a bad one).
            aborted = aborted[np.argsort(start[aborted], kind="stable")]
            k = int(np.argmin(start[aborted[1:]] - stop[aborted[:-1]]))
            keep, drop = aborted[k], aborted[k + 1]
            stop[keep] = max(stop[keep], stop[drop])
            state[drop] = SLOT_FREE
            return int(drop)
        return f"all {MAX_SLOTS} reservation slots are in use (too many concurrent writers)"

    def _check_in_flight(self, res: Reservation) -> None:
        h, i = self._h, res.slot
        if h[SLOT_STATE + i] != SLOT_WRITING or h[SLOT_START + i] != res.start or h[SLOT_STOP + i] != res.start + res.n:
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
            self._h[SLOT_STATE + res.slot] = SLOT_FREE
            self._h[COMMITTED] += res.n

    def abort(self, res: Reservation) -> None:
        """Give up ``res``: its rows are never sampled (until overwritten by later adds).

        :raises RuntimeError: if ``res`` is not in flight any more.
        """
        self._check_writable()
        with self._lock:
            self._check_in_flight(res)
            self._h[SLOT_STATE + res.slot] = SLOT_ABORTED

    def _write(self, res: Reservation, cols: list[tuple[np.ndarray, Any]]) -> None:
        n = res.n
        for r0, r1, s0, s1 in res.pieces:
            whole = s0 == 0 and s1 == n
            for view, src in cols:
                view[r0:r1] = src if whole or isinstance(src, float) else src[s0:s1]

    def _append(
        self, cols: list[tuple[Any, Any]], n: int, timeout: float, after: Callable[[int], None] | None = None
    ) -> int:
        """Reserve, write ``cols`` and commit; then call ``after(start)`` under the lock.

        ``cols`` is ``[(column view of the block, (n, ...) array or 0.0)]``; an optimized layout's
        ``after`` links the rows to their predecessors.
        """
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
                    start = h[SLOT_START + slot]
                    lo = start % self._capacity
                    try:
                        if lo + n <= self._capacity:
                            for view, src in cols:
                                view[lo : lo + n] = src
                        else:
                            self._write(Reservation(start, n, slot, self._pieces(lo, n)), cols)
                    except BaseException:
                        h[SLOT_STATE + slot] = SLOT_ABORTED
                        raise
                    h[SLOT_STATE + slot] = SLOT_FREE
                    h[COMMITTED] += n
                    if after is not None:
                        after(start)
                    return start
            # a live writer holds rows we would overwrite: wait for it outside the lock
        res = self.reserve(n, timeout=timeout)
        try:
            self._write(res, cols)
        except BaseException:
            self.abort(res)
            raise
        self.commit(res)
        if after is not None:
            with self._lock:
                after(res.start)
        return res.start

    # ---- the valid set ---------------------------------------------------------------------------
    def _valid_intervals(self) -> tuple[int, int, np.ndarray, np.ndarray]:
        """Under the lock: ``(generation, head, starts, lengths)`` of the valid set."""
        h = self._h
        head = h[HEAD]
        lo = max(0, head - self._capacity, h[FLOOR])
        if self._state.tobytes() == _ALL_FREE:
            return h[GENERATION], head, np.array([lo], np.int64), np.array([head - lo], np.int64)
        busy = self._state != SLOT_FREE
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
            h[GENERATION],
            head,
            np.asarray(starts, np.int64).reshape(-1),
            np.asarray(lengths, np.int64).reshape(-1),
        )

    # ---- state -------------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget every transition (counters to 0). Attached writers may keep adding.

        :raises RuntimeError: if a live writer has rows in flight.
        :raises PermissionError: if attached read-only.
        """
        self._check_writable()
        with self._lock:
            for i in np.flatnonzero(self._state == SLOT_WRITING):
                if pid_alive(int(self._spid[i])):
                    raise RuntimeError(
                        f"cannot reset replay {self.name!r}: pid {self._spid[i]} is writing rows "
                        f"[{self._start[i]}, {self._stop[i]})"
                    )
            self._header[PREAMBLE:] = 0
            self._header[HEAD] = 0
            self._header[COMMITTED] = 0
            self._header[GENERATION] += 1
            self._header[FINAL_HEAD] = 0
            self._header[FLOOR] = self._header[EVICTED] = 0
            self._on_reset()

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
            if h[HEAD] >= self._capacity:
                return
            if self._state.tobytes() != _ALL_FREE:
                raise RuntimeError(f"cannot fill replay {self.name!r}: reservations are in flight or abandoned")
            h[HEAD] = self._capacity
            h[COMMITTED] = self._capacity

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
        self._release_views()
        self._segment.close()

    def __enter__(self) -> Self:
        """Return the storage itself."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the storage (see :meth:`close`)."""
        self.close()
