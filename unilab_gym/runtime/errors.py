"""Errors of the async runtime."""

from __future__ import annotations


class CollectorError(RuntimeError):
    """A collector process failed: it raised (``traceback`` holds its formatted traceback) or died.

    :ivar collector: index of the collector.
    :ivar pid: its process id.
    :ivar exitcode: its exit code if it has exited (negative: killed by that signal), else ``None``.
    :ivar traceback: the collector's formatted traceback, or ``None`` if it died without one.
    """

    def __init__(self, message: str, *, collector: int, pid: int | None, exitcode: int | None, traceback: str | None):
        super().__init__(
            message if traceback is None else f"{message}\n\n--- collector {collector} traceback ---\n{traceback}"
        )
        self.collector = collector
        self.pid = pid
        self.exitcode = exitcode
        self.traceback = traceback
