"""``Controller``: live hyperparameters, snapshots and rollback of one model, safe to call from any thread.

Requests (from Python or from the HTTP server's thread) are queued while ``learn()`` runs and
executed on the learner's thread at its next *boundary* (between ``train()`` calls off-policy,
between iterations or while waiting for a rollout on-policy: never inside a gradient step);
the caller waits for the result, so an error names the bad value and a return means applied.
When ``learn()`` is not running, a request runs at once on the caller's thread. This is where
Sample Factory's PBT applies config changes (between training iterations); a restore is Ray
Tune PBT's exploit step (load a checkpoint into the running trial).

**Every change is all or nothing.** A change is checked (ranges: :mod:`unilab_gym.sb3.control.hyperparams`)
before anything is applied. A restore verifies and deserializes every file of the snapshot first
(:meth:`~unilab_gym.sb3.control.snapshots.SnapshotStore.prepare`), then applies hyperparameters, weights,
optimizer states, statistics and replay, putting back what it applied if a later step fails.
A change that passed its checks but makes the next gradient step (``model.train``) raise is
rolled back (the values as they were before it), recorded in the history with source
``"rollback"``, warned about (``UserWarning``), and the step is run again with the old values:
the run goes on. If the step fails with the old values too, the error is not the change's and is raised.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, TypeVar

from unilab_gym.sb3 import _sb3_private
from unilab_gym.sb3.control.hyperparams import Hyperparameters
from unilab_gym.sb3.control.snapshots import SnapshotStore

if TYPE_CHECKING:
    from stable_baselines3.common.base_class import BaseAlgorithm

    from unilab_gym.sb3.loops.base import LearnerLoop

T = TypeVar("T")

#: How long a request waits for the learner's next boundary, in s, before it is withdrawn (``TimeoutError``).
REQUEST_TIMEOUT_S = 60.0
#: Sources a caller may name (a history entry's ``source`` is one of these, or ``"rollback"``).
SOURCES = ("python", "http")
#: The ``source`` of a history entry that undid a change the next gradient step failed with.
ROLLBACK = "rollback"


class Controller:
    """Live control of one SB3 model.

    Args:
        model: an SB3 ``SAC``, ``TD3``, ``DDPG``, ``PPO`` or ``A2C``.
        loop: the ``AsyncRunner``'s learner loop, or ``None`` (plain SB3).
        snapshot_dir: where snapshots go (default: a fresh directory under ``runs/``, made when needed).
        snapshot_on_change: take a snapshot before every hyperparameter change.
        after_restore: called on the learner's thread after a restore (the runner publishes the weights).
        status: extra fields for :meth:`status` (e.g. collector status), called on the caller's thread.
    """

    def __init__(
        self,
        model: BaseAlgorithm,
        loop: LearnerLoop | None = None,
        *,
        snapshot_dir: str | os.PathLike[str] | None = None,
        snapshot_on_change: bool = False,
        after_restore: Callable[[], None] | None = None,
        status: Callable[[], dict[str, Any]] | None = None,
    ):
        """Check the arguments and set up the hyperparameters and the snapshot store (see the class docstring)."""
        if not isinstance(snapshot_on_change, bool):
            raise ValueError(f"snapshot_on_change must be a bool, got {snapshot_on_change!r}")
        self.model = model
        self.hyperparams = Hyperparameters(model, loop)
        self.store = SnapshotStore(snapshot_dir)
        self.snapshot_on_change = snapshot_on_change
        self._after_restore = after_restore
        self._status = status
        self._history: list[dict[str, Any]] = []
        self._lock = threading.Lock()  # guards _learner and _queue
        self._run_lock = threading.RLock()  # held by the learner for a whole learn(), by direct calls while they run
        self._learner: int | None = None
        self._queue: list[tuple[Callable[[], Any], Future[Any]]] = []
        self._trial: _Trial | None = None

    # ------------------------------------------------------------------ learner side
    def begin(self) -> None:
        """``learn()`` starts on this thread: requests now wait for its boundaries."""
        self._run_lock.acquire()
        with self._lock:
            self._learner = threading.get_ident()

    def boundary(self) -> None:
        """Run the queued requests (call on the learner's thread, between gradient steps)."""
        if not self._queue:  # a racy read is fine: a request queued now runs at the next boundary
            return
        with self._lock:
            pending, self._queue = self._queue, []
        for fn, future in pending:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as exc:  # the caller re-raises it
                    future.set_exception(exc)

    def end(self, failed: bool = False) -> None:
        """``learn()`` ended: run what is queued (withdraw it if ``learn()`` failed), then serve requests at once."""
        try:
            with self._lock:
                self._learner = None
                if failed:
                    pending, self._queue = self._queue, []
                    for _, future in pending:
                        if future.set_running_or_notify_cancel():
                            future.set_exception(RuntimeError("learn() stopped with an error; nothing was changed"))
            self.boundary()
        finally:
            self._run_lock.release()

    def _call(self, fn: Callable[[], T], timeout: float = REQUEST_TIMEOUT_S) -> T:
        if self._learner == threading.get_ident():
            return fn()
        future: Future[Any] = Future()
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if self._learner is not None:
                    self._queue.append((fn, future))
                    break
            if self._run_lock.acquire(timeout=0.05):
                try:
                    return fn()
                finally:
                    self._run_lock.release()
            if time.monotonic() > deadline:
                raise TimeoutError(f"the model was busy for {timeout} s; nothing was changed")
        try:
            return future.result(timeout=max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            if future.cancel():  # still queued: withdrawn, nothing changed
                raise TimeoutError(
                    f"learn() reached no gradient-step boundary within {timeout} s; nothing was changed"
                ) from None
            return future.result()  # it is running: wait for it

    # ------------------------------------------------------------------ API
    def set_hyperparameters(self, values: dict[str, Any], source: str = "python") -> dict[str, Any]:
        """Check all of ``values``, then apply them at the next boundary; return the current values.

        Raises:
            ValueError: unknown name, or a value of the wrong type or out of range (the message
                names it and its valid range). Nothing changes, the other values included.
            TimeoutError: ``learn()`` reached no boundary within :data:`REQUEST_TIMEOUT_S`; nothing changed.
        """
        if source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
        self.hyperparams.check(values)  # fail fast on the caller's thread; checked again when applied

        def apply() -> dict[str, Any]:
            self.hyperparams.check(values)
            if self.snapshot_on_change:
                self._snapshot(False)
            undo = self.hyperparams.save()
            changes = self.hyperparams.apply(values)
            self._log(changes, source)
            self._put_on_trial(undo, changes)
            return self.hyperparams.values()

        return self._call(apply)

    def hyperparameters(self) -> dict[str, Any]:
        """The current values, by name."""
        return self.hyperparams.values()

    def hyperparameter_history(self) -> list[dict[str, Any]]:
        """One dict per change: ``time`` (Unix s), ``num_timesteps``, ``name``, ``old``, ``new``, ``source``."""
        return [dict(entry) for entry in self._history]

    def snapshot(self, include_replay: bool = False) -> str:
        """Save the policy, optimizers, hyperparameters and counters (and the replay if asked); return the id.

        Raises:
            ValueError: ``include_replay`` is not a bool, or there is no replay to save.
        """
        if not isinstance(include_replay, bool):
            raise ValueError(f"include_replay must be a bool, got {include_replay!r}")
        return self._call(lambda: self._snapshot(include_replay))

    def snapshots(self) -> list[dict[str, Any]]:
        """Every snapshot taken, oldest first.

        Keys: ``id``, ``time``, ``num_timesteps``, ``hyperparameters``, ``bytes``, ``include_replay``, ``path``.
        """
        return self.store.list()

    def restore(self, snapshot_id: str, source: str = "python") -> dict[str, Any]:
        """Roll the learner back to snapshot ``snapshot_id``; return the hyperparameters now in force.

        Weights, optimizer states and SB3's tensors (SAC's ``log_ent_coef``) are loaded bit for bit,
        the hyperparameters set as they were, ``VecNormalize`` statistics and the replay loaded if
        the snapshot holds them. Counters (``num_timesteps``) keep counting. The history gets one
        entry (``source``) per hyperparameter whose value differs from before the restore.

        All or nothing: every file is checked against the size and SHA-256 this run wrote and
        deserialized, and the snapshot checked against the model, before anything is applied; a
        step that fails while applying (e.g. a collector holding replay rows in flight) puts back
        what the restore had applied.

        Raises:
            KeyError: no snapshot has that id.
            SnapshotIntegrityError: (a ``ValueError``) a file of the snapshot is not the one this run
                wrote; it names the file. Nothing was deserialized or changed.
            ValueError: the snapshot does not fit the model; nothing changed.
            RuntimeError: the replay could not be loaded (rows in flight); nothing changed.
        """
        self.store.record(snapshot_id)  # KeyError at once

        def run() -> dict[str, Any]:
            record = self.store.record(snapshot_id)
            wanted = {k: v for k, v in record["hyperparameters"].items() if k in self.hyperparams.names()}
            if wanted:
                self.hyperparams.check(wanted)
            prepared = self.store.prepare(self.model, snapshot_id, replay=record["include_replay"])
            self._end_trial()  # the restored values replace whatever change was on trial
            before = self.hyperparams.values()
            undo = self.hyperparams.save()
            try:
                if wanted:
                    self.hyperparams.apply(wanted)
                self.store.apply(self.model, prepared)
            except BaseException:
                undo()
                raise
            after = self.hyperparams.values()
            self._log([(n, before[n], after[n]) for n in after], source, only_changed=True)
            if self._after_restore is not None:
                self._after_restore()
            return after

        return self._call(run)

    def status(self) -> dict[str, Any]:
        """Counters: ``num_timesteps``, ``n_updates``, ``episodes``, ``learning`` (and what ``status`` adds)."""
        model = self.model
        out: dict[str, Any] = {
            "algorithm": type(model).__name__,
            "num_timesteps": int(model.num_timesteps),
            "n_updates": _sb3_private.update_count(model),
            "episodes": _sb3_private.episode_count(model),
            "learning": self._learner is not None,
            "snapshots": len(self.store.list()),
        }
        if self._status is not None:
            out.update(self._status())
        return out

    def close(self) -> None:
        """Take a change still on trial off the model (its ``train`` is SB3's again). Idempotent."""
        self._end_trial()

    # ------------------------------------------------------------------ internals
    def _snapshot(self, include_replay: bool) -> str:
        return self.store.save(self.model, self.hyperparams.values(), include_replay)

    def _put_on_trial(self, undo: Callable[[], None], changes: list[tuple[str, Any, Any]]) -> None:
        """Watch the model's next ``train()``: if it raises, roll this change back and train again.

        Changes made since the last ``train()`` are on trial together: a rollback returns to the
        values that last trained.
        """
        pending = self._trial
        if pending is not None:
            undo = pending.undo
            first = {name: old for name, old, _ in pending.changes}
            latest = {name: new for name, _, new in pending.changes}
            for name, old, new in changes:
                first.setdefault(name, old)
                latest[name] = new
            changes = [(name, first[name], latest[name]) for name in latest]
        self._end_trial()
        if any(old != new for _, old, new in changes):
            self._trial = _Trial(self, undo, changes)

    def _end_trial(self) -> None:
        if self._trial is not None:
            self._trial.remove()
            self._trial = None

    def _rolled_back(self, trial: _Trial, exc: BaseException) -> None:
        """``trial``'s change made ``train()`` raise ``exc``: it was undone; record and warn."""
        if self._trial is trial:
            self._trial = None
        now = self.hyperparams.values()
        undone = [(name, new, now[name]) for name, _, new in trial.changes if now.get(name) != new]
        self._log(undone, ROLLBACK)
        what = ", ".join(f"{name}={new!r}" for name, _, new in trial.changes)
        back = ", ".join(f"{name}={value!r}" for name, _, value in undone)
        warnings.warn(
            f"hyperparameter change {what} made the next gradient step fail ({type(exc).__name__}: {exc}); "
            f"rolled back to {back}, and training goes on",
            UserWarning,
            stacklevel=3,
        )

    def _log(self, changes: list[tuple[str, Any, Any]], source: str, only_changed: bool = False) -> None:
        logger = _sb3_private.logger_or_none(self.model)
        now = time.time()
        for name, old, new in changes:
            if only_changed and old == new:
                continue
            self._history.append(
                {
                    "time": now,
                    "num_timesteps": int(self.model.num_timesteps),
                    "name": name,
                    "old": old,
                    "new": new,
                    "source": source,
                }
            )
            if logger is not None:
                logger.record(f"unilab/hparams/{name}", new)


class _Trial:
    """A change on trial: the model's next ``train()`` runs through :meth:`train`, then SB3's ``train`` is back.

    The wrapper is an attribute of the model instance (SB3's loops and the runner's call
    ``model.train``), so :meth:`~stable_baselines3.common.base_class.BaseAlgorithm.save` is told to
    leave it out while it is there; it holds the controller weakly.
    """

    def __init__(self, controller: Controller, undo: Callable[[], None], changes: list[tuple[str, Any, Any]]):
        # typed Any: the trial wraps and calls the family's train() (and reads batch_size), which BaseAlgorithm lacks
        model: Any = controller.model
        self.model: Any = model
        self.undo, self.changes = undo, changes
        self._controller = weakref.ref(controller)
        self._own = _sb3_private.instance_attributes(model, _sb3_private.TRIAL_ATTRIBUTES)
        _sb3_private.exclude_from_save(model, _sb3_private.TRIAL_ATTRIBUTES)
        model.train = self.train

    def remove(self) -> None:
        model = self.model
        _sb3_private.restore_instance_attributes(model, _sb3_private.TRIAL_ATTRIBUTES, self._own)

    def train(self, *args: Any, **kwargs: Any) -> Any:
        controller = self._controller()
        self.remove()
        if controller is not None and controller._trial is self:
            controller._trial = None
        model = self.model
        try:
            return model.train(*args, **kwargs)
        except Exception as exc:
            self.undo()
            if controller is not None:
                controller._rolled_back(self, exc)
            if "batch_size" in kwargs:  # the caller read the value on trial: train with the old one
                kwargs["batch_size"] = model.batch_size
            elif len(args) >= 2:
                args = (args[0], model.batch_size, *args[2:])
            return model.train(*args, **kwargs)
