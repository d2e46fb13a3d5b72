"""Shared rollout storage: on-policy collectors write rollouts here, the learner copies them into SB3.

One shared-memory segment for all collectors, with two *slots*: rollout ``k`` lives in slot
``k % 2``, so collectors can write rollout ``k + 1`` while the learner still holds rollout ``k``
(``max_policy_lag=1``). In a slot, the ``n_envs = num_collectors * envs_per_collector`` envs sit
side by side: collector ``c`` owns env columns ``[c * E, (c + 1) * E)``. Segment layout, in
this order, every array C-contiguous::

    observations    float32 [2, n_steps, n_envs, *obs_shape]   obs[t]: the obs the action was taken in
    actions         float32 [2, n_steps, n_envs, action_dim]   sampled actions, before clipping (as SB3 stores them)
    rewards         float32 [2, n_steps, n_envs]               reward of step t, plus gamma * V(terminal obs)
                                                               where the episode was truncated (SB3's bootstrap)
    episode_starts  float32 [2, n_steps, n_envs]               1.0 where obs[t] is the first obs of an episode
    values          float32 [2, n_steps, n_envs]               V(obs[t]) under the behaviour policy
    log_probs       float32 [2, n_steps, n_envs]               log pi(action[t] | obs[t]) under the behaviour policy
    last_obs        float32 [2, n_envs, *obs_shape]            the obs after the last step
    last_values     float32 [2, n_envs]                        V(last_obs) under the behaviour policy
    last_dones      float32 [2, n_envs]                        1.0 where the last step ended an episode
    versions        int64   [2, num_collectors]                weight version collector c acted with in the slot

With a ``Dict`` observation (``privileged_obs=True``: keys ``"policy"`` and ``"critic"``), ``observations``
and ``last_obs`` are one float32 array per key, in the space's key order, each laid out as above with that
key's shape; they are then dicts ``{key: array}``, as in SB3's ``DictRolloutBuffer``.

These are exactly the fields of SB3's ``RolloutBuffer`` (``DictRolloutBuffer``) plus what
``compute_returns_and_advantage(last_values, dones)`` takes, so :meth:`RolloutStorage.fill`
is a copy and returns / advantages come from SB3's own code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from unilab_gym.shm import Segment
from unilab_gym.validation import check_positive_int

if TYPE_CHECKING:
    import torch


class RolloutBufferLike(Protocol):
    """What :meth:`RolloutStorage.fill` writes into: SB3's ``RolloutBuffer`` and ``DictRolloutBuffer`` have it.

    Arrays of shape ``(buffer_size, n_envs, ...)``; ``observations`` is one per key for a ``Dict`` observation.
    """

    buffer_size: int
    pos: int
    full: bool
    actions: np.ndarray
    rewards: np.ndarray
    episode_starts: np.ndarray
    values: np.ndarray
    log_probs: np.ndarray

    @property
    def observations(self) -> np.ndarray | dict[str, np.ndarray]:
        """The observations, ``(buffer_size, n_envs, *obs_shape)`` (one array per key of a ``Dict``)."""
        ...

    def reset(self) -> None:
        """Empty the buffer."""
        ...

    def compute_returns_and_advantage(self, last_values: torch.Tensor, dones: np.ndarray) -> None:
        """GAE returns and advantages of the buffer's rollout, from the value after it and its last dones."""
        ...


SLOTS = 2

#: The shape of one observation: a tuple for a ``Box``, ``{key: shape}`` for a ``Dict`` of ``Box`` es.
ObsShape = tuple[int, ...] | dict[str, tuple[int, ...]]


@dataclass(frozen=True)
class RolloutHandle:
    """Picklable description of a rollout segment (its name and shapes)."""

    name: str
    n_steps: int
    n_envs: int
    obs_shape: ObsShape
    action_dim: int
    num_collectors: int


def _fields(h: RolloutHandle) -> list[tuple[str, type[np.generic], tuple[int, ...]]]:
    s, t, n = SLOTS, h.n_steps, h.n_envs
    shapes = h.obs_shape if isinstance(h.obs_shape, dict) else {"": h.obs_shape}
    return [
        *((_key("observations", k), np.float32, (s, t, n, *shape)) for k, shape in shapes.items()),
        ("actions", np.float32, (s, t, n, h.action_dim)),
        ("rewards", np.float32, (s, t, n)),
        ("episode_starts", np.float32, (s, t, n)),
        ("values", np.float32, (s, t, n)),
        ("log_probs", np.float32, (s, t, n)),
        *((_key("last_obs", k), np.float32, (s, n, *shape)) for k, shape in shapes.items()),
        ("last_values", np.float32, (s, n)),
        ("last_dones", np.float32, (s, n)),
        ("versions", np.int64, (s, h.num_collectors)),
    ]


def _key(name: str, key: str) -> str:
    """The field of observation key ``key`` (``""``: the one array of a ``Box`` observation)."""
    return f"{name}.{key}" if key else name


def put_obs(
    array: np.ndarray | dict[str, np.ndarray],
    index: int | np.integer | tuple[int | slice, ...],
    obs: np.ndarray | dict[str, np.ndarray],
) -> None:
    """``array[index] = obs`` for an observation field, per key for a ``Dict`` observation."""
    if isinstance(array, dict):
        assert isinstance(obs, dict)
        for key, part in array.items():
            part[index] = obs[key]
    else:
        array[index] = obs


def _nbytes(h: RolloutHandle) -> int:
    return sum(_aligned(int(np.prod(shape)) * np.dtype(dtype).itemsize) for _, dtype, shape in _fields(h))


def _aligned(nbytes: int) -> int:
    return -(-nbytes // 64) * 64


class RolloutStorage:
    """Two rollout slots in shared memory (layout in the module docstring).

    ``RolloutStorage.create(...)`` makes and owns the segment (the learner); ``attach(handle)``
    maps it in a collector, which never unlinks it. Each array named in the layout is an
    attribute (a numpy view of the segment), e.g. ``storage.rewards[slot, t, cols]``.

    Args:
        n_steps: steps per env in one rollout (SB3's ``n_steps``), >= 1.
        n_envs: envs of all collectors together, >= 1.
        obs_shape: shape of one observation, or ``{key: shape}`` for a ``Dict`` observation.
        action_dim: float32 values of one action, >= 1.
        num_collectors: collectors writing into it, >= 1.

    Raises:
        ValueError: a count < 1.
        OSError: the system refused the segment (e.g. /dev/shm full).
    """

    observations: np.ndarray | dict[str, np.ndarray]
    actions: np.ndarray
    rewards: np.ndarray
    episode_starts: np.ndarray
    values: np.ndarray
    log_probs: np.ndarray
    last_obs: np.ndarray | dict[str, np.ndarray]
    last_values: np.ndarray
    last_dones: np.ndarray
    versions: np.ndarray

    def __init__(self, handle: RolloutHandle, segment: Segment):
        """Map every field of ``handle``'s layout onto ``segment``; use :meth:`create` or :meth:`attach`."""
        self._handle = handle
        self._segment = segment
        offset = 0
        self._names: list[str] = []
        for name, dtype, shape in _fields(handle):
            array = np.ndarray(shape, dtype, buffer=segment.buf, offset=offset)
            field, _, key = name.partition(".")
            if key:  # a Dict observation: one array per key
                if field not in self._names:
                    setattr(self, field, {})
                    self._names.append(field)
                getattr(self, field)[key] = array
            else:
                setattr(self, name, array)
                self._names.append(name)
            offset += _aligned(array.nbytes)

    @classmethod
    def create(
        cls, n_steps: int, n_envs: int, obs_shape: ObsShape, action_dim: int, num_collectors: int
    ) -> RolloutStorage:
        """Create and own a new segment for these sizes (arguments and errors: see the class docstring)."""
        for name, value in (
            ("n_steps", n_steps),
            ("n_envs", n_envs),
            ("action_dim", action_dim),
            ("num_collectors", num_collectors),
        ):
            check_positive_int(name, value)
        shape: ObsShape = (
            {str(k): tuple(int(d) for d in v) for k, v in obs_shape.items()}
            if isinstance(obs_shape, dict)
            else tuple(int(d) for d in obs_shape)
        )
        probe = RolloutHandle("", int(n_steps), int(n_envs), shape, int(action_dim), int(num_collectors))
        segment = Segment.create(_nbytes(probe))
        handle = RolloutHandle(segment.name, probe.n_steps, probe.n_envs, shape, probe.action_dim, probe.num_collectors)
        return cls(handle, segment)

    @classmethod
    def attach(cls, handle: RolloutHandle) -> RolloutStorage:
        """Map the segment of ``handle`` (raises ``SegmentNotFoundError`` if its owner closed it)."""
        return cls(handle, Segment.attach(handle.name))

    @property
    def handle(self) -> RolloutHandle:
        """What :meth:`attach` needs to map this storage in another process (picklable)."""
        return self._handle

    def fill(self, buffer: RolloutBufferLike, slot: int) -> None:
        """Copy slot ``slot`` into SB3's ``RolloutBuffer`` (``DictRolloutBuffer``), compute its returns and advantages.

        ``buffer`` must have ``buffer_size == n_steps`` and ``n_envs == n_envs``. It is reset, then
        holds the rollout as if ``buffer.add`` had been called ``n_steps`` times, then
        ``buffer.compute_returns_and_advantage(last_values, last_dones)`` runs (SB3's own GAE).

        Raises:
            TypeError: ``buffer`` holds one observation array and this storage one per key, or the reverse.
        """
        import torch

        buffer.reset()
        target, source = buffer.observations, self.observations
        if isinstance(target, dict) and isinstance(source, dict):  # SB3's DictRolloutBuffer
            for key, array in source.items():
                target[key][:] = array[slot].reshape(target[key].shape)
        elif isinstance(target, np.ndarray) and isinstance(source, np.ndarray):
            target[:] = source[slot].reshape(target.shape)
        else:
            raise TypeError(
                f"buffer's observations ({type(target).__name__}) are not of this storage's kind "
                f"({type(source).__name__}): a DictRolloutBuffer goes with Dict observations"
            )
        for name in ("actions", "rewards", "episode_starts", "values", "log_probs"):
            getattr(buffer, name)[:] = getattr(self, name)[slot].reshape(getattr(buffer, name).shape)
        buffer.pos, buffer.full = buffer.buffer_size, True
        buffer.compute_returns_and_advantage(
            last_values=torch.from_numpy(self.last_values[slot].copy()), dones=self.last_dones[slot].copy()
        )

    def close(self) -> None:
        """Unmap (the owner also unlinks). Idempotent."""
        for name in self._names:
            setattr(self, name, None)
        self._segment.close()
