"""Sample a replay straight into a torch tensor on the learner's device.

The only module of :mod:`unilab_gym.replay` that uses torch; it imports torch when a
:class:`TorchSampler` is created, so ``import unilab_gym.replay`` stays torch-free.

Paths:

- **CPU** (default for a CPU device): the rows are gathered by one ``numpy.take`` directly into
  the memory of a fresh ``torch.empty((B, width))`` tensor: one copy in total.
- **Staging** (default for CUDA): the rows are gathered into a page-locked (pinned) host
  buffer, then copied with ``Tensor.copy_(..., non_blocking=True)`` into a fresh device tensor,
  so the host-to-device copy overlaps with Python work. Two staging buffers are used in turn; a
  CUDA event recorded after each copy is waited on before its buffer is refilled, so a copy in
  flight is never overwritten. With ``staging=True`` on a CPU device the same code runs with an
  ordinary (unpinned) buffer and no events: that is how it is tested without a GPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from unilab_gym.replay.storage import ReplayStorage
from unilab_gym.validation import check_positive_int

__all__ = ["TorchSampler"]


class TorchSampler:
    """Gather sampled replay rows into ``(B, width)`` tensors on ``device``.

    Args:
        width: row width of the storages it will sample (``layout.width``).
        device: torch device (``"cpu"``, ``"cuda"``, ``"cuda:1"``, a ``torch.device``).
        staging: gather into a host staging buffer then copy (pinned + ``non_blocking`` on
            CUDA). Default: ``True`` for CUDA devices, ``False`` otherwise.
        dtype: column dtype of the storages (``layout.word_dtype``): float32 (default) or uint8.

    Raises:
        ValueError: if ``width < 1`` or ``dtype`` is neither.
    """

    def __init__(
        self, width: int, device: Any = "cpu", *, staging: bool | None = None, dtype: Any = np.float32
    ) -> None:
        """Check the arguments and pick the torch dtype (arguments: see the class docstring)."""
        import torch

        self._torch = torch
        self.width = check_positive_int("width", width)
        self.np_dtype = np.dtype(dtype)
        if self.np_dtype not in (np.dtype(np.float32), np.dtype(np.uint8)):
            raise ValueError(f"dtype must be float32 or uint8 (a layout's word_dtype), got {self.np_dtype}")
        self._dtype = torch.float32 if self.np_dtype == np.float32 else torch.uint8
        self.device = torch.device(device)
        self.staging = self.device.type == "cuda" if staging is None else bool(staging)
        self._pin = self.staging and self.device.type == "cuda"
        self._buffers: dict[int, list[tuple[Any, np.ndarray, Any]]] = {}
        self._turn = 0

    def _staging_slot(self, batch_size: int) -> tuple[Any, np.ndarray, Any]:
        torch = self._torch
        ring = self._buffers.get(batch_size)
        if ring is None:
            ring = []
            for _ in range(2):
                host = torch.empty((batch_size, self.width), dtype=self._dtype, pin_memory=self._pin)
                event = torch.cuda.Event() if self.device.type == "cuda" else None
                ring.append((host, host.numpy(), event))
            self._buffers[batch_size] = ring
        self._turn ^= 1
        host, host_np, event = ring[self._turn]
        if event is not None:
            event.synchronize()  # the copy that last read this buffer has finished
        return host, host_np, event

    def _upload(self, host: Any, event: Any) -> Any:
        dev = self._torch.empty(host.shape, dtype=host.dtype, device=self.device)
        dev.copy_(host, non_blocking=True)
        if event is not None:
            event.record(self._torch.cuda.current_stream(self.device))
        return dev

    def sample(self, storage: ReplayStorage, batch_size: int, rng: np.random.Generator) -> tuple[np.ndarray, Any]:
        """Draw ``batch_size`` committed transitions of ``storage`` onto :attr:`device`.

        :return: ``(seq, rows)``: ``(B,)`` int64 numpy sequence numbers and a fresh
            ``(B, width)`` tensor of :attr:`np_dtype` on :attr:`device` (split it with ``storage.layout``).
        :raises ValueError: as :meth:`ReplayStorage.sample` (empty replay, bad batch size), or
            if the storage's width differs from :attr:`width`.
        """
        if storage.layout.width != self.width or storage.layout.word_dtype != self.np_dtype:
            raise ValueError(
                f"storage rows have width {storage.layout.width} ({storage.layout.word_dtype}), "
                f"this sampler expects {self.width} ({self.np_dtype})"
            )
        batch_size = check_positive_int("batch_size", batch_size)
        if not self.staging:
            out = self._torch.empty((batch_size, self.width), dtype=self._dtype)
            seq, _ = storage.sample(batch_size, rng, out=out.numpy())
            return seq, out if self.device.type == "cpu" else out.to(self.device)
        host, host_np, event = self._staging_slot(batch_size)
        seq, _ = storage.sample(batch_size, rng, out=host_np)
        return seq, self._upload(host, event)
