"""Replay owner gone, layout mismatch, corrupted saved state (issue 19, items 3-5)."""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import pickle

import numpy as np
import pytest
from _replay_workers import own_and_hang, uniform_rows

from unilab_gym.replay import ReplayClosedError, ReplayHandle, ReplayLayout, ReplayOwnerGoneError, ReplayStorage
from unilab_gym.replay.storage import _OWNER_CHECK_EVERY

SHM = "/dev/shm"
PREFIX = f"uli{os.getpid()}_"
CTX = mp.get_context("spawn")
JOIN = 60  # seconds; a generous bound, not a synchronisation


def ours() -> set[str]:
    return {f for f in os.listdir(SHM) if f.startswith(PREFIX)}


@pytest.fixture(autouse=True)
def no_leaked_segments():
    before = ours()
    yield
    gc.collect()
    assert ours() - before == set()


def make(capacity=8, obs_dim=3, act_dim=2, extras=()):
    return ReplayStorage(ReplayLayout(obs_dim, act_dim, extras), capacity, prefix=PREFIX)


def add_values(storage, values):
    return storage.add(**uniform_rows(storage.layout, values))


# ---- item 3: the owner is gone ----------------------------------------------------------------------------
def test_writers_and_readers_learn_that_a_killed_owner_is_gone():
    replies, never = CTX.Queue(), CTX.Event()
    owner = CTX.Process(target=own_and_hang, args=(ReplayLayout(3, 2), 64, PREFIX, replies, never))
    owner.start()
    try:
        handle = replies.get(timeout=JOIN)
        writer, reader = ReplayStorage.attach(handle), ReplayStorage.attach(handle)
        add_values(writer, [1.0, 2.0])
        reader.sample(4, np.random.default_rng(0))
    finally:
        owner.kill()
        owner.join(JOIN)
    # A spawned child shares this process's resource tracker, so the name stays linked until
    # we exit: only the owner's pid tells. The check runs every _OWNER_CHECK_EVERY operations.
    with pytest.raises(ReplayOwnerGoneError, match=rf"{handle.name}.*pid {owner.pid}.*exited"):
        for _ in range(_OWNER_CHECK_EVERY):
            add_values(writer, [3.0])
    assert isinstance(ReplayOwnerGoneError("x"), ReplayClosedError)  # existing handlers still catch it
    with pytest.raises(ReplayOwnerGoneError, match="gone"):
        for _ in range(_OWNER_CHECK_EVERY):
            reader.sample(4, np.random.default_rng(0))
    with pytest.raises(ReplayOwnerGoneError, match=handle.name):  # and a new attach is refused at once
        ReplayStorage.attach(handle)
    writer.close()
    reader.close()
    # the segment is still linked (our shared tracker unlinks it when this process exits): clean up
    import _posixshmem
    from multiprocessing import resource_tracker

    _posixshmem.shm_unlink("/" + handle.name)
    resource_tracker.unregister("/" + handle.name, "shared_memory")


def test_a_live_owner_is_never_reported_gone():
    with make(capacity=4) as s:
        w = ReplayStorage.attach(s.handle)
        for k in range(3 * _OWNER_CHECK_EVERY):
            add_values(w, [float(k)])
        w.sample(8, np.random.default_rng(0))
        assert s.committed == 3 * _OWNER_CHECK_EVERY
        w.close()


# ---- item 4: attach validates the whole layout ----------------------------------------------------------------
@pytest.mark.parametrize(
    "mine, theirs, first",
    [
        (
            ReplayLayout(3, 2),
            ReplayLayout(2, 4),
            r"field 0 shape: the segment has 'obs' of shape \(3,\) float32, "
            r"the handle 'obs' of shape \(2,\)",
        ),
        (ReplayLayout(3, 2, {"a": 1}), ReplayLayout(3, 2, {"b": 1}), "field 6 name: .*'a'.*'b'"),
        (ReplayLayout(3, 2, {"a": 2}), ReplayLayout(3, 4), "field 2 shape: .*'action' of shape \\(2,\\)"),
        (ReplayLayout(3, 2, {"a": 1}), ReplayLayout(3, 2), "field 6 name: the segment has 'a' .* the handle no field"),
    ],
)
def test_attach_names_the_first_layout_mismatch_even_at_the_same_width(mine, theirs, first):
    assert mine.width == theirs.width or len(mine.fields) != len(theirs.fields)
    with ReplayStorage(mine, 8, prefix=PREFIX) as s, pytest.raises(ValueError, match=f"{s.name}.*{first}"):
        ReplayStorage.attach(ReplayHandle(s.name, theirs, 8))


def test_attach_names_a_capacity_mismatch():
    with make(capacity=8) as s, pytest.raises(ValueError, match="capacity: the segment has 8 rows, the handle 9"):
        ReplayStorage.attach(ReplayHandle(s.name, s.layout, 9))


def test_layout_fields_list_every_column_group_in_block_order():
    fields = ReplayLayout(3, 2, {"priv": 4}).fields
    assert fields == (
        ("obs", (3,), "float32"),
        ("next_obs", (3,), "float32"),
        ("action", (2,), "float32"),
        ("reward", (), "float32"),
        ("terminated", (), "float32"),
        ("truncated", (), "float32"),
        ("priv", (4,), "float32"),
    )


# ---- item 5: saved state is checked ------------------------------------------------------------------------
def saved(capacity=6):
    with make(capacity=capacity, extras={"e": 1}) as s:
        add_values(s, np.arange(5.0))
        add_values(s, [5.0, 6.0, 7.0])
        hole = s.reserve(1)
        state = s.to_state()
        s.abort(hole)
    return state


def flip(data: bytes, where: int, n: int = 64) -> bytes:
    out = bytearray(data)
    for i in range(where, where + n):
        out[i] ^= 0xFF
    return bytes(out)


def test_flipped_bytes_in_a_pickled_state_are_refused():
    state = saved()
    assert state["checksum"].startswith("sha256:")
    data = pickle.dumps(state)
    at = data.index(state["rows"].tobytes())
    corrupted = pickle.loads(flip(data, at + 8))  # unpickles fine: only the row values changed
    before = ours()
    with pytest.raises(ValueError, match="corrupted"):
        ReplayStorage.from_state(corrupted, prefix=PREFIX)
    assert ours() == before  # nothing created
    with ReplayStorage.from_state(pickle.loads(data), prefix=PREFIX) as t:  # the intact copy loads
        assert (t.reserved, t.committed) == (9, 8)


@pytest.mark.parametrize(
    "key, value, match",
    [
        ("committed", 10, r"committed = 10 > head = 9"),
        ("head", 20, "corrupted"),  # shapes still fit: only the checksum tells
        ("head", 3, r"committed = 8 > head = 3"),
        ("rows", np.zeros((5, 12), np.float32), r"shape \(6, 12\)"),
        ("rows", np.zeros((6, 12), np.float64), "float32"),
        ("holes", np.array([[5, 3]]), r"hole \[5, 3\)"),
        ("holes", np.array([[8, 12]]), r"hole \[8, 12\).*head = 9"),
        ("holes", np.zeros((33, 2), np.int64), "33 holes"),
        ("version", 1, "version 1"),
        ("checksum", None, "no sha256 checksum"),
        ("layout", ReplayLayout(3, 2, {"f": 1}), "corrupted"),  # same width, another extra name
        ("layout", ReplayLayout(3, 2), r"shape \(6, 11\)"),
    ],
)
def test_inconsistent_state_is_refused_and_creates_nothing(key, value, match):
    state = saved()
    state[key] = value
    before = ours()
    with pytest.raises(ValueError, match=match):
        ReplayStorage.from_state(state, prefix=PREFIX)
    assert ours() == before


def test_missing_keys_are_named():
    state = saved()
    del state["holes"]
    with pytest.raises(ValueError, match=r"missing.*holes"):
        ReplayStorage.from_state(state, prefix=PREFIX)
