""":class:`ProcessCollectorPool`: collectors as spawned processes on this machine, sharing memory with the learner.

::

    collector 0 ─┐  (spawned: EIC cluster + CPU policy)      ┌─► model.train()  (stock SB3, unchanged)
    collector 1 ─┼──► shared memory: replay | rollouts ──────┘         │
       ...      ─┘         ▲                                           ▼
                 └──────── versioned policy weights (shared memory) ◄──┘

What it holds: the collector processes and their pipes (episode stats and tracebacks come back
through them), the weights they act with (:class:`~unilab_gym.runtime.weights.SharedWeights`),
the counters and learner signals (:class:`~unilab_gym.runtime.counters.SharedCounters`), and the
policy module they load at start-up (a shared-memory segment, not the spawn payload: a large
payload blocks ``Process.start()`` until the child reads it, forever if the child fails while
bootstrapping). The writers write straight into the learner's replay / rollout storage.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection, wait
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess

import numpy as np

from unilab_gym.runtime.collector import collector_main
from unilab_gym.runtime.counters import PROGRESS_NS, READY, SharedCounters
from unilab_gym.runtime.errors import CollectorError, root_cause
from unilab_gym.runtime.pool import START_TIMEOUT_S as START_TIMEOUT_S  # the pools' one limit, re-exported
from unilab_gym.runtime.pool import CollectorPool, CollectorSetup, Reports
from unilab_gym.runtime.weights import SharedWeights
from unilab_gym.shm import Segment

#: Longest the learner waits for collectors to exit on close before terminating them, in s.
JOIN_TIMEOUT_S = 3.0


def _block_sigint() -> None:
    """Start-up of the pool's collector-starting thread: block SIGINT in it, for good.

    Every collector is started from this one thread, which lives until the pool closes: a collector's
    ``PR_SET_PDEATHSIG`` (:func:`~unilab_gym.runtime.collector.die_with_parent`) fires when the *thread*
    that started it exits, so a collector started from a caller's short-lived thread (``learn()`` in a
    worker thread) would be killed with that thread. A spawned child inherits the thread's signal mask
    (it survives exec): a Ctrl-C meant for the learner that reaches a collector still starting would
    print a ``KeyboardInterrupt`` traceback; ``collector_main`` then ignores SIGINT and unblocks it.
    The process still gets its Ctrl-C: the kernel hands it to a thread that does not block it.
    """
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


class ProcessCollectorPool(CollectorPool):
    """Collectors in processes started with ``start_method`` (``"spawn"``: safe with torch).

    Args:
        setup: what the collectors run (see :class:`~unilab_gym.runtime.pool.CollectorSetup`).
        start_method: a ``multiprocessing`` start method.

    Raises:
        ValueError: an unknown ``start_method``.
        OSError: the system refused a shared-memory segment; nothing is left allocated.
    """

    def __init__(self, setup: CollectorSetup, start_method: str = "spawn"):
        """Create the shared weights and counters; no process starts yet (arguments: see the class docstring)."""
        super().__init__(setup)
        self._ctx: BaseContext = mp.get_context(start_method)
        self._weights = SharedWeights(setup.weights_size)
        try:
            self._control = SharedCounters(setup.num_collectors)
        except BaseException:
            self._weights.close()
            raise
        self._procs: list[BaseProcess] = []
        self._conns: list[Connection] = []
        self._policy_segment: Segment | None = None
        self._starter: ThreadPoolExecutor | None = None  # the one thread that starts collectors, see _block_sigint
        self._policy_bytes = 0
        self._closed = False

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Put the policy in a shared segment and start one process per collector (once)."""
        if self._procs:
            return
        payload = self.setup.policy_bytes()
        self._policy_segment = Segment.create(len(payload))
        self._policy_segment.buf[: len(payload)] = payload
        self._policy_bytes = len(payload)
        for c in range(self.num_collectors):
            proc, conn = self._spawn(c)
            self._procs.append(proc)
            self._conns.append(conn)

    def _spawn(self, c: int) -> tuple[BaseProcess, Connection]:
        """Start collector ``c`` (a replacement gets the seeds of its restart count, see ``CollectorSetup``)."""
        assert self._policy_segment is not None
        spec = self.setup.collector_spec(
            c,
            self._restarts_of[c],
            policy=(self._policy_segment.name, self._policy_bytes),
            parent_pid=os.getpid(),
        )
        reader, writer = self._ctx.Pipe(duplex=False)
        proc = self._ctx.Process(  # type: ignore[attr-defined]  # each concrete context defines Process
            target=collector_main,
            args=(spec, self._weights.handle, self._control.handle, writer),
            name=f"unilab-collector-{c}",
            daemon=True,
        )
        self._control.rows[c, PROGRESS_NS] = time.monotonic_ns()  # its heartbeat runs from now: start-up counts
        if self._starter is None:
            self._starter = ThreadPoolExecutor(1, "unilab-collector-starter", initializer=_block_sigint)
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # no Ctrl-C between start and return
        try:
            self._starter.submit(proc.start).result()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)  # a Ctrl-C meanwhile is delivered here now
        writer.close()
        return proc, reader

    def close(self) -> None:
        """Stop and join every collector, then free the shared memory. Idempotent.

        Collectors in their loop get ``JOIN_TIMEOUT_S`` to exit, then SIGTERM, then SIGKILL;
        collectors still starting (imports, env construction) get SIGTERM at once.
        """
        if self._closed:
            return
        self._closed = True
        self._control.stop()
        for proc, ready in zip(self._procs, self._control.rows[:, READY]):
            if not ready:  # still importing or building its env: nothing to finish, do not wait for it
                proc.terminate()
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        for proc in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in self._procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(1.0)
            if proc.is_alive():
                proc.kill()
                proc.join(1.0)
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []
        if self._starter is not None:  # after the collectors are gone: its exit would SIGKILL them (PDEATHSIG)
            self._starter.shutdown()
            self._starter = None
        if self._policy_segment is not None:
            self._policy_segment.close()
            self._policy_segment = None
        self._control.close()
        self._weights.close()

    # ------------------------------------------------------------------ weights, counters, status
    def publish_weights(self, weights: np.ndarray) -> int:
        """Write ``weights`` into the shared weights as the next version; return that version."""
        return self._weights.publish(weights)

    @property
    def weight_version(self) -> int:
        """Newest published version (0 before the first :meth:`publish_weights`)."""
        return self._weights.version

    @property
    def counters(self) -> SharedCounters:
        """The shared counter table the collector processes write."""
        return self._control

    def _locations(self) -> list[tuple[str, int | None]]:
        host = socket.gethostname()
        pids: list[int | None] = [p.pid for p in self._procs] or [None] * self.num_collectors
        return [(host, pid) for pid in pids]

    # ------------------------------------------------------------------ faults and waiting
    def wait(self, timeout: float) -> None:
        """Block until a collector's pipe has a report or a process exits, at most ``timeout`` s."""
        wait(self._conns + [p.sentinel for p in self._procs], timeout=timeout)

    def poll(self) -> Reports:
        """Read every pipe with a report and handle deaths and hangs (see :meth:`CollectorPool.poll`)."""
        reports = Reports()
        ready = wait(self._conns + [p.sentinel for p in self._procs], timeout=0)
        hung = self.hung_collectors() if self._procs else {}
        if not ready and not hung:
            return reports
        faults: dict[int, CollectorError] = {}
        for c, (conn, proc) in enumerate(zip(self._conns, self._procs)):
            fault: CollectorError | None = None
            if conn in ready:
                while conn.poll():
                    try:
                        kind, *payload = conn.recv()
                    except (EOFError, OSError):
                        break
                    if kind == "error":
                        fault = CollectorError(  # the root cause first: "raised NameNotFound: ..."
                            f"collector {c} (pid {proc.pid}) raised {root_cause(payload[0]) or 'an exception'}",
                            collector=c,
                            pid=proc.pid,
                            exitcode=proc.exitcode,
                            traceback=payload[0],
                        )
                        break
                    if kind == "moments":
                        reports.moments.append((payload[0], payload[1]))
                        continue
                    returns, lengths = payload  # an "episodes" message
                    reports.episode_returns.extend(returns)
                    reports.episode_lengths.extend(lengths)
            if fault is None and (proc.sentinel in ready or not proc.is_alive()):
                proc.join(0.1)
                fault = self._death(c, proc)
            if fault is None and c in hung:
                fault = self._hang(c, proc, hung[c])
            if fault is not None:
                faults[c] = fault
        self._supervise(faults)
        return reports

    def _hang(self, c: int, proc: BaseProcess, since: float) -> CollectorError:
        """The error for collector ``c``, alive but without progress for ``since`` s; kills it (nothing to save)."""
        started = bool(self._control.rows[c, READY])
        message = (
            f"collector {c} (pid {proc.pid}) made no progress for {since:.1f} s "
            f"(collector_timeout_s={self.setup.collector_timeout_s:g}) "
            + ("while starting" if not started else "in its loop")
            + ": it is hung (stopped, e.g. SIGSTOP, deadlocked, or stuck in its env's step); killed it"
        )
        proc.kill()  # SIGKILL also ends a stopped process
        proc.join(1.0)
        return CollectorError(
            message, collector=c, pid=proc.pid, exitcode=proc.exitcode, traceback=None, seconds_since_progress=since
        )

    def _death(self, c: int, proc: BaseProcess) -> CollectorError:
        """The error for collector ``c``, which exited without reporting an exception."""
        code = proc.exitcode
        signalled = code is not None and code < 0
        started = bool(self._control.rows[c, READY])
        message = f"collector {c} (pid {proc.pid}) " + ("died unexpectedly" if started else "exited while starting")
        message += f" with exit code {code}" + (f" (killed by signal {-code})" if code is not None and code < 0 else "")
        if not started and not signalled:
            message += (
                ", before it could report an error (its traceback is on stderr above). Usual causes: the script "
                'creates the AsyncRunner outside `if __name__ == "__main__":`, or env_fn is not importable by the '
                "spawned process (define it at module level); collectors are spawned processes that import the script"
            )
        return CollectorError(message, collector=c, pid=proc.pid, exitcode=code, traceback=None)

    def _retire(self, c: int) -> None:
        """Join what is left of collector ``c`` (killing it after ``JOIN_TIMEOUT_S``) and close its pipe."""
        proc = self._procs[c]
        proc.join(JOIN_TIMEOUT_S)
        if proc.is_alive():
            proc.kill()
            proc.join(1.0)
        self._conns[c].close()

    def _respawn(self, c: int) -> None:
        self._procs[c], self._conns[c] = self._spawn(c)
