"""Policy weights as one flat float32 vector, and :class:`SharedWeights`: versioned in shared memory.

**The vector** starts with every tensor of the policy's ``state_dict()``, in that order,
flattened and concatenated as float32 (:func:`flatten_into` on the learner, :func:`load_flat`
in a collector, which reads that prefix). It is what a
:class:`~unilab_gym.runtime.pool.CollectorPool` publishes, one version at a time; what must
change with the weights under the same version (e.g. observation statistics) goes after the
parameters.

**SharedWeights** holds it in shared memory: the learner publishes, collectors read, no torn reads.

Segment layout::

    [ header: 8 int64 | buffer 0: size float32 | buffer 1: size float32 ]

    header[0] version      newest complete version (0 = nothing published yet)
    header[1] size         number of float32 values of one copy of the weights
    header[2] seq0         sequence counter of buffer 0 (odd while it is being written)
    header[3] seq1         sequence counter of buffer 1
    header[4] time0        ``time.monotonic_ns()`` when buffer 0 was published (system-wide clock on Linux)
    header[5] time1        the same for buffer 1

Publishing version ``v`` writes buffer ``v % 2`` inside its sequence lock (``seq += 1`` before,
``seq += 1`` after), then sets ``version = v``. A reader takes ``v = version``, checks that
``seq[v % 2]`` is even, copies the buffer, and accepts the copy only if ``seq[v % 2]`` did not
change meanwhile; otherwise it retries. The double buffer means a reader only retries when the
learner publishes twice during one copy. (The UniLab reference reads weights unlocked.)

One writer only (the learner). x86 and ARM64 keep the order of these aligned 8-byte stores and
loads as seen from Python, because every access is a separate numpy call.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from unilab_gym.shm import Segment
from unilab_gym.validation import check_positive_int

if TYPE_CHECKING:
    import torch

_VERSION, _SIZE, _SEQ0, _TIME0 = 0, 1, 2, 4
_HEADER_INTS = 8
_HEADER_BYTES = 8 * _HEADER_INTS
MAX_READ_RETRIES = 10_000


def vector_size(tensors: Sequence[torch.Tensor]) -> int:
    """Float32 values of the vector of ``tensors`` (e.g. ``list(module.state_dict().values())``)."""
    return sum(int(t.numel()) for t in tensors)


def flatten_into(tensors: Sequence[torch.Tensor], out: np.ndarray) -> np.ndarray:
    """Copy ``tensors`` (torch tensors, any device) into ``out`` ((vector_size,) float32), in order; return ``out``."""
    offset = 0
    for t in tensors:
        k = int(t.numel())
        out[offset : offset + k] = t.detach().reshape(-1).cpu().numpy()
        offset += k
    return out


def load_flat(tensors: Sequence[torch.Tensor], flat: np.ndarray) -> None:
    """Copy the start of the vector ``flat`` back into ``tensors`` (in place, in order).

    The inverse of :func:`flatten_into`; values after the tensors' total size are left to the caller.
    """
    import torch

    offset = 0
    with torch.no_grad():
        for t in tensors:
            k = int(t.numel())
            t.copy_(torch.from_numpy(flat[offset : offset + k]).view_as(t))
            offset += k


@dataclass(frozen=True)
class WeightsHandle:
    """Picklable handle of a weights segment: its name and the number of float32 values."""

    name: str
    size: int


class SharedWeights:
    """A double-buffered, sequence-locked float32 vector in shared memory.

    ``SharedWeights(size)`` creates and owns the segment (the learner); ``SharedWeights.attach(handle)``
    maps it in another process (a collector), which never unlinks it.

    Args:
        size: number of float32 values (>= 1), e.g. the parameter count of the actor.
    """

    def __init__(self, size: int, _segment: Segment | None = None):
        """Create and own a new segment of ``size`` values, or map ``_segment`` (see :meth:`attach`)."""
        if _segment is None:
            size = check_positive_int("size", size)
            _segment = Segment.create(_HEADER_BYTES + 2 * 4 * size)
        self._segment = _segment
        self._header = np.frombuffer(_segment.buf, np.int64, _HEADER_INTS)
        if _segment.owner:
            self._header[_SIZE] = size
        self.size = int(self._header[_SIZE])
        #: ``time.monotonic_ns()`` at which the version returned by the last :meth:`read` was published.
        self.read_published_ns = 0
        self._buffers = [
            np.frombuffer(_segment.buf, np.float32, self.size, _HEADER_BYTES + k * 4 * self.size) for k in (0, 1)
        ]

    @classmethod
    def attach(cls, handle: WeightsHandle) -> SharedWeights:
        """Map the segment of ``handle`` as a reader (raises ``SegmentNotFoundError`` if it is gone)."""
        return cls(handle.size, Segment.attach(handle.name))

    @property
    def handle(self) -> WeightsHandle:
        """What :meth:`attach` needs to map the segment in another process (picklable)."""
        return WeightsHandle(self._segment.name, self.size)

    @property
    def version(self) -> int:
        """Newest complete version (0 before the first publish)."""
        return int(self._header[_VERSION])

    def publish(self, values: np.ndarray) -> int:
        """Write ``values`` ((size,) float32-convertible) as the next version; return that version."""
        if values.shape != (self.size,):
            raise ValueError(f"weights must have shape ({self.size},), got {values.shape}")
        version = int(self._header[_VERSION]) + 1
        k = version % 2
        self._header[_SEQ0 + k] += 1  # odd: being written
        self._buffers[k][:] = values
        self._header[_TIME0 + k] = time.monotonic_ns()
        self._header[_SEQ0 + k] += 1  # even: complete
        self._header[_VERSION] = version
        return version

    def read(self, out: np.ndarray) -> int:
        """Copy the newest complete version into ``out`` ((size,) float32); return its version.

        Also sets :attr:`read_published_ns` to the time that version was published.

        Raises:
            RuntimeError: nothing has been published yet, or the copy kept being overwritten
                (``MAX_READ_RETRIES`` times).
        """
        for _ in range(MAX_READ_RETRIES):
            version = int(self._header[_VERSION])
            if version == 0:
                raise RuntimeError("no weights have been published yet")
            k = version % 2
            before = int(self._header[_SEQ0 + k])
            if before % 2:
                continue
            out[:] = self._buffers[k]
            published_ns = int(self._header[_TIME0 + k])
            if int(self._header[_SEQ0 + k]) == before:
                self.read_published_ns = published_ns
                return version
        raise RuntimeError(f"could not read consistent weights in {MAX_READ_RETRIES} tries")

    def close(self) -> None:
        """Unmap (the owner also unlinks). Idempotent."""
        self._header = None  # type: ignore[assignment]
        self._buffers = []
        self._segment.close()


class WeightsReader(Protocol):
    """What a collector reads its weights through: :class:`SharedWeights` (processes) or :class:`LocalWeights`.

    :ivar size: float32 values of one version.
    :ivar read_published_ns: ``time.monotonic_ns()`` at which the version last read was published (or arrived).
    """

    size: int
    read_published_ns: int

    @property
    def version(self) -> int:
        """Newest version held (0: none yet)."""
        ...

    def read(self, out: np.ndarray) -> int:
        """Copy the newest version into ``out`` ((size,) float32); return that version."""
        ...


class LocalWeights:
    """The reading side of :class:`SharedWeights` in one process: versions are handed to :meth:`offer`.

    A Ray actor is offered each version by the learner's exchange requests, the inline pool by its
    ``publish_weights``. ``read_published_ns`` is this process's ``time.monotonic_ns()`` when the version
    arrived (clocks of two machines do not compare), so the weight-sync latency is arrival to use.

    Args:
        size: float32 values of one version.
    """

    def __init__(self, size: int):
        """Hold no version yet (arguments: see the class docstring)."""
        self.size = size
        self._latest: tuple[int, np.ndarray | None, int] = (0, None, 0)
        self.read_published_ns = 0

    @property
    def version(self) -> int:
        """Newest version offered (0: none yet)."""
        return self._latest[0]

    def offer(self, version: int, values: np.ndarray) -> None:
        """Keep ``values`` ((size,) float32) as ``version`` if it is newer than what is held."""
        if version > self._latest[0]:
            self._latest = (version, values, time.monotonic_ns())

    def read(self, out: np.ndarray) -> int:
        """Copy the newest version into ``out`` (left as is before the first); return that version."""
        version, values, arrived = self._latest  # one tuple: never torn
        if values is not None:
            out[:] = values
        self.read_published_ns = arrived
        return version
