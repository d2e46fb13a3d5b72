"""Errors of the async runtime."""

from __future__ import annotations


class CollectorError(RuntimeError):
    """A collector process failed: it raised (``traceback`` holds its formatted traceback), died, or hung.

    A hung collector is one whose heartbeat (progress counter and time, in the runner's shared
    counters) did not move for ``collector_timeout_s`` seconds (stopped, deadlocked, stuck in a
    step); the message names it, its pid and the seconds since its last progress.

    :ivar collector: index of the collector.
    :ivar pid: its process id.
    :ivar exitcode: its exit code if it has exited (negative: killed by that signal), else ``None``.
    :ivar traceback: the collector's formatted traceback, or ``None`` if it died without one.
    :ivar seconds_since_progress: for a hung collector, seconds since its last progress, else ``None``.
    """

    def __init__(
        self,
        message: str,
        *,
        collector: int,
        pid: int | None,
        exitcode: int | None,
        traceback: str | None,
        seconds_since_progress: float | None = None,
    ):
        super().__init__(
            message if traceback is None else f"{message}\n\n--- collector {collector} traceback ---\n{traceback}"
        )
        self.collector = collector
        self.pid = pid
        self.exitcode = exitcode
        self.traceback = traceback
        self.seconds_since_progress = seconds_since_progress
