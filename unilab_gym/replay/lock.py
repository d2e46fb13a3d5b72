"""The header lock of a replay segment, and the liveness of the processes around it.

- :class:`SegmentLock`: ``fcntl.flock`` on the segment's own descriptor plus a
  ``threading.Lock`` (why ``flock``: see :mod:`unilab_gym.replay.ring`); it refuses to work
  once closed, or in a child that inherited it through ``fork``.
- :func:`pid_alive` / :func:`pid_namespace`: is a writer (or the owner) still running, and can
  this process see its pid at all.
- :class:`ReplayClosedError` / :class:`ReplayOwnerGoneError`: what the storage raises when it,
  or its owner, is gone.
"""

from __future__ import annotations

import fcntl
import os
import threading
import weakref

from unilab_gym.shm import Segment

__all__ = ["ReplayClosedError", "ReplayOwnerGoneError", "SegmentLock", "pid_alive", "pid_namespace"]


class ReplayClosedError(RuntimeError):
    """The storage (or the segment behind it) has been closed."""


class ReplayOwnerGoneError(ReplayClosedError):
    """The process that owns the replay is gone (killed or exited without closing it).

    Raised to attached writers and readers: rows added now would never be read.
    """


def pid_alive(pid: int) -> bool:
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


def pid_namespace() -> int:
    """Inode of this process's pid namespace (0 where there is no ``/proc``)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


_LIVE_LOCKS: weakref.WeakSet = weakref.WeakSet()


def _mark_forked() -> None:
    for lock in list(_LIVE_LOCKS):
        lock.forked = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_mark_forked)


class SegmentLock:
    """``flock`` on the segment's own descriptor + a thread lock: the header lock.

    Holds no reference to the storage (so the storage is freed, and unlinked, by refcount).
    A lock inherited through ``fork`` refuses to work: its descriptor's ``flock`` would be
    shared with the parent.
    """

    __slots__ = ("__weakref__", "closed", "fd", "forked", "name", "thread_lock")

    def __init__(self, segment: Segment) -> None:
        """Lock ``segment`` through its file descriptor (the lock keeps no reference to it)."""
        self.name, self.fd, self.closed, self.forked = segment.name, segment.fd, False, False
        self.thread_lock = threading.Lock()
        _LIVE_LOCKS.add(self)

    def check(self) -> None:
        """Raise :class:`ReplayClosedError` if the storage is closed, or this lock came through ``fork``."""
        if self.closed:
            raise ReplayClosedError(f"replay storage {self.name!r} is closed")
        if self.forked:
            raise ReplayClosedError(
                f"replay storage {self.name!r} was inherited through fork; attach a new one "
                "in this process with ReplayStorage.attach(handle)"
            )

    def __enter__(self) -> None:
        """Take the thread lock, then the ``flock``; raise :class:`ReplayClosedError` if closed or forked."""
        if self.closed or self.forked:
            self.check()
        self.thread_lock.acquire()
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except BaseException:
            self.thread_lock.release()
            raise

    def __exit__(self, *exc: object) -> None:
        """Release the ``flock``, then the thread lock."""
        try:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        finally:
            self.thread_lock.release()
