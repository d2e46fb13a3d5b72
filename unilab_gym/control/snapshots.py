"""Parameter snapshots of a training model: ordinary SB3 ``model.save`` zips plus a JSON record.

A snapshot ``<id>`` is three files in the run's directory:

- ``<id>.zip``: ``model.save()`` (policy, optimizers, hyperparameters as model attributes, counters);
  ``SAC.load`` / ``PPO.load`` open it without unilab_gym;
- ``<id>.json``: ``id``, ``time`` (Unix s), ``num_timesteps``, ``hyperparameters`` (the live
  values, runner ones included), ``bytes`` (of the zip and the replay file), ``include_replay``, ``path`` (of the zip);
- ``<id>.replay.pkl`` if asked for: SB3's ``model.save_replay_buffer`` (a plain copy).

Only snapshots taken by this store are listed and restored: it never loads a file it did not write.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def fresh_run_dir(root: str | os.PathLike[str] = "runs") -> Path:
    """Create and return a new directory ``<root>/control/<UTC time>-<pid>[-k]``."""
    base = Path(root) / "control" / f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{os.getpid()}"
    for k in range(1000):
        path = base if k == 0 else Path(f"{base}-{k}")
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"no fresh directory under {base.parent}")


@contextlib.contextmanager
def _loadable_without_unilab_gym(model: Any) -> Iterator[None]:
    """Save a ``SharedReplayBuffer`` model as one with SB3's ``ReplayBuffer`` (SB3 pickles the class)."""
    cls = getattr(model, "replay_buffer_class", None)
    if cls is None or not cls.__module__.startswith("unilab_gym"):
        yield
        return
    from stable_baselines3.common.buffers import ReplayBuffer

    kwargs = model.replay_buffer_kwargs
    model.replay_buffer_class, model.replay_buffer_kwargs = ReplayBuffer, {}
    try:
        yield
    finally:
        model.replay_buffer_class, model.replay_buffer_kwargs = cls, kwargs


class SnapshotStore:
    """The snapshots of one run, in one directory.

    Args:
        directory: where to write them; created on the first snapshot. ``None``: a fresh
            directory from :func:`fresh_run_dir` (under ``runs/``), made when first needed.
    """

    def __init__(self, directory: str | os.PathLike[str] | None = None):
        self._requested = None if directory is None else Path(directory)
        self._dir: Path | None = None
        self._records: dict[str, dict[str, Any]] = {}

    @property
    def directory(self) -> Path:
        """The run's directory (created on first use)."""
        if self._dir is None:
            if self._requested is None:
                self._dir = fresh_run_dir()
            else:
                self._requested.mkdir(parents=True, exist_ok=True)
                self._dir = self._requested
        return self._dir

    def save(self, model: Any, hyperparameters: dict[str, Any], include_replay: bool = False) -> str:
        """Write a snapshot of ``model``; return its id.

        Raises:
            ValueError: ``include_replay`` is not a bool, or the model has no replay buffer to save.
        """
        if not isinstance(include_replay, bool):
            raise ValueError(f"include_replay must be a bool, got {include_replay!r}")
        if include_replay and getattr(model, "replay_buffer", None) is None:
            raise ValueError(f"include_replay=True: a {type(model).__name__} has no replay buffer")
        sid = f"{len(self._records) + 1:04d}-t{int(model.num_timesteps)}"
        folder = self.directory
        files = [folder / f"{sid}.zip"]
        with _loadable_without_unilab_gym(model):
            model.save(files[0])
        if include_replay:
            files.append(folder / f"{sid}.replay.pkl")
            model.save_replay_buffer(files[1])
        record = {
            "id": sid,
            "time": time.time(),
            "num_timesteps": int(model.num_timesteps),
            "hyperparameters": dict(hyperparameters),
            "bytes": sum(f.stat().st_size for f in files),
            "include_replay": include_replay,
            "path": str(files[0]),
        }
        (folder / f"{sid}.json").write_text(json.dumps(record))
        self._records[sid] = record
        return sid

    def list(self) -> list[dict[str, Any]]:
        """Every snapshot taken, oldest first: ``id``, ``time``, ``num_timesteps``, ``hyperparameters``, ``bytes``."""
        return [dict(r) for r in self._records.values()]

    def record(self, snapshot_id: Any) -> dict[str, Any]:
        """The record of ``snapshot_id``.

        Raises:
            KeyError: no snapshot of this store has that id (the message lists them).
        """
        if not isinstance(snapshot_id, str) or snapshot_id not in self._records:
            raise KeyError(f"no snapshot {snapshot_id!r}; snapshots: {list(self._records)}")
        return dict(self._records[snapshot_id])

    def load_into(self, model: Any, snapshot_id: str, replay: bool = True) -> dict[str, Any]:
        """Load snapshot ``snapshot_id``'s weights, optimizer states and SB3 tensors into ``model``.

        With ``replay`` and a snapshot that holds one, the replay is loaded too: into the model's
        ``SharedReplayBuffer`` in place (:meth:`~unilab_gym.replay.ReplayStorage.load_state`: the
        segment collectors write into stays, so ``AsyncRunner``'s collectors keep writing, now after
        the restored transitions), else with SB3's ``load_replay_buffer`` (the model gets a new buffer).

        The hyperparameters are not touched (the caller applies ``record["hyperparameters"]`` first).
        Returns the record, plus ``"data"``: the zip's SB3 data (schedules included).

        Raises:
            KeyError: unknown id.
        """
        from stable_baselines3.common.save_util import load_from_zip_file, recursive_setattr

        record = self.record(snapshot_id)
        folder = self.directory
        data, params, variables = load_from_zip_file(folder / f"{snapshot_id}.zip", device=model.device)
        model.set_parameters(params, exact_match=True, device=model.device)
        for name, tensor in (variables or {}).items():
            if tensor is not None:
                recursive_setattr(model, f"{name}.data", tensor.data)
        if replay and record["include_replay"]:
            path = folder / f"{snapshot_id}.replay.pkl"
            if hasattr(model.replay_buffer, "storage"):  # a SharedReplayBuffer
                _load_shared_replay_in_place(model.replay_buffer, path)
            else:
                model.load_replay_buffer(path)
        record["data"] = data
        return record


#: How long a restore retries while a collector is between reserving and committing rows, in s.
REPLAY_RESTORE_TIMEOUT_S = 5.0


def _load_shared_replay_in_place(buffer: Any, path: Path) -> None:
    """Copy the replay saved at ``path`` (by this store) into ``buffer``'s own shared segment.

    Raises:
        RuntimeError: a collector kept rows in flight for :data:`REPLAY_RESTORE_TIMEOUT_S`.
        ValueError: the saved replay does not fit ``buffer`` (another layout or capacity).
    """
    from stable_baselines3.common.save_util import load_from_pkl

    saved = load_from_pkl(path)  # a file this store wrote (never one the user did not name)
    try:
        state = saved.storage.to_state()
    finally:
        saved.close()
    deadline = time.monotonic() + REPLAY_RESTORE_TIMEOUT_S
    while True:
        try:
            buffer.storage.load_state(state)
            return
        except RuntimeError:  # a live writer between reserve and commit: a few microseconds
            if time.monotonic() > deadline:
                raise
            time.sleep(0.001)
