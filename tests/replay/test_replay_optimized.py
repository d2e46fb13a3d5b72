"""Memory-optimized layout (issue 18, item 2): each observation once, final observations aside."""

from __future__ import annotations

import multiprocessing as mp
import os

import numpy as np
import pytest
from _replay_workers import expected_transition, stream_step, write_stream
from gymnasium import spaces
from stable_baselines3 import SAC
from stable_baselines3.common.buffers import ReplayBuffer
from stable_baselines3.common.env_util import make_vec_env

from unilab_gym.replay import ReplayLayout, ReplayStorage
from unilab_gym.sb3.replay_buffer import SharedReplayBuffer

CTX = mp.get_context("spawn")
OBS6 = spaces.Box(-1e6, 1e6, (6,), np.float32)
ACT3 = spaces.Box(-1e6, 1e6, (3,), np.float32)
DICT_OBS = spaces.Dict({"policy": OBS6, "critic": spaces.Box(-1e6, 1e6, (3,), np.float32)})


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def numpy_tuple(samples):
    def conv(x):
        return {k: v.numpy() for k, v in x.items()} if isinstance(x, dict) else x.numpy()

    return {
        "obs": conv(samples.observations),
        "next_obs": conv(samples.next_observations),
        "action": samples.actions.numpy(),
        "reward": samples.rewards.numpy()[:, 0],
        "terminated": samples.dones.numpy()[:, 0],
    }


def assert_stream_transitions(samples, dict_obs=False):
    """Every sampled tuple is a transition of the stream; returns how many were truncated."""
    got = numpy_tuple(samples)
    want = expected_transition(got["action"], dict_obs)
    for key in ("obs", "next_obs"):
        if dict_obs:
            for k in want[key]:
                np.testing.assert_array_equal(got[key][k], want[key][k], err_msg=f"{key}[{k}]")
        else:
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    np.testing.assert_array_equal(got["reward"], want["reward"])
    np.testing.assert_array_equal(got["terminated"], want["terminated"].astype(np.float32))
    return int(want["truncated"].sum())


# ---- bytes -----------------------------------------------------------------------------------------
def test_bytes_are_at_most_0_6_of_the_plain_layout_for_48_floats():
    obs, act = spaces.Box(-1, 1, (48,), np.float32), spaces.Box(-1, 1, (12,), np.float32)
    plain = SharedReplayBuffer(20_000, obs, act, n_envs=64)
    small = SharedReplayBuffer(20_000, obs, act, n_envs=64, optimize_memory_usage=True)
    assert plain.layout.row_nbytes == 444 and small.layout.row_nbytes == 256
    assert small.storage.nbytes <= 0.6 * plain.storage.nbytes
    plain.close()
    small.close()


def test_layout_has_no_next_obs_fields_and_a_next_column():
    L = ReplayLayout(48, 12, final_obs=10)
    assert [f[0] for f in L.fields] == ["obs", "action", "reward", "terminated", "truncated", "next"]
    assert L.side_nbytes == 10 * (192 + 8)


# ---- successor rows ------------------------------------------------------------------------------------
def test_a_row_without_a_committed_successor_is_never_sampled():
    buf = SharedReplayBuffer(40, OBS6, ACT3, n_envs=2, optimize_memory_usage=True, seed=0)
    buf.storage.add(**stream_step(0, 2, 0))  # t=0: no episode ends, the successors are unknown
    with pytest.raises(RuntimeError, match="successor"):
        buf.sample(4)
    with pytest.raises(RuntimeError, match="not known yet"):
        buf._get_samples(np.array([0]))
    buf.storage.add(**stream_step(0, 2, 1))  # no episode end either
    for _ in range(20):  # only step 0 is complete (step 1 waits for step 2)
        s = buf.sample(8)
        assert (s.actions[:, 2] == 0).all()
        assert_stream_transitions(s)
    buf.close()


def test_episode_ends_use_the_side_table_and_interleaved_writers_find_their_successors():
    buf = SharedReplayBuffer(300, OBS6, ACT3, n_envs=3, optimize_memory_usage=True, seed=0, final_obs_capacity=100)
    writers = [ReplayStorage.attach(buf.handle) for _ in range(2)]
    truncated = 0
    for t in range(60):  # wraps the 300-row ring: 2 writers x 3 envs x 60 steps
        for w, storage in enumerate(writers):
            storage.add(**stream_step(w, 3, t))
        if t > 5:
            truncated += assert_stream_transitions(buf.sample(64))
    assert truncated > 0  # truncated transitions were drawn, and bootstrapped from their final obs
    for storage in writers:
        storage.close()
    buf.close()


def test_a_next_obs_that_is_not_the_successors_obs_goes_aside():
    buf = SharedReplayBuffer(40, OBS6, ACT3, n_envs=1, optimize_memory_usage=True, seed=0)
    a = stream_step(0, 1, 0)
    buf.storage.add(**a)
    b = stream_step(0, 1, 5)  # not the successor of step 0: its obs differs from step 0's next_obs
    buf.storage.add(**b)
    buf.storage.add(**stream_step(0, 1, 6))
    for _ in range(10):
        assert_stream_transitions(buf.sample(8))
    buf.close()


@pytest.mark.parametrize("dict_obs", [False, True])
def test_optimized_and_plain_buffers_sample_the_same_transitions(dict_obs):
    obs_space = DICT_OBS if dict_obs else OBS6
    kw = dict(n_envs=4, seed=0, final_obs_capacity=64)
    small = SharedReplayBuffer(200, obs_space, ACT3, optimize_memory_usage=True, **kw)
    plain = SharedReplayBuffer(200, obs_space, ACT3, **kw)
    truncated = 0
    for t in range(120):  # wraps
        step = stream_step(3, 4, t, dict_obs)
        small.storage.add(**step)
        plain.storage.add(**step)
        if t > 3:
            truncated += assert_stream_transitions(small.sample(32), dict_obs)
            assert_stream_transitions(plain.sample(32), dict_obs)
    assert truncated > 0
    small.close()
    plain.close()


def test_two_writer_processes_wrap_around_and_every_sample_is_a_stream_transition():
    kw = dict(n_envs=4, seed=0)
    small = SharedReplayBuffer(240, OBS6, ACT3, optimize_memory_usage=True, final_obs_capacity=96, **kw)
    plain = SharedReplayBuffer(240, OBS6, ACT3, **kw)
    handles = [small.handle, plain.handle]
    start, replies = CTX.Event(), CTX.Queue()
    steps = 150  # 2 writers x 4 envs x 150 steps = 1200 rows: the ring wraps 5 times
    procs = [CTX.Process(target=write_stream, args=(handles, w, steps, 4, start, replies)) for w in (1, 2)]
    for p in procs:
        p.start()
    for storage in (small.storage, plain.storage):  # something to sample before the writers start
        for t in range(3):
            storage.add(**stream_step(0, 4, t))
    start.set()
    done, checked, truncated = 0, 0, 0
    while done < 2:
        truncated += assert_stream_transitions(small.sample(32))
        assert_stream_transitions(plain.sample(32))
        checked += 1
        while not replies.empty():
            replies.get()
            done += 1
        if any(p.exitcode not in (None, 0) for p in procs):
            pytest.fail(f"a writer died: {[p.exitcode for p in procs]}")
    for p in procs:
        p.join(30)
    for _ in range(20):  # after the run, with the ring wrapped
        truncated += assert_stream_transitions(small.sample(64))
    assert checked > 0 and truncated > 0
    assert small.storage.committed == plain.storage.committed == 12 + 2 * steps * 4
    small.close()
    plain.close()


# ---- through SB3 -----------------------------------------------------------------------------------------
def test_sac_with_optimize_memory_usage_and_timeouts_stores_what_sb3s_plain_buffer_stores():
    buffers = {}
    for cls, optimize in ((SharedReplayBuffer, True), (ReplayBuffer, False)):
        env = make_vec_env("Pendulum-v1", n_envs=2, seed=3, env_kwargs={"max_episode_steps": 7})
        model = SAC(
            "MlpPolicy",
            env,
            buffer_size=40,
            learning_starts=10_000,
            replay_buffer_class=cls,
            optimize_memory_usage=optimize,
            # ~6 episode ends in the 20-step ring: more side entries than the default (1 per 25 rows)
            replay_buffer_kwargs={"handle_timeout_termination": True}
            | ({"final_obs_capacity": 16} if optimize else {}),
            seed=3,
        )
        model.learn(52)  # wraps the 20-step ring, time-limit ends every 7 steps
        buffers[cls] = model.replay_buffer
    ours, sb3 = buffers[SharedReplayBuffer], buffers[ReplayBuffer]
    assert (ours.pos, ours.full, ours.size()) == (sb3.pos, sb3.full, sb3.size())
    assert ours.next_observations is None
    np.testing.assert_array_equal(ours.observations, sb3.observations)
    rows = np.arange(40)
    fields, ok = ours.storage.gather_fields(ours.storage.seq_of_rows(rows))
    last = (sb3.pos - 1) % 20  # the newest step waits for its successor
    assert not ok.reshape(20, 2)[last].any() and ok.reshape(20, 2)[np.arange(20) != last].all()
    want_next = sb3.next_observations.reshape(40, -1)
    np.testing.assert_array_equal(fields["next_obs"][ok], want_next[ok])  # final obs at time-limit ends
    assert (sb3.timeouts.reshape(40)[ok] > 0).sum() > 0
    np.testing.assert_array_equal(fields["terminated"], (sb3.dones * (1 - sb3.timeouts)).reshape(40))
    ours.close()


def test_save_and_load_round_trip(tmp_path):
    model = SAC(
        "MlpPolicy", "Pendulum-v1", buffer_size=60, learning_starts=10_000, seed=0,
        replay_buffer_class=SharedReplayBuffer, optimize_memory_usage=True,
    )  # fmt: skip
    model.learn(80)
    before = model.replay_buffer
    seq = before.storage.seq_of_rows(np.arange(60))
    fields, ok = before.storage.gather_fields(seq)
    model.save_replay_buffer(tmp_path / "replay.pkl")
    model.load_replay_buffer(tmp_path / "replay.pkl")
    after = model.replay_buffer
    assert after is not before and after.optimize_memory_usage
    fields2, ok2 = after.storage.gather_fields(seq)
    np.testing.assert_array_equal(ok, ok2)
    for name in fields:
        np.testing.assert_array_equal(fields[name][ok], fields2[name][ok], err_msg=name)
    model.learn(20, reset_num_timesteps=False)  # keeps adding and sampling
    before.close()
    after.close()


def test_segments_are_released():
    buf = SharedReplayBuffer(40, OBS6, ACT3, optimize_memory_usage=True)
    name = buf.storage.name
    buf.close()
    assert not os.path.exists(f"/dev/shm/{name}")
