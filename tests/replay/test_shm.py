"""Shared memory that cannot be backed fails at once, with a clear error, and leaves nothing behind.

A ``/dev/shm`` file is sparse: without the checks of ``Segment.create`` a segment larger than
the filesystem's free space is created silently and the process dies of SIGBUS at the first
page that cannot be supplied (issue 19, item 2). These tests need no root and no small mount:
they ask for more than the real ``/dev/shm`` holds, or lower the free space that
``shm_free_bytes`` reports.
"""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest

import unilab_gym.shm as shm
from unilab_gym.replay import ReplayLayout, ReplayStorage, SharedMemoryFullError
from unilab_gym.runtime.weights import SharedWeights
from unilab_gym.shm import Segment, shm_free_bytes

PREFIX = f"uls{os.getpid()}_"
MiB = 2**20

pytestmark = pytest.mark.skipif(shm_free_bytes() is None, reason="needs a size-limited /dev/shm (Linux tmpfs)")


def ours() -> set[str]:
    return {f for f in os.listdir(shm.SHM_DIR) if f.startswith(PREFIX)}


def every_segment() -> set[str]:
    return set(os.listdir(shm.SHM_DIR))


@pytest.fixture(autouse=True)
def no_leaked_segments():
    before = ours()
    yield
    assert ours() == before


def assert_names_the_fix(err: pytest.ExceptionInfo, size: int) -> None:
    e = err.value
    assert isinstance(e, OSError) and isinstance(e, MemoryError) and e.errno == errno.ENOSPC
    msg = str(e)
    assert f"{size} bytes" in msg and "free" in msg, msg
    assert "docker run --shm-size=" in msg and "buffer_size" in msg, msg


def test_a_segment_larger_than_the_free_space_raises_and_leaves_nothing():
    size = shm_free_bytes() + 64 * MiB
    before = every_segment()
    with pytest.raises(SharedMemoryFullError) as err:
        Segment.create(size, prefix=PREFIX)
    assert_names_the_fix(err, size)
    assert every_segment() - before == set()


def test_posix_fallocate_refuses_what_the_tmpfs_cannot_back(monkeypatch):
    # The free-space check is told there is room, so the kernel's fallocate must refuse: tmpfs
    # answers ENOSPC at once for a length beyond its total size (no page is allocated first).
    st = os.statvfs(shm.SHM_DIR)
    size = st.f_blocks * st.f_frsize + 64 * MiB
    monkeypatch.setattr(shm, "shm_free_bytes", lambda path=shm.SHM_DIR: 2 * size)
    before = every_segment()
    with pytest.raises(SharedMemoryFullError, match="posix_fallocate") as err:
        Segment.create(size, prefix=PREFIX)
    assert_names_the_fix(err, size)
    assert every_segment() - before == set()


def test_every_page_is_reserved_up_front():
    seg = Segment.create(3 * MiB + 5, prefix=PREFIX)
    try:
        assert os.fstat(seg.fd).st_blocks * 512 >= seg.size  # allocated, not a sparse file
    finally:
        seg.close()


def test_default_sb3_sized_replay_on_dockers_64mb_shm_fails_at_creation(monkeypatch):
    # the issue's case: SB3's default buffer_size 1e6, obs 48, act 12 -> 444 MB; Docker gives 64 MB
    monkeypatch.setattr(shm, "shm_free_bytes", lambda path=shm.SHM_DIR: 64 * 10**6)
    layout = ReplayLayout(48, 12)
    before = every_segment()
    with pytest.raises(MemoryError) as err:
        ReplayStorage(layout, 10**6, prefix=PREFIX)
    msg = str(err.value)  # 1152-byte header + 10**6 rows of 111 float32 + a small layout record
    assert "segment of 444001" in msg and "(423.4 MiB)" in msg and "has 64000000 bytes" in msg, msg
    with pytest.raises(OSError, match="shm-size"):
        SharedWeights(10**8)  # the runner's weight segments go through the same check
    assert every_segment() - before == set()


def test_a_segment_that_fits_works_as_before():
    seg = Segment.create(4096, prefix=PREFIX)
    try:
        a = np.frombuffer(seg.buf, np.uint8)
        a[:] = 7
        assert seg.is_linked() and int(a.sum()) == 7 * 4096
        del a
    finally:
        seg.close()
    assert not seg.is_linked()
