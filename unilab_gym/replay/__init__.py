"""Framework-neutral shared-memory replay.

A packed ring of rows written by collectors (any process) and sampled by the learner (and by
read-only readers).

- :class:`ReplayLayout`: the byte layout, a dtype and offset per field (obs | next_obs | action |
  reward | terminated | truncated | extras), optionally memory-optimized.
- :mod:`unilab_gym.replay.status`: transition statuses and status-weighted sampling.
- :class:`ReplayStorage`: the ring in POSIX shared memory (create / attach by
  :class:`ReplayHandle` / add / sample / close); :func:`final_obs_capacity_for`, the side-table
  size of a memory-optimized layout that keeps every episode end. It is built by job, as SB3's
  ``buffers.py`` is (a base class, one subclass per variant): :mod:`~unilab_gym.replay.ring`
  (the segment and the reserve / commit protocol), :mod:`~unilab_gym.replay.sampling`,
  :mod:`~unilab_gym.replay.storage` (typed ``add``, saved copies, checked by
  :mod:`~unilab_gym.replay.persistence`) and :mod:`~unilab_gym.replay.linking` (the
  memory-optimized variant, :class:`~unilab_gym.replay.linking.OptimizedReplayStorage`).
- :func:`~unilab_gym.replay.integrity.data_checksum`: the checksum saved replay state carries.
- :class:`TorchSampler` (imported lazily, needs torch): sampling straight into torch tensors.

``import unilab_gym.replay`` does not import torch. The SB3 buffer built on it is
``unilab_gym.SharedReplayBuffer``.
"""

from __future__ import annotations

from typing import Any

from unilab_gym.replay.layout import ReplayLayout
from unilab_gym.replay.linking import OptimizedReplayStorage  # defining it registers it with ReplayStorage
from unilab_gym.replay.storage import (
    MAX_SLOTS,
    ReplayClosedError,
    ReplayHandle,
    ReplayOwnerGoneError,
    ReplayStorage,
    Reservation,
    final_obs_capacity_for,
)
from unilab_gym.shm import SegmentNotFoundError, SharedMemoryFullError

__all__ = [
    "MAX_SLOTS",
    "OptimizedReplayStorage",
    "ReplayClosedError",
    "ReplayHandle",
    "ReplayLayout",
    "ReplayOwnerGoneError",
    "ReplayStorage",
    "Reservation",
    "SegmentNotFoundError",
    "SharedMemoryFullError",
    "TorchSampler",
    "final_obs_capacity_for",
]


def __getattr__(name: str) -> Any:
    if name == "TorchSampler":
        from unilab_gym.replay.torch_sampler import TorchSampler

        return TorchSampler
    raise AttributeError(f"module 'unilab_gym.replay' has no attribute {name!r}")
