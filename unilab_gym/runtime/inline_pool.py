""":class:`InlineCollectorPool`: the collectors run in the learner's process, one at a time, for tests and debugging.

``AsyncRunner(..., backend="inline")``. No process is started and nothing crosses a process
boundary: each collector is the same :class:`~unilab_gym.runtime.collector.Collector` with the same
family *writer* (:class:`~unilab_gym.sb3.loops.off_policy.ReplayWriter`,
:class:`~unilab_gym.sb3.loops.on_policy.RolloutWriter`) that a collector process runs, writing into
the same replay / rollout storage, but it is stepped by the learner itself::

    learner thread                                   collector c's thread (parked between turns)
    ─────────────────────────────────────────        ─────────────────────────────────────────────
    loop: poll(), train(), publish weights
    loop: wait(): rounds, in each of them, for c = 0, 1, ...:
          hand the turn to c ────────────────────►  one iteration of writer.run's loop: refresh the
          (blocks; c's random streams swapped in)     weights, act, step the env, write the storage
          ◄── turn handed back ──────────────────    (or find nothing to do: idle)
          until every collector idled in a round, or SLICE_ROUNDS rounds; back to the loop

A writer's loop is a plain ``while collector.running:`` loop, so each collector keeps it on a thread
of its own, parked on a semaphore except during its turn: exactly one thread (the learner or one
collector) runs at any time, in an order fixed by the learner's calls. That makes a run
deterministic, whatever the machine's load: the collectors take their turns in a fixed rotation, only
inside :meth:`InlineCollectorPool.wait`, and never while the learner trains (the off-policy loop
then trains what is due in one call, :attr:`~unilab_gym.runtime.pool.CollectorPool.runs_concurrently`).
Each collector keeps its own torch (CPU) and numpy global random streams, seeded as a collector
process seeds them (``seed + c``) and swapped in for its turns only, so the learner's streams are
those of a run without collectors at all; that is how one inline collector with
``max_policy_lag=0`` trains PPO bit for bit as stock SB3 does (as one collector process does).

This is Sample Factory's ``SerialRunner`` and RLlib's local env runner: a breakpoint (``breakpoint()``,
an IDE's) in a user env stops the run there, in the learner's process (``os.getpid()`` in the env is
the learner's). The debugger shows the collector's thread; the learner waits meanwhile.

Not supported inline: restarts (``max_collector_restarts > 0`` is refused by the runner: a fault
raises at once, with the original exception as its ``__cause__``:
``pdb.post_mortem(error.__cause__.__traceback__)`` opens the env's frame), and hang
detection (``collector_timeout_s`` is not applied: a collector stopped at a breakpoint, or stuck in
its env, stops the learner with it). Collection never overlaps training (as in stock SB3), so it is
slower than the process backend on several cores.
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
import socket
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from unilab_gym.runtime.collector import Collector, CollectorSpec, Outbox, make_vector_env
from unilab_gym.runtime.counters import PROGRESS, PROGRESS_NS, CounterTable
from unilab_gym.runtime.errors import CollectorError, root_cause
from unilab_gym.runtime.pool import CollectorPool, CollectorSetup, Reports
from unilab_gym.runtime.weights import LocalWeights

if TYPE_CHECKING:
    import torch
    from gymnasium.vector import VectorEnv

#: numpy's legacy global random state, as ``np.random.get_state()`` returns it (a tuple, or a dict when legacy=False).
NumpyState = dict[str, Any] | tuple[str, NDArray[np.uint32], int, int, float]

#: Most rounds of :meth:`InlineCollectorPool.wait` (one loop iteration of each collector, e.g. one vector-env
#: step) before the learner gets control back (its callbacks, metrics and fault checks).
SLICE_ROUNDS = 64
#: Longest :meth:`InlineCollectorPool.close` waits for a collector to end its turn (only when a Ctrl-C left
#: one running), in s; a collector stuck in its env's step is then left behind (a daemon thread).
CLOSE_TIMEOUT_S = 3.0


class _RandomStreams:
    """One collector's torch (CPU) and numpy global random states, swapped in for its turns only.

    The first turn seeds them with ``seed`` as a collector process does (``torch.manual_seed(seed)``
    on the CPU generator, ``np.random.seed(seed % 2**32)``); later turns restore where the last ended.
    """

    def __init__(self, seed: int):
        self.seed = seed
        self._states: tuple[torch.Tensor, NumpyState] | None = None  # (torch, numpy) after its last turn

    def enter(self) -> tuple[torch.Tensor, NumpyState]:
        """Make the collector's states current; return the learner's, for :meth:`leave`."""
        import torch

        saved = (torch.get_rng_state(), np.random.get_state())
        if self._states is None:
            torch.default_generator.manual_seed(self.seed)  # the CPU stream only: the learner's CUDA ones stay
            np.random.seed(self.seed % 2**32)
        else:
            torch.set_rng_state(self._states[0])
            np.random.set_state(self._states[1])
        return saved

    def leave(self, saved: tuple[torch.Tensor, NumpyState]) -> None:
        """Keep the collector's states for its next turn, restore the learner's ``saved``."""
        import torch

        self._states = (torch.get_rng_state(), np.random.get_state())
        torch.set_rng_state(saved[0])
        np.random.set_state(saved[1])


@dataclass
class _Outcome:
    """How a collector's thread ended: ``error`` (with its formatted ``traceback``) or a return."""

    error: BaseException | None = None
    traceback: str | None = None


class _Turns:
    """The hand-off between the learner and one collector's thread: exactly one of them runs at a time.

    The learner calls :meth:`give` (which starts the thread the first time) and blocks until the
    collector hands the turn back: from :meth:`tick` at the start of its next loop iteration, from
    :meth:`pause` (nothing to do), or by ending (:attr:`outcome` then says how).
    """

    def __init__(self, name: str, target: Callable[[_Turns], None]):
        self._go = threading.Semaphore(0)
        self._back = threading.Semaphore(0)
        self._thread = threading.Thread(target=self._main, args=(target,), name=name, daemon=True)
        self._used = False  # this turn's loop iteration has begun
        self.started = False
        #: the collector ended its last turn with nothing to do (it called ``idle()``).
        self.idled = False
        self.finished = False
        #: the collector has the turn (set by the learner when it gives it, cleared by the collector).
        self.active = False
        self.outcome: _Outcome | None = None
        #: its fault was counted in the pool's ``faults``.
        self.counted = False

    # ------------------------------------------------------------------ learner side
    def give(self) -> None:
        """Let the collector run one loop iteration; return when it hands the turn back."""
        self.idled = False
        self.active = True
        if not self.started:
            self.started = True
            self._thread.start()
        else:
            self._go.release()
        self._back.acquire()  # a Ctrl-C here leaves the turn out: settle() takes it back

    def settle(self, timeout: float) -> bool:
        """After a :meth:`give` left by an exception: take the turn back (waiting up to ``timeout`` s).

        Returns:
            ``True`` once the learner has the turn again, ``False`` if the collector still runs.
        """
        if self.active:
            return self._back.acquire(timeout=timeout)
        self._back.acquire(blocking=False)  # handed back after give() was left: drop that permit
        return True

    def join(self, timeout: float) -> None:
        if self.started:
            self._thread.join(timeout)

    # ------------------------------------------------------------------ collector side
    def tick(self) -> None:
        """A new loop iteration: hand the turn back first if this turn already had its iteration."""
        if self._used:
            self._handback()
        self._used = True

    def pause(self) -> None:
        """Nothing to do now: hand the turn back at once (:attr:`idled`)."""
        self.idled = True
        self._handback()

    def _handback(self) -> None:
        self.active = False
        self._back.release()
        self._go.acquire()
        self._used = False

    def _main(self, target: Callable[[_Turns], None]) -> None:
        outcome = _Outcome()
        try:
            target(self)
        except BaseException as error:
            outcome = _Outcome(error, traceback.format_exc())
        finally:
            self.outcome, self.finished, self.active = outcome, True, False
            self._back.release()


class InlineCollector(Collector):
    """A :class:`~unilab_gym.runtime.collector.Collector` stepped by the learner, in turns.

    Each read of :attr:`running` is a loop iteration of the writer (and its heartbeat); :meth:`idle`
    ends the collector's turn instead of sleeping.
    """

    def __init__(
        self, spec: CollectorSpec, env: VectorEnv, policy: torch.nn.Module, pool: InlineCollectorPool, turns: _Turns
    ):
        """A collector on ``pool``'s counters, weights and outbox, stepped in ``turns``."""
        super().__init__(spec, env, policy, pool.weights, pool.control, pool.outboxes[spec.index])
        self._turns = turns

    @property
    def running(self) -> bool:
        """False once the pool stopped; each read is one loop iteration (and may end the turn)."""
        row = self.row
        row[PROGRESS] += 1
        row[PROGRESS_NS] = time.monotonic_ns()
        self._turns.tick()
        return not self._control.stopped

    def idle(self) -> None:  # type: ignore[override]
        """Nothing to do until the learner moves: end this turn."""
        self._turns.pause()


class InlineCollectorPool(CollectorPool):
    """Collectors stepped in the learner's process, one at a time (see the module docstring).

    Args:
        setup: what the collectors run (see :class:`~unilab_gym.runtime.pool.CollectorSetup`);
            ``max_restarts`` must be 0 and ``collector_timeout_s`` is not applied.

    Raises:
        ValueError: ``setup.max_restarts > 0`` (restarts are not supported inline).

    :ivar control: the counters table (:class:`~unilab_gym.runtime.counters.CounterTable`, plain numpy).
    :ivar weights: the newest published weights (:class:`~unilab_gym.runtime.weights.LocalWeights`).
    :ivar outboxes: per collector, the messages (episodes, moments) it sent since the last :meth:`poll`.
    """

    #: collectors run only inside :meth:`wait`, never while the learner trains.
    runs_concurrently = False

    def __init__(self, setup: CollectorSetup):
        """Check ``setup`` and make the in-process counters, weights and outboxes (see the class docstring)."""
        if setup.max_restarts:
            raise ValueError(
                f'backend="inline" does not restart collectors: max_collector_restarts must be 0, got '
                f'{setup.max_restarts} (a fault raises CollectorError at once; use backend="process" for restarts)'
            )
        super().__init__(setup)
        self.control = CounterTable(setup.num_collectors)
        self.weights = LocalWeights(setup.weights_size)
        self.outboxes = [Outbox() for _ in range(setup.num_collectors)]
        self._version = 0
        self._policy_bytes: bytes | None = None
        self._turns: list[_Turns] = []
        self._streams = [_RandomStreams(setup.torch_seed(c, 0)) for c in range(setup.num_collectors)]
        self._lock = threading.Lock()  # one thread drives the collectors at a time
        self._first = 0  # the collector that starts the next round
        # (collector, learner's streams) of a turn a Ctrl-C left
        self._interrupted: tuple[int, tuple[torch.Tensor, NumpyState]] | None = None
        self._closed = False

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Make the collectors' turns (their threads start, and build their envs, at their first turn)."""
        if self._turns or self._closed:
            return
        self._policy_bytes = self.setup.policy_bytes()
        self.control.rows[:, PROGRESS_NS] = time.monotonic_ns()
        # one assignment: the metrics server's status() sees no turns or all of them
        self._turns = [_Turns(f"unilab-inline-collector-{c}", self._collector(c)) for c in range(self.num_collectors)]

    def _collector(self, c: int) -> Callable[[_Turns], None]:
        """The body of collector ``c``'s thread: build its env and policy, run a copy of its writer."""
        spec = self.setup.collector_spec(c, 0, parent_pid=os.getppid())  # the policy: from the pool's bytes
        spec = replace(spec, writer=copy.deepcopy(spec.writer))  # what a process unpickles: nothing shared

        def body(turns: _Turns) -> None:
            import torch

            # one intra-op thread, as a collector process sets: a new thread gets OpenMP's default (every
            # core), which on busy cores made each small forward pass ~10x slower. OpenMP's count is per
            # thread: the learner's own setting is left as it is
            torch.set_num_threads(1)
            assert self._policy_bytes is not None
            policy = torch.load(io.BytesIO(self._policy_bytes), weights_only=False)
            policy.eval()
            env = make_vector_env(spec, spec.writer.autoreset_mode)
            try:
                spec.writer.run(InlineCollector(spec, env, policy, self, turns))
            finally:
                with contextlib.suppress(Exception):
                    env.close()
            if not self.control.stopped:
                raise RuntimeError(f"collector {c}'s writer returned before the pool stopped it")

        return body

    def _turn(self, c: int) -> None:
        """Give collector ``c`` one turn, with its random streams in place of the learner's."""
        turns, streams = self._turns[c], self._streams[c]
        saved = streams.enter()
        try:
            turns.give()
        except BaseException:  # a Ctrl-C while it runs with its streams: close() settles it, restores them
            self._interrupted = (c, saved)
            raise
        streams.leave(saved)

    def close(self) -> None:
        """Stop every collector: each returns from its writer at its next loop iteration and closes its env.

        Idempotent. A collector whose turn a Ctrl-C interrupted gets ``CLOSE_TIMEOUT_S`` to end its step.
        """
        if self._closed:
            return
        self._closed = True
        self.control.stop()
        with self._lock:
            for c, turns in enumerate(self._turns):
                if self._interrupted is not None and self._interrupted[0] == c:
                    if not turns.settle(CLOSE_TIMEOUT_S):
                        continue  # stuck in its env's step: left behind (a daemon thread)
                    self._streams[c].leave(self._interrupted[1])
                    self._interrupted = None
                if turns.started and not turns.finished:
                    self._turn(c)  # it reads running == False and returns
                turns.join(CLOSE_TIMEOUT_S)

    # ------------------------------------------------------------------ weights and signals
    def publish_weights(self, weights: np.ndarray) -> int:
        """As :meth:`CollectorPool.publish_weights <unilab_gym.runtime.pool.CollectorPool.publish_weights>`: a copy."""
        if weights.shape != (self.setup.weights_size,):
            raise ValueError(f"weights must have shape ({self.setup.weights_size},), got {weights.shape}")
        self._version += 1
        self.weights.offer(self._version, np.array(weights, np.float32, copy=True))
        return self._version

    @property
    def weight_version(self) -> int:
        """Newest published version (0 before the first :meth:`publish_weights`)."""
        return self._version

    # ------------------------------------------------------------------ counters, status, waiting
    @property
    def counters(self) -> CounterTable:
        """The in-process counter table (:attr:`control`)."""
        return self.control

    def _locations(self) -> list[tuple[str, int | None]]:
        host, pid = socket.gethostname(), os.getpid()
        started = [t.started for t in self._turns] or [False] * self.num_collectors  # the learner's pid once started
        return [(host, pid if s else None) for s in started]

    def wait(self, timeout: float) -> None:
        """Step the collectors in rounds, one loop iteration each per round.

        Round ``r`` (counted over the pool's life) starts with collector ``r % num_collectors``, then the
        next ones in index order: none of them always gets the budget first.

        Rounds go on until every collector idled in the same round (nothing to do: no budget, no granted
        rollout), one failed, or ``SLICE_ROUNDS`` rounds passed. ``timeout`` is not used: nothing else
        runs meanwhile, so there is nothing to wait for.
        """
        with self._lock:
            if self._closed:
                return
            n = len(self._turns)
            for _ in range(SLICE_ROUNDS):
                busy = False
                first, self._first = self._first, (self._first + 1) % max(1, n)  # no collector always first
                for c in [(first + i) % n for i in range(n)]:
                    turns = self._turns[c]
                    if turns.finished:
                        continue
                    self._turn(c)
                    if turns.finished:
                        return  # it failed: poll() raises
                    busy = busy or not turns.idled
                if not busy:
                    return

    def poll(self) -> Reports:
        """Take in the collectors' messages; raise the fault of a collector whose writer raised (or returned).

        Raises:
            CollectorError: ``collector <c> (inline, pid <learner pid>) raised <root cause>``, then its
                traceback; the original exception is its ``__cause__``.
        """
        reports = Reports()
        for c, (outbox, turns) in enumerate(zip(self.outboxes, self._turns)):
            for kind, *payload in outbox.take():
                if kind == "moments":
                    reports.moments.append((payload[0], payload[1]))
                else:  # "episodes"
                    reports.episode_returns.extend(payload[0])
                    reports.episode_lengths.extend(payload[1])
            if turns.finished and not self._closed:  # before close(), a collector ends only by raising
                outcome = turns.outcome or _Outcome()
                pid = os.getpid()
                if not turns.counted:
                    turns.counted = True
                    self._faults += 1
                raise CollectorError(
                    f"collector {c} (inline, pid {pid}) raised {root_cause(outcome.traceback) or 'an exception'}",
                    collector=c,
                    pid=pid,
                    exitcode=None,
                    traceback=outcome.traceback,
                ) from outcome.error
        return reports
