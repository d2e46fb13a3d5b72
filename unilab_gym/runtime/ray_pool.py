""":class:`RayCollectorPool`: collectors as Ray actors, on this machine or on the nodes of a Ray cluster.

::

    node A: actor 0 ─┐  stage → exchange result ┐                      ┌─► model.train() (stock SB3)
    node B: actor 1 ─┼──────── Ray object store ─┼─► learner: poll() ───┤   same SharedReplayBuffer /
       ...          ─┘      (<= MAX_IN_FLIGHT    ┘   ingests in order   └── rollout storage as processes
                 ▲            per collector)                │
                 └──── one ray.put per weight version ◄─────┘

The second implementation of :class:`~unilab_gym.runtime.pool.CollectorPool`, after
:class:`~unilab_gym.runtime.process_pool.ProcessCollectorPool`. Each collector is a
:class:`~unilab_gym.runtime.ray_collector.CollectorActor` running the family's writer into a
stage in its own memory. The learner keeps a :class:`~unilab_gym.runtime.counters.CounterTable`
counters table that it updates from what the actors report, and :meth:`RayCollectorPool.poll`
keeps at most :data:`~unilab_gym.runtime.ray_collector.MAX_IN_FLIGHT` ``exchange`` requests in
flight per collector (RLlib's ``FaultTolerantActorManager`` design: ``ray.wait`` on the
requests, a cap per actor, faults seen on the request). Each result is ingested, in request
order, into the learner's replay (rows copied into a reservation of the ``ReplayStorage``) or
rollout storage (the collector's env columns of the rollout's slot); the counters the loops read
(``TRANSITIONS``, ``ROLLOUTS``) count what was ingested, so replay ratio, ``learning_starts``,
backpressure and policy lag keep their meaning. Each published weight version is one ``ray.put``;
its ObjectRef rides on each collector's next request.

The learner never polls Ray for answers: each request's ObjectRef tells, when its answer is ready,
through a callback on Ray's thread that puts it in a queue (``ObjectRef._on_ready``; a future's
callback on Rays without it), and :meth:`RayCollectorPool.wait` blocks on that queue. With
``setup.ingest_workers = K > 1``, K learner-side threads (the *ingest workers*; collector ``c``'s
answers go to worker ``c % K``, so each collector's answers stay in order) fetch each answer, copy
its data into the replay (one reservation per answer) or the rollout slot and send the collector
its next request; the training thread's :meth:`~RayCollectorPool.poll` then only counts what they
stored (the counters the loops read move there, in request order, as with ``K = 1``).

Faults: a remote exception comes back as the traceback ``run`` returns; a dead actor or node
(``RayActorError``) or an actor whose heartbeat stops for ``collector_timeout_s`` is killed and,
within ``max_restarts``, replaced by a new actor scheduled wherever its resources are free, with
the seeds of its restart count and the current weights.
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from unilab_gym.runtime.counters import (
    PROGRESS,
    PROGRESS_NS,
    READY,
    ROLLOUTS,
    STEP_CALLS,
    TERMINATED,
    TRANSITIONS,
    TRUNCATED,
    VERSION,
    CounterTable,
)
from unilab_gym.runtime.errors import CollectorError
from unilab_gym.runtime.metrics import IngestStats
from unilab_gym.runtime.pool import START_TIMEOUT_S as START_TIMEOUT_S  # the pools' one limit, re-exported
from unilab_gym.runtime.pool import CollectorPool, CollectorSetup, Reports
from unilab_gym.runtime.ray_collector import MAX_IN_FLIGHT, ROLLOUT_FIELDS, CollectorActor, sweep_stale_stages

if TYPE_CHECKING:
    from unilab_gym.replay import ReplayStorage
    from unilab_gym.runtime.rollout import RolloutStorage

#: What ``backend="ray"`` needs when Ray is not installed.
INSTALL_HINT = 'pip install "unilab-gym[ray]"'
#: Longest :meth:`RayCollectorPool.close` waits for actors to return from their loop before killing them, in s.
JOIN_TIMEOUT_S = 3.0
#: Counter fields an actor reports and the learner copies (each only grows during one actor's life).
_REPORTED = [VERSION, TERMINATED, TRUNCATED, STEP_CALLS, READY, PROGRESS]
#: How often :meth:`RayCollectorPool.poll` compares the collectors' heartbeats with their limit, in s.
HANG_CHECK_S = 0.05


def import_ray() -> Any:
    """Import Ray, or raise ``ImportError`` naming ``pip install "unilab-gym[ray]"``."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError(f'backend="ray" needs Ray: {INSTALL_HINT}') from exc
    return ray


def check_resources(resources: Any) -> dict[str, float]:
    """Validate ``collector_resources``: a dict of Ray resource names to amounts >= 0 (``None``: ``{"CPU": 1}``)."""
    if resources is None:
        return {"CPU": 1.0}
    if not isinstance(resources, dict) or not resources:
        raise ValueError(f"collector_resources must be a non-empty dict such as {{'collector': 1}}, got {resources!r}")
    out: dict[str, float] = {}
    for name, amount in resources.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"collector_resources keys must be resource names, got {name!r}")
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not 0 <= amount < float("inf"):
            raise ValueError(f"collector_resources[{name!r}] must be a finite number >= 0, got {amount!r}")
        out[name] = float(amount)
    return out


class RayCollectorPool(CollectorPool):
    """Collectors as Ray actors (see the module docstring).

    Args:
        setup: what the collectors run (see :class:`~unilab_gym.runtime.pool.CollectorSetup`).
        ray_address: if Ray is not initialised, the pool calls ``ray.init``, and shuts that Ray down
            on :meth:`close`. ``None``: a new local instance of its own, ``ray.init(address="local")``
            with the dashboard off, which never joins a cluster found through Ray's address lookup
            (``RAY_ADDRESS``, ``/tmp/ray/ray_current_cluster``: on a shared machine, another job's
            cluster). ``"auto"``: Ray's meaning, the cluster that lookup finds. ``"host:port"``: that
            head. If Ray is initialised, its cluster is used and left running.
        collector_resources: the Ray resource request of each actor, e.g. ``{"collector": 1}``
            (``"CPU"`` and ``"GPU"`` map to ``num_cpus`` / ``num_gpus``). Default ``{"CPU": 1}``.

    Raises:
        ImportError: Ray is not installed (the message names ``pip install "unilab-gym[ray]"``).
        ValueError: bad ``collector_resources`` (nothing is started).
    """

    def __init__(self, setup: CollectorSetup, ray_address: str | None = None, collector_resources: Any = None):
        """Check the arguments and initialise Ray if needed; no actor starts yet (see the class docstring)."""
        ray = import_ray()
        resources = check_resources(collector_resources)
        self._resources = dict(resources)
        if ray_address is not None and not isinstance(ray_address, str):
            raise ValueError(f"ray_address must be a str such as 'auto' or 'host:6379', or None, got {ray_address!r}")
        super().__init__(setup)
        self._ray = ray
        self._owns_ray = False
        if not ray.is_initialized():
            # address=None would let Ray join whatever RAY_ADDRESS or ray_current_cluster names
            address = "local" if ray_address is None else ray_address
            kwargs: dict[str, Any] = {"address": address, "configure_logging": False}
            if ray_address is None:
                kwargs["include_dashboard"] = False
            ray.init(**kwargs)
            self._owns_ray = True
        options: dict[str, Any] = {"num_cpus": resources.pop("CPU", 0.0), "max_concurrency": 1 + MAX_IN_FLIGHT}
        if "GPU" in resources:
            options["num_gpus"] = resources.pop("GPU")
        if resources:
            options["resources"] = resources
        self._actor_class = ray.remote(max_restarts=0, max_task_retries=0)(CollectorActor).options(**options)
        n = setup.num_collectors
        self._table = CounterTable(n)  # the learner's signals live in its globals, shipped with each request
        #: learner-side ingest threads (``setup.ingest_workers``; 1: the training thread ingests in poll()).
        self.ingest_workers = int(getattr(setup, "ingest_workers", 1) or 1)
        self._lock = threading.Lock()  # requests in flight, sequence numbers, generations: workers vs learner
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()  # what the learner thread handles in poll()
        k = self.ingest_workers
        self._queues: list[queue.SimpleQueue[Any]] = [queue.SimpleQueue() for _ in range(k)] if k > 1 else []
        self._threads: list[threading.Thread] = []
        self._held: list[Any] = []  # what wait() took from the inbox, for the next poll()
        self._pending = [0] * n  # requests in flight to each collector's current actor
        self._uncounted = [0] * n  # transitions stored in the learner's storage, not counted by poll() yet
        self._next_hang_check = 0.0
        self._version = 0
        self._weights_ref: Any = None
        self._weights_nbytes = 0
        self._policy_ref: Any = None
        self._actors: list[Any] = []
        self._run_refs: list[Any] = []
        self._generation = [0] * n  # bumped at each restart: results of a replaced actor are dropped
        self._next_seq = [0] * n  # exchange requests issued to the current actor
        self._next_ingest = [0] * n  # the next request whose result is ingested (in order)
        self._in_flight: dict[Any, tuple[int, int, int]] = {}  # ref -> (collector, generation, seq)
        self._arrived: list[dict[int, Any]] = [{} for _ in range(n)]  # seq -> result, waiting for earlier ones
        self._acked_version = [0] * n
        # the first weight version sent to each collector's current actor (0: none yet): it never acts with an older one
        self._sent_version = [0] * n
        self._progress_seen = [-1] * n
        self._node_of: list[str] = [""] * n
        self._pid_of: list[int | None] = [None] * n
        self._host_of: list[str] = [""] * n
        self._result_nbytes = [0] * n
        self._replay: ReplayStorage | None = None
        self._rollouts: RolloutStorage | None = None
        #: transitions ingested into the learner's storage so far.
        self.ingested = 0
        #: learner wall-clock seconds spent in :meth:`poll` (taking answers in, copying them, issuing requests).
        self.ingest_s = 0.0
        #: the learner thread's CPU seconds spent ingesting, by phase and per answer (:meth:`poll` and the
        #: CPU of :meth:`wait`; see :class:`~unilab_gym.runtime.metrics.IngestStats`).
        self.ingest_stats = IngestStats()
        self._worker: Any = None  # Ray's worker, when its get can be timed in two phases (see _get)
        self._closed = False

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Put the policy in the object store, attach the learner's storage and start one actor per collector."""
        if self._actors:
            return
        self._policy_ref = self._ray.put(self.setup.policy_bytes())  # one copy in the object store for every actor
        self._worker = _split_get_worker(self._ray)
        writer: Any = self.setup.writers[0]  # its sink says which storage the actors' data goes into
        if writer.sink == "replay":
            from unilab_gym.replay import ReplayStorage

            self._replay = ReplayStorage.attach(writer.replay)
        else:
            from unilab_gym.runtime.rollout import RolloutStorage

            self._rollouts = RolloutStorage.attach(writer.rollouts)
        for c in range(self.num_collectors):
            self._actors.append(None)
            self._run_refs.append(None)
            self._spawn(c)
        for w, inbox in enumerate(self._queues):
            thread = threading.Thread(target=self._work, args=(inbox,), name=f"unilab-ingest-{w}", daemon=True)
            thread.start()
            self._threads.append(thread)
        self._top_up()

    def _spawn(self, c: int) -> None:
        """Start the actor of collector ``c`` (a replacement gets the seeds of its restart count)."""
        spec = self.setup.collector_spec(c, self._restarts_of[c])
        row = self._table.rows[c].copy()
        actor = self._actor_class.remote(spec, self._policy_ref, row, self.num_collectors, self.setup.weights_size)
        with self._lock:
            self._actors[c] = actor
            self._run_refs[c] = run = actor.run.remote()
            self._next_seq[c] = self._next_ingest[c] = self._pending[c] = 0
            self._arrived[c] = {}
            _on_ready(run, self._inbox, ("run", c, self._generation[c]))
        self._acked_version[c] = self._sent_version[c] = 0
        self._progress_seen[c] = -1
        self._node_of[c], self._pid_of[c], self._host_of[c] = "", None, ""
        self._table.rows[c, PROGRESS_NS] = time.monotonic_ns()  # its heartbeat runs from now: start-up counts

    def close(self) -> None:
        """Stop every actor; shut Ray down if the pool started it. Idempotent.

        Each actor gets ``JOIN_TIMEOUT_S`` to return from its loop, then ``ray.kill``.
        """
        if self._closed:
            return
        self._closed = True
        ray = self._ray
        for inbox in self._queues:
            inbox.put(None)
        for thread in self._threads:
            thread.join(JOIN_TIMEOUT_S)
        actors = [a for a in self._actors if a is not None]
        try:
            for actor in actors:
                actor.stop.remote()
            runs = [r for r in self._run_refs if r is not None]
            if runs:
                ray.wait(runs, num_returns=len(runs), timeout=JOIN_TIMEOUT_S)
        except Exception:  # a dead cluster: nothing left to stop gracefully
            pass
        for actor in actors:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        host = socket.gethostname()
        pids = [pid for pid, h in zip(self._pid_of, self._host_of) if pid is not None and h == host]
        self._actors, self._run_refs, self._in_flight, self._held = [], [], {}, []
        self._weights_ref = self._policy_ref = None
        for storage in (self._replay, self._rollouts):
            if storage is not None:
                storage.close()
        self._replay = self._rollouts = None
        _wait_gone(pids, JOIN_TIMEOUT_S)
        if host in self._host_of:  # stages of actors killed with their node, on this machine (a local cluster)
            sweep_stale_stages()
        if self._owns_ray:
            ray.shutdown()

    # ------------------------------------------------------------------ weights and signals
    def publish_weights(self, weights: np.ndarray) -> int:
        """Put ``weights`` in the object store as the next version (sent with the next requests); return it."""
        self._version += 1
        self._weights_ref = self._ray.put(np.asarray(weights, np.float32))
        self._weights_nbytes = int(np.asarray(weights).nbytes)
        return self._version

    @property
    def weight_version(self) -> int:
        """Newest published version (0 before the first :meth:`publish_weights`)."""
        return self._version

    def policy_lag(self) -> int:
        """Published version minus the oldest version a collector acts with (0 if none acts yet).

        As :meth:`CollectorPool.policy_lag`, except that an actor counts from the first version sent to it: it reports
        the version it acts with only in its next answer, and it applies a request's weights before acting on it, so
        until that answer arrives the version sent is its floor. Without it, an actor whose first report was still in
        flight did not count, the learner published on, and the report then showed a lag above ``max_policy_lag``.
        """
        versions = np.maximum(self._table.rows[:, VERSION], np.asarray(self._sent_version, np.int64))
        acting = versions[versions > 0]
        return max(0, self._version - int(acting.min())) if acting.size else 0

    # ------------------------------------------------------------------ counters and status
    @property
    def counters(self) -> CounterTable:
        """The learner's copy of the counter table, updated from the actors' exchange results."""
        return self._table

    @property
    def bytes_in_flight(self) -> int:
        """Estimated object-store bytes of the exchange results in flight (each request ~ its collector's last)."""
        counts = [0] * self.num_collectors
        for c, _, _ in list(self._in_flight.values()):
            counts[c] += 1
        return int(sum(k * b for k, b in zip(counts, self._result_nbytes)))

    def _locations(self) -> list[tuple[str, int | None]]:
        return list(zip(self._node_of, self._pid_of))

    # ------------------------------------------------------------------ exchanges
    def _top_up(self) -> None:
        """Issue exchange requests until each live collector has ``MAX_IN_FLIGHT``."""
        if not self._actors or min(self._pending) >= MAX_IN_FLIGHT:
            return
        with self._lock:
            for c in range(self.num_collectors):
                self._request(c)

    def _request(self, c: int) -> None:
        """Under the lock: issue requests to collector ``c`` until it has ``MAX_IN_FLIGHT``.

        Each carries the learner's signals and counted totals; its ObjectRef goes, when its answer is ready, to
        the learner's inbox (``ingest_workers == 1``) or to the queue of ingest worker ``c % ingest_workers``.
        """
        actor = self._actors[c]
        if actor is None or self._pending[c] >= MAX_IN_FLIGHT:
            return
        # what the learner's storage holds from each collector (stored by a worker, counted or not): a collector
        # adds its own count to the others' to obey the budget, so backpressure is as tight as with K = 1
        totals = tuple(int(t) + u for t, u in zip(self._table.rows[:, TRANSITIONS].tolist(), self._uncounted))
        signals = self._table.signals()
        inbox = self._queues[c % len(self._queues)] if self._queues else self._inbox
        while self._pending[c] < MAX_IN_FLIGHT:
            weights = None
            if self._weights_ref is not None and self._acked_version[c] < self._version:
                # on every request until the actor has it: a request's signals (a grant) apply only after
                # its weights. In a list: the actor gets the ref, and its node fetches the object once.
                weights = (self._version, [self._weights_ref])
                if not self._sent_version[c]:
                    self._sent_version[c] = self._version
            ref = actor.exchange.remote((self._next_seq[c], signals, totals, weights))
            self._in_flight[ref] = (c, self._generation[c], self._next_seq[c])
            self._next_seq[c] += 1
            self._pending[c] += 1
            _on_ready(ref, inbox, ref)

    def _claim(self, ref: Any) -> tuple[int, int, int] | None:
        """Take ``ref`` out of the requests in flight: ``(collector, generation, seq)``, ``None`` if stale."""
        with self._lock:
            entry = self._in_flight.pop(ref, None)
            if entry is None or entry[1] != self._generation[entry[0]]:
                return None  # a replaced actor's request: dropped
            self._pending[entry[0]] -= 1
            return entry

    @property
    def ingest_cpu_s(self) -> float:
        """CPU seconds spent ingesting, on the training thread and the ingest workers (see :attr:`ingest_stats`)."""
        return self.ingest_stats.total_cpu_seconds

    #: how long the learner loops may block in :meth:`wait`: every answer and fault wakes it (through the queue
    #: Ray's callbacks fill), and a hung collector is noticed by the next :meth:`poll` (heartbeats: every
    #: :data:`HANG_CHECK_S`). Each 1 ms wake-up cost the learner ~10 µs of CPU.
    news_wait_s = HANG_CHECK_S

    def wait(self, timeout: float) -> None:
        """Block until an answer is ready (stored, with ingest workers) or an actor's loop returns, <= ``timeout`` s."""
        if self._held or not self._actors:
            return
        self.ingest_stats.begin()
        with contextlib.suppress(queue.Empty):
            self._held.append(self._inbox.get(timeout=timeout))
        self.ingest_stats.end("wait")  # CPU only: the blocked time costs none

    def _get(self, ref: Any) -> Any:
        """``ray.get(ref)``, its CPU split into the ``fetch`` and ``deserialize`` phases of :attr:`ingest_stats`.

        Ray's public ``ray.get`` does both in one call; its two steps (``Worker.get_objects``: the core worker's
        ``get_objects``, then ``Worker.deserialize_objects``) are called here one at a time, with ``ray.get``'s
        error handling (a ``RayTaskError`` is raised as an instance of its cause, any other ``RayError`` as
        is). Where this Ray lacks those methods, ``ray.get`` runs and all of it counts as ``fetch``. A numpy
        block of a large answer is read where it lies in the object store (no copy until the storage's).
        """
        stats, worker = self.ingest_stats, self._worker
        if worker is None:
            value = self._ray.get(ref)
            stats.lap("fetch")
            return value
        serialized = worker.core_worker.get_objects([ref], -1)
        stats.lap("fetch")
        (value,) = worker.deserialize_objects(serialized, [ref])
        stats.lap("deserialize")
        exceptions = self._ray.exceptions
        if isinstance(value, exceptions.RayTaskError):
            raise value.as_instanceof_cause()
        if isinstance(value, exceptions.RayError):
            raise value
        return value

    def _fetch(self, ref: Any, c: int, generation: int, seq: int) -> tuple[Any, ...]:
        """Fetch the answer ``ref`` of collector ``c`` and store its data; return what :meth:`poll` handles.

        ``("answer", c, generation, seq, result, transitions, bytes)``, or ``("fault", c, generation, error)``.
        """
        ray, stats = self._ray, self.ingest_stats
        try:
            result = self._get(ref)
        except ray.exceptions.RayTaskError as exc:  # a bug in the exchange itself
            return ("fault", c, generation, ("raised", str(exc)))
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
            return ("fault", c, generation, ("died", exc))
        data = result["data"]
        nbytes = transitions = 0
        if data is not None:
            stats.lap("bookkeeping")
            nbytes, transitions = self._store(c, data)
            with self._lock:
                self._uncounted[c] += transitions
            stats.lap("copy")
        return ("answer", c, generation, seq, result, transitions, nbytes)

    def _work(self, inbox: queue.SimpleQueue[Any]) -> None:
        """An ingest worker: fetch and store each answer its queue gets, request the next; ``None`` ends it."""
        stats = self.ingest_stats
        while True:
            ref = inbox.get()
            if ref is None:
                return
            stats.begin(worker=True)
            try:
                claimed = self._claim(ref)
                if claimed is None:
                    continue
                c, generation, seq = claimed
                stats.lap("bookkeeping")
                item = self._fetch(ref, c, generation, seq)
                if item[0] == "answer":
                    with self._lock:
                        if generation == self._generation[c]:
                            self._request(c)
                    stats.lap("request")
                self._inbox.put(item)
            except BaseException as exc:  # the training thread raises it in poll() (e.g. a closed replay)
                self._inbox.put(("error", exc))
            finally:
                stats.end("bookkeeping")

    def poll(self) -> Reports:
        """Ingest the exchange results that arrived, handle faults and send new requests (see the module docstring)."""
        reports = Reports()
        if not self._actors:
            return reports
        stats, t0 = self.ingest_stats, time.perf_counter()
        stats.begin()
        items, self._held = self._held, []
        with contextlib.suppress(queue.Empty):
            while True:
                items.append(self._inbox.get_nowait())
        if not items and time.monotonic() < self._next_hang_check and min(self._pending) >= MAX_IN_FLIGHT:
            stats.end("poll")  # nothing arrived, nothing due
            self.ingest_s += time.perf_counter() - t0
            return reports
        stats.lap("poll")
        try:
            return self._poll(items, reports)
        finally:
            stats.end("bookkeeping")
            self.ingest_s += time.perf_counter() - t0

    def _poll(self, items: list[Any], reports: Reports) -> Reports:
        stats = self.ingest_stats
        faults: dict[int, CollectorError] = {}
        touched: set[int] = set()
        for item in items:
            if not isinstance(item, tuple):  # a ready ObjectRef (ingest_workers == 1): fetch and store it here
                claimed = self._claim(item)
                if claimed is None or claimed[0] in faults:
                    continue
                stats.lap("bookkeeping")
                item = self._fetch(item, *claimed)
            kind = item[0]
            if kind == "error":
                raise item[1]
            c, generation = item[1], item[2]
            if generation != self._generation[c] or c in faults:
                if kind == "answer":
                    self._count_stale(c, item[4], item[5])
                continue
            if kind == "answer":
                self._arrived[c][item[3]] = item[4:]
                touched.add(c)
            elif kind == "fault":
                what, detail = item[3]
                faults[c] = (
                    self._error(c, "raised an exception", traceback=detail)
                    if what == "raised"
                    else self._died(c, detail)
                )
            else:  # "run": the actor's loop returned
                fault = self._run_returned(c)
                if fault is not None:
                    faults[c] = fault
        stats.lap("bookkeeping")
        for c in sorted(touched - set(faults)):
            self._ingest_arrived(c, reports)
        stats.lap("bookkeeping")
        now = time.monotonic()
        if now >= self._next_hang_check:
            self._next_hang_check = now + HANG_CHECK_S
            self._check_hung(faults)
        self._supervise(faults)
        stats.lap("bookkeeping")
        if not self._queues or faults:  # with ingest workers, they send the next requests
            self._top_up()
            stats.lap("request")
        return reports

    def _run_returned(self, c: int) -> CollectorError | None:
        """The fault of collector ``c`` whose ``run`` returned (``None`` if it did not: a spurious wake)."""
        ray = self._ray
        run = self._run_refs[c]
        if run is None:
            return None
        try:
            tb = ray.get(run, timeout=0)
        except ray.exceptions.GetTimeoutError:
            return None
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
            return self._died(c, exc)
        if tb is not None:
            return self._error(c, "raised an exception", traceback=tb)
        return self._error(c, "returned from its loop without being stopped")

    def _check_hung(self, faults: dict[int, CollectorError]) -> None:
        """Add a fault for each collector whose heartbeat stopped (see :meth:`hung_collectors`)."""
        timeout = self.setup.collector_timeout_s
        for c, since in self.hung_collectors().items():
            if c not in faults:
                started = bool(self._table.rows[c, READY])
                faults[c] = self._error(
                    c,
                    f"made no progress for {since:.1f} s (collector_timeout_s={timeout:g}) "
                    + (
                        f"while starting (does a node have free collector_resources {self._resources}?)"
                        if not started
                        else "in its loop: it is hung, or its node is unreachable"
                    )
                    + "; killed it",
                    seconds_since_progress=since,
                )

    def _ingest_arrived(self, c: int, reports: Reports) -> None:
        """Count collector ``c``'s stored results that are next in request order."""
        arrived = self._arrived[c]
        while self._next_ingest[c] in arrived:
            result, transitions, nbytes = arrived.pop(self._next_ingest[c])
            self._next_ingest[c] += 1
            self._ingest(c, result, transitions, nbytes, reports)

    def _count_stale(self, c: int, result: dict[str, Any], transitions: int) -> None:
        """Count an answer a worker stored before its collector was replaced.

        Its replay rows count (they are in the replay and get sampled); a rollout does not (the replacement
        collects it again, into the same slot).
        """
        with self._lock:
            self._uncounted[c] -= transitions
        data = result["data"]
        if data is not None and "rows" in data:
            self._table.rows[c, TRANSITIONS] += transitions
            self.ingested += transitions
            self.ingest_stats.answer(transitions)

    def _ingest(self, c: int, result: dict[str, Any], transitions: int, nbytes: int, reports: Reports) -> None:
        """Count one stored answer of collector ``c``: its messages, transitions, rollout and counters."""
        for kind, *payload in result["messages"]:
            if kind == "episodes":
                reports.episode_returns.extend(payload[0])
                reports.episode_lengths.extend(payload[1])
            elif kind == "moments":
                reports.moments.append((payload[0], payload[1]))
        data, rows = result["data"], self._table.rows
        if data is not None:
            with self._lock:
                self._uncounted[c] -= transitions
            rows[c, TRANSITIONS] += transitions
            self.ingested += transitions
            if "rollout" in data:
                rows[c, ROLLOUTS] = (
                    int(data["rollout"]) + 1
                )  # after the data: the loop reads a slot once every row passed it
        self.ingest_stats.answer(transitions)
        self._result_nbytes[c] = max(nbytes, 1024)
        row = np.frombuffer(result["row"], np.int64)
        rows[c, _REPORTED] = np.maximum(rows[c, _REPORTED], row[_REPORTED])
        if row[PROGRESS] > self._progress_seen[c]:
            self._progress_seen[c] = int(row[PROGRESS])
            rows[c, PROGRESS_NS] = time.monotonic_ns()  # the learner's clock: actors' clocks do not compare
            self._table.metrics[c] = np.frombuffer(result["metrics"], np.float64)
        self._node_of[c], self._pid_of[c], self._host_of[c] = result["node_id"], result["pid"], result["host"]
        self._acked_version[c] = max(self._acked_version[c], result["weights_version"])

    def _store(self, c: int, data: dict[str, Any]) -> tuple[int, int]:
        """Write one answer's ``data`` into the learner's storage (not counted yet); return ``(bytes, transitions)``."""
        if "rows" in data:
            return self._store_rows(data["rows"])
        return self._store_rollout(c, data)

    def _store_rows(self, rows: np.ndarray) -> tuple[int, int]:
        """Copy ``rows`` ((n, width) float32) into one reservation of the learner's replay.

        Returns ``(bytes, transitions)``.
        """
        storage, n = self._replay, len(rows)
        assert storage is not None, "ingesting rows into a pool of the rollout sink"
        res = storage.reserve(n)
        block = storage.block
        for r0, r1, s0, s1 in res.pieces:
            block[r0:r1] = rows[s0:s1]
        storage.commit(res)
        return int(rows.nbytes), n

    def _store_rollout(self, c: int, data: dict[str, Any]) -> tuple[int, int]:
        """Copy rollout ``data["rollout"]`` into collector ``c``'s env columns of its slot.

        Returns ``(bytes, transitions)``.
        """
        from unilab_gym.runtime.rollout import SLOTS

        storage, k = self._rollouts, int(data["rollout"])
        assert storage is not None, "ingesting a rollout into a pool of the replay sink"
        slot, e = k % SLOTS, self.setup.envs_per_collector
        cols = slice(c * e, (c + 1) * e)
        nbytes = 0
        for name in ROLLOUT_FIELDS:
            target, value = getattr(storage, name), data[name]
            index = (slot, cols) if name.startswith("last_") else (slot, slice(None), cols)
            pairs = [(target[k], value[k]) for k in target] if isinstance(target, dict) else [(target, value)]
            for array, part in pairs:  # a Dict observation: one array per key
                array[index] = part
                nbytes += part.nbytes
        storage.versions[slot, c] = data["version"]
        return nbytes, int(data["rewards"].size)

    # ------------------------------------------------------------------ faults
    def _where(self, c: int) -> str:
        pid, node = self._pid_of[c], self._node_of[c]
        return f"collector {c} (pid {pid if pid is not None else '?'}, node {node or 'not known yet'})"

    def _error(
        self, c: int, what: str, *, traceback: str | None = None, seconds_since_progress: float | None = None
    ) -> CollectorError:
        if seconds_since_progress is not None and self._actors[c] is not None:
            with contextlib.suppress(Exception):
                self._ray.kill(self._actors[c], no_restart=True)
        return CollectorError(
            f"{self._where(c)} {what}",
            collector=c,
            pid=self._pid_of[c],
            exitcode=None,
            traceback=traceback,
            seconds_since_progress=seconds_since_progress,
        )

    def _died(self, c: int, exc: BaseException) -> CollectorError:
        """The error for collector ``c``, whose actor (or its node) died: names the node and Ray's cause."""
        node = self._node_of[c]
        cause = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        node_dead = False
        if node:
            with contextlib.suppress(Exception):
                node_dead = any(n["NodeID"] == node and not n["Alive"] for n in self._ray.nodes())
        what = f"died: its node {node} died" if node_dead else "died"
        return CollectorError(
            f"{self._where(c)} {what} ({type(exc).__name__}: {cause})",
            collector=c,
            pid=self._pid_of[c],
            exitcode=None,
            traceback=None,
        )

    #: a replaced actor also starts its heartbeat count again (its reports are compared with the last seen).
    replaced_fields = (READY, VERSION, PROGRESS)

    def _retire(self, c: int) -> None:
        """Kill collector ``c``'s actor; results of its requests still in flight are dropped (new generation)."""
        with contextlib.suppress(Exception):
            self._ray.kill(self._actors[c], no_restart=True)
        with self._lock:
            self._generation[c] += 1
            self._actors[c] = None  # no worker sends it another request

    def _restart_head(self, fault: CollectorError) -> str:
        """The fault's first line, and its traceback's last (the remote exception) if it has one."""
        head = super()._restart_head(fault)
        if fault.traceback:
            head += ": " + fault.traceback.strip().splitlines()[-1]
        return head

    def _respawn(self, c: int) -> None:
        """A new actor for collector ``c``, wherever its resources are free."""
        self._spawn(c)


def _on_ready(ref: Any, inbox: queue.SimpleQueue[Any], item: Any) -> None:
    """Put ``item`` in ``inbox`` when the object ``ref`` is ready (or failed), from Ray's thread.

    ``ObjectRef._on_ready`` (no fetch, no deserialization) where this Ray has it, else the callback of
    ``ref.future()``. The caller keeps ``ref`` until the item is handled (a dropped ref never calls back).
    """
    hook = getattr(ref, "_on_ready", None)
    if callable(hook):
        hook(lambda _error: inbox.put(item))
    else:
        ref.future().add_done_callback(lambda _future: inbox.put(item))


def _split_get_worker(ray: Any) -> Any:
    """Ray's global worker if ``ray.get``'s two steps can be called one at a time (see ``_get``), else ``None``."""
    worker = getattr(getattr(getattr(ray, "_private", None), "worker", None), "global_worker", None)
    core = getattr(worker, "core_worker", None)
    if callable(getattr(core, "get_objects", None)) and callable(getattr(worker, "deserialize_objects", None)):
        return worker
    return None


def _wait_gone(pids: list[int], timeout: float) -> None:
    """Wait up to ``timeout`` s for the processes ``pids`` (actors on this machine) to exit."""
    import psutil

    deadline = time.monotonic() + timeout
    for pid in pids:
        if pid == os.getpid():
            continue
        with contextlib.suppress(psutil.NoSuchProcess, psutil.TimeoutExpired, psutil.AccessDenied, ChildProcessError):
            psutil.Process(pid).wait(max(0.0, deadline - time.monotonic()))
