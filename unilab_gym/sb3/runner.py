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
from unilab_gym.sb3.config import BACKENDS as BACKENDS  # re-exported (its home before the configs)
from unilab_gym.sb3.config import DEFAULT, CollectorConfig, ControlConfig, Default, MetricsConfig, merge_settings
from unilab_gym.sb3.control.runner_api import RunnerControl
from unilab_gym.sb3.loops.base import DRIVEN
from unilab_gym.validation import check_real, check_seed

if TYPE_CHECKING:
    from pathlib import Path

    from gymnasium.vector import VectorEnv

    from unilab_gym.sb3.loops.base import LearnerLoop
    from unilab_gym.sb3.loops.off_policy import OffPolicyLoop
    from unilab_gym.sb3.loops.on_policy import OnPolicyLoop


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

    **Configuration.** The settings come in three groups, each a frozen dataclass of
    :mod:`unilab_gym.sb3.config`: ``collectors=`` :class:`~unilab_gym.sb3.config.CollectorConfig` (the env, the
    counts, the seed, the backend, fault handling, ingest), ``control=``
    :class:`~unilab_gym.sb3.config.ControlConfig` (live control's server and snapshot directory) and
    ``metrics=`` :class:`~unilab_gym.sb3.config.MetricsConfig` (the Prometheus endpoint). Every field is also
    a keyword argument of the same name and default, as before the groups existed; a keyword left out
    (:data:`~unilab_gym.sb3.config.DEFAULT`) takes the config's value. A setting passed both ways is refused
    (``ValueError`` naming it). The resolved groups are :attr:`collector_config`, :attr:`control_config` and
    :attr:`metrics_config`.

    Args:
        model: an SB3 ``SAC`` / ``TD3`` / ``DDPG`` / ``PPO`` / ``A2C``.
        env_id: :attr:`CollectorConfig.env_id <unilab_gym.sb3.config.CollectorConfig.env_id>`: a registered
            gymnasium id (exactly one of ``env_id`` / ``env_fn``, by keyword or config).
        env_fn: :attr:`CollectorConfig.env_fn <unilab_gym.sb3.config.CollectorConfig.env_fn>`: a picklable
            ``env_fn(num_envs) -> gymnasium.vector.VectorEnv`` instead of ``env_id``.
        num_collectors: :attr:`CollectorConfig.num_collectors <unilab_gym.sb3.config.CollectorConfig.num_collectors>`
            (default 2).
        envs_per_collector: :attr:`CollectorConfig.envs_per_collector
            <unilab_gym.sb3.config.CollectorConfig.envs_per_collector>` (default 32).
        collectors: the collectors' settings (:class:`~unilab_gym.sb3.config.CollectorConfig`), or ``None``.
        control: live control's settings (:class:`~unilab_gym.sb3.config.ControlConfig`), or ``None``.
        metrics: the metrics endpoint's settings (:class:`~unilab_gym.sb3.config.MetricsConfig`), or ``None``.
        max_policy_lag: most weight versions a collector may act behind the learner. ``None``:
            the family's default, 4 off-policy (valid: >= 1), 0 on-policy (valid: 0 or 1).
        replay_ratio: off-policy only: gradient steps per transition; default from the model.
        env_kwargs: :attr:`CollectorConfig.env_kwargs <unilab_gym.sb3.config.CollectorConfig.env_kwargs>`:
            keyword arguments for ``gym.make_vec``.
        seed: :attr:`CollectorConfig.seed <unilab_gym.sb3.config.CollectorConfig.seed>`: the collectors'
            base seed; default ``model.seed``, else random (the seed used: :attr:`seed`).
        start_method: :attr:`CollectorConfig.start_method <unilab_gym.sb3.config.CollectorConfig.start_method>`.
        max_collector_restarts: :attr:`CollectorConfig.max_collector_restarts
            <unilab_gym.sb3.config.CollectorConfig.max_collector_restarts>`: faults survived (default 0).
        collector_timeout_s: :attr:`CollectorConfig.collector_timeout_s
            <unilab_gym.sb3.config.CollectorConfig.collector_timeout_s>`: seconds without heartbeat before
            a collector counts as hung (default 60).
        backend: :attr:`CollectorConfig.backend <unilab_gym.sb3.config.CollectorConfig.backend>`:
            ``"process"`` (default), ``"ray"`` or ``"inline"``.
        ray_address: :attr:`CollectorConfig.ray_address <unilab_gym.sb3.config.CollectorConfig.ray_address>`.
        collector_resources: :attr:`CollectorConfig.collector_resources
            <unilab_gym.sb3.config.CollectorConfig.collector_resources>`.
        ingest_workers: :attr:`CollectorConfig.ingest_workers
            <unilab_gym.sb3.config.CollectorConfig.ingest_workers>` (default 1; > 1 with ``backend="ray"``).
        metrics_port: :attr:`MetricsConfig.metrics_port <unilab_gym.sb3.config.MetricsConfig.metrics_port>`:
            serve the pipeline metrics to Prometheus (see :attr:`metrics_url`); default ``None``: no server.
        metrics_addr: :attr:`MetricsConfig.metrics_addr <unilab_gym.sb3.config.MetricsConfig.metrics_addr>`.
        control_port: :attr:`ControlConfig.control_port <unilab_gym.sb3.config.ControlConfig.control_port>`:
            serve the control API (:mod:`unilab_gym.sb3.control`) at :attr:`control_url`; default ``None``.
        control_addr: :attr:`ControlConfig.control_addr <unilab_gym.sb3.config.ControlConfig.control_addr>`.
        snapshot_dir: :attr:`ControlConfig.snapshot_dir <unilab_gym.sb3.config.ControlConfig.snapshot_dir>`.
        snapshot_on_change: :attr:`ControlConfig.snapshot_on_change
            <unilab_gym.sb3.config.ControlConfig.snapshot_on_change>`.

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
            invalid IP address or a host name that does not resolve), ``ingest_workers`` (not an int
            >= 1, or > 1 without ``backend="ray"``), a model another open ``AsyncRunner`` drives, a
            ``VecNormalize`` over non-flat observations, a ``collectors`` / ``control`` / ``metrics``
            that is not its config class, or a setting passed both as a keyword and in its config.
            A bad value has the same message by keyword or in a config.
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
        env_id: str | Default | None = DEFAULT,
        env_fn: Callable[[int], VectorEnv] | Default | None = DEFAULT,
        num_collectors: int | Default = DEFAULT,
        envs_per_collector: int | Default = DEFAULT,
        *,
        collectors: CollectorConfig | None = None,
        control: ControlConfig | None = None,
        metrics: MetricsConfig | None = None,
        max_policy_lag: int | None = None,
        replay_ratio: float | None = None,
        env_kwargs: Mapping[str, Any] | Default | None = DEFAULT,
        seed: int | Default | None = DEFAULT,
        start_method: str | Default = DEFAULT,
        max_collector_restarts: int | Default = DEFAULT,
        collector_timeout_s: float | Default = DEFAULT,
        backend: str | Default = DEFAULT,
        ray_address: str | Default | None = DEFAULT,
        collector_resources: dict[str, float] | Default | None = DEFAULT,
        ingest_workers: int | Default = DEFAULT,
        metrics_port: int | Default | None = DEFAULT,
        metrics_addr: str | Default = DEFAULT,
        control_port: int | Default | None = DEFAULT,
        control_addr: str | Default = DEFAULT,
        snapshot_dir: str | os.PathLike[str] | Default | None = DEFAULT,
        snapshot_on_change: bool | Default = DEFAULT,
    ):
        """Check every argument, then build the loop, the collector pool and the servers (see the class docstring)."""
        from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
        from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm

        from unilab_gym.sb3.loops.off_policy import OffPolicyLoop
        from unilab_gym.sb3.loops.on_policy import OnPolicyLoop

        self._closed = True  # until fully constructed
        _refuse_while_bootstrapping()
        # every argument is checked here, before anything is built or the model is claimed: a refused
        # construction leaves no state (a later AsyncRunner on the same model is accepted). Each config checks
        # its own fields when made; what needs the model or the other groups is checked below.
        cc = merge_settings(
            CollectorConfig,
            "collectors",
            collectors,
            dict(
                env_id=env_id,
                env_fn=env_fn,
                num_collectors=num_collectors,
                envs_per_collector=envs_per_collector,
                env_kwargs=env_kwargs,
                seed=seed,
                backend=backend,
                start_method=start_method,
                max_collector_restarts=max_collector_restarts,
                collector_timeout_s=collector_timeout_s,
                ray_address=ray_address,
                collector_resources=collector_resources,
                ingest_workers=ingest_workers,
            ),
        )
        ctl = merge_settings(
            ControlConfig,
            "control",
            control,
            dict(
                control_port=control_port,
                control_addr=control_addr,
                snapshot_dir=snapshot_dir,
                snapshot_on_change=snapshot_on_change,
            ),
        )
        mc = merge_settings(
            MetricsConfig, "metrics", metrics, dict(metrics_port=metrics_port, metrics_addr=metrics_addr)
        )
        if (cc.env_id is None) == (cc.env_fn is None):
            raise ValueError("pass exactly one of env_id or env_fn")
        if cc.backend == "ray":
            from unilab_gym.runtime.ray_pool import check_resources, import_ray

            import_ray()
            check_resources(cc.collector_resources)
        if not isinstance(model, (OnPolicyAlgorithm, OffPolicyAlgorithm)):
            raise ValueError(f"AsyncRunner drives SB3 SAC, TD3, DDPG, PPO or A2C models, got {type(model).__name__}")
        off_policy = isinstance(model, OffPolicyAlgorithm)
        check_env_count(model.n_envs, cc.num_collectors, cc.envs_per_collector, off_policy=off_policy)
        if off_policy and replay_ratio is not None:
            replay_ratio = check_real("replay_ratio", replay_ratio, minimum=0.0)
        # spawned processes unpickle env_fn; Ray pickles it by value (cloudpickle), fork inherits it
        check_env_source(cc.env_id, cc.env_fn, pickled=cc.backend == "process" and cc.start_method != "fork")
        if cc.backend == "process":
            _check_main_guard(cc.start_method)
        loop = _make_loop(
            OffPolicyLoop if off_policy else OnPolicyLoop,
            model,
            cc.num_collectors,
            cc.envs_per_collector,
            max_policy_lag,
            replay_ratio,
        )
        self._loop = loop
        try:
            collector_env_kwargs = loop.env_kwargs(dict(cc.env_kwargs or {}))
            seed = cc.seed
            if seed is None:
                seed = model.seed if model.seed is not None else int(np.random.SeedSequence().generate_state(1)[0])
                seed = check_seed("model.seed", seed)
            setup = CollectorSetup(
                num_collectors=cc.num_collectors,
                envs_per_collector=cc.envs_per_collector,
                seed=seed,
                policy=loop.policy,
                weights_size=loop.weights_size,
                writers=tuple(loop.writer(c) for c in range(cc.num_collectors)),
                env_id=cc.env_id,
                env_fn=cc.env_fn,
                env_kwargs=collector_env_kwargs,
                max_restarts=cc.max_collector_restarts,
                collector_timeout_s=cc.collector_timeout_s,
                ingest_workers=cc.ingest_workers,
            )
            self._pool: CollectorPool = _make_pool(cc, setup)
        except BaseException:
            loop.close()
            raise
        self._metrics_server: MetricsServer | None = None
        try:
            #: the pipeline metrics (:class:`~unilab_gym.runtime.metrics.RunnerMetrics`).
            self.metrics = RunnerMetrics(self._pool, loop.replay_info())
            if mc.metrics_port is not None and ctl.control_port is None:
                self._metrics_server = MetricsServer(self.metrics, mc.metrics_port, mc.metrics_addr)
            self.model = model
            served_with_control = mc.metrics_port is not None and ctl.control_port is not None
            metrics_app = prometheus_app(self.metrics) if served_with_control else None
            #: the live control (:class:`~unilab_gym.sb3.control.runner_api.RunnerControl`): hyperparameters,
            #: snapshots, rollback, the control server; the control methods below forward to it.
            self.control = RunnerControl(
                model,
                loop,
                self._pool,
                self.metrics,
                control_port=ctl.control_port,
                control_addr=ctl.control_addr,
                snapshot_dir=ctl.snapshot_dir,
                snapshot_on_change=ctl.snapshot_on_change,
                metrics_app=metrics_app,
            )
        except BaseException:
            if self._metrics_server is not None:
                self._metrics_server.close()
            self._pool.close()
            loop.close()
            raise
        #: the collectors' settings as resolved from ``collectors=`` and the keywords
        #: (:class:`~unilab_gym.sb3.config.CollectorConfig`; ``seed`` as passed, the seed used is :attr:`seed`).
        self.collector_config = cc
        #: live control's settings (:class:`~unilab_gym.sb3.config.ControlConfig`).
        self.control_config = ctl
        #: the metrics endpoint's settings (:class:`~unilab_gym.sb3.config.MetricsConfig`).
        self.metrics_config = mc
        self.num_collectors = cc.num_collectors
        self.envs_per_collector = cc.envs_per_collector
        #: the collectors' base seed (``collectors.seed``, else ``model.seed``, else the random one drawn).
        self.seed = setup.seed
        self.max_collector_restarts = cc.max_collector_restarts
        self.collector_timeout_s = cc.collector_timeout_s
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


def _make_pool(config: CollectorConfig, setup: CollectorSetup) -> CollectorPool:
    """The collector pool of ``config.backend`` (not started)."""
    if config.backend == "ray":
        from unilab_gym.runtime.ray_pool import RayCollectorPool

        return RayCollectorPool(setup, config.ray_address, config.collector_resources)
    if config.backend == "inline":
        return InlineCollectorPool(setup)
    return ProcessCollectorPool(setup, config.start_method)


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
