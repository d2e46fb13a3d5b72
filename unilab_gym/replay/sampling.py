"""Sampling the replay ring: uniform and status-weighted draws that never return a torn row.

:class:`SamplingRing` adds the reader's side of the protocol (see :mod:`unilab_gym.replay.ring`)
to :class:`~unilab_gym.replay.ring.ReplayRing`: draw sequence numbers uniformly from the valid
set under the lock, copy the rows with one ``numpy.take`` outside it, then re-read ``head`` and
redraw every row that may have been overwritten meanwhile (optimistic concurrency: writers never
wait for readers). Status weights (:mod:`unilab_gym.replay.status`) are served by rejection
sampling on top of the uniform draws. A variant whose transitions need more than their own row
(the memory-optimized layout, :mod:`unilab_gym.replay.linking`) overrides ``_sample_complete``
and :meth:`SamplingRing.gather_fields`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from unilab_gym.replay.header import GENERATION, HEAD
from unilab_gym.replay.ring import ReplayRing
from unilab_gym.replay.status import status_of
from unilab_gym.validation import check_positive_int

__all__ = ["MAX_SAMPLE_ROUNDS", "SamplingRing"]

#: redraw rounds before a sample gives up (a ring far too small); the optimized layout's sampler uses it too.
MAX_SAMPLE_ROUNDS = 100


class SamplingRing(ReplayRing):
    """A :class:`~unilab_gym.replay.ring.ReplayRing` that can be sampled.

    Rows are drawn uniformly, with replacement, from the valid set (committed, not being
    overwritten, not retired), seeded by the caller's ``numpy.random.Generator``; see the
    module docstring for how torn rows are excluded.
    """

    def sample_indices(self, batch_size: int, rng: np.random.Generator) -> np.ndarray:
        """Draw ``batch_size`` sequence numbers uniformly (with replacement) from the valid set.

        The rows ``seq % capacity`` are committed at the time of the call; gather them with
        :meth:`gather`, then check :meth:`overwritten` (or use :meth:`sample`, which does both).

        :param batch_size: number of draws, ``>= 1``.
        :param rng: the generator to draw from (e.g. ``np.random.default_rng(seed)``).
        :return: ``(batch_size,)`` int64 sequence numbers.
        :raises ValueError: if ``batch_size < 1`` or no row is committed.
        """
        return self._draw(batch_size, rng)[1]

    def _draw(self, batch_size: int, rng: np.random.Generator) -> tuple[int, np.ndarray]:
        batch_size = check_positive_int("batch_size", batch_size)
        if not isinstance(rng, np.random.Generator):
            raise ValueError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
        with self._lock:
            self._owner_countdown -= 1
            if self._owner_countdown <= 0:
                self._check_owner()
            generation, head, starts, lengths = self._valid_intervals()
        total = int(lengths.sum())
        if total == 0:
            raise ValueError(
                f"cannot sample from replay {self.name!r}: no committed transition yet "
                f"({head} reserved, none committed and not being overwritten)"
            )
        u = rng.integers(0, total, size=batch_size, dtype=np.int64)
        if starts.size == 1:
            return generation, u + starts[0]
        ends = np.cumsum(lengths)
        k = np.searchsorted(ends, u, side="right")
        return generation, u - (ends[k] - lengths[k]) + starts[k]

    def gather(self, seq: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Copy the rows of sequence numbers ``seq`` out of the block (one ``numpy.take``).

        :param seq: ``(B,)`` int sequence numbers (from :meth:`sample_indices`).
        :param out: optional ``(B, width)`` C-contiguous array of :attr:`ReplayLayout.word_dtype`
            to fill.
        :return: ``(B, width)`` rows (``out`` if given; split them with
            :meth:`ReplayLayout.unpack`). Rows whose sequence number is flagged by
            :meth:`overwritten` right after this call may be torn.
        """
        self._check_open()
        rows = np.asarray(seq, dtype=np.int64) % self._capacity
        if out is None:
            return self._block.take(rows, axis=0)
        if out.shape != (rows.shape[0], self._layout.width) or out.dtype != self._block.dtype:
            raise ValueError(
                f"out must be a ({rows.shape[0]}, {self._layout.width}) {self._block.dtype} array, "
                f"got {out.shape} {out.dtype}"
            )
        # rows are in range by construction: mode="clip" skips numpy's buffered bounds check
        return np.take(self._block, rows, axis=0, out=out, mode="clip")

    def overwritten(self, seq: np.ndarray, generation: int | None = None) -> np.ndarray:
        """Which of ``seq`` have been (or are being) overwritten since they were drawn.

        Call it after :meth:`gather`: a row is safe iff its sequence number is still inside
        the ring (``seq >= head - capacity``) and the replay was not reset.

        :return: ``(B,)`` bool mask.
        """
        seq = np.asarray(seq, dtype=np.int64)
        with self._lock:
            head = self._h[HEAD]
            current = self._h[GENERATION]
        if generation is not None and generation != current:
            return np.ones(seq.shape, dtype=bool)
        return seq < head - self._capacity

    def sample(
        self, batch_size: int, rng: np.random.Generator, out: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Uniformly sample committed transitions; never returns a torn or half-written row.

        :param batch_size: ``B >= 1``.
        :param rng: seeded generator (``np.random.default_rng(seed)``).
        :param out: optional ``(B, width)`` array of :attr:`ReplayLayout.word_dtype` to gather
            into (e.g. the numpy view of a torch tensor, see
            :class:`~unilab_gym.replay.torch_sampler.TorchSampler`).
        :return: ``(seq, rows)``: ``(B,)`` int64 sequence numbers and ``(B, width)`` rows; use
            :attr:`layout` slices (float32 layouts) or :meth:`ReplayLayout.unpack` to split them.
        :raises ValueError: if ``batch_size < 1`` or nothing is committed yet.
        :raises ReplayOwnerGoneError: (attachers, checked every 64th sample) if the owner
            process is gone.
        :raises RuntimeError: if writers overwrote the drawn rows 100 times in a row (a ring far
            too small for its write rate).
        """
        generation, seq = self._draw(batch_size, rng)
        out = self.gather(seq, out)
        for _ in range(MAX_SAMPLE_ROUNDS):
            bad = self.overwritten(seq, generation)
            if not bad.any():
                return seq, out
            # redraw the rows that may be torn, from the current valid set
            generation, fresh = self._draw(int(bad.sum()), rng)
            seq = seq.copy()
            seq[bad] = fresh
            if bad.all():
                self.gather(seq, out)
            else:
                out[bad] = self._block.take(fresh % self._capacity, axis=0)
                # rows drawn before may have aged meanwhile: the loop re-checks all of them
        raise RuntimeError(
            f"replay {self.name!r}: rows were overwritten during {MAX_SAMPLE_ROUNDS} sampling rounds; "
            "the capacity is far too small for the write rate"
        )

    def sample_fields(
        self, batch_size: int, rng: np.random.Generator, *, status_weights: np.ndarray | None = None
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Sample complete transitions, split into fields; never returns a torn row.

        Works for every layout. For a memory-optimized layout it also assembles each next
        observation (from the successor row or the side table) and draws only rows whose next
        observation is known: rows whose successor is not committed yet are redrawn.

        Args:
            batch_size: ``B >= 1``.
            rng: seeded generator.
            status_weights: ``None`` (uniform), or ``(3,)`` weights of the statuses normal,
                terminated, truncated (:func:`~unilab_gym.replay.status.check_status_weights`):
                each transition is drawn with probability proportional to its status's weight
                (rejection sampling, :mod:`unilab_gym.replay.status`).

        Returns:
            ``(seq, fields)``: ``(B,)`` int64 sequence numbers and ``{field name: (B, *shape)}``
            arrays in the fields' dtypes, with ``next_obs`` (``next_obs.<key>``) fields for every
            layout.

        Raises:
            ValueError: if ``batch_size < 1`` or nothing is committed yet.
            RuntimeError: after 100 rounds of redraws (no complete transition yet, or a ring far
                too small for its write rate), or 1000 rounds of status rejections (the weighted
                statuses are absent).
        """
        if status_weights is not None:
            return self._sample_weighted(batch_size, rng, np.asarray(status_weights, np.float64))
        return self._sample_complete(batch_size, rng)

    def _sample_complete(self, batch_size: int, rng: np.random.Generator) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Uniformly sampled complete transitions, split into fields (every row is complete here)."""
        seq, rows = self.sample(batch_size, rng)
        return seq, self._layout.unpack(rows)

    def _sample_weighted(
        self, batch_size: int, rng: np.random.Generator, weights: np.ndarray
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Rejection sampling: uniform draws, each kept with probability ``weights[status] / max``."""
        accept = weights / weights.max()
        seqs: list[np.ndarray] = []
        parts: list[dict[str, np.ndarray]] = []
        need = check_positive_int("batch_size", batch_size)
        for _ in range(1000):
            seq, fields = self.sample_fields(max(need, 2 * need), rng)
            keep = rng.random(seq.shape[0]) < accept[status_of(fields["terminated"], fields["truncated"])]
            keep &= np.cumsum(keep) <= need  # the first `need` accepted draws: i.i.d. from the target
            seqs.append(seq[keep])
            parts.append({name: value[keep] for name, value in fields.items()})
            need -= int(keep.sum())
            if need == 0:
                return np.concatenate(seqs), {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
        raise RuntimeError(
            f"replay {self.name!r}: status_weights {weights.tolist()} rejected nearly every draw: the statuses "
            "with weight > 0 are (almost) absent from the replay"
        )

    def gather_fields(self, seq: Any) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """The transitions ``seq`` split into fields (next observations included), and which are usable.

        Args:
            seq: ``(B,)`` int sequence numbers (e.g. from :meth:`seq_of_rows`).

        Returns:
            ``(fields, ok)``: as :meth:`sample_fields`, and a ``(B,)`` bool mask, False where a
            transition was overwritten during the copy or (optimized layout) its next observation
            is not known yet or was evicted from the side table.
        """
        seq = np.asarray(seq, dtype=np.int64)
        with self._lock:
            generation = self._h[GENERATION]
        fields = self._layout.unpack(self.gather(seq))
        return fields, ~self.overwritten(seq, generation)

    def seq_of_rows(self, rows: Any) -> np.ndarray:
        """Sequence numbers of the committed transitions now stored in block rows ``rows``.

        :param rows: int row indices in ``[0, capacity)``.
        :return: int64 sequence numbers, same shape.
        :raises ValueError: if a row is out of range or holds no committed transition
            (never written, being written, or abandoned); the message names the first one.
        """
        rows = np.asarray(rows)
        if rows.dtype.kind not in "iu":
            raise ValueError(f"rows must be integers, got dtype {rows.dtype}")
        rows = rows.astype(np.int64)
        bad = (rows < 0) | (rows >= self._capacity)
        if bad.any():
            raise ValueError(f"row {int(rows[bad][0])} is out of range [0, {self._capacity})")
        with self._lock:
            _, head, starts, lengths = self._valid_intervals()
        cap = self._capacity
        # the newest seq stored in row r is the largest seq < head with seq % cap == r
        seq = rows + cap * ((head - 1 - rows) // cap)
        valid = np.zeros(seq.shape, dtype=bool)
        for s, n in zip(starts, lengths):
            valid |= (seq >= s) & (seq < s + n)
        if not valid.all():
            raise ValueError(f"row {int(rows[~valid].flat[0])} of replay {self.name!r} holds no committed transition")
        return seq
