"""The replay storage: typed transitions in the shared ring, and saved copies of it.

:class:`ReplayStorage` is the framework-neutral core of the replay. It is built in layers, in
the pattern of SB3's ``buffers.py`` (a base class and one subclass per variant):

- :class:`~unilab_gym.replay.ring.ReplayRing` (``ring.py``): the segment, its header and lock,
  and the reserve / commit protocol (the protocol itself is described there);
- :class:`~unilab_gym.replay.sampling.SamplingRing` (``sampling.py``): uniform and
  status-weighted sampling that never returns a torn row;
- :class:`ReplayStorage` (here): validated ``add`` of transitions (obs | next_obs | action |
  reward | terminated | truncated | extras), and :meth:`~ReplayStorage.to_state` /
  :meth:`~ReplayStorage.from_state` / :meth:`~ReplayStorage.load_state`, whose format and
  checks are in :mod:`unilab_gym.replay.persistence`;
- :class:`~unilab_gym.replay.linking.OptimizedReplayStorage` (``linking.py``): the
  memory-optimized layout (``final_obs > 0``), whose rows link to their successors' observations
  and keep episode ends in a side table. ``ReplayStorage(layout, capacity)``,
  :meth:`ReplayStorage.attach` and :meth:`ReplayStorage.from_state` return one for such a layout.

The names other modules import from here (:class:`ReplayHandle`, :class:`Reservation`,
:data:`MAX_SLOTS`, the errors) are re-exported from :mod:`unilab_gym.replay.ring`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self

import numpy as np

from unilab_gym.replay.header import (
    COMMITTED,
    GENERATION,
    HEAD,
    HEADER_BYTES,
    MAX_SLOTS,
    OWNER_CHECK_EVERY,
    PREAMBLE,
    SLOT_ABORTED,
    SLOT_FREE,
    SLOT_WRITING,
    layout_record,
)
from unilab_gym.replay.layout import ReplayLayout
from unilab_gym.replay.lock import ReplayClosedError, ReplayOwnerGoneError, pid_alive
from unilab_gym.replay.persistence import RingState, checked_state, state_dict
from unilab_gym.replay.ring import ReplayHandle, Reservation
from unilab_gym.replay.sampling import SamplingRing
from unilab_gym.shm import DEFAULT_PREFIX, Segment, SegmentNotFoundError
from unilab_gym.validation import check_positive_int, check_real_array

__all__ = [
    "MAX_SLOTS",
    "ReplayClosedError",
    "ReplayHandle",
    "ReplayOwnerGoneError",
    "ReplayStorage",
    "Reservation",
    "SegmentNotFoundError",
    "as_column",
    "final_obs_capacity_for",
]

#: the names this module had before the header table moved to :mod:`unilab_gym.replay.header` (read by code and
#: tests of 0.1 as ``storage._HEADER_BYTES``, ...): the same objects.
_HEADER_BYTES, _OWNER_CHECK_EVERY, _layout_record = HEADER_BYTES, OWNER_CHECK_EVERY, layout_record


def final_obs_capacity_for(capacity: int, min_episode_length: int, streams: int) -> int:
    """Side-table size that never evicts an episode end whose row is still in the ring.

    ``ceil(capacity / min_episode_length) + 2 * streams``. Proof sketch: the entries written
    after row ``s``'s entry, before its slot is reused, belong to distinct rows: episode ends of
    rows newer than ``s`` (with ``s`` still in the ring they lie in ``capacity`` consecutive rows,
    in which each of the ``streams`` envs ends at most ``rows / min_episode_length + 1``
    episodes), plus at most one older row per stream that was still waiting for its successor.
    A next observation that is not its successor's (a reset without an episode end) counts as
    an episode end. The worst case, every row an episode end, is ``min_episode_length = 1``.

    Args:
        capacity: rows of the ring, ``>= 1``.
        min_episode_length: the shortest episode, in steps (transitions), ``>= 1``.
        streams: envs writing into the ring, all writers together (``n_envs`` of an SB3 buffer;
            every collector's envs under ``AsyncRunner``), ``>= 1``.

    Returns:
        The ``final_obs`` / ``final_obs_capacity`` that keeps every episode end of the ring.

    Raises:
        ValueError: if an argument is not a positive int (the message names it).
    """
    capacity = check_positive_int("capacity", capacity)
    length = check_positive_int("min_episode_length", min_episode_length)
    streams = check_positive_int("streams", streams)
    return -(-capacity // length) + 2 * streams


def _as_rows(name: str, value: Any, n: int, dim: int, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """Validate a ``(n, dim)`` real-valued array; returned as ``(n, dim)``.

    ``(n,)`` is accepted when ``dim == 1``, and ``(n, *shape)`` when the field has that shape.
    """
    arr = check_real_array(name, value)
    if arr.shape != (n, dim):
        if (dim == 1 and arr.shape == (n,)) or (shape is not None and arr.shape == (n, *shape)):
            return arr.reshape(n, dim)
        want = f"({n}, {dim})" if shape is None or shape == (dim,) else f"({n}, {dim}) or {(n, *shape)}"
        raise ValueError(f"{name} must have shape {want}, got {arr.shape}")
    return arr


def as_column(name: str, value: Any, n: int) -> np.ndarray:
    """``value`` as a real ``(n,)`` vector: one value per row of an add (``(n, 1)`` is accepted and flattened).

    Used by :meth:`ReplayStorage.add` and the optimized layout's add (:mod:`~unilab_gym.replay.linking`) for
    ``reward``, ``terminated`` and ``truncated``.

    Raises:
        ValueError: not an array of real numbers (:func:`~unilab_gym.validation.check_real_array`), or another
            shape (the message names ``name`` and the shape).
    """
    arr = check_real_array(name, value)
    if arr.shape != (n,):
        if arr.shape == (n, 1):
            return arr.reshape(n)
        raise ValueError(f"{name} must have shape ({n},), got {arr.shape}")
    return arr


@dataclass(frozen=True, slots=True)
class _Columns:
    """Write views of the fields of every row that ``add`` fills, for its fast path.

    Attributes:
        obs: ``(capacity, obs size)`` view of the observation field; ``None`` for a Dict
            observation (one field per key: ``add`` then always validates).
        next_obs: ``(capacity, obs size)`` view of the next-observation field; ``None`` for a Dict
            observation and for a memory-optimized layout (its rows have no such field).
        action: ``(capacity, act_dim)`` view of the action field.
        reward: ``(capacity,)`` view of the reward field.
        terminated: ``(capacity,)`` view of the terminated field.
        truncated: ``(capacity,)`` view of the truncated field.
        extras: ``(capacity, extra_dim)`` float32 view of the contiguous extra groups; ``None``
            when the layout has none.
    """

    obs: np.ndarray | None
    next_obs: np.ndarray | None
    action: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    extras: np.ndarray | None


class ReplayStorage(SamplingRing):
    """A shared-memory ring of packed transitions; the framework-neutral core of the replay.

    ``ReplayStorage(layout, capacity)`` creates and **owns** a new segment; other processes
    call :meth:`attach` with :attr:`handle`. Only the owner unlinks the segment (on
    :meth:`close`, garbage collection or interpreter exit); attachers never do. See
    :mod:`unilab_gym.replay.ring` for the commit / wrap-around protocol. For a memory-optimized
    layout (``layout.final_obs > 0``) the object is an
    :class:`~unilab_gym.replay.linking.OptimizedReplayStorage`.

    Args:
        layout: column layout (see :class:`~unilab_gym.replay.layout.ReplayLayout`).
        capacity: number of rows (transitions), ``>= 1``.
        prefix: segment name prefix (the name is ``prefix`` + 16 hex digits).

    Raises:
        ValueError: on a bad capacity.
        ~unilab_gym.shm.SharedMemoryFullError: (an ``OSError`` and a ``MemoryError``) if
            ``/dev/shm`` cannot back the segment; the message names the size, the free space and the
            fix (``docker run --shm-size=...`` or a smaller capacity / ``buffer_size``).
        OSError: if the segment cannot be created for another reason.
    """

    #: Set to True by the subclass that serves memory-optimized layouts (``final_obs > 0``):
    #: :class:`~unilab_gym.replay.linking.OptimizedReplayStorage`, which registers itself when it is defined
    #: (``unilab_gym.replay`` imports it), so that this module never imports it (no import cycle).
    serves_optimized_layouts: ClassVar[bool] = False
    _optimized_variant: ClassVar[type[ReplayStorage] | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Register a subclass that sets ``serves_optimized_layouts`` as the optimized-layout variant."""
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("serves_optimized_layouts"):
            ReplayStorage._optimized_variant = cls

    @classmethod
    def _class_for(cls, layout: Any) -> type[Self]:
        """``ReplayStorage`` serves a memory-optimized layout with its registered subclass for that layout."""
        if cls is ReplayStorage and isinstance(layout, ReplayLayout) and layout.final_obs:
            variant = ReplayStorage._optimized_variant
            if variant is None:  # only if unilab_gym.replay.linking was never imported, which the package does
                raise RuntimeError("no storage serves memory-optimized layouts: import unilab_gym.replay.linking")
            return variant  # type: ignore[return-value]
        return cls

    def _setup(self, segment: Segment, layout: ReplayLayout, capacity: int) -> None:
        super()._setup(segment, layout, capacity)
        obs_names = [layout.obs_field(k) for k, _, _ in layout.obs_spec]
        next_names = [layout.obs_field(k, next_obs=True) for k, _, _ in layout.obs_spec]
        extras = None
        if layout.extras:  # the extra groups are contiguous float32 columns
            start = layout.offset(layout.extras[0][0])
            raw = self._block.view(np.uint8)[:, start : start + 4 * layout.extra_dim]
            extras = raw.view(np.float32)
        w = self._writes
        self._columns = _Columns(
            obs=w[obs_names[0]] if len(obs_names) == 1 else None,
            next_obs=w[next_names[0]] if len(next_names) == 1 and next_names[0] in w else None,
            action=w["action"],
            reward=w["reward"],
            terminated=w["terminated"],
            truncated=w["truncated"],
            extras=extras,
        )

    def _release_views(self) -> None:
        del self._columns
        super()._release_views()

    # ---- writing -------------------------------------------------------------------------------
    def add(
        self,
        obs: Any,
        next_obs: Any,
        action: Any,
        reward: Any,
        terminated: Any,
        truncated: Any,
        extra: Any = None,
        *,
        timeout: float = 10.0,
        validate: bool = True,
        streams: Any = None,
    ) -> int:
        """Append ``n`` transitions: validate, reserve, write, commit.

        :param obs: ``(n, obs_dim)`` or ``(n, *shape)`` real numbers (cast to the field's dtype);
            for a Dict observation, a mapping ``{key: (n, *shape of the key)}`` with every key.
        :param next_obs: same as ``obs``: the observation after the action; at an episode end
            the last observation of the episode (not the reset one).
        :param action: ``(n, act_dim)`` or ``(n, *shape)`` (or ``(n,)`` if ``act_dim == 1``).
        :param reward: ``(n,)``.
        :param terminated: ``(n,)`` bool/0-1: true terminal state, cuts the bootstrap.
        :param truncated: ``(n,)`` bool/0-1: episode cut here (time limit), bootstrap kept.
        :param extra: ``None`` (extra columns set to 0), a ``(n, extra_dim)`` array, or a mapping
            ``{group name: (n, dim)}`` covering every extra group of the layout.
        :param timeout: see :meth:`reserve`.
        :param validate: ``False`` skips the shape and dtype checks, for callers that made them
            already (numpy arrays of exactly the shapes above, ``extra=None``). Bad input then
            fails inside the write; its rows are abandoned, never sampled. Ignored (always
            checked) for Dict and memory-optimized layouts.
        :param streams: memory-optimized layouts only: ``(n,)`` int ids of the env each row comes
            from, unique within the call (default ``0..n-1``). The row of stream ``s`` becomes the
            successor of this writer's previous row of stream ``s``: its ``obs`` is that row's
            next observation, if equal (else that next observation goes to the side table).
        :return: sequence number of the first row (rows are ``seq % capacity``).
        :raises ValueError: on a wrong shape or dtype (nothing is written), or
            ``n > capacity``.
        :raises ReplayClosedError: if this object or the segment's owner has closed it.
        :raises ReplayOwnerGoneError: (attachers, checked every 64th add) if the owner process
            is gone: the rows would never be read.
        """
        self._lock.check()
        self._check_writable()
        c = self._columns
        if not validate and c.obs is not None:
            cols = [
                (c.obs, obs),
                (c.next_obs, next_obs),
                (c.action, action),
                (c.reward, reward),
                (c.terminated, terminated),
                (c.truncated, truncated),
            ]
            if c.extras is not None:
                cols.append((c.extras, 0.0))
            return self._append(cols, len(obs), timeout)
        n = self._batch_size(obs)
        cols = [*self._obs_cols("obs", obs, n), *self._obs_cols("next_obs", next_obs, n)]
        if streams is not None:
            raise ValueError("streams is for memory-optimized layouts (final_obs > 0) only")
        cols += self._step_cols(action, reward, terminated, truncated, extra, n)
        return self._append(cols, n, timeout)

    def _step_cols(
        self, action: Any, reward: Any, terminated: Any, truncated: Any, extra: Any, n: int
    ) -> list[tuple[Any, Any]]:
        """Validated ``(write view, array or 0.0)`` pairs of the fields after the observations."""
        L, w, c = self._layout, self._writes, self._columns
        cols: list[tuple[Any, Any]] = [
            (c.action, _as_rows("action", action, n, L.act_dim, L.act_spec[0])),
            (c.reward, as_column("reward", reward, n)),
            (c.terminated, as_column("terminated", terminated, n)),
            (c.truncated, as_column("truncated", truncated, n)),
        ]
        if L.extras:
            if extra is None:
                cols.append((c.extras, 0.0))
            elif isinstance(extra, Mapping):
                names = [name for name, _ in L.extras]
                if set(extra) != set(names):
                    raise ValueError(f"extra must have exactly the groups {names}, got {sorted(extra)}")
                for name, dim in L.extras:
                    cols.append((w[name], _as_rows(f"extra[{name!r}]", extra[name], n, dim)))
            else:
                cols.append((c.extras, _as_rows("extra", extra, n, L.extra_dim)))
        elif extra is not None:
            raise ValueError("extra given, but the layout has no extra columns")
        return cols

    def _batch_size(self, obs: Any) -> int:
        """``n`` of an ``add``: the leading size of ``obs`` (of its first key for a Dict layout)."""
        L = self._layout
        if L.is_dict:
            if not isinstance(obs, Mapping):
                raise ValueError(f"obs must be a mapping {{key: array}} for this Dict layout, got {type(obs).__name__}")
            obs = obs.get(L.obs_spec[0][0])
        arr = obs if type(obs) is np.ndarray else np.asarray(obs)
        if arr.ndim < 2 and not (arr.ndim == 1 and L.obs_dim == 1):
            raise ValueError(f"obs must have shape (n, {L.obs_dim}), got {arr.shape}")
        return arr.shape[0]

    def _obs_cols(self, base: str, value: Any, n: int) -> list[tuple[Any, np.ndarray]]:
        """Validated ``(write view, (n, size) array)`` pairs of the observation fields ``base``.

        For ``next_obs`` of an optimized layout the pairs are ``(obs field name, array)``: it has no row field.
        """
        L = self._layout
        if not L.is_dict:
            _, shape, _ = L.obs_spec[0]
            return [(self._writes.get(base, "obs"), _as_rows(base, value, n, L.obs_dim, shape))]
        keys = [k for k, _, _ in L.obs_spec]
        if not isinstance(value, Mapping) or set(value) != set(keys):
            got = sorted(value) if isinstance(value, Mapping) else type(value).__name__
            raise ValueError(f"{base} must be a mapping with exactly the keys {keys}, got {got}")
        out = []
        for key, shape, _ in L.obs_spec:
            name = f"{base}.{key}"
            arr = _as_rows(f"{base}[{key!r}]", value[key], n, int(np.prod(shape)), shape)
            out.append((self._writes.get(name, f"obs.{key}"), arr))
        return out

    # ---- saved copies ---------------------------------------------------------------------------
    def _snapshot(self) -> RingState:
        """Under the lock: a copy of the ring's contents (rows being written become holes)."""
        head = int(self._header[HEAD])
        busy = self._state != SLOT_FREE
        holes = np.stack([self._start[busy], self._stop[busy]], axis=1)
        rows = self._block[: min(head, self._capacity)].copy()
        return RingState(self._layout, self._capacity, head, int(self._header[COMMITTED]), holes, rows)

    def _restore(self, saved: RingState) -> None:
        """Write ``saved`` into the header and block (under the lock, or into a new segment).

        The slot table must be all free.
        """
        for slot, (lo, hi) in enumerate(saved.holes):
            self._state[slot], self._start[slot], self._stop[slot], self._spid[slot] = SLOT_ABORTED, lo, hi, 0
        self._block[: saved.rows.shape[0]] = saved.rows
        self._header[HEAD] = saved.head
        self._header[COMMITTED] = saved.committed

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Replace this storage's transitions, in place, with a copy made by :meth:`to_state`.

        Unlike :meth:`from_state` no new segment is made: handles stay valid, so attached writers
        (collectors) and readers keep working on the restored contents, as after :meth:`reset`
        (the generation counter moves on, so a reader's rows from before are seen as overwritten).
        The copy is checked as :meth:`from_state` checks it, and must have this storage's layout
        and capacity.

        :raises ValueError: if ``state`` is not such a copy, is corrupted, or has another layout or
            capacity; nothing changes.
        :raises RuntimeError: if a live writer has rows in flight (nothing changes; try again).
        :raises PermissionError: if attached read-only.
        """
        saved = checked_state(state)
        layout, capacity = saved.layout, saved.capacity
        if layout != self._layout or capacity != self._capacity:
            raise ValueError(
                f"cannot load a replay state of layout {layout} and capacity {capacity} into replay {self.name!r} "
                f"(layout {self._layout}, capacity {self._capacity})"
            )
        self._check_writable()
        with self._lock:
            for i in np.flatnonzero(self._state == SLOT_WRITING):
                if pid_alive(int(self._spid[i])):
                    raise RuntimeError(
                        f"cannot load into replay {self.name!r}: pid {self._spid[i]} is writing rows "
                        f"[{self._start[i]}, {self._stop[i]})"
                    )
            self._header[PREAMBLE:] = 0  # the slot table: every slot free, then the copy's holes
            self._restore(saved)
            self._header[GENERATION] += 1

    def to_state(self) -> dict[str, Any]:
        """A plain, picklable copy (no shared memory): layout, counters, holes, used rows, checksum.

        Taken under the lock (writers wait for the copy). Rows being written become holes of
        the copy. ``"checksum"`` is the SHA-256 of everything else
        (:func:`~unilab_gym.replay.integrity.data_checksum`); :meth:`from_state` verifies it.
        Restore with :meth:`from_state`.
        """
        with self._lock:
            saved = self._snapshot()
        return state_dict(saved)

    @classmethod
    def from_state(cls, state: Mapping[str, Any], *, prefix: str = DEFAULT_PREFIX) -> Self:
        """Create a new owned storage holding a copy made by :meth:`to_state`.

        Everything is checked before the segment is created: the keys and version, the layout,
        ``0 <= committed <= head``, ``rows`` an array of shape ``(min(head, capacity), layout.width)``
        and dtype ``layout.word_dtype`` (and the side table of an optimized layout), ``holes`` an
        int64 ``(k, 2)`` table of at most 32 ranges ``0 <= start < stop <= head``, and the checksum of all of it.

        :raises ValueError: if ``state`` is not such a copy, is inconsistent, or its checksum does
            not match (corrupted); the message names the first problem. Nothing is created.
        """
        saved = checked_state(state)
        self = cls(saved.layout, saved.capacity, prefix=prefix)
        try:
            self._restore(saved)
        except BaseException:
            self.close()
            raise
        return self
