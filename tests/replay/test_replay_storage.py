"""Tests of the framework-neutral shared replay ring (unilab_gym.replay)."""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import pickle
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from _replay_workers import seeded_batch, uniform_rows

from unilab_gym.replay import (
    MAX_SLOTS,
    ReplayClosedError,
    ReplayHandle,
    ReplayLayout,
    ReplayStorage,
    SegmentNotFoundError,
)

SHM = "/dev/shm"
PREFIX = f"ult{os.getpid()}_"  # this test process's segments only
CTX = mp.get_context("spawn")
JOIN = 60  # seconds; a generous bound, not a synchronisation


def ours() -> set[str]:
    return {f for f in os.listdir(SHM) if f.startswith(PREFIX)}


def exists(name: str) -> bool:
    return os.path.exists(os.path.join(SHM, name))


@pytest.fixture(autouse=True)
def no_leaked_segments():
    before = ours()
    yield
    gc.collect()
    leaked = ours() - before
    assert not leaked, f"leaked shared-memory segments: {leaked}"


def make(capacity=16, obs_dim=3, act_dim=2, extras=()):
    return ReplayStorage(ReplayLayout(obs_dim, act_dim, extras), capacity, prefix=PREFIX)


def add_values(storage, values):
    """Add rows whose every column equals the given values."""
    return storage.add(**uniform_rows(storage.layout, values))


# ---- layout -------------------------------------------------------------------------------------
def test_layout_columns_are_contiguous_and_documented():
    L = ReplayLayout(48, 12, {"priv": 5, "height": 2})
    assert (L.obs, L.next_obs, L.action) == (slice(0, 48), slice(48, 96), slice(96, 108))
    assert (L.reward, L.terminated, L.truncated) == (108, 109, 110)
    assert L.base_width == 2 * 48 + 12 + 3 == 111
    assert (L.extra("priv"), L.extra("height")) == (slice(111, 116), slice(116, 118))
    assert L.width == 118 and L.row_nbytes == 4 * 118
    assert pickle.loads(pickle.dumps(L)) == L


@pytest.mark.parametrize(
    "args",
    [(0, 2), (3, -1), (3, 2.5), (3, 2, {"a": 0}), (3, 2, [("a", 1), ("a", 2)]), (3, 2, {"obs": 1}), (3, 2, {"x y": 1})],
)
def test_layout_rejects_bad_dims_and_names(args):
    with pytest.raises(ValueError):
        ReplayLayout(*args)


# ---- add / gather / sample ---------------------------------------------------------------------------
def test_add_writes_each_column_where_the_layout_says():
    with make(capacity=8, extras={"priv": 2}) as s:
        L = s.layout
        b = seeded_batch(L, 5, seed=1)
        first = s.add(**b, extra={"priv": np.full((5, 2), 9.0)})
        assert first == 0 and s.reserved == s.committed == 5
        rows = s.gather(np.arange(5))
        np.testing.assert_array_equal(rows[:, L.obs], b["obs"])
        np.testing.assert_array_equal(rows[:, L.next_obs], b["next_obs"])
        np.testing.assert_array_equal(rows[:, L.action], b["action"])
        np.testing.assert_array_equal(rows[:, L.reward], b["reward"])
        np.testing.assert_array_equal(rows[:, L.terminated], b["terminated"].astype(np.float32))
        np.testing.assert_array_equal(rows[:, L.truncated], b["truncated"].astype(np.float32))
        np.testing.assert_array_equal(rows[:, L.extra("priv")], 9.0)
        # wrapping over those rows without extras writes zeros there, not stale values
        s.add(**seeded_batch(L, 8, seed=2))
        assert s.reserved == 13
        np.testing.assert_array_equal(s.gather(np.arange(5, 13))[:, L.extra_columns], 0.0)


def test_ring_keeps_the_newest_capacity_rows_and_samples_only_those():
    with make(capacity=10) as s:
        add_values(s, np.arange(7))
        add_values(s, np.arange(7, 16))  # wraps: rows 7..9 then 0..5
        add_values(s, np.arange(16, 25))
        assert (s.reserved, s.committed, len(s)) == (25, 25, 10)
        seq, rows = s.sample(2000, np.random.default_rng(0))
        assert seq.min() >= 15 and seq.max() < 25
        np.testing.assert_array_equal(rows[:, 0], seq.astype(np.float32))  # row content == its seq
        assert set(seq.tolist()) == set(range(15, 25))


def test_sampling_is_seeded_and_uniform():
    with make(capacity=64) as s:
        add_values(s, np.arange(20))
        a = s.sample_indices(4000, np.random.default_rng(7))
        b = s.sample_indices(4000, np.random.default_rng(7))
        np.testing.assert_array_equal(a, b)
        assert not np.array_equal(a, s.sample_indices(4000, np.random.default_rng(8)))
        counts = np.bincount(a, minlength=20)
        assert counts.shape == (20,) and counts.min() > 130 and counts.max() < 270  # expected 200 each


def test_reserved_rows_are_never_sampled_until_committed():
    with make(capacity=10) as s:
        add_values(s, np.arange(10))
        old = s.reserve(3)  # seq 10..12 overwrite rows 0..2 (old seq 0..2)
        newer = s.reserve(2)  # seq 13..14 overwrite rows 3..4
        for r0, r1, _, _ in old.pieces + newer.pieces:
            s.block[r0:r1] = -1.0  # half-written garbage
        rng = np.random.default_rng(0)
        assert set(s.sample_indices(3000, rng).tolist()) == set(range(5, 10))
        # commits out of order: the newer rows become visible, the older stay hidden
        s.block[3:5] = np.array([13.0, 14.0], np.float32)[:, None]
        s.commit(newer)
        assert len(s) == 7
        seq, rows = s.sample(3000, rng)
        assert set(seq.tolist()) == set(range(5, 10)) | {13, 14}
        assert (rows >= 0).all()
        s.block[0:3] = np.array([10.0, 11.0, 12.0], np.float32)[:, None]
        s.commit(old)
        assert set(s.sample_indices(3000, rng).tolist()) == set(range(5, 15))
        with pytest.raises(RuntimeError, match="not in flight"):
            s.commit(old)


def test_rows_overwritten_while_being_gathered_are_redrawn(monkeypatch):
    """A writer reserves (and scribbles on) rows between the draw and the end of the copy."""
    with make(capacity=10) as s:
        add_values(s, np.arange(10))
        real_gather = s.gather
        calls = []

        def gather_racing_a_writer(seq, out=None):
            out = real_gather(seq, out)
            if not calls:
                res = s.reserve(6)  # overwrites seq 0..5 right after we copied them
                for r0, r1, _, _ in res.pieces:
                    s.block[r0:r1] = -1.0
                calls.append(res)
            return out

        monkeypatch.setattr(s, "gather", gather_racing_a_writer)
        first_draw = s.sample_indices(64, np.random.default_rng(3))
        assert (first_draw < 6).any()  # the race does hit drawn rows
        seq, rows = s.sample(64, np.random.default_rng(3))
        assert seq.min() >= 6 and seq.max() < 10
        np.testing.assert_array_equal(rows[:, 0], seq.astype(np.float32))
        np.testing.assert_array_equal(rows, np.repeat(rows[:, :1], rows.shape[1], axis=1))
        s.abort(calls[0])


def test_overwritten_flags_rows_reserved_after_the_draw():
    with make(capacity=4) as s:
        add_values(s, np.arange(4))
        seq = np.arange(4)
        assert not s.overwritten(seq).any()
        res = s.reserve(2)
        np.testing.assert_array_equal(s.overwritten(seq), [True, True, False, False])
        s.abort(res)


def test_a_live_writer_is_never_overwritten():
    with make(capacity=8) as s:
        add_values(s, np.arange(4))
        res = s.reserve(4)  # rows 4..7 in flight
        add_values(s, [8, 9, 10, 11])  # overwrites seq 0..3: fine
        with pytest.raises(TimeoutError, match=f"pid {os.getpid()}"):
            s.reserve(1, timeout=0.0)  # would overwrite seq 4, still being written
        s.commit(res)
        add_values(s, [12])
        assert s.reserved == 13


def test_reservation_slots_are_bounded_and_abandoned_ranges_never_block():
    with make(capacity=1000) as s:
        held = [s.reserve(1) for _ in range(MAX_SLOTS)]
        with pytest.raises(TimeoutError, match="slots"):
            s.reserve(1, timeout=0.0)
        for res in held[::2]:
            s.commit(res)
        for res in held[1::2]:
            s.abort(res)  # 16 holes, interleaved with committed rows
        add_values(s, np.arange(MAX_SLOTS, 2 * MAX_SLOTS))  # one add per free slot ...
        for k in range(2 * MAX_SLOTS, 3 * MAX_SLOTS):  # ... and more than the free slots
            add_values(s, [k])
        seq = set(s.sample_indices(5000, np.random.default_rng(0)).tolist())
        assert seq <= set(range(0, MAX_SLOTS, 2)) | set(range(MAX_SLOTS, 3 * MAX_SLOTS))
        assert set(range(MAX_SLOTS, 3 * MAX_SLOTS)) <= seq  # rows added later are all visible


def test_seq_of_rows_maps_rows_to_committed_transitions():
    with make(capacity=4) as s:
        add_values(s, np.arange(4))
        add_values(s, [4, 5])
        np.testing.assert_array_equal(s.seq_of_rows([0, 1, 2, 3]), [4, 5, 2, 3])
        res = s.reserve(1)  # row 2 in flight
        with pytest.raises(ValueError, match="row 2"):
            s.seq_of_rows([3, 2])
        with pytest.raises(ValueError, match="out of range"):
            s.seq_of_rows([4])
        s.abort(res)


def test_reset_forgets_everything_and_refuses_with_a_writer_in_flight():
    with make(capacity=4) as s:
        add_values(s, np.arange(3))
        res = s.reserve(1)
        with pytest.raises(RuntimeError, match="is writing"):
            s.reset()
        s.commit(res)
        s.reset()
        assert (s.reserved, s.committed, len(s)) == (0, 0, 0)
        with pytest.raises(ValueError, match="no committed"):
            s.sample_indices(1, np.random.default_rng(0))


def test_to_state_from_state_is_an_exact_plain_copy():
    with make(capacity=6, extras={"e": 1}) as s:
        add_values(s, np.arange(6))
        add_values(s, [6, 7, 8])
        hole = s.reserve(1)  # seq 9 in flight, overwriting seq 3
        state = pickle.loads(pickle.dumps(s.to_state()))
        with ReplayStorage.from_state(state, prefix=PREFIX) as t:
            assert t.name != s.name and t.is_owner
            assert (t.reserved, t.committed) == (s.reserved, s.committed)
            np.testing.assert_array_equal(t.block, s.block)
            rng = np.random.default_rng(0)
            assert set(t.sample_indices(500, rng).tolist()) == set(range(4, 9))  # the hole stays a hole
            add_values(t, [100.0])
            assert s.reserved == 10 and s.committed == 9  # the copy is independent
        s.abort(hole)


def test_load_state_restores_in_place_and_attached_writers_keep_adding():
    with make(capacity=6, extras={"e": 1}) as s:
        add_values(s, np.arange(4))
        state = s.to_state()
        saved = s.block.copy()
        writer = ReplayStorage.attach(s.handle)
        try:
            add_values(writer, [10.0, 11.0, 12.0, 13.0])  # wraps: seq 4..7
            with make(capacity=5, extras={"e": 1}) as other, pytest.raises(ValueError, match="capacity"):
                s.load_state(other.to_state())  # another capacity: refused, nothing changes
            assert (s.reserved, s.committed) == (8, 8)
            s.load_state(state)
            assert (s.reserved, s.committed) == (4, 4) and s.name == writer.name
            np.testing.assert_array_equal(s.block[:4], saved[:4])
            rng = np.random.default_rng(0)
            assert set(s.sample_indices(200, rng).tolist()) == {0, 1, 2, 3}
            add_values(writer, [20.0])  # the writer's handle still works: it adds after the restored rows
            assert (s.reserved, s.committed) == (5, 5) and s.block[4, 0] == 20.0
        finally:
            writer.close()
        with ReplayStorage.attach(s.handle, read_only=True) as reader, pytest.raises(PermissionError):
            reader.load_state(state)


# ---- bad input -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "field, value",
    [
        ("obs", np.zeros((4, 2))),
        ("obs", np.zeros(3)),
        ("next_obs", np.zeros((3, 3))),
        ("action", np.zeros((4, 3))),
        ("reward", np.zeros(5)),
        ("terminated", np.zeros((4, 2))),
        ("obs", np.array([["a"] * 3] * 4)),
        ("action", np.zeros((4, 2), dtype=complex)),
        ("truncated", np.array([None] * 4)),
    ],
)
def test_bad_shapes_and_dtypes_raise_and_write_nothing(field, value):
    with make(capacity=8) as s:
        add_values(s, [1.0, 2.0])
        before = s.block.copy()
        batch = {k: v for k, v in uniform_rows(s.layout, np.arange(4)).items() if k != "extra"}
        batch[field] = value
        with pytest.raises(ValueError, match=field):
            s.add(**batch)
        assert (s.reserved, s.committed) == (2, 2)
        np.testing.assert_array_equal(s.block, before)


def test_extra_columns_must_match_the_layout():
    with make(capacity=8, extras={"priv": 2}) as s:
        batch = {k: v for k, v in uniform_rows(s.layout, np.arange(3)).items() if k != "extra"}
        with pytest.raises(ValueError, match="groups"):
            s.add(**batch, extra={"other": np.zeros((3, 2))})
        with pytest.raises(ValueError, match=r"extra\['priv'\]"):
            s.add(**batch, extra={"priv": np.zeros((3, 3))})
    with make(capacity=8) as s:
        batch = {k: v for k, v in uniform_rows(s.layout, np.arange(3)).items() if k != "extra"}
        with pytest.raises(ValueError, match="no extra columns"):
            s.add(**batch, extra=np.zeros((3, 1)))
        assert s.reserved == 0


def test_add_larger_than_capacity_raises():
    with make(capacity=4) as s:
        with pytest.raises(ValueError, match="capacity 4"):
            add_values(s, np.arange(5))
        assert s.reserved == 0


def test_sample_on_empty_replay_raises():
    with make() as s:
        with pytest.raises(ValueError, match="no committed transition"):
            s.sample(4, np.random.default_rng(0))
        add_values(s, [1.0])
        with pytest.raises(ValueError, match="batch_size"):
            s.sample(0, np.random.default_rng(0))
        with pytest.raises(ValueError, match="Generator"):
            s.sample(2, np.random.RandomState(0))


def test_bad_capacity_and_layout_raise():
    for capacity in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="capacity"):
            ReplayStorage(ReplayLayout(2, 1), capacity, prefix=PREFIX)
    with pytest.raises(ValueError, match="ReplayLayout"):
        ReplayStorage((2, 1), 4, prefix=PREFIX)


# ---- attach / handle / ownership ---------------------------------------------------------------------
def test_attach_is_zero_copy_and_never_unlinks():
    with make(capacity=8) as owner:
        handle = pickle.loads(pickle.dumps(owner.handle))
        assert isinstance(handle, ReplayHandle) and len(pickle.dumps(handle)) < 1024
        other = ReplayStorage.attach(handle)
        assert not other.is_owner
        owner.block[3, 0] = 42.0  # written through one mapping, read through the other
        assert other.block[3, 0] == 42.0
        add_values(other, [5.0, 6.0])
        assert owner.committed == 2 and owner.gather(np.array([1]))[0, 0] == 6.0
        other.close()
        assert exists(owner.name)  # an attacher's close never unlinks
        with pytest.raises(ReplayClosedError, match=owner.name):
            add_values(other, [1.0])
    assert not exists(owner.name)


def test_attach_to_a_missing_or_closed_segment_names_it():
    layout = ReplayLayout(3, 2)
    missing = ReplayHandle(PREFIX + "0123456789abcdef", layout, 8)
    with pytest.raises(SegmentNotFoundError, match=missing.name):
        ReplayStorage.attach(missing)
    s = make(capacity=8)
    handle = s.handle
    early = ReplayStorage.attach(handle)
    s.close()
    with pytest.raises(SegmentNotFoundError, match=handle.name):
        ReplayStorage.attach(handle)
    with pytest.raises(ReplayClosedError, match=handle.name):  # attached before the close
        add_values(early, [1.0])
    early.close()


def test_attached_writers_learn_that_a_collected_owner_is_gone():
    owner = make(capacity=8)
    writer = ReplayStorage.attach(owner.handle)
    name = owner.name
    del owner
    gc.collect()
    assert not exists(name)
    with pytest.raises(ReplayClosedError, match=name):
        add_values(writer, [1.0])
    writer.close()


def test_attach_with_a_mismatched_handle_raises():
    with make(capacity=8) as s:
        with pytest.raises(ValueError, match=s.name):
            ReplayStorage.attach(ReplayHandle(s.name, ReplayLayout(3, 2), 9))
        with pytest.raises(ValueError, match="ReplayHandle"):
            ReplayStorage.attach(s.name)
        with pytest.raises(TypeError, match="handle"):
            pickle.dumps(s)


# ---- cross-process -------------------------------------------------------------------------------------
def _join(*procs):
    for p in procs:
        p.join(JOIN)
        assert p.exitcode == 0, f"child exited with {p.exitcode}"


def test_child_adds_rows_and_parent_samples_them_without_copy():
    from _replay_workers import add_seeded

    with make(capacity=64, obs_dim=48, act_dim=12) as s:
        handles, replies = CTX.Queue(), CTX.Queue()
        child = CTX.Process(target=add_seeded, args=(handles, replies, 40, 123))
        child.start()
        handles.put(s.handle)  # the handle travels through a Queue
        assert replies.get(timeout=JOIN) == ("ok", 0)
        _join(child)
        assert s.committed == 40
        seq, rows = s.sample(256, np.random.default_rng(0))
        expected = s.layout
        b = seeded_batch(expected, 40, 123)
        np.testing.assert_array_equal(rows[:, expected.obs], b["obs"][seq])
        np.testing.assert_array_equal(rows[:, expected.action], b["action"][seq])
        np.testing.assert_array_equal(rows[:, expected.reward], b["reward"][seq])
        np.testing.assert_array_equal(rows[:, expected.terminated], b["terminated"][seq])


def test_concurrent_writers_and_a_sampler_never_see_torn_rows():
    from _replay_workers import write_uniform

    # the ring wraps ~10 times; it is large enough that a sample is rarely overwritten during its
    # gather (a capacity of 50 let fast writers on an idle machine exhaust the redraws)
    batches, batch_rows, capacity = 300, 7, 400
    with make(capacity=capacity, obs_dim=48, act_dim=12, extras={"priv": 30}) as s:
        start, replies = CTX.Event(), CTX.Queue()
        writers = [
            CTX.Process(target=write_uniform, args=(s.handle, w, batches, batch_rows, start, replies)) for w in (1, 2)
        ]
        for p in writers:
            p.start()
        add_values(s, [0.5])  # so the sampler has something before the writers start
        start.set()
        rng, checked, done = np.random.default_rng(0), 0, 0
        while done < 2:  # sample while both writers are running
            _, rows = s.sample(16, rng)
            np.testing.assert_array_equal(rows, np.repeat(rows[:, :1], rows.shape[1], axis=1))
            checked += 1
            while not replies.empty():
                replies.get()
                done += 1
            if any(p.exitcode not in (None, 0) for p in writers):
                pytest.fail(f"a writer died: {[p.exitcode for p in writers]}")
        _join(*writers)
        assert s.committed == 1 + 2 * batches * batch_rows == s.reserved
        final = s.block
        np.testing.assert_array_equal(final, np.repeat(final[:, :1], final.shape[1], axis=1))
        values = final[:, 0].astype(np.int64)
        assert len(set(values.tolist())) == capacity  # every row holds a distinct transition
        assert ((values // 1_000_000 >= 1) & (values % 1_000_000 < batches * batch_rows)).all()
        del final, values
        assert checked > 0


def test_a_killed_writer_never_blocks_others_and_its_rows_are_never_sampled():
    from _replay_workers import reserve_and_hang

    with make(capacity=20) as s:
        add_values(s, np.arange(10))
        replies, never = CTX.Queue(), CTX.Event()
        child = CTX.Process(target=reserve_and_hang, args=(s.handle, 5, replies, never))
        child.start()
        assert replies.get(timeout=JOIN) == ("reserved", 10)
        os.kill(child.pid, signal.SIGKILL)
        child.join(JOIN)
        assert child.exitcode == -signal.SIGKILL
        assert exists(s.name)  # an attacher's death does not remove the segment
        add_values(s, np.arange(15, 20))  # committed after the dead range
        seq, rows = s.sample(3000, np.random.default_rng(0))
        assert set(seq.tolist()) == set(range(10)) | set(range(15, 20))
        assert (rows != -7.0).all()
        # wrapping over the dead writer's rows does not wait for it
        add_values(s, np.arange(20, 36))
        seq = s.sample_indices(3000, np.random.default_rng(1))
        assert set(seq.tolist()) == set(range(16, 36))
        add_values(s, np.arange(36, 40))
        assert len(s) == 20  # the dead rows left the window


def test_a_killed_attached_child_leaves_the_segment_to_its_owner():
    from _replay_workers import attach_and_hang

    s = make(capacity=8)
    name = s.name
    add_values(s, [1.0, 2.0])
    replies, never = CTX.Queue(), CTX.Event()
    child = CTX.Process(target=attach_and_hang, args=(s.handle, replies, never))
    child.start()
    assert replies.get(timeout=JOIN) == ("attached", 2)
    os.kill(child.pid, signal.SIGKILL)
    child.join(JOIN)
    assert exists(name)
    other = ReplayStorage.attach(s.handle)  # still attachable, data intact
    assert other.gather(np.array([1]))[0, 0] == 2.0
    other.close()
    s.close()
    assert not exists(name)


# ---- leaks --------------------------------------------------------------------------------------------
def test_close_and_garbage_collection_unlink():
    s = make()
    name = s.name
    assert exists(name)
    s.close()
    s.close()  # idempotent
    assert not exists(name)
    with pytest.raises(ReplayClosedError):
        s.sample(1, np.random.default_rng(0))
    t = make()
    name = t.name
    del t
    gc.collect()
    assert not exists(name)


def test_exception_inside_with_block_unlinks():
    with pytest.raises(ZeroDivisionError), make() as s:
        name = s.name
        1 / 0
    assert not exists(name)


def test_close_with_a_live_view_still_unlinks():
    s = make()
    view = s.block
    s.close()
    assert not exists(s.name)
    assert view.shape == (16, s.layout.width)  # the view stays readable, the name is gone
    del view


_OWNER_SCRIPT = textwrap.dedent(
    """
    import sys
    from unilab_gym.replay import ReplayLayout, ReplayStorage
    storage = ReplayStorage(ReplayLayout(4, 2), 1000, prefix={prefix!r})
    ReplayStorage.attach(storage.handle).close()  # an attacher must not cancel the crash clean-up
    print(storage.name, flush=True)
    {then}
    """
)


def _owner_process(then: str) -> subprocess.Popen:
    script = _OWNER_SCRIPT.format(prefix=PREFIX, then=then)
    return subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_owner_process_exiting_through_an_exception_unlinks():
    proc = _owner_process("raise RuntimeError('boom')")
    out, err = proc.communicate(timeout=JOIN)  # returns once every holder of the pipes exited
    assert proc.returncode == 1 and "RuntimeError: boom" in err
    name = out.strip()
    assert name.startswith(PREFIX) and not exists(name)
    assert "leaked" not in err  # our finalizer unlinked it, not the resource tracker


def test_owner_process_killed_is_cleaned_by_its_resource_tracker():
    proc = _owner_process("sys.stdin.read()")
    name = proc.stdout.readline().strip()
    assert name.startswith(PREFIX) and exists(name)
    proc.kill()
    # communicate() waits for EOF on stderr, which the owner's resource tracker holds until
    # it has cleaned up and exited: no sleep needed.
    _, err = proc.communicate(timeout=JOIN)
    assert proc.returncode == -signal.SIGKILL
    assert not exists(name)
    assert "leaked shared_memory" in err


def test_fork_inherited_owner_does_not_unlink():
    if "fork" not in mp.get_all_start_methods():
        pytest.skip("no fork on this platform")
    with make() as s:
        pid = os.fork()
        if pid == 0:  # child: close the inherited owner object
            code = 0
            try:
                s.close()
            except BaseException:
                code = 1
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert exists(s.name)


# ---- torch sampling -----------------------------------------------------------------------------------
def test_import_does_not_load_torch():
    code = "import sys, unilab_gym.replay; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "False"


@pytest.mark.parametrize("staging", [False, True])
def test_torch_sampler_gathers_into_fresh_tensors(staging):
    torch = pytest.importorskip("torch")
    from unilab_gym.replay import TorchSampler

    with make(capacity=32, obs_dim=5, act_dim=2) as s:
        add_values(s, np.arange(32))
        sampler = TorchSampler(s.layout.width, "cpu", staging=staging)
        assert sampler.staging is staging
        seq1, t1 = sampler.sample(s, 16, np.random.default_rng(0))
        keep = t1.clone()
        seq2, t2 = sampler.sample(s, 16, np.random.default_rng(1))
        seq3, t3 = sampler.sample(s, 16, np.random.default_rng(2))  # reuses the first staging buffer
        assert t1.dtype == torch.float32 and t1.shape == (16, s.layout.width) and t1.device.type == "cpu"
        torch.testing.assert_close(t1, keep, rtol=0, atol=0)  # later samples never alias it
        for seq, t in ((seq1, t1), (seq2, t2), (seq3, t3)):
            np.testing.assert_array_equal(t.numpy(), s.gather(seq))
        with pytest.raises(ValueError, match="width"):
            TorchSampler(3, "cpu").sample(s, 4, np.random.default_rng(0))


def test_torch_sampler_cuda_path():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from unilab_gym.replay import TorchSampler

    with make(capacity=64, obs_dim=48, act_dim=12) as s:
        add_values(s, np.arange(64))
        sampler = TorchSampler(s.layout.width, "cuda")
        assert sampler.staging
        results = [sampler.sample(s, 32, np.random.default_rng(k)) for k in range(4)]
        torch.cuda.synchronize()
        for seq, t in results:
            assert t.is_cuda
            np.testing.assert_array_equal(t.cpu().numpy(), s.gather(seq))
