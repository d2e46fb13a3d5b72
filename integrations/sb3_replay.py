"""``SharedReplayBuffer``: Stable-Baselines3's ``ReplayBuffer`` on a packed shared-memory ring.

Drop-in for SB3's off-policy algorithms::

    from stable_baselines3 import SAC
    from unilab_gym import SharedReplayBuffer

    model = SAC("MlpPolicy", env, replay_buffer_class=SharedReplayBuffer)

Collector processes may write into the same ring while the learner trains::

    handle = model.replay_buffer.handle                      # picklable, send it anywhere
    storage = unilab_gym.replay.ReplayStorage.attach(handle)  # in the collector process
    storage.add(obs, next_obs, action, reward, terminated, truncated)

Storage: one row per transition, ``capacity = (buffer_size // n_envs) * n_envs`` rows (SB3's
total capacity); SB3's ``[pos, env]`` slot is row ``pos * n_envs + env``. Columns follow
:class:`unilab_gym.replay.ReplayLayout`. The ``terminated`` column holds SB3's bootstrap cut,
``done * (1 - timeout)`` (``timeout`` = ``info["TimeLimit.truncated"]`` when
``handle_timeout_termination``, else 0), and ``truncated`` holds ``done * TimeLimit.truncated``.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any, cast

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import BaseBuffer, ReplayBuffer
from stable_baselines3.common.type_aliases import ReplayBufferSamples
from stable_baselines3.common.utils import get_device
from stable_baselines3.common.vec_env import VecNormalize

from unilab_gym.replay import ReplayLayout, ReplayStorage
from unilab_gym.replay.storage import ReplayHandle
from unilab_gym.replay.torch_sampler import TorchSampler
from unilab_gym.validation import REAL_DTYPE_KINDS, check_positive_int, check_real_array

__all__ = ["SharedReplayBuffer"]

_EXACT_INT = 2**24  # float32 holds every integer of magnitude <= 2**24 exactly


def _seed_from_global_state() -> np.random.SeedSequence:
    """A seed derived from numpy's global RNG state *without advancing it*: SB3's ``seed=``
    (which seeds numpy before building the buffer) fixes our sampling stream, and the rest of
    SB3 sees the same global random stream as with its own buffer."""
    mt19937 = np.random.get_state(legacy=False)["state"]
    return np.random.SeedSequence([int(mt19937["pos"]), *mt19937["key"].tolist()])


def _available_memory() -> int | None:
    """Bytes of available RAM (``psutil``, as SB3's ``ReplayBuffer`` checks it), or ``None`` without psutil."""
    try:
        import psutil
    except ImportError:  # pragma: no cover
        return None
    return int(psutil.virtual_memory().available)


def _check_observation_space(space: spaces.Space) -> None:
    if not isinstance(space, spaces.Box) or space.dtype != np.float32:
        raise ValueError(
            f"SharedReplayBuffer stores observations as float32 and supports only Box float32 "
            f"observation spaces, got {space}. Use SB3's ReplayBuffer / DictReplayBuffer, or wrap "
            "the env so its observations are Box float32 (e.g. gymnasium.wrappers.DtypeObservation)."
        )


def _check_action_space(space: spaces.Space) -> None:
    if isinstance(space, spaces.Box):
        if space.dtype.kind == "f":
            return
        bound = max(np.abs(space.low).max(initial=0), np.abs(space.high).max(initial=0))
        if space.dtype.kind in "iu" and bound <= _EXACT_INT:
            return
    elif isinstance(space, spaces.Discrete):
        if abs(int(space.start)) + int(space.n) <= _EXACT_INT:
            return
    elif isinstance(space, spaces.MultiDiscrete):
        if np.abs(space.start).max(initial=0) + np.max(space.nvec, initial=0) <= _EXACT_INT:
            return
    elif isinstance(space, spaces.MultiBinary):
        return
    raise ValueError(
        f"SharedReplayBuffer stores actions as float32 and supports Box, Discrete, MultiDiscrete "
        f"and MultiBinary action spaces whose values float32 holds exactly (|a| <= 2**24), got {space}"
    )


class SharedReplayBuffer(ReplayBuffer):
    """SB3 ``ReplayBuffer`` whose transitions live in a packed shared-memory block.

    Same constructor, ``add`` / ``sample`` semantics, ``pos`` / ``full`` / ``size()`` and
    sampled tensors (dtypes, shapes, values) as SB3's ``ReplayBuffer``; sampling is one gather
    from the packed block. Other processes attach with :attr:`handle` and add transitions
    concurrently (see :mod:`unilab_gym.replay.storage`).

    :param buffer_size: total transitions kept (SB3: ``buffer_size // n_envs`` steps of
        ``n_envs`` transitions).
    :param observation_space: a ``Box`` with dtype float32 (any shape).
    :param action_space: ``Box``, ``Discrete``, ``MultiDiscrete`` or ``MultiBinary``.
    :param device: torch device of the sampled tensors (``"auto"``, ``"cpu"``, ``"cuda"``).
    :param n_envs: number of parallel environments of each ``add``.
    :param optimize_memory_usage: must be ``False`` (the packed row already holds next_obs).
    :param handle_timeout_termination: a time-limit end (``info["TimeLimit.truncated"]``) does
        not cut the bootstrap.
    :param extra_dims: optional extra per-transition column groups ``{name: dim}``, written by
        collectors through :attr:`storage` (SB3's ``add`` writes zeros there).
    :param seed: seed of the sampling generator :attr:`rng` (``sample`` never touches numpy's
        global RNG; SB3's does). Default: derived from numpy's global RNG state without
        advancing it, so SB3's ``seed=`` makes sampling reproducible.
    :param staging: host staging buffer for device copies; default on for CUDA (pinned memory,
        ``non_blocking``), off for CPU.
    :raises ValueError: for ``optimize_memory_usage=True``, an unsupported space, or a bad size.
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
    ) -> None:
        if optimize_memory_usage:
            raise ValueError(
                "SharedReplayBuffer does not support optimize_memory_usage=True: each packed row "
                "stores its own next_obs so that collectors can write rows independently. "
                "Pass optimize_memory_usage=False (the default)."
            )
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
        self.optimize_memory_usage = False
        self.handle_timeout_termination = handle_timeout_termination
        self.obs_dim = int(np.prod(self.obs_shape))
        self._obs_batch_shape = (self.n_envs, *self.obs_shape)
        self._obs_rows_shape = (self.n_envs, self.obs_dim)
        self._act_rows_shape = (self.n_envs, self.action_dim)
        self._vec_shape = (self.n_envs,)
        self._zeros = np.zeros(self.n_envs, dtype=np.float32)
        self.action_dtype = np.dtype(self._maybe_cast_dtype(action_space.dtype))
        self._action_th_dtype = th.from_numpy(np.zeros(0, self.action_dtype)).dtype
        self.layout = ReplayLayout(self.obs_dim, self.action_dim, extra_dims or {})
        # obs | next_obs | action | reward | terminated | truncated [| extras]
        self._split_sizes = [self.obs_dim, self.obs_dim, self.action_dim, 1, 1, 1] + (
            [self.layout.extra_dim] if self.layout.extras else []
        )
        capacity = self.buffer_size * self.n_envs
        needed, available = capacity * self.layout.row_nbytes, _available_memory()
        if available is not None and needed > available:
            warnings.warn(
                "This system does not have apparently enough memory to store the complete "
                f"replay buffer {needed / 1e9:.2f}GB > {available / 1e9:.2f}GB",
                stacklevel=2,
            )
        self.rng = np.random.default_rng(_seed_from_global_state() if seed is None else seed)
        self._storage = ReplayStorage(self.layout, capacity)

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

    # ---- SB3 state: derived from the shared committed counter ------------------------------------
    @property
    def device(self) -> th.device:
        """Device of the sampled tensors (SB3's ``load_replay_buffer`` reassigns it)."""
        return self._device

    @device.setter
    def device(self, value: th.device | str) -> None:
        self._device = get_device(value)
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
        """Whether ``buffer_size`` steps (``buffer_size * n_envs`` rows) were ever committed."""
        if self._storage is None:
            return False
        return self._committed_steps() >= self.buffer_size

    @full.setter
    def full(self, value: bool) -> None:
        if self._storage is not None and bool(value) != self.full:
            raise AttributeError("SharedReplayBuffer.full is derived from the shared committed counter; use reset()")

    def size(self) -> int:
        """Steps stored, as SB3: ``buffer_size`` once full, else ``pos``."""
        steps = self._committed_steps()
        return self.buffer_size if steps >= self.buffer_size else steps

    def reset(self) -> None:
        """Forget every transition.

        :raises RuntimeError: if a collector is writing at this moment.
        """
        self.storage.reset()

    # ---- add -------------------------------------------------------------------------------------
    def add(
        self,
        obs: np.ndarray,
        next_obs: np.ndarray,
        action: np.ndarray,
        reward: np.ndarray,
        done: np.ndarray,
        infos: list[dict[str, Any]],
    ) -> None:
        """Add one step of ``n_envs`` transitions (SB3 semantics).

        :param obs: ``(n_envs, *obs_shape)`` (or ``obs_shape`` when ``n_envs == 1``).
        :param next_obs: same shape; for a finished episode, SB3's off-policy loop has already
            put ``infos[i]["terminal_observation"]`` here.
        :param action: ``n_envs * action_dim`` values (reshaped to ``(n_envs, action_dim)``).
        :param reward: ``(n_envs,)``.
        :param done: ``(n_envs,)``: ``terminated or truncated``.
        :param infos: ``n_envs`` dicts; ``info["TimeLimit.truncated"]`` marks time-limit ends.
        :raises ValueError: on a wrong shape, dtype or ``infos`` length; nothing is written.
        """
        n, real = self.n_envs, REAL_DTYPE_KINDS
        # fast path: numpy arrays of exactly SB3's shapes; anything else goes through the checks
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
        self.storage.add(obs, next_obs, action, reward, terminated, truncated, validate=False)

    def _obs_rows(self, name: str, value: Any) -> np.ndarray:
        arr = check_real_array(name, value)
        n = self.n_envs
        if arr.shape != self._obs_batch_shape and not (n == 1 and arr.shape == self.obs_shape):
            raise ValueError(f"{name} must have shape {self._obs_batch_shape}, got {arr.shape}")
        return arr.reshape(self._obs_rows_shape)

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
    def sample(self, batch_size: int, env: VecNormalize | None = None) -> ReplayBufferSamples:
        """Draw ``batch_size`` committed transitions uniformly with :attr:`rng`.

        :return: SB3 ``ReplayBufferSamples`` on :attr:`device`: ``observations`` and
            ``next_observations`` ``(B, *obs_shape)`` float32, ``actions`` ``(B, action_dim)`` in
            SB3's action dtype, ``dones`` and ``rewards`` ``(B, 1)`` float32; observations and
            rewards normalized through ``env`` when it is given (a ``VecNormalize``).
        :raises ValueError: if the buffer is empty or ``batch_size < 1``.
        """
        if env is not None:
            _, rows = self.storage.sample(batch_size, self.rng)
            return self._samples_from_numpy(rows, env)
        if self._sampler is None:
            self._sampler = TorchSampler(self.layout.width, self.device, staging=self._staging)
        _, rows_t = self._sampler.sample(self.storage, batch_size, self.rng)
        return self._split(rows_t)

    def _split(self, rows: th.Tensor) -> ReplayBufferSamples:
        obs, next_obs, actions, reward, terminated = th.split_with_sizes(rows, self._split_sizes, dim=1)[:5]
        if len(self.obs_shape) != 1:
            shape = (rows.shape[0], *self.obs_shape)
            obs, next_obs = obs.reshape(shape), next_obs.reshape(shape)
        if self.action_dtype != np.float32:
            actions = actions.to(self._action_th_dtype)
        return ReplayBufferSamples(obs, actions, next_obs, terminated, reward)

    def _samples_from_numpy(self, rows: np.ndarray, env: VecNormalize | None) -> ReplayBufferSamples:
        L, shape = self.layout, (rows.shape[0], *self.obs_shape)
        # Box observations: SB3's _normalize_obs returns an array for an array
        data = (
            cast(np.ndarray, self._normalize_obs(rows[:, L.obs].reshape(shape), env)),
            rows[:, L.action].astype(self.action_dtype),
            cast(np.ndarray, self._normalize_obs(rows[:, L.next_obs].reshape(shape), env)),
            rows[:, L.terminated : L.terminated + 1],
            self._normalize_reward(rows[:, L.reward : L.reward + 1], env),
        )
        return ReplayBufferSamples(*(self.to_torch(array) for array in data))

    def _get_samples(self, batch_inds: np.ndarray, env: VecNormalize | None = None) -> ReplayBufferSamples:
        """SB3's hook: transitions ``[batch_inds, env_indices]`` with ``env_indices`` drawn from
        numpy's global RNG exactly as SB3 does.

        :raises ValueError: if a requested slot holds no committed transition.
        :raises RuntimeError: if a collector overwrote a requested row during the copy.
        """
        env_indices = np.random.randint(0, high=self.n_envs, size=(len(batch_inds),))
        rows = np.asarray(batch_inds, dtype=np.int64) * self.n_envs + env_indices
        seq = self.storage.seq_of_rows(rows)
        data = self.storage.gather(seq)
        if self.storage.overwritten(seq).any():
            raise RuntimeError("requested replay rows were overwritten by a collector while being read")
        if env is not None:
            return self._samples_from_numpy(data, env)
        return self._split(th.from_numpy(data).to(self.device))

    # ---- pickling: a plain copy ----------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
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
        ``committed <= head``, slot table, row shapes), and its layout must match this buffer's
        ``obs_dim``, ``action_dim`` and ``buffer_size * n_envs``.

        :raises ValueError: on a corrupted or inconsistent copy; nothing is created, and SB3's
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
        storage = ReplayStorage.from_state(storage_state)
        self.__dict__.update(state)
        self._storage = storage

    def __repr__(self) -> str:
        size = "closed" if self._storage is None or self._storage.closed else f"size={self.size()}"
        return (
            f"SharedReplayBuffer(buffer_size={self.buffer_size}, n_envs={self.n_envs}, {size}, "
            f"storage={self._storage!r})"
        )
