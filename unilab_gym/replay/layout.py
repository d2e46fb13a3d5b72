"""Byte layout of the packed replay block: a dtype and a byte offset per field.

One transition is one row of ``row_nbytes`` bytes. Its fields, in block order::

    obs | next_obs | action | reward | terminated | truncated | extras ...

Each field has a shape and a dtype of its own (a ``uint8`` camera image stays ``uint8``: a quarter
of the bytes of float32). A field starts at an offset that is a multiple of its dtype's size, and
``row_nbytes`` is a multiple of the largest one, so every field of every row is aligned. The
default layout, ``ReplayLayout(obs_dim, act_dim)``, is all float32 and has no padding: it is the
packed float32 block of ``width = 2*obs_dim + act_dim + 3`` columns, byte for byte::

    col:  0 ........ D-1 | D ..... 2D-1 | 2D ... 2D+A-1 | 2D+A   | 2D+A+1     | 2D+A+2    | 2D+A+3 ...
          obs (D)        | next_obs (D) | action (A)    | reward | terminated | truncated | extras ...

A Dict observation (``{"policy": Box(48,), "critic": Box(K,)}``) gives one field per key, for obs
and for next_obs: ``obs.policy | obs.critic | next_obs.policy | next_obs.critic | action | ...``,
so the all-float32 row has ``2*48 + A + 3 + 2*K`` columns, as the seed's layout.

Semantics of the three scalar float32 fields (Gymnasium terms):

- ``reward``: the reward of the transition.
- ``terminated``: 1.0 when ``next_obs`` is a true terminal state, so the bootstrap is cut
  (``target = r + gamma * (1 - terminated) * V(next_obs)``); 0.0 otherwise.
- ``truncated``: 1.0 when the episode was cut here (time limit) without reaching a terminal
  state; informational, it does not cut the bootstrap. ``next_obs`` is then the last
  observation of the episode (Gymnasium's ``final_obs`` / SB3's ``terminal_observation``),
  never the first observation of the next episode.

Extras are optional named groups of float32 per-transition columns (e.g. a privileged critic
observation), appended in the order given.

**Memory-optimized layout** (``final_obs=F > 0``): the rows have no ``next_obs`` fields. Each
observation is stored once, and an int32 field ``next`` says where a row's next observation is:
``next > 0``: in the obs field of row ``seq + next`` (the same env's next row, written by the same
writer); ``next < 0``: in entry ``-next - 1`` of a side table of ``F`` final observations stored
after the block (episode ends, terminated or truncated, and any next observation that is not its
successor's observation); ``next == 0``: not known yet (the successor is not committed), never
sampled. Each side entry carries the sequence number of its row as an int64 ``tag``. The side
table is a ring of its own: when it must reuse the entry of a row that is still in the ring,
the storage retires that row and every older one (:attr:`ReplayStorage.oldest`), so an episode
end is never dropped while transitions around it are still sampled;
:func:`~unilab_gym.replay.storage.final_obs_capacity_for` gives the ``F`` that never retires a row
(``ceil(capacity / shortest episode) + 2 * envs``). For 48 float32 observations and 12 actions a
row is ``192 + 48 + 3*4 + 4 = 256`` bytes instead of 444.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from unilab_gym.validation import check_positive_int

__all__ = ["FieldSpec", "ReplayLayout"]

#: ``(shape, dtype name)`` of one field of one transition, e.g. ``((84, 84, 3), "uint8")``.
FieldSpec = tuple[tuple[int, ...], str]

_BASE_NAMES = frozenset({"obs", "next_obs", "action", "reward", "terminated", "truncated"})
_SCALARS = (("reward", ((), "float32")), ("terminated", ((), "float32")), ("truncated", ((), "float32")))


def _spec(what: str, value: Any) -> FieldSpec:
    """An int ``dim`` (float32 ``(dim,)``) or a ``(shape, dtype)`` pair, validated."""
    if isinstance(value, tuple) and len(value) == 2 and not isinstance(value[0], (int, np.integer)):
        shape, dtype = value
        try:
            shape = tuple(int(s) for s in shape)
            dt = np.dtype(dtype)
        except (TypeError, ValueError):
            raise ValueError(f"{what} must be a dim or a (shape, dtype) pair, got {value!r}") from None
        if any(s < 1 for s in shape):
            raise ValueError(f"{what} shape must have positive sizes, got {shape}")
        if dt.kind not in "biuf" or dt.subdtype is not None or dt.fields is not None:
            raise ValueError(f"{what} dtype must be a numeric scalar dtype (bool, int, uint, float), got {dt}")
        return shape, dt.newbyteorder("=").name
    return (check_positive_int(what, value),), "float32"


def _struct(fields: Iterable[tuple[str, tuple[int, ...], str]]) -> np.dtype:
    """Aligned structured dtype of ``fields``.

    Each field sits at a multiple of its dtype's alignment, the item size is a multiple of the
    largest alignment.
    """
    names, formats, offsets = [], [], []
    offset, align = 0, 1
    for name, shape, dt in fields:
        item = np.dtype(dt)
        offset = -(-offset // item.alignment) * item.alignment
        names.append(name)
        formats.append((item, shape) if shape else item)
        offsets.append(offset)
        offset += item.itemsize * int(np.prod(shape))
        align = max(align, item.alignment)
    itemsize = -(-offset // align) * align
    return np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": itemsize})


@dataclass(frozen=True, init=False)
class ReplayLayout:
    """Byte layout of a packed replay block (see the module docstring).

    Args:
        obs_dim: the observation: an int ``D >= 1`` (float32 ``(D,)``), a ``(shape, dtype)``
            pair (e.g. ``((84, 84, 3), "uint8")``), or a mapping ``{key: dim or (shape, dtype)}``
            for a Dict observation (one field per key, in the mapping's order).
        act_dim: the action: an int ``A >= 1`` (float32 ``(A,)``) or a ``(shape, dtype)`` pair.
        extras: optional float32 column groups, ``{name: dim}`` or ``[(name, dim), ...]``,
            appended after ``truncated`` in that order. Names must be unique identifiers.
        final_obs: ``0`` (default): each row stores its next observation. ``F > 0``: the
            memory-optimized layout (module docstring), with a side table of ``F`` entries.

    Attributes:
        obs_dim: number of observation values of one transition (all keys).
        act_dim: number of action values of one transition.
        extras: ``((name, dim), ...)``.
        obs_spec: ``((key, shape, dtype), ...)``; the key is ``""`` for a non-Dict observation.
        act_spec: ``(shape, dtype)`` of the action.
        final_obs: side-table entries of the memory-optimized layout (0: not optimized).

    Raises:
        ValueError: on a non-positive dimension, a non-numeric dtype, or a bad / duplicate name.
    """

    obs_dim: int
    act_dim: int
    extras: tuple[tuple[str, int], ...]
    obs_spec: tuple[tuple[str, tuple[int, ...], str], ...]
    act_spec: FieldSpec
    final_obs: int

    def __init__(
        self,
        obs_dim: int | FieldSpec | Mapping[str, int | FieldSpec],
        act_dim: int | FieldSpec,
        extras: Mapping[str, int] | Iterable[tuple[str, int]] = (),
        *,
        final_obs: int = 0,
    ) -> None:
        """Validate the fields and compute their offsets (arguments: see the class docstring)."""
        if isinstance(obs_dim, Mapping):
            if not obs_dim:
                raise ValueError("a Dict observation needs at least one key")
            obs_spec = []
            for key, value in obs_dim.items():
                if not isinstance(key, str) or not key:
                    raise ValueError(f"Dict observation keys must be non-empty strings, got {key!r}")
                obs_spec.append((key, *_spec(f"obs_dim[{key!r}]", value)))
        else:
            obs_spec = [("", *_spec("obs_dim", obs_dim))]
        act_spec = _spec("act_dim", act_dim)
        raw: Iterable[Any] = extras.items() if isinstance(extras, Mapping) else extras
        pairs: list[tuple[str, int]] = []
        for item in raw:
            try:
                name, dim = item
            except (TypeError, ValueError):
                raise ValueError(f"extras must be (name, dim) pairs, got {item!r}") from None
            if not isinstance(name, str) or not name.isidentifier():
                raise ValueError(f"extra column group name must be an identifier, got {name!r}")
            if name in _BASE_NAMES or name == "next":
                raise ValueError(f"extra column group name {name!r} clashes with a base column")
            if any(name == other for other, _ in pairs):
                raise ValueError(f"duplicate extra column group name {name!r}")
            pairs.append((name, check_positive_int(f"extras[{name!r}]", dim)))
        object.__setattr__(self, "obs_dim", sum(int(np.prod(shape)) for _, shape, _ in obs_spec))
        object.__setattr__(self, "act_dim", int(np.prod(act_spec[0])))
        object.__setattr__(self, "extras", tuple(pairs))
        object.__setattr__(self, "obs_spec", tuple(obs_spec))
        object.__setattr__(self, "act_spec", act_spec)
        object.__setattr__(self, "final_obs", 0 if final_obs == 0 else check_positive_int("final_obs", final_obs))
        # derived once: the layout is immutable, and these are read on every add / sample
        object.__setattr__(self, "_fields", self._make_fields())
        object.__setattr__(self, "_dtype", _struct(self._fields))  # type: ignore[attr-defined]
        f32 = all(dt == "float32" for _, _, dt in self._fields)  # type: ignore[attr-defined]
        object.__setattr__(self, "_float32", f32)
        object.__setattr__(self, "_word", np.dtype(np.float32 if f32 else np.uint8))
        object.__setattr__(self, "_width", self._dtype.itemsize // self._word.itemsize)  # type: ignore[attr-defined]

    # ---- fields and bytes ------------------------------------------------------------------
    @property
    def is_dict(self) -> bool:
        """Whether the observation is a Dict (one field per key)."""
        return self.obs_spec[0][0] != ""

    def obs_field(self, key: str = "", *, next_obs: bool = False) -> str:
        """Field name of observation key ``key`` (``"obs"``, ``"next_obs"``, ``"obs.<key>"``...)."""
        base = "next_obs" if next_obs else "obs"
        return f"{base}.{key}" if key else base

    @property
    def fields(self) -> tuple[tuple[str, tuple[int, ...], str], ...]:
        """Every field in block order, as ``(name, shape of one transition, dtype name)``.

        For the default layout: ``(("obs", (D,), "float32"), ("next_obs", (D,), "float32"),
        ("action", (A,), "float32"), ("reward", (), "float32"), ("terminated", (), "float32"),
        ("truncated", (), "float32"), *((name, (dim,), "float32") for each extra group))``. The
        shared segment records it, and :meth:`~unilab_gym.replay.ReplayStorage.attach` compares
        it field by field.
        """
        return self._fields  # type: ignore[attr-defined]

    def _make_fields(self) -> tuple[tuple[str, tuple[int, ...], str], ...]:
        out = [(self.obs_field(k), shape, dt) for k, shape, dt in self.obs_spec]
        if not self.final_obs:
            out += [(self.obs_field(k, next_obs=True), shape, dt) for k, shape, dt in self.obs_spec]
        out.append(("action", *self.act_spec))
        out += [(name, *spec) for name, spec in _SCALARS]
        out += [(name, (dim,), "float32") for name, dim in self.extras]
        if self.final_obs:
            out.append(("next", (), "int32"))
        return tuple(out)

    @property
    def side_dtype(self) -> np.dtype:
        """Structured dtype of one side-table entry (optimized layout).

        The observation fields (named as in the rows: ``"obs"`` or ``"obs.<key>"``) and an int64
        ``"tag"`` (the sequence number of the row whose next observation it is; -1 while it is written).
        """
        fields = [(self.obs_field(k), shape, dt) for k, shape, dt in self.obs_spec] + [("tag", (), "int64")]
        return _struct(fields)

    @property
    def dtype(self) -> np.dtype:
        """The numpy structured dtype of one row: field names, dtypes, shapes and byte offsets.

        ``block.view(layout.dtype)`` turns a C-contiguous ``(n, width)`` block into ``(n, 1)``
        records (see :meth:`unpack`).
        """
        return self._dtype  # type: ignore[attr-defined]

    @property
    def side_nbytes(self) -> int:
        """Bytes of the side table: ``final_obs * side_dtype.itemsize`` (0 when not optimized)."""
        return self.final_obs * self.side_dtype.itemsize if self.final_obs else 0

    @property
    def row_nbytes(self) -> int:
        """Bytes of one row (``4 * width`` for an all-float32 layout)."""
        return self.dtype.itemsize

    @property
    def float32_columns(self) -> bool:
        """Whether every field is float32: the block is then a ``(capacity, width)`` float32 array."""
        return self._float32  # type: ignore[attr-defined]

    @property
    def word_dtype(self) -> np.dtype:
        """The dtype of one column of the block: float32 for an all-float32 layout, else uint8 (bytes)."""
        return self._word  # type: ignore[attr-defined]

    @property
    def width(self) -> int:
        """Row width in columns of :attr:`word_dtype`.

        ``2*obs_dim + act_dim + 3 + extra_dim`` float32 values for an all-float32 layout, else
        :attr:`row_nbytes` bytes.
        """
        return self._width  # type: ignore[attr-defined]

    def offset(self, name: str) -> int:
        """Byte offset of field ``name`` in a row.

        Raises:
            KeyError: if there is no such field.
        """
        fields = self.dtype.fields
        assert fields is not None
        if name not in fields:
            raise KeyError(f"no field {name!r}; layout has {[f for f, _, _ in self.fields]}")
        return int(fields[name][1])

    def unpack(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """Split gathered rows into their fields (zero-copy views).

        Args:
            rows: ``(B, width)`` C-contiguous array of :attr:`word_dtype` (as
                :meth:`~unilab_gym.replay.ReplayStorage.gather` returns).

        Returns:
            ``{field name: (B, *shape) array of the field's dtype}`` in :attr:`fields` order.

        Raises:
            ValueError: if ``rows`` has another shape or dtype.
        """
        if rows.ndim != 2 or rows.shape[1] != self.width or rows.dtype != self.word_dtype:
            raise ValueError(f"rows must be a (B, {self.width}) {self.word_dtype} array, got {rows.shape} {rows.dtype}")
        records = np.ascontiguousarray(rows).view(self.dtype)[:, 0]
        return {name: records[name] for name, _, _ in self.fields}

    # ---- float32 column indices (all-float32 layouts) ----------------------------------------
    def _columns(self, name: str) -> slice:
        if not self.float32_columns:
            raise ValueError(
                f"this layout mixes dtypes ({sorted({dt for _, _, dt in self.fields})}): it has no float32 "
                "columns; use layout.offset(name), layout.unpack(rows) or storage.field(name)"
            )
        start = self.offset(name) // 4
        shape = next(shape for f, shape, _ in self.fields if f == name)
        return slice(start, start + int(np.prod(shape)))

    @property
    def obs(self) -> slice:
        """Columns of ``obs`` (every key of a Dict observation): ``[0, obs_dim)``.

        Raises:
            ValueError: if the layout is not all float32 (see :attr:`float32_columns`).
        """
        first = self._columns(self.fields[0][0])
        return slice(first.start, first.start + self.obs_dim)

    @property
    def next_obs(self) -> slice:
        """Columns of ``next_obs``: ``[obs_dim, 2*obs_dim)`` (float32 layouts)."""
        first = self._columns(self.obs_field(self.obs_spec[0][0], next_obs=True))
        return slice(first.start, first.start + self.obs_dim)

    @property
    def action(self) -> slice:
        """Columns of ``action``: ``[2*obs_dim, 2*obs_dim + act_dim)`` (float32 layouts)."""
        return self._columns("action")

    @property
    def reward(self) -> int:
        """Column index of ``reward`` (float32 layouts)."""
        return self._columns("reward").start

    @property
    def terminated(self) -> int:
        """Column index of ``terminated`` (1.0 cuts the bootstrap; float32 layouts)."""
        return self._columns("terminated").start

    @property
    def truncated(self) -> int:
        """Column index of ``truncated`` (1.0: episode cut here, bootstrap kept; float32 layouts)."""
        return self._columns("truncated").start

    @property
    def base_width(self) -> int:
        """Number of columns before the extras: ``2*obs_dim + act_dim + 3`` (float32 layouts)."""
        return self.truncated + 1

    # ---- extras ---------------------------------------------------------------------------
    @property
    def extra_dim(self) -> int:
        """Total number of extra columns."""
        return sum(dim for _, dim in self.extras)

    @property
    def extra_columns(self) -> slice:
        """All extra columns: ``[base_width, width)`` (float32 layouts)."""
        return slice(self.base_width, self.base_width + self.extra_dim)

    def extra(self, name: str) -> slice:
        """Columns of the extra group ``name`` (float32 layouts).

        Raises:
            KeyError: if there is no such group.
        """
        if name not in {n for n, _ in self.extras}:
            raise KeyError(f"no extra column group {name!r}; layout has {[n for n, _ in self.extras]}")
        return self._columns(name)
