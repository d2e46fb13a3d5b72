"""``AsyncRunner``: stock SB3 training with env collection in separate processes.

::

    collector 0 ─┐  (spawned: EIC cluster + CPU policy)      ┌─► model.train()  (stock SB3, unchanged)
    collector 1 ─┼──► shared memory: replay | rollouts ──────┘         │
       ...      ─┘         ▲                                           ▼
                 └──────── versioned policy weights (shared memory) ◄──┘

One runtime for both families of SB3 algorithms. This module owns what they share: the
collector processes, the weights they act with (:class:`SharedWeights`), the shared counters
(:class:`Control`), fault detection, ``close()`` and the ``learn()`` plumbing (callbacks,
logger, progress bar). What differs is a *loop* (learner side) and the *writer* it gives each
collector (collector side):

- off-policy (SAC, TD3, DDPG): :mod:`unilab_gym.runtime.off_policy` — collectors write
  transitions into the model's ``SharedReplayBuffer``, the learner keeps SB3's replay ratio;
- on-policy (PPO, A2C): :mod:`unilab_gym.runtime.on_policy` — collectors write whole
  rollouts into :class:`~unilab_gym.runtime.rollout.RolloutStorage`, the learner fills
  ``model.rollout_buffer`` and runs the stock ``train()``.
"""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import time
import warnings
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import Any

import numpy as np

from unilab_gym.runtime.collector import CollectorSpec, collector_main
from unilab_gym.runtime.control import READY, STOP, VERSION, Control
from unilab_gym.runtime.errors import CollectorError
from unilab_gym.runtime.metrics import MetricsServer, RunnerMetrics
from unilab_gym.runtime.weights import SharedWeights
from unilab_gym.shm import Segment

#: Longest a learner waits for collectors to exit on close before terminating them, in s.
JOIN_TIMEOUT_S = 3.0


class AsyncRunner:
    """Drive a stock SB3 model with collectors in separate processes.

    Off-policy (``SAC``, ``TD3``, ``DDPG``): the model's replay buffer must be a
    :class:`unilab_gym.SharedReplayBuffer` (``replay_buffer_class=SharedReplayBuffer``); see
    :mod:`unilab_gym.runtime.off_policy` for the replay ratio and policy lag.
    On-policy (``PPO``, ``A2C``): the model's env must have ``num_collectors *
    envs_per_collector`` envs (``n_steps`` is per env, as in SB3); see
    :mod:`unilab_gym.runtime.on_policy` for the rollout, GAE and lag semantics.

    Args:
        model: an SB3 ``SAC`` / ``TD3`` / ``DDPG`` / ``PPO`` / ``A2C``.
        env_id: a registered gymnasium id; each collector makes ``gym.make_vec(env_id,
            num_envs=envs_per_collector, **env_kwargs)`` (on-policy: with same-step autoreset).
        env_fn: instead of ``env_id``: a picklable ``env_fn(num_envs) -> gymnasium.vector.VectorEnv``
            (on-policy: with ``autoreset_mode="SameStep"``).
        num_collectors: collector processes.
        envs_per_collector: envs per collector (its EIC cluster size).
        env_kwargs: keyword arguments for ``gym.make_vec``.
        max_policy_lag: most weight versions a collector may act behind the learner. ``None``:
            the family's default, 4 off-policy (valid: >= 1), 0 on-policy (valid: 0 or 1).
        replay_ratio: off-policy only: gradient steps per transition; default from the model.
        seed: collector ``c`` seeds its env with ``seed + c * envs_per_collector`` (env ``i`` of it
            gets ``+ i``, so env ``j`` of all collectors gets ``seed + j``, as ``make_sb3_env``
            seeds them) and torch / numpy with ``seed + c``; default ``model.seed``, else random.
        start_method: multiprocessing start method for collectors (``"spawn"``, safe with torch).
        max_collector_restarts: how many collector faults (an exception in a collector, or a
            collector that died, e.g. SIGKILL) the runner survives over its life by starting a
            new collector in its place (with a new env seed; a warning names the fault). The next
            fault raises :class:`CollectorError`. Default 0: the first fault raises.
        metrics_port: serve the pipeline metrics (:data:`unilab_gym.runtime.metrics.METRICS`) to
            Prometheus at ``http://<metrics_addr>:<port>/metrics`` (0: a free port, see
            :attr:`metrics_url`). Default ``None``: no server. Needs ``prometheus-client``.
            The same figures go to the SB3 logger under ``unilab/*`` whenever the runner logs.
        metrics_addr: address the metrics server binds, loopback only by default.

    Raises:
        ValueError: an unsupported model or model setting (named in the message), both or
            neither of ``env_id`` / ``env_fn``, bad counts, a bad ``max_policy_lag``,
            ``replay_ratio``, ``max_collector_restarts``, ``metrics_port`` or ``metrics_addr``, or a model whose
            env is wrapped in ``VecNormalize`` (collectors would not normalize).
        OSError: ``metrics_port`` is already in use (``errno.EADDRINUSE``); nothing is left running.

    Use as a context manager, or call :meth:`close`; it stops and joins every collector.
    """

    def __init__(
        self,
        model: Any,
        env_id: str | None = None,
        env_fn: Callable[[int], Any] | None = None,
        num_collectors: int = 2,
        envs_per_collector: int = 32,
        *,
        env_kwargs: dict[str, Any] | None = None,
        max_policy_lag: int | None = None,
        replay_ratio: float | None = None,
        seed: int | None = None,
        start_method: str = "spawn",
        max_collector_restarts: int = 0,
        metrics_port: int | None = None,
        metrics_addr: str = "127.0.0.1",
    ):
        from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
        from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm

        from unilab_gym.runtime.off_policy import OffPolicyLoop
        from unilab_gym.runtime.on_policy import OnPolicyLoop

        self._closed = True  # until fully constructed
        if (env_id is None) == (env_fn is None):
            raise ValueError("pass exactly one of env_id or env_fn")
        for name, value in (("num_collectors", num_collectors), ("envs_per_collector", envs_per_collector)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if (
            isinstance(max_collector_restarts, bool)
            or not isinstance(max_collector_restarts, int)
            or max_collector_restarts < 0
        ):
            raise ValueError(f"max_collector_restarts must be an int >= 0, got {max_collector_restarts!r}")
        if metrics_port is not None and (
            isinstance(metrics_port, bool) or not isinstance(metrics_port, int) or not 0 <= metrics_port <= 65535
        ):
            raise ValueError(f"metrics_port must be None or an int in [0, 65535], got {metrics_port!r}")
        if not isinstance(metrics_addr, str) or not metrics_addr:
            raise ValueError(f"metrics_addr must be a host name or IP address, got {metrics_addr!r}")
        if isinstance(model, OnPolicyAlgorithm):
            family = OnPolicyLoop
        elif isinstance(model, OffPolicyAlgorithm):
            family = OffPolicyLoop
        else:
            raise ValueError(f"AsyncRunner drives SB3 SAC, TD3, DDPG, PPO or A2C models, got {type(model).__name__}")
        if model.get_vec_normalize_env() is not None:
            raise ValueError(
                "the model's env is wrapped in VecNormalize, which collectors do not apply: their observations and "
                "rewards would not be normalized; train without VecNormalize (or normalize inside the env)"
            )
        self._loop = family(model, num_collectors, envs_per_collector, max_policy_lag, replay_ratio)
        try:
            self._env_kwargs = self._loop.env_kwargs(dict(env_kwargs or {}))
        except BaseException:
            self._loop.close()
            raise
        self.model = model
        self.num_collectors = num_collectors
        self.envs_per_collector = envs_per_collector
        self.max_policy_lag: int = self._loop.max_policy_lag
        #: off-policy: gradient steps per transition; ``None`` on-policy.
        self.replay_ratio: float | None = self._loop.replay_ratio
        self._env_id, self._env_fn = env_id, env_fn
        if seed is None:
            seed = model.seed if model.seed is not None else int(np.random.SeedSequence().generate_state(1)[0])
        self.seed = int(seed)
        self._ctx = mp.get_context(start_method)

        self._policy = self._loop.policy
        self._tensors = list(self._policy.state_dict().values())
        size = sum(t.numel() for t in self._tensors)
        self._flat = np.empty(size, np.float32)
        self._published = np.full(size, np.nan, np.float32)
        self.max_collector_restarts = max_collector_restarts
        self._restarts = [0] * num_collectors  # per collector: how many times it was replaced
        self._weights: SharedWeights | None = None
        self._control: Control | None = None
        self._metrics_server: MetricsServer | None = None
        self._policy_segment: Segment | None = None
        try:
            self._weights = SharedWeights(size)
            self._control = Control(num_collectors)
            #: the pipeline metrics (:class:`~unilab_gym.runtime.metrics.RunnerMetrics`).
            self.metrics = RunnerMetrics(self._control, self._weights, self._loop.replay_storage, self._loop.batch_size)
            if metrics_port is not None:
                self._metrics_server = MetricsServer(self.metrics, metrics_port, metrics_addr)
        except BaseException:
            for resource in (self._control, self._weights, self._loop):
                if resource is not None:
                    resource.close()
            raise
        self._procs: list[Any] = []
        self._conns: list[Any] = []
        self._t0 = time.monotonic()
        self._closed = False
        self._publish()

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> AsyncRunner:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def metrics_url(self) -> str | None:
        """``http://<addr>:<port>/metrics`` of the Prometheus endpoint, or ``None`` (no ``metrics_port``, or closed)."""
        return self._metrics_server.url if self._metrics_server is not None else None

    @property
    def collector_pids(self) -> list[int]:
        """Process ids of the running collectors (empty before the first :meth:`learn`)."""
        return [p.pid for p in self._procs]

    def close(self) -> None:
        """Stop and join every collector, then free the runner's shared memory. Idempotent.

        Collectors in their loop get ``JOIN_TIMEOUT_S`` to exit, then SIGTERM, then SIGKILL;
        collectors still starting (imports, env construction) get SIGTERM at once. The metrics
        port is released. The model (and its replay buffer) stays usable; an on-policy model
        gets its own rollout buffer back.
        """
        if self._closed:
            return
        self._closed = True
        if self._metrics_server is not None:
            self._metrics_server.close()
            self._metrics_server = None
        self.metrics.close()
        self._control.globals[STOP] = 1
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
        if self._policy_segment is not None:
            self._policy_segment.close()
            self._policy_segment = None
        self._control.close()
        self._weights.close()
        self._loop.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this AsyncRunner is closed; create a new one")

    def _start_collectors(self) -> None:
        """Spawn the collectors (once; later calls do nothing)."""
        if self._procs:
            return
        import copy

        import torch

        # the policy module goes through shared memory, not the spawn payload: a large payload
        # blocks Process.start() until the child reads it, forever if the child fails while bootstrapping
        buffer = io.BytesIO()
        torch.save(copy.deepcopy(self._policy).to("cpu"), buffer)
        payload = buffer.getbuffer()
        self._policy_segment = Segment.create(payload.nbytes)
        self._policy_segment.buf[: payload.nbytes] = payload
        self._policy_bytes = payload.nbytes
        for c in range(self.num_collectors):
            proc, conn = self._spawn(c)
            self._procs.append(proc)
            self._conns.append(conn)

    def _spawn(self, c: int) -> tuple[Any, Any]:
        """Start collector ``c`` (its ``k``-th replacement gets env and torch seeds shifted by ``k * num_collectors`` collectors)."""
        shift = self._restarts[c] * self.num_collectors
        spec = CollectorSpec(
            index=c,
            num_envs=self.envs_per_collector,
            env_seed=self.seed + (c + shift) * self.envs_per_collector,
            seed=self.seed + c + shift,
            policy=(self._policy_segment.name, self._policy_bytes),
            writer=self._loop.writer(c),
            env_id=self._env_id,
            env_fn=self._env_fn,
            env_kwargs=self._env_kwargs,
            parent_pid=os.getpid(),
        )
        reader, writer = self._ctx.Pipe(duplex=False)
        proc = self._ctx.Process(
            target=collector_main,
            args=(spec, self._weights.handle, self._control.handle, writer),
            name=f"unilab-collector-{c}",
            daemon=True,
        )
        proc.start()
        writer.close()
        return proc, reader

    # ------------------------------------------------------------------ weights
    def _publish(self, only_if_changed: bool = False) -> int:
        """Publish the policy's weights as a new version (unless unchanged and ``only_if_changed``); return the version."""
        with self.metrics.learner_phase("publish_weights"):
            return self._publish_now(only_if_changed)

    def _publish_now(self, only_if_changed: bool) -> int:
        offset = 0
        for t in self._tensors:
            k = t.numel()
            self._flat[offset : offset + k] = t.detach().reshape(-1).cpu().numpy()
            offset += k
        if only_if_changed and np.array_equal(self._flat, self._published):
            return self._weights.version
        self._published[:] = self._flat
        return self._weights.publish(self._flat)

    def policy_lag(self) -> int:
        """Current policy lag: published version minus the oldest version a running collector acts with."""
        return self.metrics.policy_lag()

    # ------------------------------------------------------------------ faults and messages
    def _wait(self, timeout: float) -> None:
        """Sleep until a collector sends a message or exits, at most ``timeout`` s (learner time: waiting for data)."""
        with self.metrics.learner_phase("wait_for_data"):
            wait(self._conns + [p.sentinel for p in self._procs], timeout=timeout)

    def _poll(self) -> None:
        """Drain collector messages (episode stats go to ``model.ep_info_buffer``); handle failed or dead collectors.

        A fault is counted in ``metrics.collector_errors``; while ``max_collector_restarts``
        allows, the collector is replaced (with a warning), otherwise the fault is raised.

        Raises:
            CollectorError: a collector sent its traceback, or exited, and no restart is left.
        """
        self.metrics.tick()
        ready = wait(self._conns + [p.sentinel for p in self._procs], timeout=0)
        if not ready:
            return
        for c, (conn, proc) in enumerate(zip(self._conns, self._procs)):
            fault: CollectorError | None = None
            if conn in ready:
                while conn.poll():
                    try:
                        kind, *payload = conn.recv()
                    except (EOFError, OSError):
                        break
                    if kind == "error":
                        fault = CollectorError(
                            f"collector {c} (pid {proc.pid}) raised an exception",
                            collector=c,
                            pid=proc.pid,
                            exitcode=proc.exitcode,
                            traceback=payload[0],
                        )
                        break
                    self._on_episodes(*payload)
            if fault is None and (proc.sentinel in ready or not proc.is_alive()):
                proc.join(0.1)
                fault = self._death(c, proc)
            if fault is not None:
                self.metrics.collector_errors += 1
                if self.metrics.collector_restarts >= self.max_collector_restarts:
                    raise fault
                self._restart(c, fault)

    def _death(self, c: int, proc: Any) -> CollectorError:
        """The error for collector ``c``, which exited without reporting an exception."""
        code = proc.exitcode
        signalled = code is not None and code < 0
        message = f"collector {c} (pid {proc.pid}) " + (
            "died unexpectedly" if self._control.rows[c, READY] else "exited while starting"
        )
        message += f" with exit code {code}" + (f" (killed by signal {-code})" if signalled else "")
        if not self._control.rows[c, READY] and not signalled:
            message += (
                ", before it could report an error (its traceback is on stderr above). Usual causes: the script creates "
                'the AsyncRunner outside `if __name__ == "__main__":`, or env_fn is not importable by the spawned '
                "process (define it at module level); collectors are spawned processes that import the script"
            )
        return CollectorError(message, collector=c, pid=proc.pid, exitcode=code, traceback=None)

    def _restart(self, c: int, fault: CollectorError) -> None:
        """Replace collector ``c`` after ``fault``: stop what is left of it, start a new one in its row."""
        proc = self._procs[c]
        proc.join(JOIN_TIMEOUT_S)
        if proc.is_alive():
            proc.kill()
            proc.join(1.0)
        self._conns[c].close()
        self.metrics.collector_restarts += 1
        self._restarts[c] += 1
        head = str(fault).split("\n\n--- collector")[0]
        if fault.traceback:
            head += ": " + fault.traceback.strip().splitlines()[-1]
        warnings.warn(
            f"{head}; restarting it ({self.metrics.collector_restarts} of max_collector_restarts="
            f"{self.max_collector_restarts})",
            RuntimeWarning,
            stacklevel=2,
        )
        self._control.rows[c, READY] = 0
        self._control.rows[c, VERSION] = 0
        self._procs[c], self._conns[c] = self._spawn(c)

    def _on_episodes(self, returns: list[float], lengths: list[int]) -> None:
        model = self.model
        for r, l in zip(returns, lengths):
            model.ep_info_buffer.append({"r": r, "l": l, "t": round(time.monotonic() - self._t0, 6)})
        model._episode_num += len(returns)

    # ------------------------------------------------------------------ training
    def learn(
        self,
        total_timesteps: int,
        callback: Any = None,
        log_interval: int | None = None,
        tb_log_name: str = "AsyncRunner",
        reset_num_timesteps: bool = True,
        progress_bar: bool = False,
    ) -> Any:
        """Train ``self.model`` for ``total_timesteps`` env steps (transitions); return the model.

        Same signature and meaning as SB3's ``model.learn``: callbacks, the logger, TensorBoard
        and the progress bar work unchanged. ``on_step`` is called once per ``model.n_envs``
        transitions written by the collectors, with ``model.num_timesteps`` rising by
        ``model.n_envs``; on-policy, ``on_rollout_start`` / ``on_rollout_end`` frame each
        rollout. ``log_interval`` is in episodes off-policy (default 4) and in rollouts
        on-policy (default 1), as in SB3. The callbacks' ``self.locals`` do not hold per-step
        ``infos`` / ``dones`` (the learner never sees single steps).

        Raises:
            CollectorError: a collector raised (with its traceback) or died (e.g. SIGKILL).
                Collectors are stopped before any exception leaves ``learn``.
            RuntimeError: the runner is closed.
        """
        self._check_open()
        model = self.model
        if log_interval is None:
            log_interval = self._loop.default_log_interval
        try:
            total, callback = model._setup_learn(
                total_timesteps, callback, reset_num_timesteps, tb_log_name, progress_bar
            )
            callback.on_training_start(locals(), globals())
            self._t0 = time.monotonic()
            self.metrics.begin()
            self._loop.run(self, total, callback, log_interval)
            callback.on_training_end()
        except BaseException:
            self.close()
            raise
        return model
