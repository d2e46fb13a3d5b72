"""The collector process of :class:`~unilab_gym.runtime.process_pool.ProcessCollectorPool`.

One vector env (an EIC cluster) and a CPU copy of the policy, in a process started with the
``spawn`` start method. Everything it needs arrives as picklable handles. :func:`collector_main`
sets up what every collector shares (env, policy, weights, counters, error channel) as a
:class:`Collector`, then hands it to the spec's *writer*, which runs the family's loop and
decides what is written where: :class:`~unilab_gym.sb3.loops.off_policy.ReplayWriter`
(transitions into the shared replay) or :class:`~unilab_gym.sb3.loops.on_policy.RolloutWriter`
(rollouts into the shared rollout storage). A writer uses only the :class:`Collector` methods
and attributes documented there, so another backend can run the same writer with its own.

It reports to the learner through its own one-way pipe (``("episodes", returns, lengths)``
messages, or ``("error", traceback)`` before it exits with code 1). It ignores SIGINT (the
learner decides when to stop; the pool spawns it with SIGINT blocked, so a Ctrl-C during its
start-up prints no ``KeyboardInterrupt`` traceback either) and exits when the learner sets
``stop`` or disappears. Its heartbeat (:attr:`Collector.running`) tells the learner it is alive.

It dies with the learner whatever it is doing (:func:`die_with_parent`: on Linux the kernel sends it
SIGKILL when the learner exits, even inside a hung ``env.step`` or while stopped), so it never keeps
the learner's resource tracker, and with it the learner's ``/dev/shm`` segments, alive.

Every observation and reward its env returns is checked for NaN / inf before a writer sees it
(:class:`FiniteCheckedEnv`, shared with the Ray collectors): a non-finite value is a
:class:`~unilab_gym.runtime.errors.CollectorError` naming the collector, the env and the step, and
nothing of that step reaches the replay or rollout.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

import numpy as np

from unilab_gym.latency import LatencyHistogram, StepLatency
from unilab_gym.runtime.counters import (
    PROGRESS,
    PROGRESS_NS,
    READY,
    STEP_LATENCY,
    TERMINATED,
    TRUNCATED,
    VERSION,
    WEIGHT_SYNC_LATENCY,
    CountersHandle,
    CounterTable,
    SharedCounters,
)
from unilab_gym.runtime.errors import CollectorError
from unilab_gym.runtime.normalization import CollectorNormalizer, NormalizationSpec
from unilab_gym.runtime.weights import SharedWeights, WeightsHandle, WeightsReader, load_flat, vector_size
from unilab_gym.shm import Segment

if TYPE_CHECKING:
    import torch
    from gymnasium.vector import VectorEnv

#: How long a collector sleeps between checks while it may not collect, in s.
IDLE_WAIT_S = 0.0005
#: ``PR_SET_PDEATHSIG`` of ``<linux/prctl.h>``: the signal the kernel sends this process when its parent exits.
PR_SET_PDEATHSIG = 1
#: Where ``prctl`` is unavailable (not Linux): how often the watchdog thread compares ``getppid()``, in s.
WATCHDOG_INTERVAL_S = 0.2
#: Exit code of a collector that found its learner gone at start-up.
ORPHAN_EXIT_CODE = 3
#: Where a writer writes (:attr:`Writer.sink`).
Sink = Literal["replay", "rollout"]


class Writer(Protocol):
    """The family-specific part of a collector: picklable, built by the learner loop, run in the collector.

    ``run`` collects until :attr:`Collector.running` turns false, writing what the family's
    learner reads (replay transitions, rollouts) and counting in :attr:`Collector.row`.

    A transport that cannot hand the writer the learner's storage (Ray: another machine) reads
    :attr:`sink` to know which storage to stand in for, and replaces the handle attribute it names.
    """

    #: where the writer writes: ``"replay"`` (transitions into the replay ring of its ``replay``
    #: attribute, a :class:`~unilab_gym.replay.ReplayHandle`) or ``"rollout"`` (rollouts into the slots of
    #: its ``rollouts`` attribute, a :class:`~unilab_gym.runtime.rollout.RolloutHandle`, at env column ``column``).
    sink: ClassVar[Sink]
    #: autoreset mode the writer needs from the env (``"SameStep"``), or ``None`` for any.
    autoreset_mode: str | None
    #: the learner's ``VecNormalize`` settings (the collector then keeps a :attr:`Collector.normalizer`), or ``None``.
    normalization: NormalizationSpec | None

    def run(self, collector: Collector) -> None:
        """Collect until :attr:`Collector.running` turns false, writing into the writer's sink."""
        ...


@dataclass
class CollectorSpec:
    """What one collector needs (picklable).

    ``env_id`` / ``env_kwargs`` or ``env_fn`` (``env_fn(num_envs) -> gymnasium VectorEnv``) make its
    env, reset with ``env_seed`` (env ``i`` gets ``env_seed + i``); ``seed`` seeds torch and
    numpy. ``policy`` is (segment name, size in bytes) of a shared-memory segment holding the
    module the collector runs (SB3 actor, or the whole ``ActorCriticPolicy``), saved with
    ``torch.save``; its weights then follow the learner's through :class:`SharedWeights`.
    ``parent_pid`` is the learner's pid; in the running collector, the pid of the parent it dies with
    (:func:`die_with_parent`: the learner, or its fork server).
    """

    index: int
    num_envs: int
    env_seed: int
    seed: int
    policy: tuple[str, int]
    writer: Writer
    env_id: str | None = None
    env_fn: Callable[[int], VectorEnv] | None = None
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    parent_pid: int = 0


class Closable(Protocol):
    """What a collector process opens and closes when it ends: its env, its shared-memory views."""

    def close(self) -> None:
        """Release it."""
        ...


class MessageSink(Protocol):
    """Where a collector sends its reports to the learner: a ``multiprocessing`` pipe end, or an :class:`Outbox`."""

    def send(self, message: tuple[Any, ...]) -> None:
        """Queue ``message`` (a picklable tuple such as ``("episodes", returns, lengths)``) for the learner."""
        ...


class Outbox:
    """An in-process stand-in for a collector process's pipe: :meth:`send` queues, :meth:`take` empties.

    A Ray actor's messages ride on its next exchange result; an inline collector's are taken by the
    pool's ``poll``. Thread-safe (one lock).
    """

    def __init__(self) -> None:
        """Start with no message queued."""
        self._lock = threading.Lock()
        self._messages: list[tuple[Any, ...]] = []

    def send(self, message: tuple[Any, ...]) -> None:
        """Queue ``message``."""
        with self._lock:
            self._messages.append(message)

    def take(self) -> list[tuple[Any, ...]]:
        """The messages queued since the last call, in order."""
        with self._lock:
            taken, self._messages = self._messages, []
        return taken


def make_vector_env(spec: CollectorSpec, autoreset_mode: str | None = None) -> VectorEnv:
    """The collector's gymnasium ``VectorEnv`` (with ``autoreset_mode`` if given and made from ``env_id``)."""
    if spec.env_fn is not None:
        return spec.env_fn(spec.num_envs)
    if spec.env_id is None:
        raise ValueError("a collector needs env_id or env_fn")
    import gymnasium as gym

    from unilab_gym.registration import register_envs

    register_envs()  # UniLab ids, for an env_id made in this spawned process

    kwargs = dict(spec.env_kwargs)
    if autoreset_mode is None:
        return gym.make_vec(spec.env_id, num_envs=spec.num_envs, **kwargs)
    if gym.spec(spec.env_id).vector_entry_point is not None:  # a native vector env takes it as a kwarg
        return gym.make_vec(spec.env_id, num_envs=spec.num_envs, **kwargs, autoreset_mode=autoreset_mode)
    from gymnasium.vector import AutoresetMode

    return gym.make_vec(
        spec.env_id,
        num_envs=spec.num_envs,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": AutoresetMode(autoreset_mode)},
        **kwargs,
    )


#: a batch of observations: one array, or one per key of a ``Dict`` observation (``privileged_obs=True``).
Observations = np.ndarray | dict[str, np.ndarray]


def obs_tensor(obs: Observations) -> torch.Tensor | dict[str, torch.Tensor]:
    """A batch of observations as float32 torch, as SB3 feeds its policies.

    One tensor, or a dict of them for a ``Dict`` observation (``privileged_obs=True``).
    """
    import torch

    if isinstance(obs, dict):
        return {k: torch.as_tensor(np.asarray(v, np.float32)) for k, v in obs.items()}
    return torch.as_tensor(np.asarray(obs, np.float32))


def obs_rows(obs: Observations, index: int | slice | np.ndarray) -> Observations:
    """``obs[index]`` of a batch of observations (of each key's array for a ``Dict`` observation)."""
    return {k: v[index] for k, v in obs.items()} if isinstance(obs, dict) else obs[index]


def obs_copy(obs: Observations) -> Observations:
    """A float32 copy of a batch of observations (of each key's array for a ``Dict`` observation)."""
    if isinstance(obs, dict):
        return {k: np.array(v, np.float32, copy=True) for k, v in obs.items()}
    return np.array(obs, np.float32, copy=True)


def autoreset_mode_of(env: VectorEnv | FiniteCheckedEnv) -> str:
    """The env's autoreset mode as a string (``"NextStep"``, ``"SameStep"`` or ``"Disabled"``)."""
    mode = env.metadata.get("autoreset_mode", "NextStep")
    return str(getattr(mode, "value", mode))


def die_with_parent(learner_pid: int) -> int:
    """Make this process die with its parent, whatever it is doing then; return the parent's pid.

    The parent is the learner ``learner_pid`` (start methods ``spawn`` and ``fork``) or the
    learner's fork server (``forkserver``), which exits when the learner does once this process let go
    of its "alive" pipe (:func:`_let_go_of_fork_server`).

    On Linux: ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` (``man 2 prctl``), through ``ctypes`` on libc. The
    kernel then SIGKILLs this process when the thread that started it exits, even while it is stuck in
    C code, deadlocked, or stopped (SIGSTOP); the pool starts every collector from one thread that
    lives until it closes (see :class:`~unilab_gym.runtime.process_pool.ProcessCollectorPool`).
    Elsewhere, or if ``prctl`` fails: a daemon thread that compares ``os.getppid()`` every
    ``WATCHDOG_INTERVAL_S`` and ends the process (``os._exit``) once the parent changed; it needs the
    GIL, so an env stuck in C code that holds it, or a stopped process, outlives the parent there.

    Then, because the parent may have died before the death signal was set (nobody would send it),
    this exits with ``ORPHAN_EXIT_CODE`` if the parent changed meanwhile, or if the parent is not the
    learner and the learner is gone.

    Args:
        learner_pid: pid of the learner process that started this collector.

    Returns:
        the pid of the parent whose death ends this process.
    """
    parent = os.getppid()
    if parent != learner_pid:
        _let_go_of_fork_server()
    watched = False
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            zero = ctypes.c_ulong(0)
            watched = libc.prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), zero, zero, zero) == 0
    if not watched:
        threading.Thread(target=_watch_parent, args=(parent,), name="unilab-parent-watchdog", daemon=True).start()
    if os.getppid() != parent or (parent != learner_pid and not _exists(learner_pid)):
        os._exit(ORPHAN_EXIT_CODE)
    return parent


def _let_go_of_fork_server() -> None:
    """Close this process's copy of the fork server's "alive" pipe, so the server exits with the learner.

    ``multiprocessing``'s fork server exits at EOF on that pipe, and hands its write end to every process
    it forks (``multiprocessing.forkserver._forkserver._forkserver_alive_fd``, a private attribute of
    CPython 3.8-3.13), so that they may use it too: a collector holding it would keep the server, its
    parent, alive after the learner died, and its death signal would never come. Without it, this
    process can no longer start processes through that fork server (its env's own subprocesses need
    another start method).
    """
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)
        server._forkserver_alive_fd = None  # type: ignore[union-attr]


def _exists(pid: int) -> bool:
    """Whether process ``pid`` exists (``kill(pid, 0)``)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _watch_parent(parent_pid: int) -> None:
    """The watchdog thread of :func:`die_with_parent`: end the process once its parent is no longer ``parent_pid``."""
    while os.getppid() == parent_pid:
        time.sleep(WATCHDOG_INTERVAL_S)
    os._exit(ORPHAN_EXIT_CODE)


class FiniteCheckedEnv:
    """A collector's vector env whose ``reset`` and ``step`` refuse non-finite observations and rewards.

    Every other attribute is the wrapped env's. After each ``step`` one ``np.isfinite(...).all()``
    runs over the batch of observations (each key of a ``Dict`` observation), one over the rewards,
    and one over the ``final_obs`` of the envs whose episode ended (same-step autoreset); ``reset``
    checks its observations. Integer and boolean arrays are finite by construction and skipped.
    The check runs before the writer sees the step, so a NaN / inf reaches neither the replay, the
    rollout, nor the ``VecNormalize`` statistics.

    Args:
        env: the collector's gymnasium vector env.
        collector: the collector's index (named in the error).

    Raises:
        CollectorError: from ``reset`` / ``step``: a NaN or inf in an observation, a reward or a
            ``final_obs``; the message names the collector, the env index (in this collector), the
            step (the collector's count of ``env.step`` calls, 1 for the first; 0: its ``reset``), what
            was non-finite and where.

    :ivar steps: ``env.step`` calls so far.
    """

    def __init__(self, env: VectorEnv, collector: int):
        """Wrap ``env`` (arguments: see the class docstring)."""
        self.env = env
        self.collector = collector
        self.steps = 0

    def __getattr__(self, name: str) -> Any:
        """Every other attribute is the wrapped env's."""
        if name == "env":  # not yet set (e.g. while copying): no recursion
            raise AttributeError(name)
        return getattr(self.env, name)

    def reset(self, **kwargs: Any) -> Any:
        """The env's ``reset(**kwargs)``, its observations checked (``CollectorError`` on a NaN / inf)."""
        obs, info = self.env.reset(**kwargs)
        self._check("observation", obs)
        return obs, info

    def step(self, actions: Any) -> Any:
        """The env's ``step(actions)``, its observations, rewards and ``final_obs`` checked (``CollectorError``)."""
        out = self.env.step(actions)
        self.steps += 1
        obs, reward, info = out[0], out[1], out[4]
        self._check("observation", obs)
        self._check("reward", reward)
        if isinstance(info, dict) and "final_obs" in info:
            for i in np.flatnonzero(info.get("_final_obs", np.ones(len(info["final_obs"]), bool))):
                self._check("final_obs", info["final_obs"][i], env_index=int(i))
        return out

    def _check(self, what: str, values: Any, env_index: int | None = None) -> None:
        """Raise :class:`CollectorError` if ``values`` (a batch, or env ``env_index``'s value) holds a NaN / inf."""
        if isinstance(values, dict):
            for key, part in values.items():
                self._check(f"{what} {key!r}", part, env_index)
            return
        array = np.asarray(values)
        if array.dtype == object:  # e.g. a stacked object array of final observations
            try:
                array = array.astype(np.float64)
            except (TypeError, ValueError):
                return
        if array.dtype.kind not in "fc" or np.isfinite(array).all():
            return
        bad = np.argwhere(~np.isfinite(array))[0]
        i = env_index if env_index is not None else int(bad[0])
        where = tuple(int(b) for b in (bad if env_index is not None else bad[1:]))
        value = array[tuple(bad)]
        at = f"[{', '.join(map(str, where))}]" if where else ""
        step = f"step {self.steps}" + (" (its reset)" if self.steps == 0 else "")
        raise CollectorError(
            f"collector {self.collector}: env {i} returned a non-finite {what} ({what}{at} = {value}) at {step}; "
            "nothing of this step was written to the replay or rollout. A NaN or inf comes from the env "
            "(e.g. a physics blow-up or a division by zero in its task math): fix it, or end the episode "
            "before it happens",
            collector=self.collector,
            pid=os.getpid(),
            exitcode=None,
            traceback=None,
        )


class Collector:
    """What a writer works with inside the collector process.

    :ivar spec: the :class:`CollectorSpec`.
    :ivar env: the gymnasium vector env (``num_envs`` envs), not yet reset, behind a
        :class:`FiniteCheckedEnv` (its ``reset`` / ``step`` raise ``CollectorError`` on a NaN / inf).
    :ivar policy: the torch module on CPU, in eval mode, with the weights of :attr:`version`.
    :ivar row: this collector's counters (int64, fields of :mod:`unilab_gym.runtime.counters`:
        ``TRANSITIONS``, ``STEP_CALLS``, ``ROLLOUTS``, ... ), which it alone writes.
    :ivar version: weight version loaded into :attr:`policy` (0: none yet).
    :ivar normalizer: with a ``VecNormalize`` on the learner's model: the
        :class:`~unilab_gym.runtime.normalization.CollectorNormalizer` holding the statistics of
        :attr:`version` (loaded with the weights); else ``None``.

    The learner's signals are read with :meth:`budget`, :meth:`learning_starts`, :meth:`granted`
    and :meth:`total_transitions`.

    Metrics go to this collector's row of ``control.metrics``: the env's
    :class:`~unilab_gym.latency.StepLatency` (if the env keeps one, as ``UniLabVectorEnv`` does)
    is re-bound there, and :meth:`refresh` records the weight-sync latency (from the publish, or
    from this collector's start if later, to the version being loaded).
    """

    def __init__(
        self,
        spec: CollectorSpec,
        env: VectorEnv,
        policy: torch.nn.Module,
        weights: WeightsReader,
        control: CounterTable,
        conn: MessageSink,
    ):
        """Bind the collector to its counter row and metrics, and mark it ready (no weights loaded yet).

        Args:
            spec: the :class:`CollectorSpec`.
            env: the gymnasium vector env, not yet reset (wrapped in a :class:`FiniteCheckedEnv`).
            policy: the torch module the collector runs.
            weights: where the learner's weight versions are read from.
            control: the runner's counter table (this collector writes its row ``spec.index``).
            conn: where the collector's reports to the learner go.
        """
        self.spec, self.policy, self.conn = spec, policy, conn
        self.env = FiniteCheckedEnv(env, spec.index)  # shared by the Ray collectors (StagedCollector)
        self._control = control
        self.row = control.rows[spec.index]
        self.version = 0
        self._weights = weights
        self._params = list(policy.state_dict().values())
        self._params_size = vector_size(self._params)
        self._flat = np.empty(weights.size, np.float32)  # the policy's parameters first, then any tail
        normalization = spec.writer.normalization
        self.normalizer = None if normalization is None else CollectorNormalizer(normalization, env.num_envs)
        self._ep_return = np.zeros(env.num_envs)
        self._ep_length = np.zeros(env.num_envs, np.int64)
        metrics = control.metrics[spec.index]
        self._weight_sync = LatencyHistogram(metrics[WEIGHT_SYNC_LATENCY])
        base = env.unwrapped
        if getattr(base, "step_latency", None) is not None:  # a UniLabVectorEnv (or an env that keeps one)
            base.step_latency = StepLatency(metrics[STEP_LATENCY])  # type: ignore[attr-defined]  # not VectorEnv's
        self._ready_ns = time.monotonic_ns()
        self.row[PROGRESS_NS] = self._ready_ns
        self.row[READY] = 1

    @property
    def running(self) -> bool:
        """False once the learner set ``stop`` or exited.

        Each read is also this collector's heartbeat (``PROGRESS`` += 1, ``PROGRESS_NS`` = now): a
        writer reads it once per loop iteration, idle ones included, so a collector that stops
        reading it (stopped, deadlocked, stuck in ``env.step``) is one the learner sees as hung.
        """
        row = self.row
        row[PROGRESS] += 1
        row[PROGRESS_NS] = time.monotonic_ns()
        return not self._control.stopped and os.getppid() == self.spec.parent_pid

    def budget(self) -> int:
        """Off-policy: collectors together may write transitions while :meth:`total_transitions` is below this."""
        return self._control.signals()[0]

    def learning_starts(self) -> int:
        """Off-policy: collectors act uniformly at random while :meth:`total_transitions` is below this."""
        return self._control.signals()[1]

    def granted(self) -> int:
        """On-policy: collectors may collect the rollouts numbered below this."""
        return self._control.signals()[2]

    def total_transitions(self) -> int:
        """Transitions written by all collectors together."""
        return self._control.total_transitions()

    def refresh(self) -> int:
        """Load the newest published weights into :attr:`policy` if they are newer; return :attr:`version`."""
        if self._weights.version > self.version:
            self.version = self._weights.read(self._flat)
            load_flat(self._params, self._flat)
            if self.normalizer is not None:  # the statistics published with these weights
                self.normalizer.load(self._flat[self._params_size :])
            # a version published before this collector existed waited for its start-up, not for a sync
            since = max(self._weights.read_published_ns, self._ready_ns)
            self._weight_sync.observe((time.monotonic_ns() - since) / 1e3)
            self.row[VERSION] = self.version
        return self.version

    def send_moments(self) -> None:
        """Hand the observation / return moments gathered since the last call to the learner (if any)."""
        if self.normalizer is None:
            return
        obs_moments, return_moments = self.normalizer.take_moments()
        if obs_moments.count or return_moments.count:
            self.conn.send(("moments", obs_moments, return_moments))

    @staticmethod
    def idle() -> None:
        """Sleep a little: the writer may not collect now (no budget, no granted rollout, no weights)."""
        time.sleep(IDLE_WAIT_S)

    def track_episodes(
        self, reward: np.ndarray, terminated: np.ndarray, truncated: np.ndarray, counted: np.ndarray | None = None
    ) -> np.ndarray:
        """Add ``reward`` (N,) to the running episode stats (only where ``counted``), report the finished ones.

        An episode finished where ``terminated | truncated`` (N,) bool (and ``counted``); it counts
        as terminated if ``terminated``, else truncated. Returns the indices of the envs whose
        episode ended (their stats restart from zero).
        """
        done = terminated | truncated
        if counted is not None:
            done = done & counted
        if counted is None:
            self._ep_return += reward
            self._ep_length += 1
        else:
            self._ep_return[counted] += reward[counted]
            self._ep_length[counted] += 1
        idx = np.flatnonzero(done)
        if idx.size:
            ended_terminated = int(np.count_nonzero(terminated[idx]))
            self.row[TERMINATED] += ended_terminated  # before the message: a log it triggers counts these
            self.row[TRUNCATED] += idx.size - ended_terminated
            self.conn.send(("episodes", self._ep_return[idx].tolist(), self._ep_length[idx].tolist()))
            self._ep_return[idx] = 0.0
            self._ep_length[idx] = 0
        return idx


def collector_main(
    spec: CollectorSpec, weights_handle: WeightsHandle, control_handle: CountersHandle, conn: Connection
) -> None:
    """Process entry point: run the writer; on an exception, report it through ``conn`` first, then clean up."""
    # first: from now on the kernel ends this process with the learner (or its fork server)
    spec = replace(spec, parent_pid=die_with_parent(spec.parent_pid))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # discards a Ctrl-C that arrived while starting (blocked till now)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    opened: list[Closable] = []  # closed in reverse order, after the learner has been told of any error
    code = 0
    try:
        _run(spec, weights_handle, control_handle, conn, opened)
    except BaseException:
        code = 1
        with contextlib.suppress(OSError):
            conn.send(("error", traceback.format_exc()))
    finally:
        for resource in reversed(opened):
            with contextlib.suppress(Exception):
                resource.close()
        # skip interpreter teardown (torch's takes ~1 s): every resource was released above
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _run(
    spec: CollectorSpec,
    weights_handle: WeightsHandle,
    control_handle: CountersHandle,
    conn: Connection,
    opened: list[Closable],
) -> None:
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(spec.seed)
    np.random.seed(spec.seed % 2**32)
    name, size = spec.policy
    segment = Segment.attach(name)
    try:
        policy = torch.load(io.BytesIO(bytes(segment.buf[:size])), weights_only=False)
    finally:
        segment.close()
    policy.eval()
    weights = SharedWeights.attach(weights_handle)
    opened.append(weights)
    control = SharedCounters.attach(control_handle)
    opened.append(control)
    env = make_vector_env(spec, spec.writer.autoreset_mode)
    opened.append(env)
    spec.writer.run(Collector(spec, env, policy, weights, control, conn))
