"""POSIX shared-memory segments with one owner, and attachers that never unlink.

Ownership rules (why this module exists):

- The **owner** creates the segment (``shm_open(O_CREAT | O_EXCL)``) and registers it with its
  ``multiprocessing`` resource tracker, as ``SharedMemory(create=True)`` does. The owner unlinks it
  on :meth:`Segment.close`, when it is garbage collected, and at interpreter exit (also after an
  uncaught exception), through a :func:`weakref.finalize`. If the owner is killed (SIGKILL), its
  resource tracker unlinks the segment once every process sharing that tracker has exited
  (the tracker then prints a "leaked shared_memory objects" warning).
- An **attacher** opens the segment with ``shm_open`` directly and never registers it with a
  resource tracker. ``SharedMemory(name)`` would register it, and on Python 3.10-3.12 the
  tracker then unlinks the segment when the attaching process exits (cpython #82300).
  Registering and then unregistering is not a fix: a spawned child shares its parent's tracker,
  whose registry is a set, so the child's unregister would also erase the owner's
  registration (and with it the crash clean-up).

POSIX only (Linux, macOS): Windows named memory has no unlink and is not supported.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import weakref
from multiprocessing import resource_tracker

from unilab_gym.validation import check_positive_int

try:
    import _posixshmem
except ImportError:  # pragma: no cover - Windows
    _posixshmem = None

__all__ = ["DEFAULT_PREFIX", "Segment", "SegmentNotFoundError", "new_segment_name"]

DEFAULT_PREFIX = "unilab_"


class SegmentNotFoundError(FileNotFoundError):
    """The named shared-memory segment does not exist (closed by its owner, or never created)."""


def new_segment_name(prefix: str = DEFAULT_PREFIX) -> str:
    """A fresh segment name: ``prefix`` + 16 random hex digits (at most 31 chars for macOS)."""
    name = f"{prefix}{secrets.token_hex(8)}"
    if len(name) > 31 or "/" in name:
        raise ValueError(f"segment name prefix {prefix!r} is too long or contains '/'")
    return name


def _release(mm: mmap.mmap, view: memoryview, fd: int, unlink_name: str | None, owner_pid: int) -> None:
    """Unlink first (so no /dev/shm entry survives), then unmap and close the descriptor.

    Only the creating process unlinks: a process that inherited the owner through ``fork``
    just unmaps. If a numpy view of the mapping is still alive the unmap is left to the
    garbage collector (the mapping goes away with the last view); the name is gone anyway.
    """
    if unlink_name is not None and os.getpid() == owner_pid:
        try:
            _posixshmem.shm_unlink("/" + unlink_name)
        except FileNotFoundError:
            pass
        else:
            resource_tracker.unregister("/" + unlink_name, "shared_memory")
    try:
        view.release()
        mm.close()
    except BufferError:
        pass
    with contextlib.suppress(OSError):
        os.close(fd)


def _map(fd: int) -> tuple[mmap.mmap, int]:
    size = os.fstat(fd).st_size
    return mmap.mmap(fd, size), size


class Segment:
    """A mapped POSIX shared-memory segment.

    Use :meth:`create` (owner) or :meth:`attach` (attacher); do not call the constructor.

    :ivar name: segment name, without the leading ``/`` (on Linux: ``/dev/shm/<name>``).
    :ivar size: mapped size in bytes.
    :ivar buf: writable ``memoryview`` of the whole segment.
    :ivar fd: file descriptor of the segment, private to this object (usable with ``flock``).
    :ivar owner: whether this object unlinks the segment on close.
    """

    name: str
    size: int
    buf: memoryview
    fd: int
    owner: bool
    _finalizer: weakref.finalize

    def __init__(self) -> None:  # pragma: no cover - guarded
        raise TypeError("use Segment.create(size) or Segment.attach(name)")

    @classmethod
    def create(cls, size: int, prefix: str = DEFAULT_PREFIX) -> Segment:
        """Create and own a new zero-filled segment of ``size`` bytes named ``prefix + hex``.

        The segment is registered with this process's ``multiprocessing`` resource tracker
        (exactly as ``SharedMemory(create=True)`` does), which unlinks it if this process is
        killed before it could.

        :raises ValueError: if ``size < 1``.
        :raises OSError: if the system refuses the segment (e.g. /dev/shm full).
        """
        if _posixshmem is None:  # pragma: no cover - Windows
            raise NotImplementedError("shared replay segments need POSIX shared memory")
        size = check_positive_int("segment size", size)
        while True:
            name = new_segment_name(prefix)
            try:
                fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
                break
            except FileExistsError:  # pragma: no cover - 64 random bits collided
                continue
        try:
            os.ftruncate(fd, size)
            mm, size = _map(fd)
        except BaseException:
            os.close(fd)
            _posixshmem.shm_unlink("/" + name)
            raise
        resource_tracker.register("/" + name, "shared_memory")
        return cls._wrap(name, size, mm, fd, owner=True)

    @classmethod
    def attach(cls, name: str) -> Segment:
        """Map the existing segment ``name`` without taking ownership (never unlinks it).

        :raises SegmentNotFoundError: if no segment of that name exists.
        """
        if _posixshmem is None:  # pragma: no cover - Windows
            raise NotImplementedError("shared replay segments need POSIX shared memory")
        try:
            fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
        except FileNotFoundError:
            raise SegmentNotFoundError(
                f"shared replay segment {name!r} does not exist: its owner closed it, or it was never created"
            ) from None
        try:
            mm, size = _map(fd)
        except BaseException:
            os.close(fd)
            raise
        return cls._wrap(name, size, mm, fd, owner=False)

    @classmethod
    def _wrap(cls, name: str, size: int, mm: mmap.mmap, fd: int, owner: bool) -> Segment:
        self = object.__new__(cls)
        self.name, self.size, self.buf, self.fd, self.owner = name, size, memoryview(mm), fd, owner
        self._finalizer = weakref.finalize(self, _release, mm, self.buf, fd, name if owner else None, os.getpid())
        return self

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has run."""
        return not self._finalizer.alive

    def close(self) -> None:
        """Unmap; the owner also unlinks the name. Idempotent.

        Release every numpy view of :attr:`buf` first: a view still alive keeps the mapping
        (not the name) until it is freed.
        """
        self._finalizer()
