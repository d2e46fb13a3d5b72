"""Tianshou 2.x adapter: :class:`TianshouVectorEnv` and :class:`SharedVectorReplayBuffer`.

Tianshou's ``Collector`` drives a ``BaseVectorEnv`` (``step(action, id)``, ``reset(env_id=...)``,
infos as object arrays of dicts) and resets finished envs itself, after storing the
transition, so ``obs_next`` of the last transition of an episode is the true terminal
observation. :class:`TianshouVectorEnv` gives that API over one batched
:class:`~unilab_gym.vector_env.UniLabVectorEnv`, and behaves like Tianshou's
``DummyVectorEnv`` over N single ``gym.make("UniLab/Quadruped-v0")`` envs::

    from tianshou.data import Collector
    from unilab_gym.integrations.tianshou import SharedVectorReplayBuffer, make_tianshou_env

    envs = make_tianshou_env("UniLab/Quadruped-v0", 64, seed=0)
    buffer = SharedVectorReplayBuffer(1_000_000, len(envs))
    collector = Collector(policy, envs, buffer, exploration_noise=True)

:class:`SharedVectorReplayBuffer` is a ``VectorReplayBuffer`` whose obs, obs_next, act and
rew live in the packed shared-memory block of a :class:`unilab_gym.replay.ReplayStorage`,
and whose ``hasnull()`` (called by the trainer after every collect) costs O(1) in the buffer
size instead of copying the whole buffer.

Importing this module imports Tianshou (and torch).
"""

from __future__ import annotations

import contextlib
import copy
import numbers
import os
import tempfile
from collections.abc import Sequence
from typing import Any, ClassVar, cast

import h5py
import numpy as np
import pandas as pd
from gymnasium import spaces
from gymnasium.vector import AutoresetMode
from tianshou.data import Batch, VectorReplayBuffer
from tianshou.data.batch import BatchProtocol
from tianshou.data.types import RolloutBatchProtocol
from tianshou.data.utils.converter import from_hdf5, to_hdf5
from tianshou.env import BaseVectorEnv

from unilab_gym.integrations._infos import make_unilab_vector_env, unbatch_infos
from unilab_gym.replay import ReplayHandle, ReplayLayout, ReplayStorage
from unilab_gym.replay.integrity import data_checksum, verify_checksum
from unilab_gym.validation import check_positive_int, check_seed
from unilab_gym.vector_env import UniLabVectorEnv

__all__ = ["SharedVectorReplayBuffer", "TianshouVectorEnv", "make_tianshou_env"]


def _object_array(items: Sequence[Any]) -> np.ndarray:
    """1-D object array of ``items`` (dicts stay dicts)."""
    out = np.empty(len(items), dtype=object)
    for k, item in enumerate(items):
        out[k] = item
    return out


def _rows(obs: Any, ids: np.ndarray) -> np.ndarray:
    """Rows ``ids`` of the observation; for a dict observation (``privileged_obs=True``), an (R,) object array of
    one dict per env, as ``DummyVectorEnv`` stacks single envs' dict observations (Tianshou's ``Batch`` stacks it)."""
    if isinstance(obs, dict):
        return _object_array([{k: v[j] for k, v in obs.items()} for j in ids.tolist()])
    return obs[ids]


class TianshouVectorEnv(BaseVectorEnv):
    """Tianshou ``BaseVectorEnv`` over a :class:`~unilab_gym.vector_env.UniLabVectorEnv`.

    Same results as Tianshou's ``DummyVectorEnv`` over N single envs (seeded alike):

    - ``reset(env_id=None, seed=None, options=None)`` -> ``obs`` (R, 48) float32 (with ``privileged_obs=True``
      an (R,) object array of ``{"policy": (48,), "critic": (68,)}`` dicts, as ``DummyVectorEnv`` gives) and
      ``infos``, an (R,) object array of the single env's reset-info dicts.
    - ``step(action, id=None)`` -> ``obs`` (R, 48) float32, ``rew`` (R,) float64,
      ``terminated`` (R,) bool, ``truncated`` (R,) bool, ``infos`` (R,) object array of dicts
      (``reward_terms``: dict of floats; ``env_id``: int). Finished envs are **not** reset:
      the Collector resets them with ``reset(env_id=...)``, so ``obs`` holds the true final
      observation.
    - ``seed(s)``: env ``i`` and its action space get ``s + i`` (a list gives one seed per env);
      like ``DummyVectorEnv`` this resets the envs.
    - ``action_space`` / ``observation_space``: lists of N per-env spaces (each action space
      has its own RNG, used by ``Collector.collect(random=True)``).

    The N envs are rows of one batched simulation, so they always advance together: stepping
    a subset ``id`` (the Collector does so in ``n_episode`` mode) advances the other envs with
    zero actions and marks them stale; a stale env must be reset before it is stepped again
    (the Collector resets every env at the end of an ``n_episode`` collect).

    Args:
        venv: a ``UniLabVectorEnv`` with ``autoreset_mode`` ``"Disabled"`` or ``"NextStep"``.

    Raises:
        TypeError: ``venv`` is not a ``UniLabVectorEnv``.
        ValueError: ``venv`` is in ``"SameStep"`` mode (it would replace the final
            observation with the next episode's first one).
    """

    def __init__(self, venv: UniLabVectorEnv):
        if not isinstance(venv, UniLabVectorEnv):
            raise TypeError(f"TianshouVectorEnv wraps a UniLabVectorEnv, got {type(venv).__name__}")
        if venv.autoreset_mode == AutoresetMode.SAME_STEP:
            raise ValueError(
                "TianshouVectorEnv needs a UniLabVectorEnv with autoreset_mode='Disabled' or 'NextStep', "
                "got 'SameStep'; use make_tianshou_env"
            )
        # BaseVectorEnv.__init__ builds one worker per env; here the N envs are rows of one
        # batched env, so the base-class state is set directly (synchronous, never async).
        self.venv = venv
        self._env_fns: list = []
        self.workers: list = []
        self.env_num = venv.num_envs
        self.wait_num = venv.num_envs
        self.timeout = None
        self.is_async = False
        self.waiting_conn: list = []
        self.waiting_id: list[int] = []
        self.ready_id = list(range(venv.num_envs))
        self.is_closed = False
        self._action_spaces = [copy.deepcopy(venv.single_action_space) for _ in range(venv.num_envs)]
        self._action_shape = cast(spaces.Box, venv.single_action_space).shape
        self._stale = np.zeros(venv.num_envs, dtype=bool)

    # ------------------------------------------------------------------ attributes
    def get_env_attr(self, key: str, id: int | list[int] | np.ndarray | None = None) -> list[Any]:
        """Attribute ``key`` for each env of ``id`` (the vector env's attribute, shared by all envs).

        ``action_space`` and ``observation_space`` are the per-env (single) spaces.

        Raises:
            AttributeError: no such attribute.
        """
        self._assert_is_not_closed()
        ids = self._ids(id)
        if key == "action_space":
            return [self._action_spaces[j] for j in ids]
        if key == "observation_space":
            return [self.venv.single_observation_space for _ in ids]
        value = getattr(self.venv, key)
        return [value for _ in ids]

    def set_env_attr(self, key: str, value: Any, id: int | list[int] | np.ndarray | None = None) -> None:
        """Set ``key`` on the vector env (shared by all envs).

        Raises:
            ValueError: ``id`` is not every env.
        """
        self._assert_is_not_closed()
        if set(self._ids(id).tolist()) != set(range(self.env_num)):
            raise ValueError(
                f"set_env_attr({key!r}) on a subset of envs is not supported: the {self.env_num} envs "
                "share one UniLabVectorEnv"
            )
        setattr(self.venv, key, value)

    # ------------------------------------------------------------------ reset / step
    def reset(
        self,
        env_id: int | list[int] | np.ndarray | None = None,
        **kwargs: Any,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Reset the envs ``env_id`` (default: all).

        Args:
            env_id: an env index or a sequence of them.
            **kwargs: ``seed`` and ``options``, below.

        Keyword Args:
            seed (int | Sequence[int] | None): like Tianshou (which passes the same kwargs to every
                env's ``reset``), an int seeds every selected env (and its action space) with that
                same int; a sequence gives one seed per selected env. ``None`` continues each env's
                random stream.
            options (dict | None): passed to the env's reset (``"reset_mask"`` is not allowed).

        Returns:
            ``(obs, infos)``: (R, 48) float32 and an (R,) object array of dicts.

        Raises:
            TypeError: an unknown keyword argument.
            ValueError: bad ``env_id``, a seed that is not a non-negative int (``bool`` is refused), a seed
                list of the wrong length, or ``reset_mask`` in options.
        """
        self._assert_is_not_closed()
        seed = kwargs.pop("seed", None)
        options = dict(kwargs.pop("options", None) or {})
        if kwargs:
            raise TypeError(f"TianshouVectorEnv.reset() got unexpected keyword arguments {sorted(kwargs)}")
        if "reset_mask" in options:
            raise ValueError("use env_id to choose the envs to reset, not options['reset_mask']")
        ids = self._ids(env_id)
        mask = np.zeros(self.env_num, dtype=bool)
        mask[ids] = True
        seeds: list[int | None] | None = None
        if seed is not None:
            per_env = [check_seed("seed", seed)] * len(ids) if isinstance(seed, numbers.Number) else _seed_list(seed)
            if len(per_env) != len(ids):
                raise ValueError(f"got {len(per_env)} seeds for {len(ids)} envs")
            seeds = [None] * self.env_num
            for j, s in zip(ids.tolist(), per_env):
                seeds[j] = s
        obs, info = self.venv.reset(seed=seeds, options={**options, "reset_mask": mask})
        if seeds is not None:
            for j in ids.tolist():
                self._action_spaces[j].seed(seeds[j])
        self._stale[mask] = False
        infos = unbatch_infos(info, self.env_num)
        return _rows(obs, ids), _object_array([infos[j] for j in ids.tolist()])

    def step(
        self,
        action: np.ndarray | Any,
        id: int | list[int] | np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Step the envs ``id`` (default: all) with ``action`` ((R, 12), row ``k`` for env ``id[k]``).

        Returns:
            ``(obs, rew, terminated, truncated, infos)`` for the R envs (see the class docstring).

        Raises:
            ValueError: ``action`` is ``None`` or has the wrong length / shape, NaN/inf actions
                (nothing is stepped), or bad ``id``.
            RuntimeError: a stale env (advanced while not in ``id``) is stepped before its reset.
            unilab_gym.vector_env.FinishedEnvError: with autoreset ``"Disabled"``, an env of ``id`` finished
                and was not reset (nothing is stepped).
        """
        self._assert_is_not_closed()
        ids = self._ids(id)
        if action is None:
            raise ValueError("action must not be None: TianshouVectorEnv is synchronous")
        action = np.asarray(action)
        if len(action) != len(ids):
            raise ValueError(f"got {len(action)} actions for {len(ids)} envs")
        if self._stale[ids].any():
            stale = ids[self._stale[ids]].tolist()
            raise RuntimeError(
                f"envs {stale} advanced (with zero actions) while other envs were stepped alone; "
                "reset them (reset(env_id=...)) before stepping them again"
            )
        full = np.zeros((self.env_num, *self._action_shape))
        try:
            full[ids] = action
        except (TypeError, ValueError):
            raise ValueError(f"actions must have shape {(len(ids), *self._action_shape)}, got {action.shape}") from None
        idle = np.ones(self.env_num, dtype=bool)
        idle[ids] = False
        # the idle envs advance with zero actions (and are marked stale), finished or not
        obs, rew, terminated, truncated, info = self.venv._step(full, allow_finished=idle)
        self._stale |= idle
        infos = unbatch_infos(info, self.env_num)
        for j in ids.tolist():
            infos[j]["env_id"] = j
        return (
            _rows(obs, ids),
            rew[ids],
            terminated[ids],
            truncated[ids],
            _object_array([infos[j] for j in ids.tolist()]),
        )

    def seed(self, seed: int | list[int] | None = None) -> list[list[int] | None]:
        """Seed env ``i`` and its action space with ``seed + i`` (or ``seed[i]``) and reset all envs.

        Returns:
            ``[[seed_0], [seed_1], ...]`` as Tianshou's ``DummyVectorEnv`` returns.

        Raises:
            ValueError: a seed that is not a non-negative int (``bool`` is refused), or a list of the wrong length.
        """
        self._assert_is_not_closed()
        if seed is None:
            seeds: list[int | None] = [None] * self.env_num
        elif isinstance(seed, numbers.Number):
            first = check_seed("seed", seed)
            seeds = [first + i for i in range(self.env_num)]
        else:
            seeds = _seed_list(seed)
        self.venv.reset(seed=seeds)  # validates the list
        for space, s in zip(self._action_spaces, seeds):
            space.seed(s)
        self._stale[:] = False
        # Tianshou annotates list[int] | None, but its DummyVectorEnv returns [None] for an unseeded env too
        return [[s] for s in seeds]  # type: ignore[list-item]

    # Tianshou annotates list[Any]; a lazy Sequence keeps Collector(render=...), which discards the result,
    # from drawing all N frames on every step.
    def render(self, **kwargs: Any) -> Sequence[np.ndarray | None]:  # type: ignore[override]
        """The N frames ((240, 320, 3) uint8, env ``i`` drawn when indexed), or N ``None`` without a render mode."""
        self._assert_is_not_closed()
        frames = self.venv.render()
        return [None] * self.env_num if frames is None else frames

    def close(self) -> None:
        """Close the vector env (its pybullet worlds)."""
        self._assert_is_not_closed()
        self.venv.close()
        self.is_closed = True

    def _ids(self, id: int | list[int] | np.ndarray | None) -> np.ndarray:
        ids = np.asarray(self._wrap_id(id))
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
            raise ValueError(f"env ids must be an int or a sequence of ints, got {id!r}")
        ids = ids.astype(np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.env_num):
            raise ValueError(f"env ids must be in [0, {self.env_num}), got {ids.tolist()}")
        if np.unique(ids).size != ids.size:
            raise ValueError(f"env ids must be distinct, got {ids.tolist()}")
        return ids


def make_tianshou_env(env_id: str, num_envs: int, seed: int | None = None, **env_kwargs: Any) -> TianshouVectorEnv:
    """Create a :class:`TianshouVectorEnv` of ``num_envs`` envs of a UniLab id.

    Args:
        env_id: a registered UniLab id, e.g. ``"UniLab/Quadruped-v0"``.
        num_envs: number of envs N (>= 1).
        seed: if given, ``envs.seed(seed)``: env ``i`` and its action space get ``seed + i``.
        **env_kwargs: arguments of the vector env (``envs_per_cluster``, ``render_mode``,
            ``max_episode_steps``, task arguments ...).

    Raises:
        TypeError: ``env_id`` does not make a ``UniLabVectorEnv``.
        ValueError: invalid env arguments (raised by the env, naming the argument).
    """
    venv = make_unilab_vector_env(
        env_id, num_envs, "make_tianshou_env", "tianshou.env.DummyVectorEnv / SubprocVectorEnv", **env_kwargs
    )
    envs = TianshouVectorEnv(venv)
    if seed is not None:
        envs.seed(seed)
    return envs


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
    """The parts of a ``SharedVectorReplayBuffer`` state its checksum covers: sizes, counters and
    every numeric array of ``_meta`` (``info`` / ``policy`` hold Python objects and are not covered)."""
    meta = state["_meta"]
    parts: list[Any] = [
        state["maxsize"],
        state["_obs_shape"],
        state["_act_dim"],
        state["_lengths"],
        state["last_index"],
    ]
    parts.append([(int(b._insertion_idx), int(b._size)) for b in state["buffers"]])
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


def _seed_list(seed: Any) -> list[int | None]:
    """A per-env seed list (its entries are checked by the env), or ``ValueError`` if ``seed`` is no sequence."""
    if not isinstance(seed, (list, tuple, np.ndarray)):
        raise ValueError(f"seed must be an int, a list of ints/None, or None; got {seed!r}")
    return list(seed)
