"""The memory-optimized replay: rows linked to their successors, episode ends in a side table.

A memory-optimized layout (``ReplayLayout(..., final_obs=F)``, ``F > 0``) stores each
observation once: a row's next observation is its successor's observation (the same stream's
next row), so rows carry an int32 ``next`` field instead of ``next_obs`` (see
:class:`~unilab_gym.replay.layout.ReplayLayout`). :class:`OptimizedReplayStorage` keeps that
field right:

- **linking**: each writer remembers, per stream (env), its last row and that row's next
  observation. When the stream's next row is committed, the writer (under the lock) points the
  previous row at it (``next = seq distance``) if its observation is that next observation, and
  otherwise (a reset in between) stores the next observation in the side table. Rows that end
  an episode (terminated or truncated) put their final observation in the side table at once.
- **the side table**: a ring of ``F`` entries after the block, each tagged with its row's
  sequence number. An entry is never lost while its row may be sampled: reusing the entry of a
  row still in the ring retires that row and every older one (the header's floor, see
  :attr:`~unilab_gym.replay.ring.ReplayRing.oldest`), counted in
  :attr:`~unilab_gym.replay.ring.ReplayRing.final_obs_evictions` and warned once;
  :func:`~unilab_gym.replay.storage.final_obs_capacity_for` gives the ``F`` that retires nothing.
- **assembling**: sampling copies the rows and their next observations lock-free, then
  re-checks ``next``, the side tags, ``head``, the floor and the generation under the lock, and
  redraws every row whose next observation is unknown (``next == 0``), overwritten or torn.

``ReplayStorage(layout, capacity)``, ``ReplayStorage.attach`` and ``ReplayStorage.from_state``
return an :class:`OptimizedReplayStorage` for such a layout; it is used exactly as a
:class:`~unilab_gym.replay.storage.ReplayStorage`.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from unilab_gym.replay.header import EVICTED, FINAL_HEAD, FLOOR, GENERATION, HEAD, HEADER_BYTES
from unilab_gym.replay.layout import ReplayLayout
from unilab_gym.replay.persistence import RingState
from unilab_gym.replay.sampling import MAX_SAMPLE_ROUNDS
from unilab_gym.replay.storage import ReplayStorage, as_column
from unilab_gym.shm import Segment

__all__ = ["OptimizedReplayStorage"]

#: ``(stream ids (n,), episode ends (n,), obs {field: (n, size)}, next obs {field: (n, size)})`` of one add
_Links = tuple[np.ndarray, np.ndarray, dict[str, np.ndarray], dict[str, np.ndarray]]


class OptimizedReplayStorage(ReplayStorage):
    """The :class:`~unilab_gym.replay.storage.ReplayStorage` of a memory-optimized layout.

    Made by ``ReplayStorage(layout, capacity)`` (and ``attach`` / ``from_state``) when
    ``layout.final_obs > 0``; see the module docstring for how next observations are linked,
    kept and assembled. ``add`` takes ``streams`` (the env of each row) and always validates;
    ``sample_fields`` and ``gather_fields`` return ``next_obs`` fields as for any layout and
    never return a transition whose next observation is not known.

    Raises:
        ValueError: if ``layout`` is not memory-optimized (``final_obs == 0``).
    """

    serves_optimized_layouts = True

    def _setup(self, segment: Segment, layout: ReplayLayout, capacity: int) -> None:
        if not layout.final_obs:
            segment.close()
            raise ValueError("OptimizedReplayStorage needs a memory-optimized layout (final_obs > 0)")
        super()._setup(segment, layout, capacity)
        offset = HEADER_BYTES + capacity * layout.row_nbytes
        self._side = np.frombuffer(segment.buf, dtype=layout.side_dtype, count=layout.final_obs, offset=offset)
        # per writer: its rows waiting for a successor, by stream id (see _pending_rows)
        self._pending: dict[str, np.ndarray] = {}
        self._evicted_seen = False  # this object's writes evicted a live side entry (warn once)
        self._evicted_warned = False

    def _on_reset(self) -> None:
        self._side["tag"][:] = -1  # no entry belongs to a row

    def _release_views(self) -> None:
        del self._side
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
        """Append ``n`` transitions and link them to this writer's previous rows of their streams.

        As :meth:`ReplayStorage.add <unilab_gym.replay.storage.ReplayStorage.add>` (same
        arguments, errors and return value); ``validate`` is ignored (always checked), and
        ``streams`` gives the ``(n,)`` int ids of the env each row comes from, unique within the
        call (default ``0..n-1``). The row of stream ``s`` becomes the successor of this writer's
        previous row of stream ``s``: its ``obs`` is that row's next observation, if equal (else
        that next observation goes to the side table).
        """
        self._lock.check()
        self._check_writable()
        n = self._batch_size(obs)
        obs_cols, next_cols = self._obs_cols("obs", obs, n), self._obs_cols("next_obs", next_obs, n)
        links = self._links(obs_cols, next_cols, terminated, truncated, streams, n)
        cols = [*obs_cols, (self._writes["next"], 0.0)]
        cols += self._step_cols(action, reward, terminated, truncated, extra, n)
        start = self._append(cols, n, timeout, lambda first: self._link(first, links))
        if self._evicted_seen and not self._evicted_warned:
            self._warn_evicted()
        return start

    def _warn_evicted(self) -> None:
        """Warn once per object that the side table retired rows early (see :attr:`oldest`)."""
        self._evicted_warned = True
        with self._lock:
            head, floor, evicted = self._h[HEAD], self._h[FLOOR], self._h[EVICTED]
        F, cap = self._layout.final_obs, self._capacity
        window = max(0, head - max(head - cap, floor))
        warnings.warn(
            f"replay {self.name!r}: its side table (final_obs_capacity={F}) is full of episode ends whose rows "
            f"are still in the ring; so that no episode end is dropped, the oldest rows are retired with them "
            f"({evicted} ends so far; the ring samples {window} of its {cap} rows now). Episodes are shorter than "
            f"capacity / final_obs_capacity = {cap / F:.1f} steps: raise final_obs_capacity to at least "
            "final_obs_capacity_for(capacity, shortest episode length, envs) to keep the whole ring",
            RuntimeWarning,
            stacklevel=3,
        )

    def _links(
        self, obs_cols: list[Any], next_cols: list[Any], terminated: Any, truncated: Any, streams: Any, n: int
    ) -> _Links:
        """Optimized layouts: what :meth:`_link` needs, validated before anything is written."""
        L = self._layout
        names = [L.obs_field(k) for k, _, _ in L.obs_spec]
        dtypes = {L.obs_field(k): np.dtype(dt) for k, _, dt in L.obs_spec}
        obs = {name: np.asarray(arr, dtypes[name]) for name, (_, arr) in zip(names, obs_cols)}
        nxt = {name: np.asarray(arr, dtypes[name]) for name, (_, arr) in zip(names, next_cols)}
        done = (as_column("terminated", terminated, n) != 0) | (as_column("truncated", truncated, n) != 0)
        if streams is None:
            ids = np.arange(n, dtype=np.int64)
        else:
            ids = np.asarray(streams)
            if ids.shape != (n,) or ids.dtype.kind not in "iu" or (n and ids.min() < 0):
                raise ValueError(f"streams must be ({n},) integers >= 0, got {ids.dtype} {ids.shape}")
            ids = ids.astype(np.int64)
            if np.unique(ids).shape[0] != n:
                raise ValueError(f"streams must be unique within one add, got {ids.tolist()}")
        return ids, done, obs, nxt

    def _put_side(self, seqs: np.ndarray, values: Mapping[str, np.ndarray]) -> None:
        """Under the lock: store next observations in the side table.

        The next observations ``values[name][i]`` of rows ``seqs[i]`` go to the next side entries
        (if more than the table holds, only the newest are kept).

        An entry is never lost while its row may still be sampled: when an overwritten entry
        (or a dropped one of this call) belongs to a row at or above the floor, the floor moves
        past that row, which retires it and every older row (see :attr:`~unilab_gym.replay.ring.ReplayRing.oldest`).
        """
        side, h, F = self._side, self._h, self._layout.final_obs
        m = int(seqs.shape[0])
        if m == 0:
            return
        k0 = h[FINAL_HEAD]
        h[FINAL_HEAD] = k0 + m
        keep = slice(max(0, m - F), m)  # older ones would be overwritten at once
        slots = (k0 + np.arange(m, dtype=np.int64)[keep]) % F
        lost = np.concatenate([seqs[: keep.start], side["tag"][slots]])
        lost = lost[lost >= max(h[HEAD] - self._capacity, h[FLOOR])]
        if lost.shape[0]:  # episode ends whose rows are still in the ring: retire those rows
            h[FLOOR] = int(lost.max()) + 1
            h[EVICTED] += int(lost.shape[0])
            self._evicted_seen = True
        side["tag"][slots] = -1  # readers re-check the tag after copying: a torn entry is rejected
        for name, value in values.items():
            side[name][slots] = value[keep].reshape(-1, *side[name].shape[1:])
        side["tag"][slots] = seqs[keep]
        self._fields["next"][seqs[keep] % self._capacity] = -(slots + 1)

    def _link(self, start: int, links: _Links) -> None:
        """Under the lock, link rows ``[start, start + n)`` once they are written.

        Points each stream's previous row at its successor (or at a side entry), and keeps this
        add's rows pending.
        """
        ids, done, obs, nxt = links
        h, cap = self._h, self._capacity
        generation, oldest = h[GENERATION], max(h[HEAD] - cap, h[FLOOR])
        seqs = start + np.arange(ids.shape[0], dtype=np.int64)
        pend = self._pending_rows(int(ids.max()) + 1)
        p = pend["seq"][ids]
        live = (p >= oldest) & (pend["generation"][ids] == generation) & (p >= 0)
        same = live.copy()
        for name, value in obs.items():
            same &= (pend[name][ids] == value.reshape(value.shape[0], -1)).all(axis=1)
        self._fields["next"][p[same] % cap] = (seqs - p)[same]
        other = live & ~same  # not the successor's observation (e.g. a reset in between): keep it aside
        if other.any():
            self._put_side(p[other], {name: pend[name][ids[other]] for name in obs})
        if done.any():
            self._put_side(seqs[done], {name: value[done] for name, value in nxt.items()})
        pend["seq"][ids] = np.where(done, -1, seqs)
        pend["generation"][ids] = generation
        for name, value in nxt.items():
            pend[name][ids] = value.reshape(value.shape[0], -1)

    def _pending_rows(self, streams: int) -> dict[str, np.ndarray]:
        """This writer's rows waiting for a successor, by stream id.

        Holds ``seq`` (-1: none), ``generation``, and each observation field's next observation
        (grown on demand).
        """
        pend = self._pending
        if pend and pend["seq"].shape[0] >= streams:
            return pend
        size = max(streams, 2 * pend["seq"].shape[0] if pend else 0)
        grown: dict[str, np.ndarray] = {
            "seq": np.full(size, -1, np.int64),
            "generation": np.zeros(size, np.int64),
        }
        for key, shape, dt in self._layout.obs_spec:
            grown[self._layout.obs_field(key)] = np.zeros((size, int(np.prod(shape))), dt)
        for name, value in pend.items():
            grown[name][: value.shape[0]] = value
        self._pending = grown
        return grown

    # ---- reading -------------------------------------------------------------------------------
    def _sample_complete(self, batch_size: int, rng: np.random.Generator) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Uniformly sampled transitions whose next observation is known, with it assembled."""
        generation, seq = self._draw(batch_size, rng)
        fields, check = self._transitions(seq)
        for _ in range(MAX_SAMPLE_ROUNDS):
            bad = self._incomplete(seq, check, generation)
            if not bad.any():
                return seq, fields
            generation, fresh = self._draw(int(bad.sum()), rng)
            seq = seq.copy()
            seq[bad] = fresh
            again, check_again = self._transitions(fresh)
            for name, value in again.items():
                fields[name][bad] = value
            for part, value in zip(check, check_again):
                part[bad] = value
        raise RuntimeError(
            f"replay {self.name!r}: no complete transition in {MAX_SAMPLE_ROUNDS} sampling rounds: the "
            "successors of the drawn rows are not committed yet (add more steps), or the ring is far too small"
        )

    def gather_fields(self, seq: Any) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Gather rows ``seq`` with their next observations assembled.

        As :meth:`SamplingRing.gather_fields <unilab_gym.replay.sampling.SamplingRing.gather_fields>`;
        ``ok`` is also False where a next observation is not known yet or was evicted from the
        side table.
        """
        seq = np.asarray(seq, dtype=np.int64)
        with self._lock:
            generation = self._h[GENERATION]
        fields, check = self._transitions(seq)
        return fields, ~self._incomplete(seq, check, generation)

    def _transitions(self, seq: np.ndarray) -> tuple[dict[str, np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Optimized layouts: copy rows ``seq`` and their next observations, lock-free.

        Returns the fields and ``(delta, slot, tag)``: the ``next`` values read, the side slots
        and the side tags read before the copy, for :meth:`_incomplete`.
        """
        L, cap, side = self._layout, self._capacity, self._side
        fields = dict(L.unpack(self._block.take(seq % cap, axis=0)))
        delta = fields.pop("next").astype(np.int64)
        succ, aside = delta > 0, delta < 0
        slot = np.where(aside, -delta - 1, 0)
        tag = side["tag"][slot]
        succ_rows = ((seq + delta) % cap)[succ]
        for key, shape, dt in L.obs_spec:
            name = L.obs_field(key)
            out = np.zeros((seq.shape[0], *shape), dt)
            out[succ] = self._fields[name][succ_rows]
            out[aside] = side[name][slot[aside]]
            fields[L.obs_field(key, next_obs=True)] = out
        return fields, (delta, slot, tag)

    def _incomplete(
        self, seq: np.ndarray, check: tuple[np.ndarray, np.ndarray, np.ndarray], generation: int
    ) -> np.ndarray:
        """Optimized layouts, after :meth:`_transitions`: which of ``seq`` must not be used."""
        delta, slot, tag = check
        side = self._side
        with self._lock:
            head, current, floor = self._h[HEAD], self._h[GENERATION], self._h[FLOOR]
            now = self._fields["next"][seq % self._capacity]
            tag_now = side["tag"][slot]
        if current != generation:
            return np.ones(seq.shape, dtype=bool)
        if floor and not self._evicted_warned:
            self._warn_evicted()
        aside = delta < 0
        bad = (seq < max(head - self._capacity, floor)) | (delta == 0) | (now != delta)
        return bad | (aside & ((tag != seq) | (tag_now != seq)))

    # ---- saved copies ---------------------------------------------------------------------------
    def _snapshot(self) -> RingState:
        saved = super()._snapshot()
        h = self._header
        return saved._replace(side=self._side.view(np.uint8).copy(), final_head=int(h[FINAL_HEAD]), floor=int(h[FLOOR]))

    def _restore(self, saved: RingState) -> None:
        assert saved.side is not None  # checked_state gives one for an optimized layout
        super()._restore(saved)
        self._side.view(np.uint8)[:] = saved.side
        self._header[FINAL_HEAD] = int(saved.final_head)
        self._header[FLOOR] = int(saved.floor)
