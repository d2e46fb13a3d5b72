"""``SharedReplayBuffer``: Stable-Baselines3's ``ReplayBuffer`` on a packed shared-memory ring.

Drop-in for SB3's off-policy algorithms, for every observation and action space SB3 supports
(``Box`` of any dtype, ``Discrete``, ``MultiDiscrete``, ``MultiBinary``, and a ``Dict`` of them,
where SB3 would use its ``DictReplayBuffer``)::

    from stable_baselines3 import SAC
    from unilab_gym import SharedReplayBuffer

    model = SAC("MlpPolicy", env, replay_buffer_class=SharedReplayBuffer)

Collector processes may write into the same ring while the learner trains::

    handle = model.replay_buffer.handle                      # picklable, send it anywhere
    storage = unilab_gym.replay.ReplayStorage.attach(handle)  # in the collector process
    storage.add(obs, next_obs, action, reward, terminated, truncated)

Storage: one row per transition, ``capacity = (buffer_size // n_envs) * n_envs`` rows (SB3's
total capacity); SB3's ``[pos, env]`` slot is row ``pos * n_envs + env``. Fields follow
:class:`unilab_gym.replay.ReplayLayout`, each in its own dtype: observations in the space's
dtype (a ``uint8`` image stays ``uint8``), actions in SB3's (float64 is stored as float32, as SB3
does). The ``terminated`` field holds SB3's bootstrap cut, ``done * (1 - timeout)`` (``timeout`` =
``info["TimeLimit.truncated"]`` when ``handle_timeout_termination``, else 0), and ``truncated``
holds ``done * TimeLimit.truncated``.

A model built with ``replay_buffer_class=SharedReplayBuffer`` saves as a plain SB3 file:
``model.save`` leaves out ``replay_buffer_class``, ``replay_buffer_kwargs`` and
``optimize_memory_usage`` (SB3 cloudpickles the class, which would make ``SAC.load`` import
unilab_gym), so ``SAC.load`` works without unilab_gym and gives SB3's default buffer
(``ReplayBuffer``, or ``DictReplayBuffer`` for a ``Dict`` space). To train on from a
``SharedReplayBuffer`` again, pass the settings to the load:
``SAC.load(path, env, replay_buffer_class=SharedReplayBuffer, optimize_memory_usage=True)``.
The saved replay (``save_replay_buffer``) is a ``SharedReplayBuffer`` pickle: it needs unilab_gym.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import BaseBuffer, ReplayBuffer
from stable_baselines3.common.type_aliases import DictReplayBufferSamples, ReplayBufferSamples
from stable_baselines3.common.utils import get_device
from stable_baselines3.common.vec_env import VecNormalize

from unilab_gym.replay import ReplayLayout, ReplayStorage
from unilab_gym.replay.status import check_status_weights
from unilab_gym.replay.storage import ReplayHandle
from unilab_gym.replay.torch_sampler import TorchSampler
from unilab_gym.sb3 import _sb3_private
from unilab_gym.validation import REAL_DTYPE_KINDS, check_positive_int, check_real_array

__all__ = ["SharedReplayBuffer"]

_LEAF_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)


#: what a model with a SharedReplayBuffer leaves out of its saved file (see the module docstring).
UNSAVED_MODEL_PARAMS = ("replay_buffer_class", "replay_buffer_kwargs", "optimize_memory_usage", "_excluded_save_params")


def _seed_from_global_state() -> np.random.SeedSequence:
    """A seed derived from numpy's global RNG state *without advancing it*.

    SB3's ``seed=`` (which seeds numpy before building the buffer) fixes our sampling stream, and the rest of
    SB3 sees the same global random stream as with its own buffer.
    """
    mt19937 = np.random.get_state(legacy=False)["state"]
    return np.random.SeedSequence([int(mt19937["pos"]), *mt19937["key"].tolist()])


def _available_memory() -> int | None:
    """Bytes of available RAM (``psutil``, as SB3's ``ReplayBuffer`` checks it), or ``None`` without psutil."""
    try:
        import psutil
    except ImportError:  # pragma: no cover
        return None
    return int(psutil.virtual_memory().available)


def _leaf_ok(space: spaces.Space) -> bool:
    return isinstance(space, _LEAF_SPACES) and space.dtype is not None and space.dtype.kind in REAL_DTYPE_KINDS


def _check_observation_space(space: spaces.Space) -> None:
    if _leaf_ok(space):
        return
    if isinstance(space, spaces.Dict) and len(space.spaces) > 0 and all(_leaf_ok(s) for s in space.spaces.values()):
        return
    raise ValueError(
        "SharedReplayBuffer supports the observation spaces SB3's replay buffers do: Box (any numeric "
        "dtype), Discrete, MultiDiscrete, MultiBinary, and a Dict of them (not nested); got "
        f"{space}. Flatten it (e.g. gymnasium.wrappers.FlattenObservation) or use SB3's own buffer."
    )


def _check_action_space(space: spaces.Space) -> None:
    if not _leaf_ok(space):
        raise ValueError(
            f"SharedReplayBuffer supports Box, Discrete, MultiDiscrete and MultiBinary action spaces, got {space}"
        )


def _box(shape: tuple[int, ...], dtype: str) -> spaces.Box:
    """A ``Box`` of every value of ``dtype`` (a space for a reader that was given none)."""
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return spaces.Box(-np.inf, np.inf, shape, dt)
    info = np.iinfo(dt) if dt.kind in "iu" else np.iinfo(np.uint8)
    return spaces.Box(info.min, info.max, shape, dt)


def _space_of(layout: ReplayLayout) -> spaces.Space:
    """The observation space a reader uses by default: ``Box`` (``Dict`` of them) of the stored fields."""
    if layout.is_dict:
        return spaces.Dict({key: _box(shape, dt) for key, shape, dt in layout.obs_spec})
    _, shape, dt = layout.obs_spec[0]
    return _box(shape, dt)


def _obs_layout(space: spaces.Space, shape: Any) -> Any:
    """The ``ReplayLayout`` observation spec of an SB3 observation space (its dtype, SB3's shape)."""
    if isinstance(space, spaces.Dict):
        return {key: (tuple(shape[key]), np.dtype(sub.dtype).name) for key, sub in space.spaces.items()}
    return tuple(shape), np.dtype(space.dtype).name


class SharedReplayBuffer(ReplayBuffer):
    """SB3 ``ReplayBuffer`` whose transitions live in a packed shared-memory block.

    Same constructor, ``add`` / ``sample`` semantics, ``pos`` / ``full`` / ``size()``, public
    storage arrays (:attr:`observations`, :attr:`next_observations`, :attr:`actions`,
    :attr:`rewards`, :attr:`dones`, :attr:`timeouts`) and sampled tensors (dtypes, shapes,
    values) as SB3's ``ReplayBuffer``, or as its ``DictReplayBuffer`` for a ``Dict`` observation
    space (samples are then ``DictReplayBufferSamples``). Sampling is one gather from the packed
    block. Other processes attach with :attr:`handle` and add transitions concurrently (see
    :mod:`unilab_gym.replay.storage`).

    Args:
        buffer_size: total transitions kept (SB3: ``buffer_size // n_envs`` steps of ``n_envs``
            transitions).
        observation_space: ``Box`` (any numeric dtype and shape), ``Discrete``, ``MultiDiscrete``,
            ``MultiBinary``, or a ``Dict`` of those; stored in its own dtype.
        action_space: ``Box``, ``Discrete``, ``MultiDiscrete`` or ``MultiBinary``; stored in SB3's
            action dtype (float64 becomes float32, SB3 GH#1572).
        device: torch device of the sampled tensors (``"auto"``, ``"cpu"``, ``"cuda"``).
        n_envs: number of parallel environments of each ``add``.
        optimize_memory_usage: store each observation once (the memory-optimized layout of
            :class:`~unilab_gym.replay.ReplayLayout`): a row's next observation is the same env's
            next row, and the final observation of every episode end, terminated or truncated,
            is kept in a side table, so a truncated transition bootstraps from its true final
            observation. Works with ``handle_timeout_termination=True``, unlike SB3's (SB3 #934).
        handle_timeout_termination: a time-limit end (``info["TimeLimit.truncated"]``) does not
            cut the bootstrap.
        extra_dims: optional extra float32 per-transition column groups ``{name: dim}``, written
            by collectors through :attr:`storage` (SB3's ``add`` writes zeros there).
        seed: seed of the sampling generator :attr:`rng` (``sample`` never touches numpy's global
            RNG; SB3's does). Default: derived from numpy's global RNG state without advancing
            it, so SB3's ``seed=`` makes sampling reproducible.
        staging: host staging buffer for device copies; default on for CUDA (pinned memory,
            ``non_blocking``), off for CPU.
        status_weights: ``None`` (default: uniform, the unbiased choice) or
            ``{"normal": w0, "terminated": w1, "truncated": w2}`` (missing keys weigh 1.0): each
            batch draws statuses in proportion to the weights times their counts (HybridReplay).
            Any non-uniform weighting biases the learning target; see :mod:`unilab_gym.replay.status`.
        final_obs_capacity: side-table entries of the optimized layout (default
            ``max(n_envs, capacity // 25)``: 8 bytes per transition for 48 float32
            observations, enough for episodes of about 25 steps or more). No episode end is ever
            dropped while its row can be sampled: if the table must reuse the entry of a row still
            in the ring, that row and every older one are retired with it, so terminal and
            truncated transitions keep their share of the samples and the ring holds fewer rows
            (a ``RuntimeWarning`` naming ``final_obs_capacity``; counted by
            ``storage.final_obs_evictions``, the window starts at ``storage.oldest``).
            ``unilab_gym.replay.final_obs_capacity_for(capacity, shortest episode, n_envs)`` is
            large enough for the whole ring (``capacity + 2 * n_envs`` if any episode may last
            one step).

    Raises:
        ValueError: for an unsupported space (named in the message) or a bad size.
    """

    def __init__(
        self,
        buffer_size: int,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        device: th.device | str = "auto",
        n_envs: int = 1,
        optimize_memory_usage: bool = False,
        handle_timeout_termination: bool = True,
        *,
        extra_dims: Mapping[str, int] | None = None,
        seed: int | None = None,
        staging: bool | None = None,
        final_obs_capacity: int | None = None,
        status_weights: Mapping[str, float] | None = None,
        _attach: tuple[ReplayHandle, bool] | None = None,
    ) -> None:
        """Check the spaces and options and create the shared storage (arguments: see the class docstring)."""
        self.status_weights = check_status_weights(status_weights)
        _check_observation_space(observation_space)
        _check_action_space(action_space)
        n_envs = check_positive_int("n_envs", n_envs)
        buffer_size = check_positive_int("buffer_size", buffer_size)
        self._storage: ReplayStorage | None = None
        self._sampler: TorchSampler | None = None
        self._staging = staging
        # BaseBuffer, not ReplayBuffer.__init__: SB3's would allocate its own arrays.
        BaseBuffer.__init__(self, buffer_size, observation_space, action_space, device, n_envs=n_envs)
        self.buffer_size = max(buffer_size // self.n_envs, 1)
        self.optimize_memory_usage = bool(optimize_memory_usage)
        capacity = self.buffer_size * self.n_envs
        final_obs = 0
        if self.optimize_memory_usage:
            default = max(self.n_envs, capacity // 25)
            final_obs = check_positive_int(
                "final_obs_capacity", default if final_obs_capacity is None else final_obs_capacity
            )
        self.handle_timeout_termination = handle_timeout_termination
        self.is_dict = isinstance(observation_space, spaces.Dict)
        self.action_dtype = np.dtype(self._maybe_cast_dtype(action_space.dtype))
        self.layout = ReplayLayout(
            _obs_layout(observation_space, self.obs_shape),
            ((self.action_dim,), self.action_dtype.name),
            extra_dims or {},
            final_obs=final_obs,
        )
        self.obs_dim = self.layout.obs_dim
        self._obs_shapes: dict[str, tuple[int, ...]] = {
            key: shape for key, shape, _ in self.layout.obs_spec
        }  # key "" for a non-Dict space
        self._obs_batch_shape = (self.n_envs, *self.obs_shape) if not self.is_dict else ()
        self._obs_rows_shape = (self.n_envs, self.obs_dim)
        self._obs_dtype = np.dtype(self.layout.obs_spec[0][2])
        self._act_rows_shape = (self.n_envs, self.action_dim)
        self._vec_shape = (self.n_envs,)
        self._zeros = np.zeros(self.n_envs, dtype=np.float32)
        # float32 layouts: one float32 gather, then column slices per field (start, stop, shape)
        self._columns = (
            {name: (self.layout.offset(name) // 4, shape) for name, shape, _ in self.layout.fields}
            if self.layout.float32_columns
            else None
        )
        # non-Dict float32 layouts: obs | next_obs | action | reward | terminated | truncated [| extras]
        self._split_sizes: list[int] | None = None
        if self._columns is not None and not self.is_dict:
            self._split_sizes = [self.obs_dim, self.obs_dim, self.action_dim, 1, 1, 1] + (
                [self.layout.extra_dim] if self.layout.extras else []
            )
        self._reshape_obs = self.obs_shape != (self.obs_dim,)
        self.rng = np.random.default_rng(_seed_from_global_state() if seed is None else seed)
        if _attach is not None:  # see attach()
            handle, read_only = _attach
            if handle.layout != self.layout or handle.capacity != capacity:
                raise ValueError(
                    f"the spaces given to SharedReplayBuffer.attach give the layout {self.layout} of "
                    f"{capacity} rows, the replay has {handle.layout} of {handle.capacity} rows"
                )
            self._storage = ReplayStorage.attach(handle, read_only=read_only)
            return
        needed, available = capacity * self.layout.row_nbytes + self.layout.side_nbytes, _available_memory()
        if available is not None and needed > available:
            warnings.warn(
                "This system does not have apparently enough memory to store the complete "
                f"replay buffer {needed / 1e9:.2f}GB > {available / 1e9:.2f}GB",
                stacklevel=2,
            )
        self._storage = ReplayStorage(self.layout, capacity)
        building = _sb3_private.algorithm_building(sys._getframe(1), SharedReplayBuffer)
        if building is not None:  # model.save leaves out the replay settings
            _sb3_private.exclude_from_save(building, UNSAVED_MODEL_PARAMS)

    @classmethod
    def attach(
        cls,
        handle: ReplayHandle,
        read_only: bool = True,
        *,
        n_envs: int = 1,
        device: th.device | str = "auto",
        seed: int | None = None,
        observation_space: spaces.Space | None = None,
        action_space: spaces.Space | None = None,
        handle_timeout_termination: bool = True,
        status_weights: Mapping[str, float] | None = None,
        staging: bool | None = None,
    ) -> SharedReplayBuffer:
        """Open another process's replay (``buffer.handle``) as a ``SharedReplayBuffer``, zero copy.

        Several learners can then train from one replay, each in its own process, while its
        owner's collectors fill it. A reader never unlinks the segment, and when it is killed
        (even by SIGKILL) nothing is left behind (see :meth:`ReplayStorage.attach`).

        Args:
            handle: the owner's :attr:`handle` (picklable: send it through a Queue or Pipe).
            read_only: map the replay read-only (default): ``sample`` works, ``add`` and
                ``reset`` raise ``PermissionError``.
            n_envs: SB3's ``n_envs`` for the public arrays and ``pos`` (must divide the capacity).
            device: torch device of the sampled tensors.
            seed: seed of this reader's sampling generator (give each reader its own).
            observation_space: the replay's observation space, for ``VecNormalize`` and SB3's
                checks; default: ``Box`` spaces (``Dict`` of them) of the stored shapes and dtypes.
            action_space: likewise (default: a ``Box`` of the stored action shape and dtype).
            handle_timeout_termination: as the owner's.
            status_weights: this reader's status weights (see the constructor).
            staging: as the constructor's.

        Returns:
            A buffer whose :attr:`storage` is attached, not owned.

        Raises:
            ValueError: if ``handle`` is not a ``ReplayHandle``, ``n_envs`` does not divide its
                capacity, or the given spaces do not give the replay's layout.
            SegmentNotFoundError: if the replay was closed.
            ReplayOwnerGoneError: if its owner process is gone.
        """
        if not isinstance(handle, ReplayHandle):
            raise ValueError(f"attach needs a ReplayHandle (buffer.handle), got {type(handle).__name__}")
        n_envs = check_positive_int("n_envs", n_envs)
        if handle.capacity % n_envs:
            raise ValueError(f"n_envs = {n_envs} does not divide the replay's capacity {handle.capacity}")
        L = handle.layout
        self = cls.__new__(cls)
        self.__init__(  # type: ignore[misc]
            handle.capacity,
            observation_space if observation_space is not None else _space_of(L),
            action_space if action_space is not None else _box(L.act_spec[0], L.act_spec[1]),
            device,
            n_envs,
            bool(L.final_obs),
            handle_timeout_termination,
            extra_dims=dict(L.extras),
            seed=seed,
            staging=staging,
            final_obs_capacity=L.final_obs or None,
            status_weights=status_weights,
            _attach=(handle, bool(read_only)),
        )
        return self

    # ---- shared storage -----------------------------------------------------------------
    @property
    def storage(self) -> ReplayStorage:
        """The shared ring (owned by this buffer)."""
        if self._storage is None:  # pragma: no cover - only during __init__
            raise RuntimeError("SharedReplayBuffer is not initialised")
        return self._storage

    @property
    def handle(self) -> ReplayHandle:
        """Picklable handle; ``ReplayStorage.attach(handle)`` in a collector process."""
        return self.storage.handle

    def close(self) -> None:
        """Release and unlink the shared segment (also done at garbage collection / exit)."""
        if self._storage is not None:
            self._storage.close()

    # ---- SB3's public storage arrays: views of the shared block ------------------------------------
    def _steps_view(self, name: str) -> np.ndarray:
        view = self.storage.field(name)
        return view.reshape(self.buffer_size, self.n_envs, *view.shape[1:])

    def _obs_view(self, base: str) -> np.ndarray | dict[str, np.ndarray]:
        L = self.layout
        if not self.is_dict:
            return self._steps_view(base)
        return {key: self._steps_view(L.obs_field(key, next_obs=base == "next_obs")) for key in self._obs_shapes}

    @property
    def observations(self) -> np.ndarray | dict[str, np.ndarray]:  # type: ignore[override]
        """SB3's ``observations``: a ``(buffer_size, n_envs, *obs_shape)`` view of the shared block.

        In the space's dtype; ``[pos, env]`` is row ``pos * n_envs + env``; a dict of such views, one per key, for a
        Dict space. Writes go to the shared block.
        """
        return self._obs_view("obs")

    @property
    def next_observations(self) -> np.ndarray | dict[str, np.ndarray] | None:  # type: ignore[override]
        """SB3's ``next_observations``: as :attr:`observations`, for the next observation.

        At an episode end, the episode's final observation. ``None`` with ``optimize_memory_usage``, as SB3 (the next
        observations are the successor rows and the side table).
        """
        if self.optimize_memory_usage:
            return None
        return self._obs_view("next_obs")

    @property
    def actions(self) -> np.ndarray:  # type: ignore[override]
        """SB3's ``actions``: ``(buffer_size, n_envs, action_dim)`` in SB3's action dtype, a view."""
        return self._steps_view("action")

    @property
    def rewards(self) -> np.ndarray:  # type: ignore[override]
        """SB3's ``rewards``: ``(buffer_size, n_envs)`` float32, a view."""
        return self._steps_view("reward")

    @property
    def timeouts(self) -> np.ndarray:  # type: ignore[override]
        """SB3's ``timeouts``: ``(buffer_size, n_envs)`` float32, 1.0 where an episode ended on its time limit.

        A view of the ``truncated`` field. With ``handle_timeout_termination=False``, SB3 records no timeouts: a zero
        array (a copy).
        """
        if not self.handle_timeout_termination:
            return np.zeros((self.buffer_size, self.n_envs), np.float32)
        return self._steps_view("truncated")

    @property
    def dones(self) -> np.ndarray:  # type: ignore[override]
        """SB3's ``dones``: ``(buffer_size, n_envs)`` float32, 1.0 where an episode ended (terminated or truncated).

        The block stores SB3's bootstrap cut ``done * (1 - timeout)`` and the time-limit flag, so this is computed
        from those two views: a copy (SB3's optimized-memory ``learn`` marks the last step done in it; our rows need
        no such mark).
        """
        return np.maximum(self._steps_view("terminated"), self._steps_view("truncated"))

    # ---- SB3 state: derived from the shared committed counter ------------------------------------
    @property
    def device(self) -> th.device:
        """Device of the sampled tensors (SB3's ``load_replay_buffer`` reassigns it)."""
        return self._device

    @device.setter
    def device(self, value: th.device | str) -> None:
        # as SB3's buffers: "auto" is resolved, any other device is kept as given
        self._device = get_device(value) if str(value) == "auto" else th.device(value)
        self._sampler = None

    def _committed_steps(self) -> int:
        return self.storage.committed // self.n_envs

    @property
    def pos(self) -> int:
        """Next step slot SB3 would write: ``(committed // n_envs) % buffer_size``."""
        if self._storage is None:
            return 0
        return self._committed_steps() % self.buffer_size

    @pos.setter
    def pos(self, value: int) -> None:
        if self._storage is not None and value != self.pos:
            raise AttributeError("SharedReplayBuffer.pos is derived from the shared committed counter; use reset()")

    @property
    def full(self) -> bool:
        """Whether ``buffer_size`` steps (``buffer_size * n_envs`` rows) were ever committed.

        Setting it to ``True``, as SB3's tests do, declares every row valid (rows never written
        hold zeros, as SB3's arrays do); the next add then starts at step 0. Setting ``False``
        on a full buffer raises ``AttributeError`` (use :meth:`reset`).
        """
        if self._storage is None:
            return False
        return self._committed_steps() >= self.buffer_size

    @full.setter
    def full(self, value: bool) -> None:
        if self._storage is None or bool(value) == self.full:
            return
        if value:
            self.storage.fill()
            return
        raise AttributeError("SharedReplayBuffer.full is derived from the shared committed counter; use reset()")

    def size(self) -> int:
        """Steps stored, as SB3: ``buffer_size`` once full, else ``pos``."""
        steps = self._committed_steps()
        return self.buffer_size if steps >= self.buffer_size else steps

    def reset(self) -> None:
        """Forget every transition.

        Raises:
            RuntimeError: if a collector is writing at this moment.
        """
        self.storage.reset()

    # ---- add -------------------------------------------------------------------------------------
    def add(
        self,
        obs: np.ndarray | dict[str, np.ndarray],
        next_obs: np.ndarray | dict[str, np.ndarray],
        action: np.ndarray,
        reward: np.ndarray,
        done: np.ndarray,
        infos: list[dict[str, Any]],
    ) -> None:
        """Add one step of ``n_envs`` transitions (SB3 semantics).

        Args:
            obs: ``(n_envs, *obs_shape)`` (or ``obs_shape`` when ``n_envs == 1``; ``(n_envs,)``
                for ``Discrete``); a dict of such arrays for a Dict space. Cast to the stored dtype.
            next_obs: same shape; for a finished episode, SB3's off-policy loop has already put
                ``infos[i]["terminal_observation"]`` here.
            action: ``n_envs * action_dim`` values (reshaped to ``(n_envs, action_dim)``).
            reward: ``(n_envs,)``.
            done: ``(n_envs,)``: ``terminated or truncated``.
            infos: ``n_envs`` dicts; ``info["TimeLimit.truncated"]`` marks time-limit ends.

        Raises:
            ValueError: on a wrong shape, dtype, Dict key set or ``infos`` length; nothing is written.
        """
        n, real = self.n_envs, REAL_DTYPE_KINDS
        # fast path: numpy arrays of exactly SB3's shapes; anything else goes through the checks
        dict_obs = self.is_dict
        if dict_obs:
            obs, next_obs = self._dict_rows("obs", obs), self._dict_rows("next_obs", next_obs)
        else:
            if not (type(obs) is np.ndarray and obs.shape == self._obs_rows_shape and obs.dtype.kind in real):
                obs = self._obs_rows("obs", obs)
            if not (
                type(next_obs) is np.ndarray and next_obs.shape == self._obs_rows_shape and next_obs.dtype.kind in real
            ):
                next_obs = self._obs_rows("next_obs", next_obs)
        if not (type(action) is np.ndarray and action.shape == self._act_rows_shape and action.dtype.kind in real):
            action = self._action_rows(action)
        if not (type(reward) is np.ndarray and reward.shape == self._vec_shape and reward.dtype.kind in real):
            reward = self._vector("reward", reward)
        if not (type(done) is np.ndarray and done.shape == self._vec_shape and done.dtype.kind in real):
            done = self._vector("done", done)
        if len(infos) != n:
            raise ValueError(f"infos must be a list of n_envs = {n} dicts, got {len(infos)}")
        # SB3 samples dones * (1 - timeouts): only the infos of finished envs matter
        terminated, truncated = done, self._zeros
        for i in done.nonzero()[0].tolist():
            if infos[i].get("TimeLimit.truncated", False):
                if truncated is self._zeros:
                    truncated = np.zeros(n, dtype=np.float32)
                    terminated = done.astype(np.float32)
                truncated[i] = done[i]
                if self.handle_timeout_termination:
                    terminated[i] = 0.0
        self.storage.add(obs, next_obs, action, reward, terminated, truncated, validate=dict_obs)

    def _obs_rows(self, name: str, value: Any, key: str = "") -> np.ndarray:
        arr = check_real_array(name, value)
        n, shape = self.n_envs, self._obs_shapes[key]
        dim = int(np.prod(shape))
        ok = arr.shape == (n, *shape) or (n == 1 and arr.shape == shape) or (shape == (1,) and arr.shape == (n,))
        if not ok:
            raise ValueError(f"{name} must have shape {(n, *shape)}, got {arr.shape}")
        return arr.reshape(n, dim)

    def _dict_rows(self, name: str, value: Any) -> dict[str, np.ndarray]:
        keys = list(self._obs_shapes)
        if not isinstance(value, Mapping) or set(value) != set(keys):
            got = sorted(value) if isinstance(value, Mapping) else type(value).__name__
            raise ValueError(f"{name} must be a dict with exactly the keys {keys}, got {got}")
        return {key: self._obs_rows(f"{name}[{key!r}]", value[key], key) for key in keys}

    def _action_rows(self, value: Any) -> np.ndarray:
        arr = check_real_array("action", value)
        if arr.size != self.n_envs * self.action_dim:  # SB3 reshapes any layout of that size
            raise ValueError(
                f"action must hold n_envs * action_dim = {self.n_envs * self.action_dim} values "
                f"(shape {self._act_rows_shape}), got shape {arr.shape}"
            )
        return arr.reshape(self._act_rows_shape)

    def _vector(self, name: str, value: Any) -> np.ndarray:
        arr = check_real_array(name, value)
        if arr.size != self.n_envs or arr.ndim > 2:
            raise ValueError(f"{name} must have shape ({self.n_envs},), got {arr.shape}")
        return arr.reshape(self.n_envs)

    # ---- sample ----------------------------------------------------------------------------------
    def sample(  # type: ignore[override]
        self, batch_size: int, env: VecNormalize | None = None
    ) -> ReplayBufferSamples | DictReplayBufferSamples:
        """Draw ``batch_size`` committed transitions uniformly with :attr:`rng`.

        Args:
            batch_size: ``B >= 1``.
            env: a ``VecNormalize`` to normalize observations and rewards through, or ``None``.

        Returns:
            SB3 ``ReplayBufferSamples`` (``DictReplayBufferSamples`` for a Dict space) on
            :attr:`device`: ``observations`` and ``next_observations`` ``(B, *obs_shape)`` in the
            space's dtype (dicts of them for a Dict space), ``actions`` ``(B, action_dim)`` in
            SB3's action dtype, ``dones`` and ``rewards`` ``(B, 1)`` float32.

        Raises:
            ValueError: if the buffer is empty or ``batch_size < 1``.
        """
        if env is not None or self._columns is None or self.status_weights is not None:
            _, fields = self.storage.sample_fields(batch_size, self.rng, status_weights=self.status_weights)
            return self._samples_from_fields(fields, env)
        if self._sampler is None:
            self._sampler = TorchSampler(self.layout.width, self.device, staging=self._staging)
        _, rows_t = self._sampler.sample(self.storage, batch_size, self.rng)
        return self._split(rows_t)

    def _pack(self, fields: Mapping[str, Any], convert: Any) -> ReplayBufferSamples | DictReplayBufferSamples:
        """SB3 samples from per-field arrays or tensors; ``convert(name, value)`` finishes each one."""
        L = self.layout
        if self.is_dict:
            obs = {key: convert("obs", fields[L.obs_field(key)]) for key in self._obs_shapes}
            nxt = {key: convert("obs", fields[L.obs_field(key, next_obs=True)]) for key in self._obs_shapes}
            rest = (convert("action", fields["action"]), convert("done", fields["terminated"]))
            return DictReplayBufferSamples(obs, rest[0], nxt, rest[1], convert("reward", fields["reward"]))
        return ReplayBufferSamples(
            convert("obs", fields["obs"]),
            convert("action", fields["action"]),
            convert("obs", fields["next_obs"]),
            convert("done", fields["terminated"]),
            convert("reward", fields["reward"]),
        )

    def _split(self, rows: th.Tensor) -> ReplayBufferSamples | DictReplayBufferSamples:
        columns, batch = self._columns, rows.shape[0]
        assert columns is not None
        if self._split_sizes is not None:  # the 48-float path: one split, as fast as before
            obs, next_obs, actions, reward, terminated = th.split_with_sizes(rows, self._split_sizes, dim=1)[:5]
            if self._reshape_obs:
                shape = (batch, *self.obs_shape)
                obs, next_obs = obs.reshape(shape), next_obs.reshape(shape)
            return ReplayBufferSamples(obs, actions, next_obs, terminated, reward)

        def field(name: str) -> th.Tensor:
            start, shape = columns[name]
            size = int(np.prod(shape))
            part = rows[:, start : start + size]
            return part if len(shape) == 1 else part.reshape(batch, *shape)

        fields = {name: field(name) for name in columns}
        return self._pack(fields, lambda kind, value: value.reshape(batch, 1) if kind in ("done", "reward") else value)

    def _samples_from_fields(
        self, fields: dict[str, np.ndarray], env: VecNormalize | None
    ) -> ReplayBufferSamples | DictReplayBufferSamples:
        batch = fields["reward"].shape[0]
        if env is not None:
            L = self.layout
            for base in ("obs", "next_obs"):
                if self.is_dict:
                    names = {key: L.obs_field(key, next_obs=base == "next_obs") for key in self._obs_shapes}
                    normed = self._normalize_obs({key: fields[f] for key, f in names.items()}, env)
                    assert isinstance(normed, dict)
                    fields.update({names[key]: value for key, value in normed.items()})
                else:
                    fields[base] = self._normalize_obs(fields[base], env)  # type: ignore[assignment]
            fields["reward"] = self._normalize_reward(fields["reward"].reshape(batch, 1), env)

        def convert(kind: str, value: np.ndarray) -> th.Tensor:
            if kind in ("done", "reward"):
                value = value.reshape(batch, 1)
            return self.to_torch(np.ascontiguousarray(value))

        return self._pack(fields, convert)

    def _get_samples(  # type: ignore[override]
        self, batch_inds: np.ndarray, env: VecNormalize | None = None
    ) -> ReplayBufferSamples | DictReplayBufferSamples:
        """SB3's hook: transitions ``[batch_inds, env_indices]``.

        ``env_indices`` are drawn from numpy's global RNG exactly as SB3 does.

        Raises:
            ValueError: if a requested slot holds no committed transition.
            RuntimeError: if a collector overwrote a requested row during the copy.
        """
        env_indices = np.random.randint(0, high=self.n_envs, size=(len(batch_inds),))
        rows = np.asarray(batch_inds, dtype=np.int64) * self.n_envs + env_indices
        seq = self.storage.seq_of_rows(rows)
        if env is not None or self._columns is None:
            fields, ok = self.storage.gather_fields(seq)
            if not ok.all():
                raise RuntimeError(
                    f"requested replay row {int(rows[~ok][0])} was overwritten while being read, or (optimized "
                    "layout) its next observation is not known yet"
                )
            return self._samples_from_fields(fields, env)
        data = self.storage.gather(seq)
        if self.storage.overwritten(seq).any():
            raise RuntimeError("requested replay rows were overwritten by a collector while being read")
        return self._split(th.from_numpy(data).to(self.device))

    # ---- pickling: a plain copy ----------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        """A picklable copy: the transitions themselves (``storage.to_state()``) instead of the shared segment.

        Raises:
            ValueError: the buffer is closed.
        """
        state = self.__dict__.copy()
        storage = state.pop("_storage")
        if storage is None or storage.closed:
            raise ValueError("cannot pickle a closed SharedReplayBuffer: its transitions are gone")
        state["_sampler"] = None
        state["_storage_state"] = storage.to_state()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Restore a pickled copy (SB3's ``load_replay_buffer``) into a new shared segment.

        The storage state is checked as :meth:`ReplayStorage.from_state` does (checksum,
        ``committed <= head``, slot table, row shapes), and its layout must be this buffer's
        (``obs_dim``, ``action_dim``, ``buffer_size * n_envs``, then every field's shape and dtype).

        Raises:
            ValueError: on a corrupted or inconsistent copy; nothing is created, and SB3's
                ``load_replay_buffer`` keeps the model's current buffer.
        """
        state = dict(state)
        storage_state = state.pop("_storage_state", None)
        if not isinstance(storage_state, Mapping):
            raise ValueError("not a pickled SharedReplayBuffer: it has no replay storage state")
        layout = storage_state.get("layout")
        try:
            expected = (state["obs_dim"], state["action_dim"], state["buffer_size"] * state["n_envs"])
        except (KeyError, TypeError) as e:
            raise ValueError(f"not a pickled SharedReplayBuffer: missing or bad {e}") from None
        found = (getattr(layout, "obs_dim", None), getattr(layout, "act_dim", None), storage_state.get("capacity"))
        if found != expected:
            raise ValueError(
                "pickled SharedReplayBuffer is inconsistent: its storage has (obs_dim, act_dim, capacity) = "
                f"{found}, the buffer expects (obs_dim, action_dim, buffer_size * n_envs) = {expected}"
            )
        if layout != state.get("layout"):
            raise ValueError(
                f"pickled SharedReplayBuffer is inconsistent: its storage layout {layout} is not the "
                f"buffer's {state.get('layout')}"
            )
        storage = ReplayStorage.from_state(storage_state)
        self.__dict__.update(state)
        self._storage = storage

    def __repr__(self) -> str:
        """``SharedReplayBuffer(buffer_size=..., n_envs=..., size=... or closed, storage=...)``."""
        size = "closed" if self._storage is None or self._storage.closed else f"size={self.size()}"
        return (
            f"SharedReplayBuffer(buffer_size={self.buffer_size}, n_envs={self.n_envs}, {size}, "
            f"storage={self._storage!r})"
        )
