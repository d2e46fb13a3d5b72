"""``ControlCallback``: the control API for a stock SB3 ``model.learn(callback=...)``, without ``AsyncRunner``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stable_baselines3.common.callbacks import BaseCallback

from unilab_gym.sb3.control.controller import Controller
from unilab_gym.sb3.control.server import ControlServer, require_control_extra
from unilab_gym.sb3.control.snapshots import SnapshotStore


class ControlCallback(BaseCallback):
    """Serve the hyperparameter, snapshot and status endpoints of the model it is passed to.

    The server starts when the callback is made (so :attr:`control_url` is known before
    ``learn``); the endpoints answer once the callback is attached to a model (the first
    ``learn(callback=...)``; 503 before). Changes are applied on the learner's thread at the next
    ``on_step`` or ``on_rollout_end`` (SB3 calls neither inside ``train()``), or at once between
    ``learn()`` calls. The server keeps serving after ``learn()`` returns, until :meth:`close`.

    Args:
        port: TCP port; 0 picks a free one. ``None``: no server (the Python methods only).
        addr: address to bind, ``127.0.0.1`` (loopback only) by default.
        snapshot_dir: the run's directory (snapshots, the token file); default a fresh one under ``runs/``.
        snapshot_on_change: take a snapshot before every hyperparameter change.
        verbose: SB3's callback verbosity.

    Raises:
        ImportError: FastAPI or uvicorn is missing (``pip install "unilab-gym[control]"``).
        OSError: the port is in use.

    Use as a context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        port: int | None = 0,
        addr: str = "127.0.0.1",
        *,
        snapshot_dir: str | Path | None = None,
        snapshot_on_change: bool = False,
        verbose: int = 0,
    ):
        """Start the server unless ``port`` is ``None`` (arguments: see the class docstring)."""
        super().__init__(verbose)
        if port is not None:
            require_control_extra()
        if not isinstance(snapshot_on_change, bool):
            raise ValueError(f"snapshot_on_change must be a bool, got {snapshot_on_change!r}")
        self._snapshot_on_change = snapshot_on_change
        self._store = SnapshotStore(snapshot_dir)
        self._controller: Controller | None = None
        self._server: ControlServer | None = None
        if port is not None:
            self._server = ControlServer(
                _Proxy(self), port, addr, token_dir=self._store.directory, run_id=self._store.run_id
            )

    # ------------------------------------------------------------------ SB3 hooks
    def _init_callback(self) -> None:
        if self._controller is None or self._controller.model is not self.model:
            controller = Controller(self.model, snapshot_on_change=self._snapshot_on_change)
            controller.store = self._store  # the run's directory, where the token file is
            self._controller = controller

    def _on_training_start(self) -> None:
        self.controller.begin()

    def _on_step(self) -> bool:
        self.controller.boundary()
        return True

    def _on_rollout_end(self) -> None:
        self.controller.boundary()

    def _on_training_end(self) -> None:
        self.controller.end()

    # ------------------------------------------------------------------ API
    @property
    def controller(self) -> Controller:
        """The :class:`~unilab_gym.sb3.control.controller.Controller` (``RuntimeError`` before ``learn``)."""
        if self._controller is None:
            raise RuntimeError("ControlCallback is not attached to a model yet: pass it to model.learn(callback=...)")
        return self._controller

    @property
    def control_url(self) -> str | None:
        """``http://<addr>:<port>`` of the API (under ``/api/v1``), or ``None`` (no server, or closed)."""
        return self._server.url if self._server is not None else None

    @property
    def control_token_path(self) -> Path | None:
        """The token file, or ``None`` (no server, or closed).

        ``<run dir>/control_token``, or ``control_token-<run id>`` if another live run holds that name.
        """
        return self._server.token_path if self._server is not None else None

    @property
    def control_token(self) -> str | None:
        """The bearer token (``$UNILAB_CONTROL_TOKEN``, else random; also in ``<run dir>/control_token``, 0600)."""
        return self._server.token if self._server is not None else None

    def set_hyperparameters(self, **values: Any) -> dict[str, Any]:
        """See :meth:`unilab_gym.AsyncRunner.set_hyperparameters`."""
        return self.controller.set_hyperparameters(values)

    def hyperparameters(self) -> dict[str, Any]:
        """The current values, by name."""
        return self.controller.hyperparameters()

    def hyperparameter_history(self) -> list[dict[str, Any]]:
        """One dict per change: ``time``, ``num_timesteps``, ``name``, ``old``, ``new``, ``source``."""
        return self.controller.hyperparameter_history()

    def snapshot(self, include_replay: bool = False) -> str:
        """Save a snapshot; return its id (see :meth:`unilab_gym.AsyncRunner.snapshot`)."""
        return self.controller.snapshot(include_replay)

    def snapshots(self) -> list[dict[str, Any]]:
        """The snapshots taken: ``id``, ``time``, ``num_timesteps``, ``hyperparameters``, ``bytes``."""
        return self.controller.snapshots()

    def restore(self, snapshot_id: str) -> dict[str, Any]:
        """Roll the model back to a snapshot; return the hyperparameters in force."""
        return self.controller.restore(snapshot_id)

    def close(self) -> None:
        """Stop the server and release its port and token file. Idempotent."""
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._controller is not None:
            self._controller.close()

    def __enter__(self) -> ControlCallback:
        """Return the callback itself."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the callback (see :meth:`close`)."""
        self.close()

    def __del__(self) -> None:
        """Close the server if it is still open."""
        if getattr(self, "_server", None) is not None:
            self.close()


class _Proxy:
    """What the server calls: the callback's controller once it has one (503 before)."""

    def __init__(self, callback: ControlCallback):
        self._callback = callback

    def __getattr__(self, name: str) -> Any:
        controller = self._callback._controller
        if controller is None:
            raise TimeoutError("ControlCallback is not attached to a model yet (model.learn(callback=...))")
        return getattr(controller, name)
