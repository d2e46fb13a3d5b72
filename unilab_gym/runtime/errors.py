"""Errors of the async runtime."""

from __future__ import annotations

import re

#: A dotted exception type name, as ``traceback.format_exc()`` writes it (``gymnasium.error.NameNotFound``).
_TYPE_NAME = re.compile(r"[A-Za-z_][\w.]*")


def root_cause(traceback: str | None) -> str | None:
    """The exception a formatted traceback ends with, on one line: ``"NameNotFound: Environment ..."``.

    The line after the last frame (``File "..."``) of ``traceback`` (the text of
    ``traceback.format_exc()``, chained exceptions included: the last one is the one raised),
    with the module path dropped from the type name (``gymnasium.error.NameNotFound`` ->
    ``NameNotFound``). Only the first line of a multi-line message is kept.

    Returns:
        that line, or ``None`` if ``traceback`` is ``None`` or holds no such line.
    """
    if not traceback:
        return None
    lines = traceback.rstrip().splitlines()
    frames = [i for i, line in enumerate(lines) if line.lstrip().startswith('File "')]
    for line in lines[frames[-1] + 1 if frames else 0 :]:
        if not line or line[0].isspace() or line.startswith("Traceback (most recent call last)"):
            continue  # code and caret lines of the last frame, or a header
        name, sep, text = line.partition(": ")
        if _TYPE_NAME.fullmatch(name) is None:
            return line.strip()
        return f"{name.rpartition('.')[2]}{sep}{text}".strip()
    return None


class CollectorError(RuntimeError):
    """A collector process failed: it raised (``traceback`` holds its formatted traceback), died, or hung.

    The first line of the message names the collector, its pid and the root cause: for an exception,
    the exception it raised (type and message, e.g. ``collector 0 (pid 123) raised NameNotFound:
    Environment `Quadrupd` doesn't exist ...``, see :func:`root_cause`); the remote traceback follows
    after a blank line. A hung collector is one whose heartbeat (progress counter and time, in the
    runner's shared counters) did not move for ``collector_timeout_s`` seconds (stopped,
    deadlocked, stuck in a step); the message names it, its pid and the seconds since its last
    progress.

    :ivar collector: index of the collector.
    :ivar pid: its process id.
    :ivar exitcode: its exit code if it has exited (negative: killed by that signal), else ``None``.
    :ivar traceback: the collector's formatted traceback, or ``None`` if it died without one.
    :ivar cause: the root cause taken from ``traceback`` (:func:`root_cause`), or ``None``.
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
        """Set the attributes above and append the root cause of ``traceback`` to ``message`` (unless it names it)."""
        cause = root_cause(traceback)
        head = message if cause is None or cause in message else f"{message}: {cause}"
        super().__init__(
            head if traceback is None else f"{head}\n\n--- collector {collector} traceback ---\n{traceback}"
        )
        self.collector = collector
        self.pid = pid
        self.exitcode = exitcode
        self.traceback = traceback
        self.cause = cause
        self.seconds_since_progress = seconds_since_progress
