"""Tianshou adapter: vector env like DummyVectorEnv, SharedVectorReplayBuffer like VectorReplayBuffer."""

import pickle

import gymnasium as gym
import numpy as np
import pytest
import torch
from tianshou.algorithm.modelfree.sac import SACPolicy
from tianshou.data import Batch, Collector, ReplayBuffer, VectorReplayBuffer
from tianshou.env import DummyVectorEnv
from tianshou.utils.net.common import Net
from tianshou.utils.net.continuous import ContinuousActorProbabilistic

import unilab_gym  # noqa: F401  (registers the id)
from unilab_gym import UniLabVectorEnv
from unilab_gym.replay import ReplayStorage
from unilab_gym.tianshou import SharedVectorReplayBuffer, TianshouVectorEnv, make_tianshou_env

ID = "UniLab/Quadruped-v0"
# short episodes that end both ways: falls (tilt > 0.1 rad) and time limits (40 steps)
ENDS_BOTH_WAYS = dict(max_episode_steps=40, termination={"max_tilt": 0.1})
FIELDS = ("obs", "act", "obs_next", "terminated", "truncated", "done")


def _reference_envs(n, **kwargs):
    return DummyVectorEnv([lambda: gym.make(ID, **kwargs) for _ in range(n)])


def _policy(seed=0):
    torch.manual_seed(seed)
    actor = ContinuousActorProbabilistic(
        preprocess_net=Net(state_shape=48, hidden_sizes=[32]), action_shape=12, unbounded=True
    )
    return SACPolicy(actor=actor, action_space=gym.spaces.Box(-1, 1, (12,), np.float32))


def _same_infos(mine, theirs):
    assert mine.dtype == theirs.dtype == object and len(mine) == len(theirs)
    for a, b in zip(mine, theirs):
        assert a.keys() >= b.keys()
        for key in b:
            np.testing.assert_array_equal(a[key], b[key])  # also compares nested dicts (reward_terms)


@pytest.mark.parametrize("mode", ["Disabled", "NextStep"])
def test_vector_env_steps_like_dummy_vector_env(mode):
    n = 4
    ours = TianshouVectorEnv(UniLabVectorEnv(n, autoreset_mode=mode, **ENDS_BOTH_WAYS))
    ref = _reference_envs(n, **ENDS_BOTH_WAYS)
    assert len(ours) == ours.env_num == n
    assert ours.seed(3) == ref.seed(3) == [[3], [4], [5], [6]]
    (obs, info), (obs_r, info_r) = ours.reset(), ref.reset()
    np.testing.assert_array_equal(obs, obs_r)
    _same_infos(info, info_r)
    rng = np.random.default_rng(0)
    ends = {"terminated": 0, "truncated": 0}
    for _ in range(120):
        act = rng.uniform(-1, 1, (n, 12)).astype(np.float32)
        out, out_r = ours.step(act, np.arange(n)), ref.step(act, np.arange(n))
        for mine, theirs in zip(out[:4], out_r[:4]):
            np.testing.assert_array_equal(mine, theirs)
            assert mine.dtype == theirs.dtype
        _same_infos(out[4], out_r[4])
        assert [i["env_id"] for i in out[4]] == list(range(n))
        terminated, truncated = out[2], out[3]
        ends["terminated"] += terminated.sum()
        ends["truncated"] += truncated.sum()
        done = np.flatnonzero(terminated | truncated)
        if done.size:  # the Collector resets finished envs by id
            (obs, info), (obs_r, info_r) = ours.reset(env_id=done), ref.reset(env_id=done)
            assert obs.shape == (done.size, 48)
            np.testing.assert_array_equal(obs, obs_r)
            _same_infos(info, info_r)
    assert ends["terminated"] > 0 and ends["truncated"] > 0, ends
    # the per-env action spaces were seeded like the reference's (Collector's random=True)
    for mine, theirs in zip(ours.action_space, ref.action_space):
        np.testing.assert_array_equal(mine.sample(), theirs.sample())
    ours.close(), ref.close()


def test_subset_steps_mark_the_others_stale():
    envs = make_tianshou_env(ID, 3, seed=0)
    envs.reset()
    obs, _, _, _, info = envs.step(np.zeros((2, 12)), id=[2, 0])
    assert obs.shape == (2, 48) and [i["env_id"] for i in info] == [2, 0]
    with pytest.raises(RuntimeError, match=r"envs \[1\]"):
        envs.step(np.zeros((3, 12)))
    envs.reset(env_id=[1])
    assert envs.step(np.zeros((3, 12)))[0].shape == (3, 48)
    envs.close()


def test_vector_env_rejects_bad_input():
    with pytest.raises(ValueError, match="SameStep"):
        TianshouVectorEnv(UniLabVectorEnv(1, autoreset_mode="SameStep"))
    with pytest.raises(TypeError, match="UniLabVectorEnv"):
        TianshouVectorEnv(gym.make(ID))
    envs = make_tianshou_env(ID, 2, seed=0)
    envs.reset()
    with pytest.raises(ValueError, match="2 envs"):
        envs.step(np.zeros((1, 12)))
    with pytest.raises(ValueError, match=r"\[0, 2\)"):
        envs.step(np.zeros((1, 12)), id=[5])
    with pytest.raises(ValueError, match="distinct"):
        envs.reset(env_id=[1, 1])
    with pytest.raises(TypeError, match="unexpected"):
        envs.reset(colour="red")
    with pytest.raises(ValueError, match="subset"):
        envs.set_env_attr("max_episode_steps", 3, id=[0])
    envs.set_env_attr("max_episode_steps", 3)
    assert envs.get_env_attr("max_episode_steps") == [3, 3]
    envs.close()
    with pytest.raises(AssertionError, match="after close"):
        envs.reset()


def _collect(envs, buffer, seed):
    collector = Collector(_policy(), envs, buffer)
    envs.seed(seed)
    collector.reset()
    collector.collect(n_step=4 * 60, random=True)  # exploration from the per-env action spaces
    collector.collect(n_step=4 * 60)  # the policy's actions
    return collector


def test_collects_into_shared_buffer_like_vector_replay_buffer():
    size = 4 * 100  # 120 steps per env: every sub-buffer wraps around
    shared = SharedVectorReplayBuffer(size, 4)
    standard = VectorReplayBuffer(size, 4)
    _collect(make_tianshou_env(ID, 4, **ENDS_BOTH_WAYS), shared, seed=1)
    _collect(make_tianshou_env(ID, 4, **ENDS_BOTH_WAYS), standard, seed=1)
    # Tianshou's reference semantics: DummyVectorEnv over single envs, standard buffer
    reference = VectorReplayBuffer(size, 4)
    _collect(_reference_envs(4, **ENDS_BOTH_WAYS), reference, seed=1)

    assert len(shared) == len(standard) == len(reference) == size
    np.testing.assert_array_equal(shared.last_index, standard.last_index)
    a, b, ref = shared[:], standard[:], reference[:]
    for key in FIELDS:
        np.testing.assert_array_equal(getattr(a, key), getattr(b, key), err_msg=key)
        np.testing.assert_array_equal(getattr(a, key), getattr(ref, key), err_msg=key)
    assert a.rew.dtype == np.float32  # stored in the float32 block
    np.testing.assert_array_equal(a.rew, b.rew.astype(np.float32))
    np.testing.assert_array_equal(a.info.env_id, b.info.env_id)
    assert a.done.any() and a.terminated.any() and a.truncated.any()

    # episode ends keep the true final obs: obs_next != the next row's obs (a fresh episode)
    ends = np.flatnonzero(shared.done[: shared.maxsize])
    ends = ends[(ends + 1) % 100 != 0]  # next row in the same sub-buffer
    ends = ends[ends != shared.last_index[ends // 100]]  # row ends + 1 was written after row ends
    assert ends.size > 0
    assert all(not np.array_equal(shared.obs_next[i], shared.obs[i + 1]) for i in ends)
    # ... while inside an episode obs_next is the next obs
    inside = np.flatnonzero(~shared.done[:size])
    inside = inside[((inside + 1) % 100 != 0) & ~np.isin(inside, shared.last_index)]
    np.testing.assert_array_equal(shared.obs_next[inside], shared.obs[inside + 1])

    # the transitions live in the shared block; another mapping of it sees them
    attached = ReplayStorage.attach(shared.handle)
    L, block = attached.layout, attached.block
    np.testing.assert_array_equal(block[:, L.obs], shared.obs)
    np.testing.assert_array_equal(block[:, L.next_obs], shared.obs_next)
    np.testing.assert_array_equal(block[:, L.action], shared.act)
    np.testing.assert_array_equal(block[:, L.reward], shared.rew)
    np.testing.assert_array_equal(block[:, L.terminated], shared.terminated)
    np.testing.assert_array_equal(block[:, L.truncated], shared.truncated)
    del block
    attached.close()
    shared.close()


def _batch(n, rew=0.0, obs_dtype=np.float32, obs_dim=48):
    return Batch(
        obs=np.zeros((n, obs_dim), obs_dtype),
        act=np.zeros((n, 12), np.float32),
        rew=np.full(n, rew),
        terminated=np.zeros(n, bool),
        truncated=np.zeros(n, bool),
        obs_next=np.zeros((n, obs_dim), obs_dtype),
        info=Batch(env_id=np.arange(n)),
    )


def test_hasnull_tracks_written_rows_without_rescanning(monkeypatch):
    buf = SharedVectorReplayBuffer(40, 2)
    buf.add(_batch(2))
    assert not buf.hasnull()
    idx, *_ = buf.add(_batch(2, rew=np.nan))
    assert buf.hasnull() and buf.isnull().rew.sum() == 2  # agrees with Tianshou's full scan
    buf.set_array_at_key(np.zeros(2), "rew", index=idx)  # e.g. an episode hook fixing them
    assert not buf.hasnull()
    buf.add(_batch(2, rew=np.nan))
    buf.reset()
    assert not buf.hasnull()
    # hasnull no longer gathers the buffer (Tianshou's version is self[:].hasnull())
    monkeypatch.setattr(SharedVectorReplayBuffer, "__getitem__", lambda *a: pytest.fail("rescanned"))
    assert buf.hasnull() is False


def test_shared_buffer_rejects_bad_input_without_writing():
    with pytest.raises(ValueError, match="stack_num"):
        SharedVectorReplayBuffer(10, 2, stack_num=4)
    with pytest.raises(ValueError, match="both"):
        SharedVectorReplayBuffer(10, 2, obs_shape=(48,))
    buf = SharedVectorReplayBuffer(10, 2, obs_shape=(48,), act_dim=12)
    assert buf.storage.layout.width == 48 * 2 + 12 + 3
    with pytest.raises(ValueError, match="float32"):
        buf.add(_batch(2, obs_dtype=np.int64))
    with pytest.raises(ValueError, match=r"obs must have shape \(2, 48\)"):
        buf.add(_batch(2, obs_dim=47))
    assert len(buf) == 0 and buf.last_index.tolist() == [0, 5]
    with pytest.raises(NotImplementedError):
        buf.dropnull()
    with pytest.raises(NotImplementedError):
        buf.set_batch(Batch())
    with pytest.raises(RuntimeError, match="first add"):
        SharedVectorReplayBuffer(10, 2).handle


def test_pickled_buffer_is_a_copy_in_a_new_block():
    buf = SharedVectorReplayBuffer(20, 2)
    for k in range(3):
        buf.add(_batch(2, rew=float(k)))
    copy = pickle.loads(pickle.dumps(buf))
    assert copy.handle.name != buf.handle.name
    for key in (*FIELDS, "rew"):
        np.testing.assert_array_equal(getattr(copy[:], key), getattr(buf[:], key))
    copy.add(_batch(2, rew=9.0))  # writes the new block, not the original
    assert np.shares_memory(copy.rew, copy.storage.block)
    assert len(copy) == 8 and len(buf) == 6
    buf.close(), copy.close()


def test_collector_checks_buffer_count():
    envs = make_tianshou_env(ID, 3, seed=0)
    with pytest.raises(ValueError, match="at least"):
        Collector(_policy(), envs, SharedVectorReplayBuffer(30, 2))
    with pytest.raises(ValueError):
        Collector(_policy(), envs, ReplayBuffer(30))
    envs.close()


def test_hdf5_round_trip_into_a_new_block(tmp_path):
    buf = SharedVectorReplayBuffer(20, 2)
    for k in range(13):  # sub-buffers wrap around
        buf.add(_batch(2, rew=float(k)))
    path = str(tmp_path / "buf.h5")
    buf.save_hdf5(path, compression="gzip")
    loaded = SharedVectorReplayBuffer.load_hdf5(path)
    assert loaded.handle.name != buf.handle.name and np.shares_memory(loaded.rew, loaded.storage.block)
    assert len(loaded) == len(buf) == 20
    np.testing.assert_array_equal(loaded.last_index, buf.last_index)
    for key in (*FIELDS, "rew"):
        np.testing.assert_array_equal(getattr(loaded[:], key), getattr(buf[:], key), err_msg=key)
    np.testing.assert_array_equal(loaded[:].info.env_id, buf[:].info.env_id)
    loaded.add(_batch(2, rew=9.0))  # continues where the original stopped, in its own block
    assert loaded.last_index.tolist() == [3, 13] and buf.rew.max() == 12.0
    # an empty (not yet allocated) buffer round-trips too
    SharedVectorReplayBuffer(10, 2).save_hdf5(path)
    empty = SharedVectorReplayBuffer.load_hdf5(path)
    assert len(empty) == 0 and empty.last_index.tolist() == [0, 5]
    buf.close(), loaded.close()


def test_hdf5_failure_leaves_no_partial_file(tmp_path, monkeypatch):
    import unilab_gym.tianshou.replay_buffer as ts

    buf = SharedVectorReplayBuffer(10, 2)
    buf.add(_batch(2))
    path = tmp_path / "buf.h5"
    path.write_bytes(b"previous")

    def half_written(state, group, compression=None):
        group.create_dataset("obs", data=np.zeros(3))
        raise OSError("disk full")

    monkeypatch.setattr(ts, "to_hdf5", half_written)
    with pytest.raises(OSError, match="disk full"):
        buf.save_hdf5(str(path))
    assert path.read_bytes() == b"previous" and sorted(p.name for p in tmp_path.iterdir()) == ["buf.h5"]
    monkeypatch.undo()
    with pytest.raises(FileNotFoundError):
        buf.save_hdf5(str(tmp_path / "missing" / "buf.h5"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["buf.h5"]
    buf.close()


def test_hdf5_load_refuses_edited_data(tmp_path):
    import h5py

    buf = SharedVectorReplayBuffer(10, 2)
    buf.add(_batch(2, rew=1.0))
    path = str(tmp_path / "buf.h5")
    buf.save_hdf5(path)
    with h5py.File(path, "r+") as f:
        f["_meta"]["rew"][0] = 5.0
    with pytest.raises(ValueError, match="corrupted"):
        SharedVectorReplayBuffer.load_hdf5(path)
    buf.close()


def test_vector_reward_is_refused_before_any_bookkeeping():
    ref = VectorReplayBuffer(10, 2)  # the reference stores it
    ref.add(Batch(_batch(2), rew=np.ones((2, 3))))
    assert ref[:].rew.shape == (2, 3)
    buf = SharedVectorReplayBuffer(10, 2)
    buf.add(_batch(2, rew=1.0))
    before = buf.storage.block.copy()
    for rew in (np.ones((2, 3)), np.ones((2, 1)), np.ones(3), np.array(["a", "b"])):
        with pytest.raises(ValueError, match=r"rew must have shape \(2,\)"):
            buf.add(Batch(_batch(2), rew=rew))
        assert len(buf) == 2 and buf.last_index.tolist() == [0, 5]
        assert [len(b) for b in buf.buffers] == [1, 1]
        np.testing.assert_array_equal(buf.storage.block, before)
    fresh = SharedVectorReplayBuffer(10, 2)  # refused on the first add too: nothing is allocated
    with pytest.raises(ValueError, match="vector rewards"):
        fresh.add(Batch(_batch(2), rew=np.ones((2, 3))))
    assert len(fresh) == 0 and fresh._storage is None
    buf.close()
