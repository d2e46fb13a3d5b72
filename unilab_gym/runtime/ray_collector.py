"""The collector side of :class:`~unilab_gym.runtime.ray_pool.RayCollectorPool`: one Ray actor per collector.

A :class:`CollectorActor` runs the same writer as a collector process
(:class:`~unilab_gym.sb3.loops.off_policy.ReplayWriter` or
:class:`~unilab_gym.sb3.loops.on_policy.RolloutWriter`), with the same env, CPU policy and seeds.
It may run on another machine, so it cannot write the learner's shared memory: its writer writes
into a *stage* instead, a storage of the same layout in the actor's own memory
(:class:`ReplayStage`: a small replay ring; :class:`RolloutStage`: two rollout slots of its
own envs), and the learner takes what is staged with :meth:`CollectorActor.exchange`::

    actor thread "run"                       actor threads "exchange" (at most MAX_IN_FLIGHT)
    ──────────────────────────────────       ──────────────────────────────────────────────────
    writer.run(StagedCollector):             take a new weight version (one ObjectRef for all)
      act, step, write into the stage        apply the learner's signals (budget, grant, ...)
      (paused while the stage is full)       one exchange at a time: wait <= EXCHANGE_WAIT_S
                                             for an answer's worth of data, then return the
                                             staged rows / the finished rollout, the episode
                                             and moment messages, this collector's counters

The learner keeps ``MAX_IN_FLIGHT`` requests in flight: the second one is a pipelined request that
takes its signals at once but waits for the stage until the first has taken its data, so it gathers
fresh rows while the first answer travels and is ingested. How much is "an answer's worth" adapts to
the collector's speed (off-policy): ``EXCHANGE_TARGET_S`` seconds of its recent write rate, at least
``EXCHANGE_MIN_STEPS`` vector steps and at most half the stage; a writer paused by the learner
(budget, no weights yet) answers at once with what is staged, so backpressure never waits out
``EXCHANGE_WAIT_S``. The learner's cost is mostly per answer, so bigger answers from fast collectors
cost it less per transition.

The stage is a single-producer, single-consumer ring: the writer never overwrites what the
learner has not taken (:meth:`StagedCollector.budget` and :meth:`StagedCollector.granted` also
stop at the stage's room), so each exchange result is at most one stage of data and the object
store holds at most ``MAX_IN_FLIGHT`` results per collector, whatever the run length.
"""

from __future__ import annotations

import contextlib
import io
import os
import socket
import threading
import time
import traceback
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from unilab_gym.runtime.collector import Collector, CollectorSpec, Outbox, make_vector_env
from unilab_gym.runtime.counters import PROGRESS, PROGRESS_NS, ROLLOUTS, TRANSITIONS, CounterTable
from unilab_gym.runtime.weights import LocalWeights
from unilab_gym.shm import SHM_DIR

if TYPE_CHECKING:
    import torch

#: The names this module had before they moved to neutral modules (kept for imports of 0.1):
#: :class:`~unilab_gym.runtime.counters.CounterTable`, :class:`~unilab_gym.runtime.weights.LocalWeights`,
#: :class:`~unilab_gym.runtime.collector.Outbox`.
LocalControl = CounterTable

#: Exchange requests each collector may have in flight (RLlib's ``max_requests_in_flight_per_env_runner``).
MAX_IN_FLIGHT = 2
#: Longest an exchange waits for new data before it returns what it has (its answer is also the heartbeat), in s.
EXCHANGE_WAIT_S = 0.05
#: The floor of an answer's size (off-policy): an exchange returns at once when this many vector-env steps of
#: transitions are staged, or more if the collector is fast (see ``EXCHANGE_TARGET_S``).
EXCHANGE_MIN_STEPS = 4
#: Off-policy answers aim at this many seconds of the collector's recent write rate (between the
#: ``EXCHANGE_MIN_STEPS`` floor and half the stage): a fast collector sends fewer, bigger answers, in s.
EXCHANGE_TARGET_S = 0.025
#: Weight of the newest rate sample in a stage's running write rate (an exponential moving average).
RATE_SMOOTHING = 0.3
#: Off-policy stage: a ring of this many vector-env steps of transitions (capped at the learner's capacity).
STAGE_STEPS = 64
#: Name prefix of an off-policy stage's segment, then the owner's pid in hex and ``_`` (see :func:`sweep_stale_stages`).
STAGE_PREFIX = "unistg"


def sweep_stale_stages(shm_dir: str = SHM_DIR) -> list[str]:
    """Unlink the off-policy stage segments in ``shm_dir`` whose owner process is gone; return their names.

    A stage's segment is unlinked by its actor on exit, and by the actor's resource tracker if the
    actor alone is killed; when Ray kills a node's processes together (a node that dies on a machine
    that lives on, as in a local test cluster), nothing does. Every new actor, and the pool's
    ``close()`` on the learner's host, therefore sweeps the stages of dead actors of its machine.
    """
    import psutil

    swept = []
    with contextlib.suppress(OSError):
        for name in os.listdir(shm_dir):
            if not name.startswith(STAGE_PREFIX):
                continue
            try:
                pid = int(name[len(STAGE_PREFIX) :].split("_", 1)[0], 16)
            except ValueError:
                continue
            if not psutil.pid_exists(pid):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(shm_dir, name))
                    swept.append(name)
    return swept


class ReplayStage:
    """Off-policy stage: a replay ring of the learner's layout in this actor's memory.

    Args:
        writer: the learner's :class:`~unilab_gym.sb3.loops.off_policy.ReplayWriter`.
        num_envs: envs of the collector.

    :ivar writer: the same writer, writing into the stage.
    """

    def __init__(self, writer: Any, num_envs: int):  # a Writer whose sink is "replay"
        """Create the stage ring and point a copy of ``writer`` at it (arguments: see the class docstring)."""
        from unilab_gym.replay import ReplayStorage

        handle = writer.replay
        self.capacity = min(handle.capacity, STAGE_STEPS * num_envs)
        self._num_envs = num_envs
        self._ring = ReplayStorage(handle.layout, self.capacity, prefix=f"{STAGE_PREFIX}{os.getpid():x}_")
        self.writer = replace(writer, replay=self._ring.handle)
        self._taken = 0  # ring rows taken by the learner
        self._floor = min(EXCHANGE_MIN_STEPS * num_envs, self.capacity)
        #: rows an exchange waits for (adaptive: see the module docstring).
        self.target_rows = self._floor
        self._rate = 0.0  # rows per second written, running average over takes
        self._taken_at = time.monotonic()

    def staged(self, row: np.ndarray) -> int:
        """Rows written and not yet taken."""
        return self._ring.committed - self._taken

    def ready(self, row: np.ndarray) -> bool:
        """Whether :attr:`target_rows` rows are staged (an answer's worth: see the module docstring)."""
        return self.staged(row) >= self.target_rows

    def has_data(self, row: np.ndarray) -> bool:
        """Whether any row is staged."""
        return self.staged(row) > 0

    def _adapt(self, rows: int, paused: bool) -> None:
        """Update the write rate with ``rows`` taken since the last take, and :attr:`target_rows` from it.

        A take while the writer was paused by the learner says nothing of its speed (the rate stays).
        """
        now = time.monotonic()
        elapsed, self._taken_at = now - self._taken_at, now
        if not paused and elapsed > 0:
            sample = rows / elapsed
            self._rate = sample if self._rate == 0 else (1 - RATE_SMOOTHING) * self._rate + RATE_SMOOTHING * sample
        target = int(self._rate * EXCHANGE_TARGET_S) // self._num_envs * self._num_envs  # whole vector steps
        self.target_rows = max(self._floor, min(target, self.capacity // 2))

    def limit_budget(self, budget: int, total: int, row: np.ndarray) -> int:
        """``budget`` lowered so that one more step (``num_envs`` rows) never overwrites a row not yet taken."""
        room = self.capacity - self.staged(row)
        return min(budget, total + room - self._num_envs + 1)

    def limit_granted(self, granted: int) -> int:
        """``granted`` unchanged (off-policy collectors get no rollouts)."""
        return granted

    def attached(self) -> None:
        """The writer has attached the ring (its name stays: attachers check it; see :func:`sweep_stale_stages`)."""

    def take(self, row: np.ndarray, paused: bool = False) -> dict[str, Any] | None:
        """The staged rows, ``{"rows": (n, width) float32}`` in write order, or ``None`` if none.

        One contiguous block (a single buffer: the object store hands it to the learner without a copy when
        it is large). ``paused``: the writer waited for the learner since the last take (see :meth:`_adapt`).
        """
        committed = self._ring.committed
        n = committed - self._taken
        self._adapt(max(n, 0), paused)
        if n <= 0:
            return None
        lo, cap = self._taken % self.capacity, self.capacity
        block = self._ring.block
        rows = block[lo : lo + n].copy() if lo + n <= cap else np.concatenate((block[lo:], block[: lo + n - cap]))
        self._taken = committed
        return {"rows": rows}

    def close(self) -> None:
        """Close the stage ring (its segment is unlinked)."""
        self._ring.close()


#: The arrays of one rollout that an actor ships (the rollout storage's fields but ``versions``).
ROLLOUT_FIELDS = (
    "observations",
    "actions",
    "rewards",
    "episode_starts",
    "values",
    "log_probs",
    "last_obs",
    "last_values",
    "last_dones",
)


class RolloutStage:
    """On-policy stage: two rollout slots of this collector's envs in this actor's memory.

    Args:
        writer: the learner's :class:`~unilab_gym.sb3.loops.on_policy.RolloutWriter`.
        num_envs: envs of the collector.
        index: the collector's index.
        rollouts_done: rollouts the learner already has from this collector (a replacement redoes the next).
    """

    def __init__(self, writer: Any, num_envs: int, index: int, rollouts_done: int):
        """Create the slots and point a copy of ``writer`` at column 0 of them (arguments: see the class docstring)."""
        from unilab_gym.runtime.rollout import RolloutStorage

        h = writer.rollouts
        self._slots = RolloutStorage.create(h.n_steps, num_envs, h.obs_shape, h.action_dim, h.num_collectors)
        self.writer = replace(writer, rollouts=self._slots.handle, column=0)
        self._index = index
        self._shipped = rollouts_done

    def ready(self, row: np.ndarray) -> bool:
        """Whether a finished rollout has not been taken yet."""
        return int(row[ROLLOUTS]) > self._shipped

    def has_data(self, row: np.ndarray) -> bool:
        """Whether a finished rollout has not been taken yet (as :meth:`ready`)."""
        return self.ready(row)

    def limit_budget(self, budget: int, total: int, row: np.ndarray) -> int:
        """``budget`` unchanged (on-policy collectors write no transitions)."""
        return budget

    def attached(self) -> None:
        """The writer has mapped the slots: unlink their name, so no ``/dev/shm`` entry outlives this process."""
        from multiprocessing import resource_tracker

        name = self._slots.handle.name
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(SHM_DIR, name))
            resource_tracker.unregister("/" + name, "shared_memory")

    def limit_granted(self, granted: int) -> int:
        """A rollout may start only in a slot whose previous rollout was taken."""
        from unilab_gym.runtime.rollout import SLOTS

        return min(granted, self._shipped + SLOTS)

    def take(self, row: np.ndarray, paused: bool = False) -> dict[str, Any] | None:
        """The oldest finished rollout not yet taken: ``{"rollout": k, "version": v, <field>: array}``, or ``None``.

        ``paused`` is unused (an on-policy answer is one rollout).
        """
        from unilab_gym.runtime.rollout import SLOTS

        if int(row[ROLLOUTS]) <= self._shipped:
            return None
        k = self._shipped
        slot = k % SLOTS
        block: dict[str, Any] = {name: _slot_copy(getattr(self._slots, name), slot) for name in ROLLOUT_FIELDS}
        block["rollout"] = k
        block["version"] = int(self._slots.versions[slot, self._index])
        self._shipped = k + 1
        return block

    def close(self) -> None:
        """Close the rollout slots."""
        self._slots.close()


def _slot_copy(field: Any, slot: int) -> Any:
    """A copy of ``field[slot]`` (per key for a ``Dict`` observation's ``{key: array}``)."""
    if isinstance(field, dict):
        return {key: part[slot].copy() for key, part in field.items()}
    return field[slot].copy()


class StagedCollector(Collector):
    """A :class:`~unilab_gym.runtime.collector.Collector` whose writes go to a stage.

    Its learner signals are the learner's, lowered so the writer never overruns the stage; each
    read of :attr:`running` also wakes a waiting exchange.
    """

    def __init__(
        self,
        spec: CollectorSpec,
        env: Any,
        policy: torch.nn.Module,
        actor: CollectorActor,
        stage: ReplayStage | RolloutStage,
    ):
        """A collector on ``actor``'s counters, weights and outbox, writing into ``stage``."""
        super().__init__(spec, env, policy, actor.weights, actor.control, actor.outbox)
        self._stage = stage
        self._wake = actor.wake
        self._actor = actor
        self.control = actor.control
        self._attached = False

    @property
    def running(self) -> bool:
        """False once the learner stopped this actor; each read is the heartbeat and wakes a waiting exchange.

        Unlike a process, an actor does not watch its parent (the raylet): Ray ends the actors of a
        dead node or driver itself, and the learner sees that as the actor's death.
        """
        row = self.row
        row[PROGRESS] += 1
        row[PROGRESS_NS] = time.monotonic_ns()
        self._actor.paused = False  # until idle() says otherwise
        alive = not self.control.stopped
        if not self._attached:  # the writer reads this first after it attached its storage
            self._attached = True
            self._stage.attached()
        self._wake.set()
        return alive

    def budget(self) -> int:
        """The learner's budget, lowered to this collector's share and so that no staged row is overwritten.

        Collector processes read each other's counts live; an actor knows the others' only as the learner
        stored them when it sent its last request, and their staged rows not at all. So each actor takes
        ``ceil(room / num_collectors)`` of the room the learner saw (budget minus everything it stored, the
        ``totals`` of the request): together they never pass the budget by more than one step each, as
        processes do (``tests/runtime/test_ingest_workers.py``).
        """
        budget = super().budget()
        seen, n = self._actor.learner_total, self.control.num_collectors
        if n > 1 and seen is not None:
            budget = min(budget, seen + max(0, -(-(budget - seen) // n)))
        return self._stage.limit_budget(budget, self.total_transitions(), self.row)

    def granted(self) -> int:
        """The learner's grant, lowered so that a rollout starts only in a slot already taken."""
        return int(self._stage.limit_granted(super().granted()))

    def idle(self) -> None:  # type: ignore[override]  # an instance method here: it tells the actor
        """The writer may not collect now: say so to a waiting exchange (it answers at once), then sleep a little."""
        self._actor.paused = self._actor.was_paused = True
        self._wake.set()
        super().idle()


class CollectorActor:
    """One collector as a Ray actor (the pool wraps this class with ``ray.remote``; see the module docstring).

    Args:
        spec: the collector's :class:`~unilab_gym.runtime.collector.CollectorSpec` (its ``policy`` is unused).
        policy_bytes: the policy module, saved with ``torch.save``.
        row: int64: the learner's counters row of this collector (its totals so far).
        num_collectors: collectors of the pool.
        weights_size: float32 values of one weight version.
    """

    def __init__(
        self, spec: CollectorSpec, policy_bytes: bytes, row: np.ndarray, num_collectors: int, weights_size: int
    ):
        """Set up the actor's counters (from ``row``), weights and outbox (arguments: see the class docstring)."""
        import ray

        self.spec = spec
        self._policy_bytes = policy_bytes
        self.control = CounterTable(num_collectors)
        self.control.rows[spec.index] = row
        self.weights = LocalWeights(weights_size)
        self.outbox = Outbox()
        self.wake = threading.Event()
        #: the writer is waiting for the learner (budget, grant, weights) now / did since the last take.
        self.paused = self.was_paused = False
        #: transitions the learner had stored from all collectors when it sent the newest request applied.
        self.learner_total: int | None = None
        self._lock = threading.Lock()  # one exchange takes from the stage at a time; close waits for it
        self._taking = threading.Lock()  # one exchange waits for the stage at a time (the others queue)
        self._stage: ReplayStage | RolloutStage | None = None
        self._finished = False
        self._signals_seq = -1
        self._node_id = ray.get_runtime_context().get_node_id()

    def run(self) -> str | None:
        """Run the writer until the learner stops it; return ``None``, or the traceback of what it raised."""
        opened: list[Any] = []
        try:
            self._run(opened)
            return None
        except BaseException:
            return traceback.format_exc()
        finally:
            with self._lock:
                self._finished = True
                self._stage = None
                for resource in reversed(opened):
                    with contextlib.suppress(Exception):
                        resource.close()

    def _run(self, opened: list[Any]) -> None:
        import torch

        spec = self.spec
        sweep_stale_stages()
        torch.set_num_threads(1)
        torch.manual_seed(spec.seed)
        np.random.seed(spec.seed % 2**32)
        policy = torch.load(io.BytesIO(self._policy_bytes), weights_only=False)
        policy.eval()
        row = self.control.rows[spec.index]
        if spec.writer.sink == "replay":
            stage: ReplayStage | RolloutStage = ReplayStage(spec.writer, spec.num_envs)
        else:
            stage = RolloutStage(spec.writer, spec.num_envs, spec.index, int(row[ROLLOUTS]))
        opened.append(stage)
        spec = replace(spec, writer=stage.writer, parent_pid=os.getppid())
        env = make_vector_env(spec, spec.writer.autoreset_mode)
        opened.append(env)
        collector = StagedCollector(spec, env, policy, self, stage)
        with self._lock:
            self._stage = stage
        spec.writer.run(collector)

    def exchange(self, request: tuple[int, tuple[int, int, int], tuple[int, ...], Any]) -> dict[str, Any]:
        """Take the learner's signals and newest weights; return what was staged since the last exchange.

        Args:
            request: one tuple of plain Python values (one argument to serialize: a Ray call's cost grows with
                its arguments, and a numpy argument costs several times an int's), ``(seq, signals, totals,
                weights)``: ``seq``, the request's number (0, 1, ...: only signals newer than those applied
                are applied); ``signals``, ``(budget, learning_starts, granted)`` as the learner set them;
                ``totals``, the transitions the learner took from each collector (``num_collectors`` ints);
                ``weights``, ``(version, [ObjectRef of the (weights_size,) float32 vector])``, or ``None``
                if unchanged.

        Returns:
            ``{"data": stage data or None, "messages": [...], "row": bytes of the int64 counters row,
            "metrics": bytes of the float64 metrics row, "node_id": hex str, "pid": int, "host": str,
            "finished": bool, "weights_version": newest version held}`` (the rows as bytes: cheaper to
            serialize than small arrays; ``np.frombuffer`` reads them back).
        """
        import ray

        seq, signals, totals, weights = request
        control, index = self.control, self.spec.index
        if weights is not None:  # before the signals: a rollout granted with these weights starts with them
            version, (ref,) = weights
            self.weights.offer(version, ray.get(ref))
        with self._lock:
            if seq > self._signals_seq:  # requests may run out of order: the newest signals win
                self._signals_seq = seq
                others = np.arange(control.num_collectors) != index
                control.rows[others, TRANSITIONS] = np.asarray(totals, np.int64)[others]  # before the budget
                self.learner_total = int(sum(totals))
                control.set_signals(*signals)
        row = control.rows[index]
        with self._taking:  # a pipelined request waits here while the one before it gathers its answer
            deadline = time.monotonic() + EXCHANGE_WAIT_S
            while not self._finished and time.monotonic() < deadline:
                stage = self._stage
                if stage is not None and (stage.ready(row) or (self.paused and stage.has_data(row))):
                    break
                self.wake.wait(max(0.0, deadline - time.monotonic()))
                self.wake.clear()
            with self._lock:
                paused, self.was_paused = self.was_paused, False
                data = self._stage.take(row, paused) if self._stage is not None else None
                messages = self.outbox.take()  # after the data: the moments sent before a rollout finished come with it
        return {
            "data": data,
            "messages": messages,
            "row": row.tobytes(),
            "metrics": control.metrics[index].tobytes(),
            "node_id": self._node_id,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "finished": self._finished,
            "weights_version": self.weights.version,
        }

    def stop(self) -> None:
        """Ask the writer to return (it notices within one step)."""
        self.control.stop()
