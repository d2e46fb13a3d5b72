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

Backing (why a segment never dies of SIGBUS): a ``/dev/shm`` file is sparse, so a segment larger
than the free space of its filesystem is created without complaint, and the process is killed
by SIGBUS at the first page the filesystem cannot supply (Docker's default ``/dev/shm`` is
64 MB). :meth:`Segment.create` therefore checks the free space first (``os.statvfs``) and then
reserves every page (``os.posix_fallocate``), so a segment that cannot be backed fails at once
with :class:`SharedMemoryFullError` and leaves nothing in ``/dev/shm``.

POSIX only (Linux, macOS): Windows named memory has no unlink and is not supported.
"""

from __future__ import annotations

import contextlib
import errno
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

__all__ = [
    "DEFAULT_PREFIX",
    "SHM_DIR",
    "Segment",
    "SegmentNotFoundError",
    "SharedMemoryFullError",
    "new_segment_name",
    "shm_free_bytes",
]

DEFAULT_PREFIX = "unilab_"
SHM_DIR = "/dev/shm"  #: where Linux keeps POSIX shared memory (a tmpfs)


class SharedMemoryFullError(OSError, MemoryError):
    """The filesystem behind shared memory (``/dev/shm``) cannot back a segment of the asked size.

    Both an ``OSError`` (``errno.ENOSPC``) and a ``MemoryError``; nothing is left in ``/dev/shm``.
    """


def shm_free_bytes(path: str = SHM_DIR) -> int | None:
    """Bytes an unprivileged process may still allocate on the filesystem at ``path``.

    Args:
        path: a directory on the filesystem (default ``/dev/shm``).

    Returns:
        ``f_bavail * f_frsize`` of ``os.statvfs(path)``, or ``None`` if ``path`` does not exist
        (macOS keeps POSIX shared memory in no filesystem) or reports no block count (an
        unlimited tmpfs).
    """
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    if st.f_blocks == 0:
        return None
    return st.f_bavail * st.f_frsize


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _full_error(size: int, free: int | None, cause: str) -> SharedMemoryFullError:
    """The error raised when ``size`` bytes cannot be backed: the size, the free space and the fix."""
    have = "unknown" if free is None else f"{free} bytes ({_mib(free)})"
    need_mb = -(-size // 2**20) + 64
    return SharedMemoryFullError(
        errno.ENOSPC,
        f"cannot back a shared-memory segment of {size} bytes ({_mib(size)}): {SHM_DIR} has {have} free "
        f"({cause}). Give shared memory more room (Docker: `docker run --shm-size={need_mb}m ...`, "
        "Kubernetes: a memory-backed emptyDir on /dev/shm), or ask for less (e.g. a smaller replay "
        "`buffer_size`, fewer envs or a shorter rollout).",
    )


def _reserve(fd: int, size: int) -> None:
    """Allocate every page of the segment now, so a write can never hit a missing page (SIGBUS).

    Raises:
        SharedMemoryFullError: if the filesystem has no room for ``size`` bytes.
    """
    if not hasattr(os, "posix_fallocate"):  # pragma: no cover - macOS: no fallocate on shm
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
            raise _full_error(size, shm_free_bytes(), f"posix_fallocate: {e.strerror}") from None
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENODEV):  # no fallocate: size check only
            raise


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


def _map(fd: int, read_only: bool = False) -> tuple[mmap.mmap, int]:
    size = os.fstat(fd).st_size
    return mmap.mmap(fd, size, access=mmap.ACCESS_READ if read_only else mmap.ACCESS_WRITE), size


class Segment:
    """A mapped POSIX shared-memory segment.

    Use :meth:`create` (owner) or :meth:`attach` (attacher); do not call the constructor.

    :ivar name: segment name, without the leading ``/`` (on Linux: ``/dev/shm/<name>``).
    :ivar size: mapped size in bytes.
    :ivar buf: ``memoryview`` of the whole segment (read-only for a read-only attach).
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
        """Refuse direct construction.

        Raises:
            TypeError: always; use :meth:`create` or :meth:`attach`.
        """
        raise TypeError("use Segment.create(size) or Segment.attach(name)")

    @classmethod
    def create(cls, size: int, prefix: str = DEFAULT_PREFIX) -> Segment:
        """Create and own a new zero-filled segment of ``size`` bytes named ``prefix + hex``.

        The segment is registered with this process's ``multiprocessing`` resource tracker
        (exactly as ``SharedMemory(create=True)`` does), which unlinks it if this process is
        killed before it could.

        Every page is reserved before this returns (see the module docstring): writing into the
        segment can never raise SIGBUS.

        :raises ValueError: if ``size < 1``.
        :raises SharedMemoryFullError: (an ``OSError`` and a ``MemoryError``) if ``/dev/shm``
            has less than ``size`` bytes free; the message names the size, the free space and
            the fix. Nothing is left in ``/dev/shm``.
        :raises OSError: if the system refuses the segment for another reason.
        """
        if _posixshmem is None:  # pragma: no cover - Windows
            raise NotImplementedError("shared replay segments need POSIX shared memory")
        size = check_positive_int("segment size", size)
        free = shm_free_bytes()
        if free is not None and size > free:
            raise _full_error(size, free, "checked before creating it")
        while True:
            name = new_segment_name(prefix)
            try:
                fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
                break
            except FileExistsError:  # pragma: no cover - 64 random bits collided
                continue
        try:
            os.ftruncate(fd, size)
            _reserve(fd, size)
            mm, size = _map(fd)
        except BaseException:
            os.close(fd)
            _posixshmem.shm_unlink("/" + name)
            raise
        resource_tracker.register("/" + name, "shared_memory")
        return cls._wrap(name, size, mm, fd, owner=True)

    @classmethod
    def attach(cls, name: str, *, read_only: bool = False) -> Segment:
        """Map the existing segment ``name`` without taking ownership (never unlinks it).

        :param read_only: open and map it read-only (``O_RDONLY``, ``PROT_READ``): any write
            through :attr:`buf` raises ``TypeError``, and the kernel refuses stores into the pages.
        :raises SegmentNotFoundError: if no segment of that name exists.
        """
        if _posixshmem is None:  # pragma: no cover - Windows
            raise NotImplementedError("shared replay segments need POSIX shared memory")
        try:
            fd = _posixshmem.shm_open("/" + name, os.O_RDONLY if read_only else os.O_RDWR, mode=0o600)
        except FileNotFoundError:
            raise SegmentNotFoundError(
                f"shared replay segment {name!r} does not exist: its owner closed it, or it was never created"
            ) from None
        try:
            mm, size = _map(fd, read_only)
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

    def is_linked(self) -> bool:
        """Whether :attr:`name` still resolves to this segment (not unlinked, nor re-created).

        One ``shm_open`` + two ``fstat`` + ``close`` (a few microseconds).
        """
        if self.closed:
            return False
        try:
            fd = _posixshmem.shm_open("/" + self.name, os.O_RDONLY, mode=0o600)
        except OSError:
            return False
        try:
            other, mine = os.fstat(fd), os.fstat(self.fd)
        finally:
            os.close(fd)
        return (other.st_dev, other.st_ino) == (mine.st_dev, mine.st_ino)

    def close(self) -> None:
        """Unmap; the owner also unlinks the name. Idempotent.

        Release every numpy view of :attr:`buf` first: a view still alive keeps the mapping
        (not the name) until it is freed.
        """
        self._finalizer()
