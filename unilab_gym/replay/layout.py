"""Column layout of the packed replay block.

One transition is one row of ``width`` float32 values::

    col:  0 ........ D-1 | D ..... 2D-1 | 2D ... 2D+A-1 | 2D+A   | 2D+A+1     | 2D+A+2    | 2D+A+3 ...
          obs (D)        | next_obs (D) | action (A)    | reward | terminated | truncated | extras ...

with ``D = obs_dim`` and ``A = act_dim``, so ``width = 2*D + A + 3 + sum(extra dims)``.

Semantics of the three scalar columns (Gymnasium terms):

- ``reward``: the reward of the transition.
- ``terminated``: 1.0 when ``next_obs`` is a true terminal state, so the bootstrap is cut
  (``target = r + gamma * (1 - terminated) * V(next_obs)``); 0.0 otherwise.
- ``truncated``: 1.0 when the episode was cut here (time limit) without reaching a terminal
  state; informational, it does not cut the bootstrap. ``next_obs`` is then the last
  observation of the episode (Gymnasium's ``final_obs`` / SB3's ``terminal_observation``),
  never the first observation of the next episode.

Extras are optional named groups of per-transition columns (e.g. a privileged critic
observation), appended in the order given.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from unilab_gym.validation import check_positive_int

__all__ = ["ReplayLayout"]


@dataclass(frozen=True, init=False)
class ReplayLayout:
    """Column layout of a packed float32 replay block (see the module docstring).

    :param obs_dim: number of float32 values of one (flattened) observation, ``>= 1``.
    :param act_dim: number of float32 values of one (flattened) action, ``>= 1``.
    :param extras: optional extra column groups, ``{name: dim}`` or ``[(name, dim), ...]``,
        appended after ``truncated`` in that order. Names must be unique identifiers. Stored as
        a tuple of ``(name, dim)`` pairs.
    :raises ValueError: on a non-positive dimension or a bad / duplicate extra name.
    """

    obs_dim: int
    act_dim: int
    extras: tuple[tuple[str, int], ...] = ()

    def __init__(self, obs_dim: int, act_dim: int, extras: Mapping[str, int] | Iterable[tuple[str, int]] = ()) -> None:
        obs_dim = check_positive_int("obs_dim", obs_dim)
        act_dim = check_positive_int("act_dim", act_dim)
        raw: Iterable[Any] = extras.items() if isinstance(extras, Mapping) else extras
        pairs: list[tuple[str, int]] = []
        for item in raw:
            try:
                name, dim = item
            except (TypeError, ValueError):
                raise ValueError(f"extras must be (name, dim) pairs, got {item!r}") from None
            if not isinstance(name, str) or not name.isidentifier():
                raise ValueError(f"extra column group name must be an identifier, got {name!r}")
            if name in {"obs", "next_obs", "action", "reward", "terminated", "truncated"}:
                raise ValueError(f"extra column group name {name!r} clashes with a base column")
            if any(name == other for other, _ in pairs):
                raise ValueError(f"duplicate extra column group name {name!r}")
            pairs.append((name, check_positive_int(f"extras[{name!r}]", dim)))
        object.__setattr__(self, "obs_dim", obs_dim)
        object.__setattr__(self, "act_dim", act_dim)
        object.__setattr__(self, "extras", tuple(pairs))

    # ---- base columns -------------------------------------------------------------------
    @property
    def obs(self) -> slice:
        """Columns of ``obs``: ``[0, obs_dim)``."""
        return slice(0, self.obs_dim)

    @property
    def next_obs(self) -> slice:
        """Columns of ``next_obs``: ``[obs_dim, 2*obs_dim)``."""
        return slice(self.obs_dim, 2 * self.obs_dim)

    @property
    def action(self) -> slice:
        """Columns of ``action``: ``[2*obs_dim, 2*obs_dim + act_dim)``."""
        return slice(2 * self.obs_dim, 2 * self.obs_dim + self.act_dim)

    @property
    def reward(self) -> int:
        """Column index of ``reward``."""
        return 2 * self.obs_dim + self.act_dim

    @property
    def terminated(self) -> int:
        """Column index of ``terminated`` (1.0 cuts the bootstrap)."""
        return self.reward + 1

    @property
    def truncated(self) -> int:
        """Column index of ``truncated`` (1.0: episode cut here, bootstrap kept)."""
        return self.reward + 2

    @property
    def base_width(self) -> int:
        """Number of columns before the extras: ``2*obs_dim + act_dim + 3``."""
        return self.reward + 3

    # ---- extras ---------------------------------------------------------------------------
    @property
    def extra_dim(self) -> int:
        """Total number of extra columns."""
        return sum(dim for _, dim in self.extras)

    @property
    def extra_columns(self) -> slice:
        """All extra columns: ``[base_width, width)``."""
        return slice(self.base_width, self.width)

    def extra(self, name: str) -> slice:
        """Columns of the extra group ``name``.

        :raises KeyError: if there is no such group.
        """
        start = self.base_width
        for other, dim in self.extras:
            if other == name:
                return slice(start, start + dim)
            start += dim
        raise KeyError(f"no extra column group {name!r}; layout has {[n for n, _ in self.extras]}")

    @property
    def fields(self) -> tuple[tuple[str, tuple[int, ...], str], ...]:
        """Every column group in block order, as ``(name, shape of one transition, dtype)``.

        ``(("obs", (D,), "float32"), ("next_obs", (D,), "float32"), ("action", (A,), "float32"),
        ("reward", (), "float32"), ("terminated", (), "float32"), ("truncated", (), "float32"),
        *((name, (dim,), "float32") for each extra group))``. The shared segment records it, and
        :meth:`~unilab_gym.replay.ReplayStorage.attach` compares it field by field.
        """
        D, A = (self.obs_dim,), (self.act_dim,)
        base = (("obs", D), ("next_obs", D), ("action", A), ("reward", ()), ("terminated", ()), ("truncated", ()))
        return tuple((name, shape, "float32") for name, shape in (*base, *((n, (d,)) for n, d in self.extras)))

    @property
    def width(self) -> int:
        """Row width in float32 values: ``2*obs_dim + act_dim + 3 + extra_dim``."""
        return self.base_width + self.extra_dim

    @property
    def row_nbytes(self) -> int:
        """Bytes of one row (``4 * width``)."""
        return 4 * self.width
