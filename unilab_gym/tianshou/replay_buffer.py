"""Tianshou 2.x replay buffer: :class:`SharedVectorReplayBuffer`, a ``VectorReplayBuffer`` in shared memory.

Its obs, obs_next, act and rew live in the packed shared-memory block of a
:class:`unilab_gym.replay.ReplayStorage`, and its ``hasnull()`` (called by the trainer after every
collect) costs O(1) in the buffer size instead of copying the whole buffer.

Importing this module imports Tianshou (and torch).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Sequence
from typing import Any, ClassVar

import h5py
import numpy as np
import pandas as pd
from tianshou.data import Batch, VectorReplayBuffer
from tianshou.data.batch import BatchProtocol
from tianshou.data.types import RolloutBatchProtocol
from tianshou.data.utils.converter import from_hdf5, to_hdf5

from unilab_gym.replay import ReplayHandle, ReplayLayout, ReplayStorage
from unilab_gym.replay.integrity import data_checksum, verify_checksum
from unilab_gym.validation import check_positive_int

__all__ = ["SharedVectorReplayBuffer"]


def _null_rows(data: BatchProtocol, idx: np.ndarray) -> np.ndarray:
    """(len(idx),) bool: rows ``idx`` of ``data`` holding a null (``pandas.isnull``, as ``Batch.isnull``)."""
    out = np.zeros(len(idx), dtype=bool)
    for key in data.get_keys():
        value = data[key]
        if isinstance(value, Batch):
            out |= _null_rows(value, idx)
            continue
        rows = np.asarray(value[idx])
        if rows.dtype.kind not in "biu":  # bools and ints are never null
            out |= pd.isnull(rows).reshape(len(idx), -1).any(axis=1)
    return out


class SharedVectorReplayBuffer(VectorReplayBuffer):
    """Tianshou ``VectorReplayBuffer`` whose transitions live in a packed shared-memory block.

    Same constructor, ``add`` / ``sample`` / indexing semantics as ``VectorReplayBuffer``
    (``buffer_num`` sub-buffers of ``ceil(total_size / buffer_num)`` transitions, one per env).
    ``obs``, ``obs_next``, ``act`` and ``rew`` are zero-copy float32 views of the block of a
    :class:`~unilab_gym.replay.ReplayStorage` (layout :class:`~unilab_gym.replay.ReplayLayout`:
    obs | next_obs | action | reward | terminated | truncated); Tianshou index ``k`` is block
    row ``k``, so sub-buffer ``b`` owns rows ``[b * size, (b + 1) * size)``. ``terminated`` /
    ``truncated`` are also written to the block; Tianshou reads them (and ``done``) from
    process-local bool arrays, and keeps ``info`` / ``policy`` in process memory as usual.
    Rows are placed by Tianshou's own bookkeeping, not by the storage's ring protocol: other
    processes may attach with :attr:`handle` and read ``storage.block``, but should not add.

    Differences from ``VectorReplayBuffer``: ``rew`` is stored as float32; observations and
    actions must be float arrays (Box spaces); ``hasnull()`` is O(1) in the buffer size: rows
    are checked for NaN / None when they are written, not rescanned after every collect.

    The block is allocated at the first :meth:`add` (from its shapes), or at once when
    ``obs_shape`` and ``act_dim`` are given.

    Args:
        total_size: total number of transitions.
        buffer_num: number of sub-buffers (>= the number of envs of the Collector).
        obs_shape: shape of one observation (float32), to allocate at construction.
        act_dim: number of action values (float32), to allocate at construction.
        **kwargs: ``VectorReplayBuffer`` options; ``stack_num``, ``ignore_obs_next``,
            ``save_only_last_obs`` and ``sample_avail`` must keep their defaults.

    Raises:
        ValueError: an unsupported option, a ``total_size``, ``buffer_num``, ``obs_shape`` entry or
            ``act_dim`` that is not a positive int, or (at ``add``) non-float observations/actions or
            shapes that differ from the block's (nothing is written).
    """

    _UNSUPPORTED: ClassVar[dict[str, object]] = {
        "stack_num": 1,
        "ignore_obs_next": False,
        "save_only_last_obs": False,
        "sample_avail": False,
    }

    def __init__(
        self,
        total_size: int,
        buffer_num: int,
        *,
        obs_shape: Sequence[int] | None = None,
        act_dim: int | None = None,
        **kwargs: Any,
    ) -> None:
        """Check the options; allocate now if ``obs_shape`` and ``act_dim`` are given (see the class docstring)."""
        for key, default in self._UNSUPPORTED.items():
            if key in kwargs and kwargs[key] != default:
                raise ValueError(
                    f"SharedVectorReplayBuffer does not support {key}={kwargs[key]!r}: each packed row stores "
                    "one obs and its obs_next. Use tianshou's VectorReplayBuffer for frame stacking."
                )
        total_size = check_positive_int("total_size", total_size)
        buffer_num = check_positive_int("buffer_num", buffer_num)
        super().__init__(total_size, buffer_num, **kwargs)
        self._storage: ReplayStorage | None = None
        self._obs_shape: tuple[int, ...] | None = None
        self._act_dim: int | None = None
        self._null = np.zeros(self.maxsize, dtype=bool)
        if (obs_shape is None) != (act_dim is None):
            raise ValueError("give both obs_shape and act_dim, or neither (then the first add allocates)")
        if obs_shape is not None and act_dim is not None:
            shape = tuple(check_positive_int(f"obs_shape[{k}]", d) for k, d in enumerate(obs_shape))
            self._allocate(shape, check_positive_int("act_dim", act_dim))

    # ------------------------------------------------------------------ shared storage
    @property
    def storage(self) -> ReplayStorage:
        """The shared storage holding the block.

        Raises:
            RuntimeError: before the first ``add`` (when not allocated at construction).
        """
        if self._storage is None:
            raise RuntimeError("the shared block is allocated at the first add (or pass obs_shape and act_dim)")
        return self._storage

    @property
    def handle(self) -> ReplayHandle:
        """Picklable handle: ``ReplayStorage.attach(handle)`` maps the block in another process."""
        return self.storage.handle

    @property
    def layout(self) -> ReplayLayout:
        """Column layout of the block."""
        return self.storage.layout

    def close(self) -> None:
        """Unlink the shared segment; this buffer keeps working on its (now private) mapping."""
        if self._storage is not None:
            self._storage.close()

    def _allocate(self, obs_shape: tuple[int, ...], act_dim: int) -> None:
        layout = ReplayLayout(int(np.prod(obs_shape)), act_dim)
        storage = ReplayStorage(layout, self.maxsize)
        block = storage.block
        n = self.maxsize
        views = {
            "obs": block[:, layout.obs].reshape(n, *obs_shape),
            "obs_next": block[:, layout.next_obs].reshape(n, *obs_shape),
            "act": block[:, layout.action],
            "rew": block[:, layout.reward],
        }
        if not all(np.shares_memory(v, block) for v in views.values()):  # pragma: no cover - numpy guarantees it
            raise AssertionError("column views of the shared block must not be copies")
        old = self._meta
        self._meta = Batch(
            {
                **views,
                "terminated": np.zeros(n, dtype=bool),
                "truncated": np.zeros(n, dtype=bool),
                "done": np.zeros(n, dtype=bool),
            }
        )
        for key in old.get_keys():  # only after unpickling: data to move into the block
            self._meta[key] = old[key]
            if key in views:
                views[key][:] = old[key]
                self._meta[key] = views[key]
        block[:, layout.terminated] = self._meta.terminated
        block[:, layout.truncated] = self._meta.truncated
        self._set_batch_for_children()
        self._storage, self._obs_shape, self._act_dim = storage, obs_shape, act_dim

    # ------------------------------------------------------------------ add
    def add(
        self,
        batch: RolloutBatchProtocol,
        buffer_ids: np.ndarray | list[int] | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Add R transitions, row ``k`` into sub-buffer ``buffer_ids[k]`` (``VectorReplayBuffer.add``).

        Returns:
            ``(insertion_idx, episode_return, episode_length, episode_start_idx)``, each (R,).

        Raises:
            ValueError: non-float obs / act, shapes that differ from the block's, or a ``rew`` that is
                not one number per transition (shape (R,): vector rewards are refused); nothing is
                written and no index advances.
        """
        obs, act = np.asarray(batch.obs), np.asarray(batch.act)
        obs_next = np.asarray(batch.obs_next) if "obs_next" in batch.get_keys() else None
        if obs.dtype.kind != "f" or act.dtype.kind != "f":
            raise ValueError(
                f"SharedVectorReplayBuffer stores float32 obs and actions (Box spaces), got obs {obs.dtype}, "
                f"act {act.dtype}; use tianshou's VectorReplayBuffer for other spaces"
            )
        if obs_next is None:
            raise ValueError("SharedVectorReplayBuffer needs obs_next in every added batch")
        r = len(obs)
        rew = np.asarray(batch.rew)
        if rew.shape != (r,) or rew.dtype.kind not in "biuf":
            raise ValueError(
                f"SharedVectorReplayBuffer stores one float reward per transition: rew must have shape ({r},) "
                f"and a numeric dtype, got shape {rew.shape}, dtype {rew.dtype}; use tianshou's VectorReplayBuffer "
                "for vector rewards"
            )
        if self._obs_shape is None or self._act_dim is None:  # the first add: allocate the block
            obs_shape, act_dim = obs.shape[1:], int(np.prod(act.shape[1:], dtype=int))
            self._allocate(obs_shape, act_dim)
        else:
            obs_shape, act_dim = self._obs_shape, self._act_dim
        expected = {"obs": (r, *obs_shape), "obs_next": (r, *obs_shape), "act": (r, act_dim)}
        for name, arr in (("obs", obs), ("obs_next", obs_next), ("act", act)):
            if arr.shape != expected[name]:
                raise ValueError(f"{name} must have shape {expected[name]}, got {arr.shape}")
        result = super().add(batch, buffer_ids)
        idx = result[0]
        if self._storage is not None and not self._storage.closed:
            block, layout = self._storage.block, self._storage.layout
            block[idx, layout.terminated] = self._meta.terminated[idx]
            block[idx, layout.truncated] = self._meta.truncated[idx]
        self._null[idx] = _null_rows(self._meta, idx)
        return result

    def set_array_at_key(
        self,
        seq: np.ndarray,
        key: str,
        index: Any = None,
        default_value: float | None = None,
    ) -> None:
        """``ReplayBuffer.set_array_at_key`` (used by episode hooks), keeping ``hasnull()`` exact."""
        new_key = key not in self._meta.get_keys()
        super().set_array_at_key(seq, key, index, default_value)
        # a new key fills the rows outside ``index`` with its default (NaN / None): recheck every row.
        # Only stored rows count (as Tianshou's ``self[:].hasnull()``); a row is checked again when added.
        everything = np.arange(self.maxsize)
        rows = everything if index is None or new_key else everything[index].reshape(-1)
        sub = np.searchsorted(self._offset, rows, side="right") - 1
        rows = rows[rows - self._offset[sub] < np.asarray(self._lengths)[sub]]
        self._null[rows] = _null_rows(self._meta, rows)

    # ------------------------------------------------------------------ null checks without rescans
    def hasnull(self) -> bool:
        """Whether a stored transition holds NaN or None (Tianshou's ``Batch.isnull``), in O(1) of the size.

        Each row is checked when written (:meth:`add`, :meth:`set_array_at_key`); Tianshou's
        version copies the whole buffer on every call (0.52 s at 200k transitions), and its
        off-policy trainer calls it after every collect.
        """
        return bool(self._null.any())

    def reset(self, keep_statistics: bool = False) -> None:
        """Forget all transitions (``VectorReplayBuffer.reset``)."""
        super().reset(keep_statistics=keep_statistics)
        self._null[:] = False

    def set_batch(self, batch: RolloutBatchProtocol) -> None:
        """Not supported: it would replace the shared block by ``batch``'s own arrays."""
        raise NotImplementedError("SharedVectorReplayBuffer cannot swap its shared block; add() the transitions")

    def dropnull(self) -> None:
        """Not supported: dropping rows would move transitions between sub-buffers."""
        raise NotImplementedError("SharedVectorReplayBuffer does not support dropnull()")

    # ------------------------------------------------------------------ HDF5: the pickled state, written atomically
    def save_hdf5(self, path: str, compression: str | None = None) -> None:
        """Save a copy of the buffer (data, counters and a SHA-256 checksum) to the HDF5 file ``path``.

        The file is written next to ``path`` under a temporary name and renamed into place once
        complete, so a failure leaves neither a partial file nor a changed ``path``.

        Args:
            path: the file to write (replaced if it exists).
            compression: h5py dataset compression (e.g. ``"gzip"``), or ``None``.

        Raises:
            OSError: the file cannot be written (nothing is left at ``path``'s directory).
        """
        state = self.__getstate__()
        folder = os.path.dirname(os.path.abspath(path))
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".part")
        os.close(fd)
        try:
            with h5py.File(tmp, "w") as f:
                to_hdf5(state, f, compression=compression)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    @classmethod
    def load_hdf5(cls, path: str, device: str | None = None) -> SharedVectorReplayBuffer:
        """Load a buffer saved by :meth:`save_hdf5` into a new shared block.

        As with Tianshou's ``load_hdf5``, the file holds pickled entries (the sub-buffers, ``info``),
        which run code when loaded: load only files you trust. The checksum is verified after reading.

        Args:
            path: the HDF5 file.
            device: unused (kept for Tianshou's signature; the data are numpy arrays).

        Returns:
            A new buffer with the saved transitions, counters and sub-buffer positions.

        Raises:
            OSError: the file cannot be read.
            ValueError: the file holds no ``SharedVectorReplayBuffer`` state, or a corrupted or
                inconsistent one (checksum or invariants fail); nothing is allocated.
        """
        with h5py.File(path, "r") as f:
            state = from_hdf5(f, device=device)
        if not isinstance(state, dict):
            raise ValueError(f"{path!r} holds no SharedVectorReplayBuffer state")
        # HDF5 attributes come back as numpy scalars: restore the Python values the checksum covers
        state = {k: v.item() if isinstance(v, np.generic) else v for k, v in state.items()}
        buf = cls.__new__(cls)
        buf.__setstate__(state)
        return buf

    # ------------------------------------------------------------------ pickling: a copy, re-homed on load
    def __getstate__(self) -> dict[str, Any]:
        """A plain copy for pickling, with ``"_checksum"``: the SHA-256 of its data and counters."""
        state = self.__dict__.copy()
        state["_storage"] = None  # the views in _meta pickle as plain arrays
        state["_checksum"] = data_checksum(*_checksummed(state))
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Restore a pickled copy into a new shared block, after checking it.

        Raises:
            ValueError: the copy has no or a wrong checksum (corrupted), or is inconsistent
                (array lengths or shapes that differ from ``maxsize`` / ``obs_shape`` / ``act_dim``,
                sub-buffer lengths out of range); nothing is restored.
        """
        state = dict(state)
        checksum = state.pop("_checksum", None)
        _check_state(state)
        verify_checksum("SharedVectorReplayBuffer state", checksum, *_checksummed(state))
        super().__setstate__(state)
        if self._obs_shape is not None and self._act_dim is not None:  # move the data into a new shared block
            self._allocate(self._obs_shape, self._act_dim)


_BUFFER_KEYS = (
    "maxsize",
    "buffer_num",
    "_meta",
    "_lengths",
    "_offset",
    "last_index",
    "buffers",
    "_obs_shape",
    "_act_dim",
)


def _checksummed(state: dict[str, Any]) -> list[Any]:
    """The parts of a ``SharedVectorReplayBuffer`` state its checksum covers.

    Sizes, counters and every numeric array of ``_meta`` (``info`` / ``policy`` hold Python objects and are not
    covered).
    """
    meta = state["_meta"]
    parts: list[Any] = [
        state["maxsize"],
        state["_obs_shape"],
        state["_act_dim"],
        state["_lengths"],
        state["last_index"],
    ]
    # a sub-buffer's write position has no public name in Tianshou (ReplayBuffer._insertion_idx); len() is its size
    parts.append([(int(b._insertion_idx), len(b)) for b in state["buffers"]])
    for key in sorted(meta.get_keys()):
        value = meta[key]
        if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
            parts += [key, value]
    return parts


def _check_state(state: dict[str, Any]) -> None:
    """Invariants of a pickled ``SharedVectorReplayBuffer``: keys, array lengths and shapes, sub-buffer lengths."""
    what = "SharedVectorReplayBuffer state"
    missing = [key for key in _BUFFER_KEYS if key not in state]
    if missing:
        raise ValueError(f"not a {what}: missing {missing}")
    n, meta, obs_shape, act_dim = state["maxsize"], state["_meta"], state["_obs_shape"], state["_act_dim"]
    if not isinstance(meta, Batch):
        raise ValueError(f"{what}: _meta must be a tianshou Batch, got {type(meta).__name__}")
    if obs_shape is not None:
        expected = {"obs": (n, *obs_shape), "obs_next": (n, *obs_shape), "act": (n, act_dim), "rew": (n,)}
        expected.update({key: (n,) for key in ("terminated", "truncated", "done")})
        for key, shape in expected.items():
            got = getattr(meta.get(key), "shape", None)
            if got != shape:
                raise ValueError(f"{what} is inconsistent: {key} has shape {got}, expected {shape}")
    sizes = np.diff(np.append(np.asarray(state["_offset"]), n))
    lengths = np.asarray(state["_lengths"])
    if lengths.shape != sizes.shape or (lengths < 0).any() or (lengths > sizes).any():
        raise ValueError(f"{what} is inconsistent: sub-buffer lengths {lengths.tolist()} outside [0, {sizes.tolist()}]")
