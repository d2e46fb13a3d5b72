"""``RunnerControl``: the live control of one :class:`~unilab_gym.sb3.runner.AsyncRunner`, held as its ``control``.

It owns the runner's :class:`~unilab_gym.sb3.control.controller.Controller`, which applies changes on the
learner's thread between gradient steps (see :mod:`unilab_gym.sb3.control.controller`), and the optional
control server. It is given what it works on (the model, the loop, the pool, the metrics) and is closed by
the runner, instead of reading the runner's private attributes; it holds no reference to the runner.
``AsyncRunner``'s control methods (``set_hyperparameters``, ``snapshot``, ``restore``, ...) forward to it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from unilab_gym.sb3.control.controller import Controller

if TYPE_CHECKING:
    from stable_baselines3.common.base_class import BaseAlgorithm

    from unilab_gym.runtime.metrics import RunnerMetrics
    from unilab_gym.runtime.pool import CollectorPool
    from unilab_gym.sb3.control.server import ControlServer
    from unilab_gym.sb3.loops.base import LearnerLoop


class RunnerControl:
    """Live hyperparameters, snapshots, rollback and the control server of an ``AsyncRunner``.

    Args:
        model: the runner's SB3 model.
        loop: the runner's learner loop (its ``boundary`` hook is set inside :meth:`controlled`).
        pool: the runner's collector pool (restored weights are published to it).
        metrics: the runner's pipeline metrics.
        control_port: serve the HTTP API on this port (0: any free port), or ``None`` (no server).
        control_addr: the address the server binds.
        snapshot_dir: where snapshots go (``None``: a temporary directory per run).
        snapshot_on_change: snapshot before every hyperparameter change.
        metrics_app: a Prometheus ASGI app the server mounts at ``/metrics``, or ``None``.

    Raises:
        ValueError: a bad ``control_port`` / ``control_addr`` / ``snapshot_dir`` (raised by the server or the store).
    """

    def __init__(
        self,
        model: BaseAlgorithm,
        loop: LearnerLoop,
        pool: CollectorPool,
        metrics: RunnerMetrics,
        *,
        control_port: int | None,
        control_addr: str,
        snapshot_dir: str | os.PathLike[str] | None,
        snapshot_on_change: bool,
        metrics_app: Any = None,
    ) -> None:
        """Make the controller, and the server with ``control_port`` (arguments: see the class docstring)."""
        self.model, self._loop, self._pool, self._metrics = model, loop, pool, metrics
        self._closed = False
        #: the :class:`~unilab_gym.sb3.control.controller.Controller` (applies requests between gradient steps).
        self.controller = Controller(
            model,
            loop,
            snapshot_dir=snapshot_dir,
            snapshot_on_change=snapshot_on_change,
            after_restore=self._publish_restored,
            status=self._runner_status,
        )
        #: the HTTP server (:class:`~unilab_gym.sb3.control.server.ControlServer`), or ``None`` without a port.
        self.server: ControlServer | None = None
        if control_port is not None:
            from unilab_gym.sb3.control.server import ControlServer

            try:
                self.server = ControlServer(
                    self.controller,
                    control_port,
                    control_addr,
                    token_dir=self.controller.store.directory,
                    metrics_app=metrics_app,
                    run_id=self.controller.store.run_id,
                )
            except BaseException:
                self.controller.close()
                raise

    def close(self) -> None:
        """Stop the server and the controller (the app, its thread and the model keep no reference). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.server is not None:
            self.server.close()
            self.server = None
        self.controller.close()

    @contextlib.contextmanager
    def controlled(self) -> Iterator[None]:
        """Inside ``learn()``: requests are applied at the loop's boundaries, on this thread."""
        self.controller.begin()
        self._loop.boundary = self.controller.boundary
        failed = True
        try:
            yield
            failed = False
        finally:
            self._loop.boundary = None
            self.controller.end(failed)

    def _publish_restored(self) -> None:
        if not self._closed:
            self._loop.publish(self._pool, self._metrics)  # collectors get the restored weights as a new version

    def _runner_status(self) -> dict[str, Any]:
        if self._closed:
            return {"closed": True, "collectors": []}
        return {
            "closed": False,
            "weight_version": int(self._pool.weight_version),
            "policy_lag": int(self._pool.policy_lag()),
            "max_policy_lag": self.max_policy_lag,
            "replay_ratio": self.replay_ratio,
            "collectors": [dataclasses.asdict(s) for s in self._pool.status()],
        }

    # ------------------------------------------------------------------ public API
    @property
    def replay_ratio(self) -> float | None:
        """Off-policy: gradient steps per transition (live: ``set_hyperparameters(replay_ratio=...)``).

        ``None`` on-policy.
        """
        ratio = getattr(self._loop, "replay_ratio", None)
        return None if ratio is None else float(ratio)

    @property
    def max_policy_lag(self) -> int:
        """Most weight versions a collector may act behind the learner (live: ``set_hyperparameters``)."""
        return int(self._loop.max_policy_lag)

    @property
    def control_url(self) -> str | None:
        """``http://<addr>:<port>`` of the control API (routes under ``/api/v1``).

        ``None`` without ``control_port``, or once closed.
        """
        return self.server.url if self.server is not None else None

    @property
    def control_token_path(self) -> Path | None:
        """The token file (mode 0600).

        ``control_token`` in the run's directory, or ``control_token-<run id>`` if another live run holds that
        name. ``None`` without ``control_port``, or once closed.
        """
        return self.server.token_path if self.server is not None else None

    @property
    def control_token(self) -> str | None:
        """The API's bearer token: ``$UNILAB_CONTROL_TOKEN`` if set, else random.

        Also written, mode 0600, to ``control_token`` in the run's directory. ``None`` without ``control_port``.
        """
        return self.server.token if self.server is not None else None

    def set_hyperparameters(self, **values: Any) -> dict[str, Any]:
        """Change hyperparameters of the running job; return the current values once applied.

        Each value is checked, then all are applied together at the learner's next gradient-step
        boundary (at once when :meth:`learn` is not running), where SB3 reads it
        (:mod:`unilab_gym.sb3.control.hyperparams`). The change is recorded in
        :meth:`hyperparameter_history` and logged to the SB3 logger as ``unilab/hparams/<name>``.
        ``max_policy_lag`` gates the next weight version published.

        Args:
            **values: e.g. ``learning_rate=1e-4``; the names :meth:`hyperparameters` lists.

        Returns:
            The current values, by name (:meth:`hyperparameters`).

        Raises:
            ValueError: an unknown name, or a value of the wrong type or out of range (the
                message names it and its valid range); nothing changes, the other values included.
            TimeoutError: the learner reached no boundary within 60 s; nothing changes.
        """
        return self.controller.set_hyperparameters(values, source="python")

    def hyperparameters(self) -> dict[str, Any]:
        """The current values of the live hyperparameters, by name (JSON types)."""
        return self.controller.hyperparameters()

    def hyperparameter_history(self) -> list[dict[str, Any]]:
        """The hyperparameter changes, one dict per change, oldest first.

        Keys: ``time`` (Unix s), ``num_timesteps``, ``name``, ``old``, ``new``, ``source`` (``"python"`` or
        ``"http"``).
        """
        return self.controller.hyperparameter_history()

    def snapshot(self, include_replay: bool = False) -> str:
        """Save a snapshot of the learner in ``snapshot_dir``; return its id.

        The policy, optimizers, hyperparameters and counters (``model.save``, an ordinary SB3 zip), plus the replay
        if asked (SB3's ``save_replay_buffer``) and ``VecNormalize`` statistics.

        Args:
            include_replay: also save the replay.

        Returns:
            The snapshot's id, ``<run id>-<n>-t<num_timesteps>`` (unique to this run: files are never overwritten,
            also when several runs share ``snapshot_dir``).

        Raises:
            ValueError: ``include_replay`` is not a bool, or the model has no replay.
        """
        return self.controller.snapshot(include_replay)

    def snapshots(self) -> list[dict[str, Any]]:
        """The snapshots taken, oldest first.

        Keys: ``id``, ``time`` (Unix s), ``num_timesteps``, ``hyperparameters``, ``bytes`` (files on disk),
        ``include_replay``, ``path``, ``run_id``, ``files``, ``sha256`` (``{file name: hex digest}``).
        """
        return self.controller.snapshots()

    def restore(self, snapshot_id: str) -> dict[str, Any]:
        """Roll the learner back to snapshot ``snapshot_id``; return the hyperparameters in force.

        Weights and optimizer states are restored bit for bit, then the hyperparameters.

        Collectors keep running and get the restored weights as a new version. ``num_timesteps``
        keeps counting. A snapshot's replay (``include_replay=True``) is copied back into the model's
        ``SharedReplayBuffer`` in place: the same shared segment, which collectors keep writing into.

        All or nothing: every file is checked against the SHA-256 this run recorded when it wrote it,
        before anything is deserialized, and everything is read and checked before anything is applied.

        Raises:
            KeyError: no snapshot has that id.
            SnapshotIntegrityError: (a ``ValueError``) a file of the snapshot was changed, replaced or
                removed since this run wrote it (the message names it); nothing changed.
            ValueError: the snapshot does not fit the model; nothing changed.
            RuntimeError: the replay could not be loaded (a collector kept rows in flight); nothing changed.
        """
        return self.controller.restore(snapshot_id, source="python")
