"""``RunnerControl``: the control API's methods on :class:`~unilab_gym.sb3.runner.AsyncRunner`.

``AsyncRunner`` inherits them; they work on the runner's :class:`~unilab_gym.sb3.control.controller.Controller`,
which applies changes on the learner's thread between gradient steps (see :mod:`unilab_gym.sb3.control.controller`).
"""

from __future__ import annotations

import contextlib
import dataclasses
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
    """Live hyperparameters, snapshots, rollback and the control server of an ``AsyncRunner``."""

    _controller: Controller
    _control_server: ControlServer | None = None
    _loop: LearnerLoop
    _pool: CollectorPool
    metrics: RunnerMetrics
    model: BaseAlgorithm

    def _start_control(
        self,
        control_port: int | None,
        control_addr: str,
        snapshot_dir: str | Path | None,
        snapshot_on_change: bool,
        metrics_app: Any = None,
    ) -> None:
        """Make the controller (and the server, with ``control_port``); the loop and the pool exist."""
        self._controller = Controller(
            self.model,
            self._loop,
            snapshot_dir=snapshot_dir,
            snapshot_on_change=snapshot_on_change,
            after_restore=self._publish_restored,
            status=self._runner_status,
        )
        self._control_server = None
        if control_port is not None:
            from unilab_gym.sb3.control.server import ControlServer

            self._control_server = ControlServer(
                self._controller,
                control_port,
                control_addr,
                token_dir=self._controller.store.directory,
                metrics_app=metrics_app,
                run_id=self._controller.store.run_id,
            )

    def _stop_control(self) -> None:
        """Stop the server; the app, the server's thread and the model keep no reference to the runner."""
        if self._control_server is not None:
            self._control_server.close()
            self._control_server = None
        controller = getattr(self, "_controller", None)
        if controller is not None:
            controller.close()

    @contextlib.contextmanager
    def _controlled(self) -> Iterator[None]:
        """Inside ``learn()``: requests are applied at the loop's boundaries, on this thread."""
        self._controller.begin()
        self._loop.boundary = self._controller.boundary
        failed = True
        try:
            yield
            failed = False
        finally:
            self._loop.boundary = None
            self._controller.end(failed)

    def _publish_restored(self) -> None:
        if not getattr(self, "_closed", True):
            self._loop.publish(self._pool, self.metrics)  # collectors get the restored weights as a new version

    def _runner_status(self) -> dict[str, Any]:
        if getattr(self, "_closed", True):
            return {"closed": True, "collectors": []}
        status = getattr(self, "collector_status", None)
        collectors = status() if callable(status) else [dataclasses.asdict(s) for s in self._pool.status()]
        return {
            "closed": False,
            "weight_version": int(self._pool.weight_version),
            "policy_lag": int(self._pool.policy_lag()),
            "max_policy_lag": self.max_policy_lag,
            "replay_ratio": self.replay_ratio,
            "collectors": collectors,
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
        return self._control_server.url if self._control_server is not None else None

    @property
    def control_token_path(self) -> Path | None:
        """The token file (mode 0600).

        ``control_token`` in the run's directory, or ``control_token-<run id>`` if another live run holds that
        name. ``None`` without ``control_port``, or once closed.
        """
        return self._control_server.token_path if self._control_server is not None else None

    @property
    def control_token(self) -> str | None:
        """The API's bearer token: ``$UNILAB_CONTROL_TOKEN`` if set, else random.

        Also written, mode 0600, to ``control_token`` in the run's directory. ``None`` without ``control_port``.
        """
        return self._control_server.token if self._control_server is not None else None

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
        return self._controller.set_hyperparameters(values, source="python")

    def hyperparameters(self) -> dict[str, Any]:
        """The current values of the live hyperparameters, by name (JSON types)."""
        return self._controller.hyperparameters()

    def hyperparameter_history(self) -> list[dict[str, Any]]:
        """The hyperparameter changes, one dict per change, oldest first.

        Keys: ``time`` (Unix s), ``num_timesteps``, ``name``, ``old``, ``new``, ``source`` (``"python"`` or
        ``"http"``).
        """
        return self._controller.hyperparameter_history()

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
        return self._controller.snapshot(include_replay)

    def snapshots(self) -> list[dict[str, Any]]:
        """The snapshots taken, oldest first.

        Keys: ``id``, ``time`` (Unix s), ``num_timesteps``, ``hyperparameters``, ``bytes`` (files on disk),
        ``include_replay``, ``path``, ``run_id``, ``files``, ``sha256`` (``{file name: hex digest}``).
        """
        return self._controller.snapshots()

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
        return self._controller.restore(snapshot_id, source="python")
