"""Several learners on one shared replay (issue 18, item 4): read-only readers."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal

import numpy as np
import pytest
import torch as th
from _replay_workers import read_uniform, sb3_reader_and_hang, uniform_rows, write_uniform
from gymnasium import spaces

from unilab_gym.replay import ReplayLayout, ReplayStorage
from unilab_gym.sb3.replay_buffer import SharedReplayBuffer

CTX = mp.get_context("spawn")
JOIN = 60  # seconds; a generous bound, not a synchronisation
OBS = spaces.Box(-1e7, 1e7, (8,), np.float32)
ACT = spaces.Box(-1e7, 1e7, (2,), np.float32)


def exists(name: str) -> bool:
    return os.path.exists(f"/dev/shm/{name}")


def _join(*procs):
    for p in procs:
        p.join(JOIN)
        assert p.exitcode == 0, p.exitcode


def test_a_read_only_buffer_samples_the_owners_data_and_refuses_writes():
    owner = SharedReplayBuffer(40, OBS, ACT, n_envs=2, seed=0)
    owner.storage.add(**uniform_rows(owner.layout, np.arange(20.0)))
    reader = SharedReplayBuffer.attach(owner.handle, n_envs=2, device="cpu", seed=3)
    assert reader.storage.read_only and not reader.storage.is_owner
    assert (reader.size(), reader.pos) == (owner.size(), owner.pos)
    s = reader.sample(32)
    th.testing.assert_close(s.observations, s.rewards.expand(32, 8))  # rows are whole
    np.testing.assert_array_equal(reader.observations, owner.observations)
    with pytest.raises(PermissionError, match="read-only"):
        reader.add(np.zeros((2, 8)), np.zeros((2, 8)), np.zeros((2, 2)), np.zeros(2), np.zeros(2), [{}, {}])
    with pytest.raises(PermissionError, match="read-only"):
        reader.reset()
    with pytest.raises(ValueError, match="does not divide"):
        SharedReplayBuffer.attach(owner.handle, n_envs=3)
    with pytest.raises(ValueError, match="layout"):
        SharedReplayBuffer.attach(owner.handle, observation_space=spaces.Box(-1, 1, (9,), np.float32))
    copy_ = pickle.loads(pickle.dumps(reader))  # a plain copy, owned by the copy
    assert copy_.storage.is_owner and copy_.size() == owner.size()
    copy_.close()
    name = owner.storage.name
    reader.close()
    assert exists(name)  # a reader never unlinks
    owner.storage.add(**uniform_rows(owner.layout, [99.0]))  # the owner goes on
    owner.close()
    assert not exists(name)


def test_readers_work_with_the_optimized_layout_and_dict_observations():
    obs = spaces.Dict({"policy": OBS, "critic": spaces.Box(-1e7, 1e7, (3,), np.float32)})
    owner = SharedReplayBuffer(40, obs, ACT, n_envs=1, seed=0, optimize_memory_usage=True)
    rng = np.random.default_rng(0)
    o = {k: rng.standard_normal((1, *s.shape)).astype(np.float32) for k, s in obs.spaces.items()}
    for _ in range(10):
        n = {k: rng.standard_normal((1, *s.shape)).astype(np.float32) for k, s in obs.spaces.items()}
        owner.add(o, n, np.zeros((1, 2), np.float32), np.zeros(1), np.zeros(1), [{}])
        o = n
    reader = SharedReplayBuffer.attach(owner.handle, seed=1)
    assert reader.optimize_memory_usage and reader.is_dict
    s = reader.sample(16)
    assert s.observations["policy"].shape == (16, 8) and s.next_observations["critic"].shape == (16, 3)
    reader.close()
    owner.close()


def test_two_reader_processes_sample_during_a_run_and_never_see_torn_rows():
    batches, batch_rows = 300, 7
    with ReplayStorage(ReplayLayout({"policy": 48, "critic": 7}, 12), 400) as s:
        s.add(**uniform_rows(s.layout, [0.5]))  # something to sample before the writer starts
        start, replies = CTX.Event(), CTX.Queue()
        writer = CTX.Process(target=write_uniform, args=(s.handle, 1, batches, batch_rows, start, replies))
        readers = [CTX.Process(target=read_uniform, args=(s.handle, 200, start, replies)) for _ in range(2)]
        for p in (writer, *readers):
            p.start()
        start.set()
        got = [replies.get(timeout=JOIN) for _ in range(3)]
        _join(writer, *readers)
        reads = [r for r in got if r[0] == "read"]
        assert len(reads) == 2 and all(torn == 0 for _, _, torn in reads), got
        assert s.committed == 1 + batches * batch_rows


def test_killing_a_reader_leaves_the_run_going_and_nothing_in_dev_shm():
    owner = SharedReplayBuffer(200, OBS, ACT, seed=0)
    owner.storage.add(**uniform_rows(owner.layout, np.arange(50.0)))
    replies, never = CTX.Queue(), CTX.Event()
    reader = CTX.Process(target=sb3_reader_and_hang, args=(owner.handle, replies, never))
    reader.start()
    assert replies.get(timeout=JOIN) == ("sampled", 8)
    os.kill(reader.pid, signal.SIGKILL)
    reader.join(JOIN)
    assert reader.exitcode == -signal.SIGKILL
    name = owner.storage.name
    assert exists(name)  # the killed reader did not take the replay with it
    owner.storage.add(**uniform_rows(owner.layout, np.arange(50.0, 120.0)))  # the run goes on
    assert owner.sample(16).observations.shape == (16, 8) and owner.size() == 120
    owner.close()
    assert not exists(name)  # the reader created no segment, and holds none open: nothing is left
