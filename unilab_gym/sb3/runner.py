"""``AsyncRunner``: stock SB3 training with env collection in separate processes.

::

    collector 0 ─┐  (spawned: EIC cluster + CPU policy)      ┌─► model.train()  (stock SB3, unchanged)
    collector 1 ─┼──► shared memory: replay | rollouts ──────┘         │
       ...      ─┘         ▲                                           ▼
                 └──────── versioned policy weights (shared memory) ◄──┘

One runtime for both families of SB3 algorithms. This module checks the arguments, picks the
family's *loop* and builds the :class:`~unilab_gym.runtime.pool.CollectorPool` it runs against
(today a :class:`~unilab_gym.runtime.process_pool.ProcessCollectorPool`), the pipeline metrics,
and the ``learn()`` plumbing (callbacks, logger, progress bar) and ``close()``. A family is a
loop (learner side) and the *writer* it gives each collector (collector side):

- off-policy (SAC, TD3, DDPG): :mod:`unilab_gym.sb3.loops.off_policy` — collectors write
  transitions into the model's ``SharedReplayBuffer``, the learner keeps SB3's replay ratio;
- on-policy (PPO, A2C): :mod:`unilab_gym.sb3.loops.on_policy` — collectors write whole
  rollouts into :class:`~unilab_gym.runtime.rollout.RolloutStorage`, the learner fills
  ``model.rollout_buffer`` and runs the stock ``train()``.

:mod:`unilab_gym.runtime.pool` describes the seam between the loops and the collectors.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import multiprocessing as mp
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from unilab_gym.runtime.inline_pool import InlineCollectorPool
from unilab_gym.runtime.metrics import MetricsServer, RunnerMetrics, prometheus_app
from unilab_gym.runtime.pool import CollectorPool, CollectorSetup, check_env_count, check_env_source
from unilab_gym.runtime.process_pool import ProcessCollectorPool
from unilab_gym.sb3 import _sb3_private
from unilab_gym.sb3.control.runner_api import RunnerControl
from unilab_gym.sb3.loops.base import DRIVEN
from unilab_gym.validation import check_host, check_int, check_positive_int, check_real, check_seed

if TYPE_CHECKING:
    from pathlib import Path

    from unilab_gym.sb3.loops.base import LearnerLoop
    from unilab_gym.sb3.loops.off_policy import OffPolicyLoop
    from unilab_gym.sb3.loops.on_policy import OnPolicyLoop

#: The collector pools ``AsyncRunner(backend=...)`` builds: spawned processes, Ray actors, or in the learner.
BACKENDS = ("process", "ray", "inline")


class AsyncRunner:
    """Drive a stock SB3 model with collectors in separate processes.

    Off-policy (``SAC``, ``TD3``, ``DDPG``): the model's replay buffer must be a
    :class:`unilab_gym.SharedReplayBuffer` (``replay_buffer_class=SharedReplayBuffer``); see
    :mod:`unilab_gym.sb3.loops.off_policy` for the replay ratio and policy lag.
    On-policy (``PPO``, ``A2C``): the model's env must have ``num_collectors *
    envs_per_collector`` envs (``n_steps`` is per env, as in SB3); see
    :mod:`unilab_gym.sb3.loops.on_policy` for the rollout, GAE and lag semantics.

    **VecNormalize.** A model whose env is ``VecNormalize(...)`` trains as it would without the
    runner: collectors normalize observations (and, with ``norm_reward``, rewards) with the
    learner's statistics, shipped with the weights under the same version; the raw observation
    (and return) moments they step are merged back into the model's ``VecNormalize``, so
    ``obs_rms.count`` grows by the observations stepped and ``VecNormalize.save`` after the run
    writes the file ``unilab-gym play`` and :func:`unilab_gym.evaluation.evaluate_gait` load.
    Off-policy, the replay keeps raw data and SB3 normalizes it when it samples, as it does
    without the runner. See :mod:`unilab_gym.runtime.normalization`.

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
        collector_timeout_s: a collector whose heartbeat (a progress counter and time it updates at
            every iteration of its loop, idle ones included) does not move for this many seconds
            is hung (stopped, deadlocked, stuck in its env's step): a fault like a death, killed,
            then restarted within ``max_collector_restarts`` or raised as :class:`CollectorError`
            (naming it, its pid and the seconds since its last progress). A collector still
            starting gets at least ``START_TIMEOUT_S`` (60 s, :mod:`~unilab_gym.runtime.process_pool`).
            Default 60: a healthy collector beats every few milliseconds.
        metrics_port: serve the pipeline metrics (:data:`unilab_gym.runtime.metrics.METRICS`) to
            Prometheus at ``http://<metrics_addr>:<port>/metrics`` (0: a free port, see
            :attr:`metrics_url`). Default ``None``: no server. Needs ``prometheus-client``.
            The same figures go to the SB3 logger under ``unilab/*`` whenever the runner logs.
        metrics_addr: address the metrics server binds, loopback only by default.
        control_port: serve the control API (:mod:`unilab_gym.sb3.control`: live hyperparameters, snapshots,
            rollback, status; bearer token :attr:`control_token`) at :attr:`control_url` (0: a free port).
            With ``metrics_port`` too, ``/metrics`` is served on this server instead (one port per
            runner). Default ``None``: no server; the Python methods work anyway. Needs
            ``pip install "unilab-gym[control]"``.
        control_addr: address the control server binds, loopback only by default.
        snapshot_dir: the run's directory (:meth:`snapshot` files, the token file); default a fresh
            directory under ``runs/``, made when first needed.
        snapshot_on_change: take a snapshot before every hyperparameter change.
        backend: ``"process"`` (default): collectors are processes on this machine, sharing memory with
            the learner. ``"ray"``: each collector is a Ray actor, on any node of a Ray cluster, shipping
            its data through the object store (:mod:`unilab_gym.runtime.ray_pool`, ``docs/ray.md``).
            ``"inline"``: no process; the learner steps the collectors itself, one at a time, between
            its training calls (:mod:`unilab_gym.runtime.inline_pool`): deterministic, and a breakpoint
            in the env works; for tests and debugging. ``max_collector_restarts`` must be 0 there, and
            ``collector_timeout_s`` and ``start_method`` are not used; no main guard is needed.
        ray_address: ``backend="ray"``: if Ray is not initialised, the runner calls
            ``ray.init(address=ray_address)`` (``None``: a local instance, dashboard off; ``"auto"``:
            this machine's cluster) and shuts it down on :meth:`close`; an initialised Ray is used and left running.
        collector_resources: ``backend="ray"``: the Ray resource request of each collector actor, e.g.
            ``{"collector": 1}`` for nodes that advertise a custom ``collector`` resource. Default: one CPU.

    Raises:
        ImportError: ``backend="ray"`` without Ray installed (the message names ``pip install "unilab-gym[ray]"``).
        ValueError: an unsupported model or model setting (named in the message), an unknown
            ``backend``, ``backend="inline"`` with ``max_collector_restarts > 0``, both or
            neither of ``env_id`` / ``env_fn``, an ``env_fn`` that is not callable or (spawned
            collectors) not picklable, a model env whose ``n_envs`` is not ``num_collectors *
            envs_per_collector`` (off-policy: or 1, an env that only gives the spaces; the
            message names the three numbers), bad counts, a bad ``max_policy_lag``,
            ``replay_ratio``, ``max_collector_restarts``, ``collector_timeout_s``, ``seed``,
            ``env_kwargs``, ``metrics_port``, ``control_port``, ``snapshot_dir``,
            ``snapshot_on_change``, ``start_method`` (not one of
            ``multiprocessing.get_all_start_methods()``), ``metrics_addr`` or ``control_addr`` (an
            invalid IP address or a host name that does not resolve), a model another open
            ``AsyncRunner`` drives, or a ``VecNormalize`` over non-flat observations.
        gymnasium.error.Error: ``env_id`` is not registered (``NameNotFound`` with Gymnasium's
            "Did you mean" on the message's first line, after the ``env_id``; ``VersionNotFound``, ...).
        RuntimeError: ``backend="process"`` with ``"spawn"`` / ``"forkserver"``, and the runner is
            created at the top level of the main script, outside ``if __name__ == "__main__":``
            (the collectors would import the script and run it again); the message names the file
            and line.
        OSError: ``metrics_port`` is already in use (``errno.EADDRINUSE``); nothing is left running.

    Every argument is checked before anything is built or the model is claimed: a refused
    construction leaves no state, and a valid ``AsyncRunner`` on the same model can follow it.
    All of these are raised in the learner's process, before any collector starts.

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
        collector_timeout_s: float = 60.0,
        metrics_port: int | None = None,
        metrics_addr: str = "127.0.0.1",
        control_port: int | None = None,
        control_addr: str = "127.0.0.1",
        snapshot_dir: str | None = None,
        snapshot_on_change: bool = False,
        backend: str = "process",
        ray_address: str | None = None,
        collector_resources: dict[str, float] | None = None,
    ):
        """Check every argument, then build the loop, the collector pool and the servers (see the class docstring)."""
        from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
        from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm

        from unilab_gym.sb3.loops.off_policy import OffPolicyLoop
        from unilab_gym.sb3.loops.on_policy import OnPolicyLoop

        self._closed = True  # until fully constructed
        _refuse_while_bootstrapping()
        # every argument is checked here, before anything is built or the model is claimed: a refused
        # construction leaves no state (a later AsyncRunner on the same model is accepted)
        if (env_id is None) == (env_fn is None):
            raise ValueError("pass exactly one of env_id or env_fn")
        num_collectors = check_positive_int("num_collectors", num_collectors)
        envs_per_collector = check_positive_int("envs_per_collector", envs_per_collector)
        max_collector_restarts = check_int("max_collector_restarts", max_collector_restarts, minimum=0)
        collector_timeout_s = check_real(
            "collector_timeout_s", collector_timeout_s, minimum=0.0, exclusive_minimum=True
        )
        metrics_port, metrics_addr, control_port, control_addr = _check_servers(
            metrics_port, metrics_addr, control_port, control_addr
        )
        _check_run_options(snapshot_on_change, snapshot_dir, env_kwargs)
        if seed is not None:
            seed = check_seed("seed", seed)
        _check_backend(backend, start_method, ray_address, collector_resources, max_collector_restarts)
        if not isinstance(model, (OnPolicyAlgorithm, OffPolicyAlgorithm)):
            raise ValueError(f"AsyncRunner drives SB3 SAC, TD3, DDPG, PPO or A2C models, got {type(model).__name__}")
        off_policy = isinstance(model, OffPolicyAlgorithm)
        check_env_count(model.n_envs, num_collectors, envs_per_collector, off_policy=off_policy)
        if off_policy and replay_ratio is not None:
            replay_ratio = check_real("replay_ratio", replay_ratio, minimum=0.0)
        # spawned processes unpickle env_fn; Ray pickles it by value (cloudpickle), fork inherits it
        check_env_source(env_id, env_fn, pickled=backend == "process" and start_method != "fork")
        if backend == "process":
            _check_main_guard(start_method)
        loop = _make_loop(
            OffPolicyLoop if off_policy else OnPolicyLoop,
            model,
            num_collectors,
            envs_per_collector,
            max_policy_lag,
            replay_ratio,
        )
        self._loop = loop
        try:
            collector_env_kwargs = loop.env_kwargs(dict(env_kwargs or {}))
            if seed is None:
                seed = model.seed if model.seed is not None else int(np.random.SeedSequence().generate_state(1)[0])
                seed = check_seed("model.seed", seed)
            setup = CollectorSetup(
                num_collectors=num_collectors,
                envs_per_collector=envs_per_collector,
                seed=seed,
                policy=loop.policy,
                weights_size=loop.weights_size,
                writers=tuple(loop.writer(c) for c in range(num_collectors)),
                env_id=env_id,
                env_fn=env_fn,
                env_kwargs=collector_env_kwargs,
                max_restarts=max_collector_restarts,
                collector_timeout_s=collector_timeout_s,
            )
            self._pool: CollectorPool = _make_pool(backend, setup, start_method, ray_address, collector_resources)
        except BaseException:
            loop.close()
            raise
        self._metrics_server: MetricsServer | None = None
        try:
            #: the pipeline metrics (:class:`~unilab_gym.runtime.metrics.RunnerMetrics`).
            self.metrics = RunnerMetrics(self._pool, loop.replay_info())
            if metrics_port is not None and control_port is None:
                self._metrics_server = MetricsServer(self.metrics, metrics_port, metrics_addr)
            self.model = model
            metrics_app = None if metrics_port is None or control_port is None else prometheus_app(self.metrics)
            #: the live control (:class:`~unilab_gym.sb3.control.runner_api.RunnerControl`): hyperparameters,
            #: snapshots, rollback, the control server; the control methods below forward to it.
            self.control = RunnerControl(
                model,
                loop,
                self._pool,
                self.metrics,
                control_port=control_port,
                control_addr=control_addr,
                snapshot_dir=snapshot_dir,
                snapshot_on_change=snapshot_on_change,
                metrics_app=metrics_app,
            )
        except BaseException:
            if self._metrics_server is not None:
                self._metrics_server.close()
            self._pool.close()
            loop.close()
            raise
        self.num_collectors = num_collectors
        self.envs_per_collector = envs_per_collector
        self.seed = setup.seed
        self.max_collector_restarts = max_collector_restarts
        self.collector_timeout_s = collector_timeout_s
        self._closed = False
        loop.publish(self._pool, self.metrics)

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> AsyncRunner:
        """Return the runner itself."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the runner (see :meth:`close`)."""
        self.close()

    def __del__(self) -> None:
        """Close the runner if it is still open."""
        if not getattr(self, "_closed", True):
            self.close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has run (or the construction failed)."""
        return self._closed

    @property
    def metrics_url(self) -> str | None:
        """``http://<addr>:<port>/metrics`` of the Prometheus endpoint, or ``None`` (no ``metrics_port``, or closed)."""
        server = self.control.server
        if self._metrics_server is None and server is not None and server.serves_metrics:
            return f"{server.url}/metrics"  # one port per runner: on the control server
        return self._metrics_server.url if self._metrics_server is not None else None

    @property
    def collector_pids(self) -> list[int]:
        """Process ids of the running collectors (empty before the first :meth:`learn`, and once closed).

        With ``backend="inline"``, each collector's is the learner's own pid (``os.getpid()``).
        """
        return [s.pid for s in self._pool.status() if s.pid is not None]

    def collector_status(self) -> list[dict[str, Any]]:
        """The status of each collector, one dict per collector; empty once closed.

        Keys: ``index``, ``node_id`` (the Ray node id, hex, with ``backend="ray"``; the host name with processes;
        ``""`` before it reported), ``pid`` (``None`` before it started), ``env_steps`` (transitions the learner has
        from it), ``weight_version`` (the version it acts with, 0: none yet) and ``restarts``. Safe to call from
        another thread while :meth:`learn` runs.
        """
        return [dataclasses.asdict(s) for s in self._pool.status()]

    def policy_lag(self) -> int:
        """Current policy lag: published version minus the oldest version a running collector acts with."""
        return self._pool.policy_lag()

    # ------------------------------------------------------------------ live control (forwarded to self.control)
    @property
    def replay_ratio(self) -> float | None:
        """Off-policy: gradient steps per transition (live: ``set_hyperparameters``); ``None`` on-policy."""
        return self.control.replay_ratio

    @property
    def max_policy_lag(self) -> int:
        """Most weight versions a collector may act behind the learner (live: ``set_hyperparameters``)."""
        return self.control.max_policy_lag

    @property
    def control_url(self) -> str | None:
        """``http://<addr>:<port>`` of the control API (routes under ``/api/v1``); ``None`` without ``control_port``."""
        return self.control.control_url

    @property
    def control_token_path(self) -> Path | None:
        """The control API's token file (mode 0600), or ``None`` (see :attr:`RunnerControl.control_token_path`)."""
        return self.control.control_token_path

    @property
    def control_token(self) -> str | None:
        """The control API's bearer token, or ``None`` (see :attr:`RunnerControl.control_token`)."""
        return self.control.control_token

    def set_hyperparameters(self, **values: Any) -> dict[str, Any]:
        """Change hyperparameters of the running job; return the current values once applied.

        See :meth:`RunnerControl.set_hyperparameters` (the checks, when they apply, the errors raised).
        """
        return self.control.set_hyperparameters(**values)

    def hyperparameters(self) -> dict[str, Any]:
        """The current values of the live hyperparameters, by name (JSON types)."""
        return self.control.hyperparameters()

    def hyperparameter_history(self) -> list[dict[str, Any]]:
        """The hyperparameter changes, oldest first (see :meth:`RunnerControl.hyperparameter_history`)."""
        return self.control.hyperparameter_history()

    def snapshot(self, include_replay: bool = False) -> str:
        """Save a snapshot of the learner; return its id (see :meth:`RunnerControl.snapshot`)."""
        return self.control.snapshot(include_replay)

    def snapshots(self) -> list[dict[str, Any]]:
        """The snapshots taken, oldest first (see :meth:`RunnerControl.snapshots`)."""
        return self.control.snapshots()

    def restore(self, snapshot_id: str) -> dict[str, Any]:
        """Roll the learner back to snapshot ``snapshot_id``; return the hyperparameters in force.

        See :meth:`RunnerControl.restore` (all or nothing; the errors raised).
        """
        return self.control.restore(snapshot_id)

    def close(self) -> None:
        """Stop and join every collector, then free the runner's shared memory. Idempotent.

        Collectors in their loop get ``JOIN_TIMEOUT_S`` (:mod:`~unilab_gym.runtime.process_pool`)
        to exit, then SIGTERM, then SIGKILL; collectors still starting (imports, env
        construction) get SIGTERM at once. The metrics port is released. The model (and its
        replay buffer) stays usable; an on-policy model gets its own rollout buffer back.
        """
        if self._closed:
            return
        self._closed = True
        self.control.close()
        if self._metrics_server is not None:
            self._metrics_server.close()
            self._metrics_server = None
        self.metrics.close()
        self._pool.close()
        self._loop.close()

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
            CollectorError: a collector raised (with its traceback), died (e.g. SIGKILL), or hung
                (no progress for ``collector_timeout_s``, e.g. SIGSTOP).
                Collectors are stopped before any exception leaves ``learn``.
            RuntimeError: the runner is closed.
        """
        if self._closed:
            raise RuntimeError("this AsyncRunner is closed; create a new one")
        model = self.model
        if log_interval is None:
            log_interval = self._loop.default_log_interval
        try:
            with _statistics_frozen(model.get_vec_normalize_env()):  # _setup_learn may reset the model's own env
                total, callback = _sb3_private.setup_learn(
                    model, total_timesteps, callback, reset_num_timesteps, tb_log_name, progress_bar
                )
            callback.on_training_start(locals(), globals())
            self.metrics.begin()
            with self.control.controlled():  # hyperparameter changes, snapshots, restores: between gradient steps
                self._loop.run(self._pool, self.metrics, total, callback, log_interval)
            callback.on_training_end()
        except BaseException:
            _close_progress_bars(callback)  # first: a live bar would redraw over the traceback
            self.close()
            raise
        return model


def _close_progress_bars(callback: Any) -> None:
    """Close the bar of every SB3 ``ProgressBarCallback`` in ``callback`` (a ``CallbackList`` tree).

    SB3 closes its tqdm/rich bar only in ``on_training_end``. When ``learn`` is left by an
    exception (Ctrl-C), rich's live display keeps redrawing over the traceback, and ``tqdm.__del__``
    runs at interpreter exit, where it fails (``ImportError: sys.meta_path is None``). Closing a
    closed bar does nothing. Anything that is not a callback (a user's raw argument) is ignored.
    """
    from stable_baselines3.common.callbacks import CallbackList, ProgressBarCallback

    pending = [callback]
    while pending:
        item = pending.pop()
        if isinstance(item, CallbackList):
            pending.extend(item.callbacks)
        elif isinstance(item, ProgressBarCallback) and getattr(item, "pbar", None) is not None:
            item.pbar.close()


@contextlib.contextmanager
def _statistics_frozen(vec_normalize: Any) -> Iterator[None]:
    """Keep a ``VecNormalize``'s statistics as they are (``training=False``) inside the block.

    The model's own env is never stepped under the runner; SB3's ``_setup_learn`` still resets it,
    and those observations must not count: the statistics hold what the collectors stepped.
    """
    if vec_normalize is None:
        yield
        return
    training = vec_normalize.training
    vec_normalize.training = False
    try:
        yield
    finally:
        vec_normalize.training = training


_GUARD = 'if __name__ == "__main__":'


def _check_servers(
    metrics_port: int | None, metrics_addr: str, control_port: int | None, control_addr: str
) -> tuple[int | None, str, int | None, str]:
    """The checked ``(metrics_port, metrics_addr, control_port, control_addr)`` (``ValueError`` naming a bad one)."""
    if metrics_port is not None:
        metrics_port = check_int("metrics_port", metrics_port, minimum=0, maximum=65535)
    if control_port is not None:
        control_port = check_int("control_port", control_port, minimum=0, maximum=65535)
    metrics_addr = check_host("metrics_addr", metrics_addr)
    control_addr = check_host("control_addr", control_addr)
    return metrics_port, metrics_addr, control_port, control_addr


def _check_run_options(snapshot_on_change: Any, snapshot_dir: Any, env_kwargs: Any) -> None:
    """Raise ``ValueError`` naming ``snapshot_on_change`` (not a bool), ``snapshot_dir`` or ``env_kwargs``."""
    if not isinstance(snapshot_on_change, bool):
        raise ValueError(f"snapshot_on_change must be a bool, got {snapshot_on_change!r}")
    if snapshot_dir is not None and not isinstance(snapshot_dir, (str, os.PathLike)):
        raise ValueError(f"snapshot_dir must be a path (str or os.PathLike) or None, got {snapshot_dir!r}")
    if env_kwargs is not None and not isinstance(env_kwargs, Mapping):
        raise ValueError(f"env_kwargs must be a dict of keyword arguments for gym.make_vec, got {env_kwargs!r}")


def _check_backend(
    backend: str,
    start_method: str,
    ray_address: Any,
    collector_resources: dict[str, float] | None,
    max_collector_restarts: int,
) -> None:
    """Check the backend and its options; with ``backend="ray"``, import Ray and check the resources.

    Raises:
        ValueError: an unknown ``backend`` or ``start_method``, Ray options without ``backend="ray"``, a
            ``ray_address`` that is not a str, restarts with ``backend="inline"``, or bad ``collector_resources``.
        ImportError: ``backend="ray"`` without Ray installed.
    """
    if backend not in BACKENDS:
        raise ValueError(f'backend must be "process", "ray" or "inline", got {backend!r}')
    methods = mp.get_all_start_methods()
    if start_method not in methods:
        raise ValueError(f"start_method must be one of {methods} (multiprocessing start methods), got {start_method!r}")
    if backend != "ray" and (ray_address is not None or collector_resources is not None):
        raise ValueError('ray_address and collector_resources need backend="ray"')
    if ray_address is not None and not isinstance(ray_address, str):
        raise ValueError(f"ray_address must be a str such as 'auto' or 'host:6379', or None, got {ray_address!r}")
    if backend == "inline" and max_collector_restarts:
        raise ValueError(
            f'backend="inline" does not restart collectors: max_collector_restarts must be 0, got '
            f'{max_collector_restarts} (a fault raises CollectorError at once; backend="process" restarts)'
        )
    if backend == "ray":
        from unilab_gym.runtime.ray_pool import check_resources, import_ray

        import_ray()
        check_resources(collector_resources)


def _make_loop(
    loop_type: type[OffPolicyLoop] | type[OnPolicyLoop],
    model: Any,
    num_collectors: int,
    envs_per_collector: int,
    max_policy_lag: int | None,
    replay_ratio: float | None,
) -> LearnerLoop:
    """The ``loop_type`` loop over ``model``; if it raises, ``model`` is left unclaimed (as it was)."""
    claimed = model in DRIVEN
    try:  # the loops check the model's settings before they claim it; whatever they raise, no claim is left
        return loop_type(model, num_collectors, envs_per_collector, max_policy_lag, replay_ratio)
    except BaseException:
        if not claimed:
            DRIVEN.discard(model)
        raise


def _make_pool(
    backend: str,
    setup: CollectorSetup,
    start_method: str,
    ray_address: str | None,
    collector_resources: dict[str, float] | None,
) -> CollectorPool:
    """The collector pool of ``backend`` (not started)."""
    if backend == "ray":
        from unilab_gym.runtime.ray_pool import RayCollectorPool

        return RayCollectorPool(setup, ray_address, collector_resources)
    if backend == "inline":
        return InlineCollectorPool(setup)
    return ProcessCollectorPool(setup, start_method)


def _refuse_while_bootstrapping() -> None:
    """In a collector that is still bootstrapping (importing the user's script): refuse at once, build nothing.

    Reached only when :func:`_check_main_guard` could not see the script (no source, an unusual
    launcher): the collector then exits at once, and the learner reports that it exited while starting.
    """
    if getattr(mp.current_process(), "_inheriting", False):
        raise RuntimeError(
            f"an AsyncRunner is being created while a spawned process imports the main script: the script "
            f"creates it outside `{_GUARD}`. Put the script's training code under `{_GUARD}`"
        )


def _check_main_guard(start_method: str) -> None:
    """Refuse an ``AsyncRunner`` created at the top level of the main script, outside ``if __name__ == "__main__":``.

    ``"spawn"`` and ``"forkserver"`` children import the main script (as ``__mp_main__``) before
    they run, as :mod:`multiprocessing.spawn` does it: a script path, or a module run with
    ``python -m`` (not a package's ``__main__``). Unguarded, each collector would run the
    construction again, build a model and a runner of its own, and die while bootstrapping. The
    check finds the main script's top-level frame on the call stack and asks its source (``ast``)
    whether the running line is inside an ``if`` on ``__name__``. Interactive sessions, notebooks
    and ``python -c`` have no script to import, and are never refused; nor is anything the check
    cannot read.

    Raises:
        RuntimeError: the runner is created outside the guard; the message names the file, the
            line and the fix.
    """
    if start_method == "fork":
        return
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name:  # python -m: the module is imported by name, unless it is a __main__
        if spec.name == "__main__" or spec.name.endswith(".__main__"):
            return
    elif not path or os.path.splitext(os.path.basename(path))[0] == "ipython":
        return
    if not path:
        return
    frame = sys._getframe(1)
    while frame is not None and not (
        frame.f_code.co_name == "<module>"
        and frame.f_globals.get("__name__") == "__main__"
        and os.path.abspath(frame.f_code.co_filename) == os.path.abspath(path)
    ):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return
    lineno = frame.f_lineno
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return
    if _guarded(tree.body, lineno):
        return
    raise RuntimeError(
        f"the AsyncRunner is created at the top level of {path} (line {lineno}), outside `{_GUARD}`. Its collectors "
        f"are processes started with start_method={start_method!r}, which import this script first: each would "
        f"run that line again, build its own model and runner, and die while starting. Put the script's training "
        f"code under `{_GUARD}` (or in a function called from there)"
    )


def _guarded(body: list[ast.stmt], lineno: int) -> bool:
    """Whether line ``lineno`` of ``body`` runs under an ``if`` that reads ``__name__`` (``True``: line not found)."""
    for stmt in body:
        if not stmt.lineno <= lineno <= (stmt.end_lineno or stmt.lineno):
            continue
        if isinstance(stmt, ast.If) and any(
            isinstance(node, ast.Name) and node.id == "__name__" for node in ast.walk(stmt.test)
        ):
            return True
        blocks = [getattr(stmt, name, None) for name in ("body", "orelse", "finalbody")]
        blocks += [handler.body for handler in getattr(stmt, "handlers", [])]
        blocks += [case.body for case in getattr(stmt, "cases", [])]
        for block in blocks:
            if isinstance(block, list) and block and block[0].lineno <= lineno <= (block[-1].end_lineno or 0):
                return _guarded(block, lineno)
        return False  # in the statement itself (e.g. a `with AsyncRunner(...)` line), under no guard
    return True  # not found (the file changed since it ran): do not refuse
