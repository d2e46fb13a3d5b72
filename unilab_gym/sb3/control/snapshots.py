"""Parameter snapshots of a training model: ordinary SB3 ``model.save`` zips plus a JSON record.

A snapshot ``<id>`` is these files in the run's directory:

- ``<id>.zip``: ``model.save()`` (policy, optimizers, hyperparameters as model attributes, counters);
  ``SAC.load`` / ``PPO.load`` open it without unilab_gym;
- ``<id>.replay.pkl`` if asked for: the pickle SB3's ``model.save_replay_buffer`` writes (a plain copy);
- ``<id>.statistics.npz`` if the model's env is a ``VecNormalize``: its running mean / variance /
  count arrays (observations, and returns), a NumPy archive read with ``allow_pickle=False``;
- ``<id>.json``: ``id``, ``run_id``, ``time`` (Unix s), ``num_timesteps``, ``hyperparameters`` (the
  live values, runner ones included), ``bytes`` (of the files above), ``include_replay``, ``path``
  (of the zip), ``files`` (the files' names) and ``sha256`` (``{file name: hex digest}``).

**Only files this run wrote are ever loaded.** Ids are ``<run id>-<n>-t<num_timesteps>``, where
the run id (:func:`new_run_id`: UTC start time, pid and 24 random bits) is unique per
:class:`SnapshotStore`, so two runs sharing a directory (a resumed job, two trials) never pick
the same names; every file is created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` and is never
overwritten. The store keeps each file's size and SHA-256 in memory (the JSON copy is for people:
it is never read back). A restore reads each file once into memory (``O_NOFOLLOW``: not through a
symbolic link; regular files only), checks its size and digest, and raises
:class:`SnapshotIntegrityError` naming the file before any byte of it is deserialized; the
verified bytes, not the file, are then loaded. The zip's ``data`` entry (SB3's cloudpickled
attributes) is not loaded at all: a restore takes the weights (``torch.load(weights_only=True)``)
and the hyperparameters from the record.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import hashlib
import io
import json
import os
import pickle
import secrets
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stable_baselines3.common.buffers import ReplayBuffer

#: Flags every snapshot file is created with: a new file, never through a symbolic link.
CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
#: Flags a snapshot file is read with (``O_NONBLOCK``: a FIFO put in its place cannot block the open).
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


class SnapshotIntegrityError(ValueError):
    """A snapshot file is not the one this run wrote (changed, replaced, removed, or a link).

    A ``ValueError`` (the HTTP API answers 400); nothing was loaded or changed.

    :ivar path: the offending file.
    :ivar field: ``"id"`` (what the HTTP error names).
    """

    def __init__(self, path: Path, message: str):
        """An error about snapshot file ``path``, with ``message``."""
        super().__init__(message)
        self.path = path
        self.field = "id"


def new_run_id() -> str:
    """A run id: ``<UTC time>-<pid>-<6 hex digits>``, e.g. ``20250101T120000Z-4242-9f3a1c``.

    Time and pid alone can repeat (containers all run as pid 1; a restarted job in the same
    second), so 24 random bits (``secrets``) are added.
    """
    return f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}-{secrets.token_hex(3)}"


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


class _HashingFile:
    """A write-only file object over a new file's descriptor that hashes what it writes."""

    def __init__(self, fd: int):
        self._file = os.fdopen(fd, "wb")
        self.sha256 = hashlib.sha256()
        self.size = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.sha256.update(view)
        self.size += view.nbytes
        return self._file.write(view)

    def close(self) -> None:
        self._file.close()


@dataclass(frozen=True)
class FileDigest:
    """What the store wrote: a file's name (in the run's directory), size in bytes and SHA-256 (hex)."""

    name: str
    size: int
    sha256: str


def _write_new(path: Path, write: Any) -> FileDigest:
    """Create ``path`` (``O_EXCL | O_NOFOLLOW``, mode ``0o644`` less the umask); ``write(file)`` fills it.

    Raises:
        FileExistsError: ``path`` exists (a file or a link): nothing is written.
    """
    out = _HashingFile(os.open(path, CREATE_FLAGS, 0o644))
    try:
        write(out)
    except BaseException:
        out.close()
        path.unlink(missing_ok=True)
        raise
    out.close()
    return FileDigest(path.name, out.size, out.sha256.hexdigest())


def _statistics(model: Any) -> dict[str, Any] | None:
    """The ``VecNormalize`` running statistics of ``model``'s env as arrays, or ``None`` (no ``VecNormalize``)."""
    import numpy as np

    vec = model.get_vec_normalize_env() if hasattr(model, "get_vec_normalize_env") else None
    if vec is None:
        return None
    out: dict[str, Any] = {}
    groups = {"obs": vec.obs_rms, "ret": vec.ret_rms}
    for group, rms in groups.items():
        for key, r in rms.items() if isinstance(rms, dict) else [("", rms)]:
            prefix = f"{group}/{key}" if key else group
            out[f"{prefix}/mean"] = np.asarray(r.mean, np.float64)
            out[f"{prefix}/var"] = np.asarray(r.var, np.float64)
            out[f"{prefix}/count"] = np.asarray(r.count, np.float64)
    return out


def _apply_statistics(model: Any, arrays: dict[str, Any], check_only: bool) -> None:
    """Copy saved statistics into ``model``'s ``VecNormalize`` (or only check that they fit).

    Raises:
        ValueError: the model has no ``VecNormalize``, or the arrays do not match its statistics.
    """
    import numpy as np

    current = _statistics(model)
    if current is None or set(current) != set(arrays):
        raise ValueError("the snapshot's VecNormalize statistics do not match the model's env")
    for name, value in arrays.items():
        if np.shape(value) != np.shape(current[name]):
            raise ValueError(f"VecNormalize statistics {name}: shape {np.shape(value)} != {np.shape(current[name])}")
    if check_only:
        return
    vec = model.get_vec_normalize_env()
    for group, rms in {"obs": vec.obs_rms, "ret": vec.ret_rms}.items():
        for key, r in rms.items() if isinstance(rms, dict) else [("", rms)]:
            prefix = f"{group}/{key}" if key else group
            r.mean = np.array(arrays[f"{prefix}/mean"], dtype=np.asarray(r.mean).dtype)
            r.var = np.array(arrays[f"{prefix}/var"], dtype=np.asarray(r.var).dtype)
            r.count = float(arrays[f"{prefix}/count"])


@dataclass
class PreparedRestore:
    """A snapshot read, verified and deserialized in memory, not yet applied (:meth:`SnapshotStore.prepare`).

    :ivar record: the snapshot's record.
    :ivar params: the zip's state dicts (``torch.load(weights_only=True)`` of verified bytes).
    :ivar variables: SB3's extra tensors (SAC's ``log_ent_coef``), or ``None``.
    :ivar replay_state: a ``SharedReplayBuffer``'s storage state (:meth:`~unilab_gym.replay.ReplayStorage.to_state`),
        to load in place; or ``None``.
    :ivar replay_buffer: an SB3 ``ReplayBuffer`` to put in place of the model's; or ``None``.
    :ivar statistics: ``VecNormalize`` statistics arrays, or ``None``.
    """

    record: dict[str, Any]
    params: dict[str, Any]
    variables: dict[str, Any] | None
    replay_state: dict[str, Any] | None = None
    replay_buffer: ReplayBuffer | None = None
    statistics: dict[str, Any] | None = None


class SnapshotStore:
    """The snapshots of one run, in one directory.

    Args:
        directory: where to write them; created on the first snapshot. ``None``: a fresh
            directory from :func:`fresh_run_dir` (under ``runs/``), made when first needed.
            Several runs may share one directory: their ids never collide (see :attr:`run_id`).
    """

    def __init__(self, directory: str | os.PathLike[str] | None = None):
        """Start an empty store with a new run id; nothing is created yet (arguments: see the class docstring)."""
        self._requested = None if directory is None else Path(directory)
        self._dir: Path | None = None
        self._records: dict[str, dict[str, Any]] = {}
        self._digests: dict[str, tuple[FileDigest, ...]] = {}
        #: this run's id (:func:`new_run_id`), the prefix of every snapshot id it gives.
        self.run_id = new_run_id()

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
        """Write a snapshot of ``model``; return its id. No existing file is ever overwritten.

        Raises:
            ValueError: ``include_replay`` is not a bool, or the model has no replay buffer to save.
            FileExistsError: 100 fresh names in a row were taken (another process writing the same names).
        """
        import numpy as np

        if not isinstance(include_replay, bool):
            raise ValueError(f"include_replay must be a bool, got {include_replay!r}")
        if include_replay and getattr(model, "replay_buffer", None) is None:
            raise ValueError(f"include_replay=True: a {type(model).__name__} has no replay buffer")
        folder = self.directory
        zipped = io.BytesIO()
        with _loadable_without_unilab_gym(model):
            model.save(zipped)

        def dump_replay(f: _HashingFile) -> None:
            pickle.dump(model.replay_buffer, f, pickle.HIGHEST_PROTOCOL)

        statistics = _statistics(model)
        arrays = io.BytesIO()
        if statistics is not None:
            np.savez(arrays, **statistics)
        for attempt in range(100):
            sid = f"{self.run_id}-{len(self._records) + 1 + attempt:04d}-t{int(model.num_timesteps)}"
            written: list[FileDigest] = []
            try:
                written.append(_write_new(folder / f"{sid}.zip", lambda f: f.write(zipped.getbuffer())))
                if include_replay:  # what SB3's save_replay_buffer writes (save_to_pkl), hashed as written
                    written.append(_write_new(folder / f"{sid}.replay.pkl", dump_replay))
                if statistics is not None:
                    written.append(_write_new(folder / f"{sid}.statistics.npz", lambda f: f.write(arrays.getbuffer())))
            except FileExistsError:
                for digest in written:
                    (folder / digest.name).unlink(missing_ok=True)
                continue
            except BaseException:
                for digest in written:
                    (folder / digest.name).unlink(missing_ok=True)
                raise
            break
        else:
            raise FileExistsError(f"no free snapshot name in {folder} after 100 tries (run {self.run_id})")
        record = {
            "id": sid,
            "run_id": self.run_id,
            "time": time.time(),
            "num_timesteps": int(model.num_timesteps),
            "hyperparameters": dict(hyperparameters),
            "bytes": sum(d.size for d in written),
            "include_replay": include_replay,
            "path": str(folder / f"{sid}.zip"),
            "files": [d.name for d in written],
            "sha256": {d.name: d.sha256 for d in written},
        }
        try:
            _write_new(folder / f"{sid}.json", lambda f: f.write(json.dumps(record).encode()))
        except BaseException:
            for digest in written:
                (folder / digest.name).unlink(missing_ok=True)
            raise
        self._records[sid] = record
        self._digests[sid] = tuple(written)
        return sid

    def list(self) -> list[dict[str, Any]]:
        """Every snapshot taken, oldest first: ``id``, ``time``, ``num_timesteps``, ``hyperparameters``, ``bytes``."""
        return [copy.deepcopy(r) for r in self._records.values()]

    def record(self, snapshot_id: Any) -> dict[str, Any]:
        """The record of ``snapshot_id``.

        Raises:
            KeyError: no snapshot of this store has that id (the message lists them).
        """
        if not isinstance(snapshot_id, str) or snapshot_id not in self._records:
            raise KeyError(f"no snapshot {snapshot_id!r}; snapshots: {list(self._records)}")
        return copy.deepcopy(self._records[snapshot_id])

    def read_verified(self, snapshot_id: str, name: str) -> bytes:
        """The bytes of snapshot file ``name``, once they match the size and SHA-256 this store wrote.

        Raises:
            KeyError: unknown id, or ``name`` is not one of its files.
            SnapshotIntegrityError: the file is missing, not a regular file, a symbolic link, or its
                size or digest differ (the message names the file).
        """
        self.record(snapshot_id)
        digest = {d.name: d for d in self._digests[snapshot_id]}.get(name)
        if digest is None:
            raise KeyError(f"snapshot {snapshot_id!r} has no file {name!r}")
        path = self.directory / name

        def refuse(why: str) -> SnapshotIntegrityError:
            return SnapshotIntegrityError(
                path, f"{path} is not the file this run wrote for snapshot {snapshot_id!r}: {why}; nothing was loaded"
            )

        try:
            fd = os.open(path, READ_FLAGS)
        except FileNotFoundError:
            raise refuse("it is gone") from None
        except OSError as exc:
            raise refuse(
                "it is a symbolic link" if exc.errno == errno.ELOOP else f"it cannot be opened ({exc})"
            ) from None
        with os.fdopen(fd, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise refuse("it is not a regular file")
            if info.st_size != digest.size:
                raise refuse(f"it has {info.st_size} bytes, this run wrote {digest.size}")
            data = f.read(digest.size + 1)
        found = hashlib.sha256(data).hexdigest()
        if len(data) != digest.size or found != digest.sha256:
            raise refuse(f"its SHA-256 is {found}, this run wrote {digest.sha256}")
        return data

    def prepare(self, model: Any, snapshot_id: str, replay: bool = True) -> PreparedRestore:
        """Read, verify and deserialize snapshot ``snapshot_id`` for ``model``, changing nothing.

        Every file is verified (:meth:`read_verified`) before any is deserialized; then the weights
        are checked against the model's (same state dicts, same tensor shapes), the replay against
        the model's replay (same layout and capacity), the statistics against its ``VecNormalize``.

        Raises:
            KeyError: unknown id.
            SnapshotIntegrityError: a file is not the one this run wrote (nothing was deserialized).
            ValueError: the snapshot does not fit the model.
        """
        import numpy as np
        from stable_baselines3.common.save_util import load_from_zip_file

        record = self.record(snapshot_id)
        use_replay = replay and record["include_replay"]
        names = [n for n in record["files"] if use_replay or not n.endswith(".replay.pkl")]
        raw = {name: self.read_verified(snapshot_id, name) for name in names}  # all verified, then loaded
        _, params, variables = load_from_zip_file(
            io.BytesIO(raw[f"{snapshot_id}.zip"]), load_data=False, device=model.device
        )
        _check_params(model, params)
        prepared = PreparedRestore(record, params, variables)
        stats_name = f"{snapshot_id}.statistics.npz"
        if stats_name in raw:
            with np.load(io.BytesIO(raw.pop(stats_name)), allow_pickle=False) as archive:
                prepared.statistics = {k: archive[k] for k in archive.files}
            _apply_statistics(model, prepared.statistics, check_only=True)
        if use_replay:
            saved = pickle.loads(raw.pop(f"{snapshot_id}.replay.pkl"))  # verified: the bytes this store wrote
            if hasattr(model.replay_buffer, "storage"):  # a SharedReplayBuffer: load in place
                storage = model.replay_buffer.storage
                try:
                    fits = saved.storage.layout == storage.layout and saved.storage.capacity == storage.capacity
                    state = saved.storage.to_state()
                finally:
                    saved.close()
                if not fits:
                    raise ValueError(
                        f"snapshot {snapshot_id!r}: its replay's layout or capacity is not the model's replay's "
                        f"({storage.layout}, {storage.capacity} rows)"
                    )
                prepared.replay_state = state
            else:
                from stable_baselines3.common.buffers import ReplayBuffer

                if not isinstance(saved, ReplayBuffer):
                    raise ValueError(
                        f"snapshot {snapshot_id!r}: its replay is a {type(saved).__name__}, not a ReplayBuffer"
                    )
                prepared.replay_buffer = saved
        return prepared

    def apply(self, model: Any, prepared: PreparedRestore) -> None:
        """Load a snapshot from :meth:`prepare` into ``model``.

        Weights, optimizer states, SB3 tensors, statistics, then the replay. All or nothing: if a step fails, the
        earlier ones are undone (from copies taken first) and the error is raised.

        With a ``SharedReplayBuffer`` the replay is loaded in place
        (:meth:`~unilab_gym.replay.ReplayStorage.load_state`: the segment collectors write into stays,
        so ``AsyncRunner``'s collectors keep writing, now after the restored transitions); an SB3
        ``ReplayBuffer`` is put in place of the model's, as ``load_replay_buffer`` does.

        Raises:
            RuntimeError: a collector kept rows in flight for :data:`REPLAY_RESTORE_TIMEOUT_S`; nothing changed.
        """
        from stable_baselines3.common.save_util import recursive_getattr, recursive_setattr

        weights = copy.deepcopy(model.get_parameters())
        names = [n for n, t in (prepared.variables or {}).items() if t is not None]
        tensors = {n: recursive_getattr(model, n).data.clone() for n in names}
        statistics = _statistics(model)
        try:
            model.set_parameters(prepared.params, exact_match=True, device=model.device)
            for name in names:
                recursive_setattr(model, f"{name}.data", prepared.variables[name].data)  # type: ignore[index]
            if prepared.statistics is not None:
                _apply_statistics(model, prepared.statistics, check_only=False)
            if prepared.replay_state is not None:
                _load_shared_replay_in_place(model.replay_buffer, prepared.replay_state)
            elif prepared.replay_buffer is not None:
                prepared.replay_buffer.device = model.device  # as load_replay_buffer does (SB3 #1561)
                model.replay_buffer = prepared.replay_buffer
        except BaseException:
            model.set_parameters(weights, exact_match=True, device=model.device)
            for name, tensor in tensors.items():
                recursive_setattr(model, f"{name}.data", tensor)
            if statistics is not None:
                _apply_statistics(model, statistics, check_only=False)
            raise

    def load_into(self, model: Any, snapshot_id: str, replay: bool = True) -> dict[str, Any]:
        """:meth:`prepare`, then :meth:`apply` snapshot ``snapshot_id``; return its record.

        The hyperparameters are not touched (the :class:`~unilab_gym.sb3.control.controller.Controller`
        applies ``record["hyperparameters"]``).

        Raises:
            KeyError: unknown id.
            SnapshotIntegrityError: a file is not the one this run wrote; nothing changed.
            ValueError: the snapshot does not fit the model; nothing changed.
            RuntimeError: as :meth:`apply`; nothing changed.
        """
        prepared = self.prepare(model, snapshot_id, replay)
        self.apply(model, prepared)
        return prepared.record


def _check_params(model: Any, params: dict[str, Any]) -> None:
    """Raise ``ValueError`` unless ``params`` has the model's state dicts, with its tensors' shapes."""
    current = model.get_parameters()
    if set(params) != set(current):
        raise ValueError(f"the snapshot's state dicts {sorted(params)} are not the model's {sorted(current)}")
    for name, state in params.items():
        mine = current[name]
        if "state" in mine and "param_groups" in mine:  # an optimizer: load_state_dict checks the groups
            if len(state.get("param_groups", ())) != len(mine["param_groups"]):
                raise ValueError(f"{name}: the snapshot's optimizer has other parameter groups")
            continue
        if set(state) != set(mine):
            raise ValueError(f"{name}: the snapshot's tensors are not the model's")
        for key, tensor in state.items():
            if getattr(tensor, "shape", None) != getattr(mine[key], "shape", None):
                raise ValueError(f"{name}.{key}: shape {tuple(tensor.shape)} != the model's {tuple(mine[key].shape)}")


#: How long a restore retries while a collector is between reserving and committing rows, in s.
REPLAY_RESTORE_TIMEOUT_S = 5.0


def _load_shared_replay_in_place(buffer: Any, state: dict[str, Any]) -> None:
    """Copy a replay storage state into ``buffer``'s own shared segment (all of it, or nothing).

    Raises:
        RuntimeError: a collector kept rows in flight for :data:`REPLAY_RESTORE_TIMEOUT_S`.
        ValueError: the saved replay does not fit ``buffer`` (another layout or capacity).
    """
    deadline = time.monotonic() + REPLAY_RESTORE_TIMEOUT_S
    while True:
        try:
            buffer.storage.load_state(state)
            return
        except RuntimeError:  # a live writer between reserve and commit: a few microseconds
            if time.monotonic() > deadline:
                raise
            time.sleep(0.001)
