"""Tianshou conformance: the VectorReplayBuffer cases of Tianshou's ``test/base/test_buffer.py`` and the
vector-env cases of its ``test/base/test_env.py``, written for our adapters.

Each buffer case runs on Tianshou's ``VectorReplayBuffer`` (the reference, which must pass it as Tianshou's
own test asserts) and on :class:`SharedVectorReplayBuffer`; each env case compares
:class:`TianshouVectorEnv` with ``DummyVectorEnv`` over single envs. Our buffer stores float observations and
actions with ``obs_next`` and one float reward per transition, so the cases feed those (Tianshou's use ints,
nested ``Batch`` observations and (2,) rewards). Cases that do not apply are listed, with the reason, in
docs/integrations.md ("Conformance").
"""

import pickle

import gymnasium as gym
import numpy as np
import pytest
import torch
from tianshou.data import Batch, VectorReplayBuffer
from tianshou.env import DummyVectorEnv, VectorEnvNormObs
from tianshou.utils import RunningMeanStd

import unilab_gym  # noqa: F401  (registers the id)
from unilab_gym.tianshou import SharedVectorReplayBuffer, make_tianshou_env

ID = "UniLab/Quadruped-v0"
SHORT = dict(max_episode_steps=20, termination={"max_tilt": 0.1})
BUFFERS = [VectorReplayBuffer, SharedVectorReplayBuffer]


def _rows(obs, terminated, rew=None, truncated=None, act=None, **extra):
    """R transitions: obs/act/obs_next as float (R, 1) columns, one float reward each."""
    obs = np.asarray(obs, dtype=np.float32).reshape(-1, 1)
    r = len(obs)
    return Batch(
        obs=obs,
        act=(obs if act is None else np.asarray(act, dtype=np.float32).reshape(-1, 1)),
        rew=np.asarray(obs[:, 0] if rew is None else rew, dtype=float),
        terminated=np.asarray(terminated, dtype=bool).reshape(r),
        truncated=np.zeros(r, bool) if truncated is None else np.asarray(truncated, dtype=bool).reshape(r),
        obs_next=obs + 1,
        **extra,
    )


# ---------------------------------------------------------------------------------------- test_buffer.py
@pytest.mark.parametrize("cls", BUFFERS)
def test_replaybuffermanager(cls):
    buf = cls(20, 4)
    ptr, ep_rew, ep_len, ep_idx = buf.add(_rows([1, 2, 3], [0, 0, 1]), buffer_ids=[0, 1, 2])
    assert ep_len.tolist() == [0, 0, 1] and ep_rew.tolist() == [0, 0, 3]
    assert ptr.tolist() == [0, 5, 10] and ep_idx.tolist() == [0, 5, 10]
    with pytest.raises(NotImplementedError):
        buf.update(buf)  # a manager cannot be updated
    indices = buf.sample_indices(11000)
    assert np.bincount(indices)[[0, 5, 10]].min() >= 3000  # uniform
    _, indices = buf.sample(0)
    assert indices.tolist() == [0, 5, 10]
    assert buf.prev(indices).tolist() == [0, 5, 10] and buf.next(indices).tolist() == [0, 5, 10]
    assert buf.unfinished_index().tolist() == [0, 5]
    buf.add(_rows([4], [1]), buffer_ids=[3])
    assert buf.unfinished_index().tolist() == [0, 5]
    buf.sample(10)
    _, indices = buf.sample(0)
    assert indices.tolist() == [0, 5, 10, 15]
    assert buf.prev(indices).tolist() == indices.tolist() and buf.next(indices).tolist() == indices.tolist()
    zeros = np.zeros(4)
    buf.add(_rows(zeros, zeros), buffer_ids=[0, 1, 2, 3])
    buf.add(_rows(zeros, 1 - zeros), buffer_ids=[0, 1, 2, 3])
    assert len(buf) == 12
    buf.add(_rows(zeros, zeros), buffer_ids=[0, 1, 2, 3])
    buf.add(_rows(zeros, [0, 1, 0, 1]), buffer_ids=[0, 1, 2, 3])
    assert len(buf) == 20
    assert np.bincount(buf.sample_indices(120000)).min() >= 5000
    buf.sample(10)
    indices = buf.sample_indices(0)
    assert indices.tolist() == list(range(20))
    assert buf.done.astype(int).tolist() == [0, 0, 1, 0, 0, 0, 0, 1, 0, 1, 1, 0, 1, 0, 0, 1, 0, 1, 0, 1]
    assert buf.prev(indices).tolist() == [0, 0, 1, 3, 3, 5, 5, 6, 8, 8, 10, 11, 11, 13, 13, 15, 16, 16, 18, 18]
    assert buf.next(indices).tolist() == [1, 2, 2, 4, 4, 6, 7, 7, 9, 9, 10, 12, 12, 14, 14, 15, 17, 17, 19, 19]
    assert buf.unfinished_index().tolist() == [4, 14]
    ptr, ep_rew, ep_len, ep_idx = buf.add(_rows([1], [1]), buffer_ids=[2])
    assert ep_len.tolist() == [3] and ep_rew.tolist() == [1] and ptr.tolist() == [10] and ep_idx.tolist() == [13]
    assert buf.unfinished_index().tolist() == [4]
    indices = np.sort(buf.sample_indices(0))
    assert indices.tolist() == list(range(20))
    assert buf.prev(indices).tolist() == [0, 0, 1, 3, 3, 5, 5, 6, 8, 8, 14, 11, 11, 13, 13, 15, 16, 16, 18, 18]
    assert buf.next(indices).tolist() == [1, 2, 2, 4, 4, 6, 7, 7, 9, 9, 10, 12, 12, 14, 10, 15, 17, 17, 19, 19]
    # corner cases: an int index, -1
    assert buf.prev(-1) == buf.prev(np.array([buf.maxsize - 1]))[0]
    assert buf.next(-1) == buf.next(np.array([buf.maxsize - 1]))[0]
    assert buf.sample_indices(-1).tolist() == []
    # set_batch (Tianshou's case ends with it) is a documented limitation of the shared buffer
    if cls is SharedVectorReplayBuffer:
        with pytest.raises(NotImplementedError):
            buf.set_batch(buf._meta)


def _info_rows(i, r, t):
    return Batch(number=Batch(n=np.full(r, i), t=torch.ones(r, 1) * t), extra=np.full(r, None, dtype=object))


@pytest.mark.parametrize("cls", BUFFERS)
def test_multibuf_hdf5(cls, tmp_path):
    size = 100
    buf = cls(size * 4, 4)
    for i in range(4):
        terminated = i % 3 == 2
        buf.add(_rows([i] * 3, [terminated] * 3, rew=[1.0] * 3, info=_info_rows(i, 3, 1.0)), buffer_ids=[0, 1, 2])
    path = str(tmp_path / "buf.hdf5")
    buf.save_hdf5(path)
    loaded = cls.load_hdf5(path)
    assert type(loaded) is cls
    assert len(loaded) == len(buf) == 12
    assert np.allclose(loaded.act, buf.act)
    assert loaded.stack_num == buf.stack_num and loaded.maxsize == buf.maxsize
    assert np.all(loaded._indices == buf._indices)
    np.testing.assert_array_equal(loaded[:].info.number.n, buf[:].info.number.n)
    # the sub-buffers are shallow views of the manager's arrays (Tianshou checks the saved buffer; its own
    # loaded VectorReplayBuffer does not keep this, ours does)
    for b in (buf, loaded) if cls is SharedVectorReplayBuffer else (buf,):
        b.info.number.n[0] = -100
        assert b.buffers[0].info.number.n[0] == -100
    # the loaded buffer still behaves normally
    for b in (buf, loaded):
        info = Batch(number=Batch(n=np.full(4, 3)), **{"Timelimit.truncate": np.ones(4, bool)})
        b.add(_rows([5] * 4, [False] * 4, rew=[2.0] * 4, info=info))
        act = np.zeros(b.maxsize)
        for k in range(3):
            act[np.arange(5) + size * k] = [0, 1, 2, 3, 5]
        act[size * 3] = 5
        assert np.allclose(b.act[:, 0], act)
        assert set(b.info.keys()) == {"number", "extra", "Timelimit.truncate"}


@pytest.mark.parametrize("cls", BUFFERS)
def test_pickle(cls):
    buf = cls(100, 2)
    for i in range(4):
        buf.add(_rows([i, i], [0, 0], rew=[1.0, 1.0], info=Batch(r=np.random.rand(2))))
    copy = pickle.loads(pickle.dumps(buf))
    assert len(copy) == len(buf) == 8
    assert np.allclose(copy.act, buf.act)
    assert copy.stack_num == buf.stack_num


@pytest.mark.parametrize("cls", BUFFERS)
def test_get_vector_replay_buffer_indices(cls):
    buf = cls(10, 2)
    for _ in range(5):
        buf.add(_rows([0, 1], [False, False]))
    assert buf.get_buffer_indices(0, 3).tolist() == [0, 1, 2]
    assert buf.get_buffer_indices(3, 2).tolist() == [3, 4, 0, 1]
    assert buf.get_buffer_indices(6, 9).tolist() == [6, 7, 8]
    assert buf.get_buffer_indices(8, 7).tolist() == [8, 9, 5, 6]
    with pytest.raises(ValueError):
        buf.get_buffer_indices(3, 6)  # the range crosses sub-buffers
    with pytest.raises(ValueError):
        buf.get_buffer_indices(6, 3)


@pytest.mark.parametrize("cls", BUFFERS)
def test_custom_key(cls):
    rng = np.random.default_rng(0)
    batch = Batch(
        obs=rng.normal(size=(1, 11)).astype(np.float32),
        obs_next=rng.normal(size=(1, 11)).astype(np.float32),
        act=rng.normal(size=(1, 3)).astype(np.float32),
        rew=np.array([4.28125]),
        terminated=np.array([False]),
        truncated=np.array([False]),
        done=np.array([False]),
        info=Batch(),
        policy=Batch(),
    )
    buf = cls(1, 1)
    buf.add(batch)
    sampled, _ = buf.sample(1)
    assert set(batch.get_keys()) == set(sampled.get_keys())
    for key in batch.get_keys():
        if isinstance(batch[key], np.ndarray):
            assert np.allclose(batch[key], sampled[key]), key
        else:
            assert len(batch[key].get_keys()) == len(sampled[key].get_keys()) == 0


@pytest.mark.parametrize("cls", BUFFERS)
def test_buffer_hasnull(cls):
    """The hasnull half of Tianshou's test_buffer_dropnull (dropnull is not supported by the shared buffer)."""
    buf = cls(10, 1)
    for i in range(4):
        buf.add(_rows([i], [i % 3 == 0], info=Batch(n=np.array([i]))))
    assert len(buf[:3]) == 3
    buf.set_array_at_key(np.array([1, 2, 3], float), "newkey", [0, 1, 2])
    assert np.array_equal(buf.newkey[:3], [1, 2, 3])
    assert buf.hasnull()  # row 3 has no newkey
    buf.set_array_at_key(np.array([4.0]), "newkey", [3])
    assert not buf.hasnull()
    # dropnull itself fails on Tianshou's VectorReplayBuffer (its case uses a single ReplayBuffer)
    if cls is SharedVectorReplayBuffer:
        with pytest.raises(NotImplementedError):
            buf.dropnull()


# ---------------------------------------------------------------------------------------- test_env.py
def _reference(n):
    return DummyVectorEnv([lambda: gym.make(ID, **SHORT) for _ in range(n)])


def test_vecenv():
    n = 3
    envs = [make_tianshou_env(ID, n, **SHORT), _reference(n)]
    for v in envs:
        v.seed(0)
        v.reset()
    for a in [1.0] * 5 + [0.0] * 10 + [1.0] * 20:
        out = []
        for v in envs:
            obs, rew, terminated, truncated, _ = v.step(np.full((n, 12), a, dtype=np.float32))
            if (terminated | truncated).any():
                obs, _ = v.reset(np.flatnonzero(terminated | truncated))
            out.append((obs, rew, terminated, truncated))
        for mine, theirs in zip(*out):
            np.testing.assert_array_equal(mine, theirs)
    for v in envs:
        v.set_env_attr("size", 7)
        assert v.get_env_attr("size") == [7] * n
        assert v.get_env_attr("size", id=0) == [7]
        assert v.get_env_attr("size", id=[0, 1]) == [7, 7]
        assert v.get_env_attr("render_mode") == [None] * n
        assert v.env_num == n
    assert envs[0].action_space == envs[1].action_space
    with pytest.raises(ValueError, match="subset"):  # documented: the N envs are one object
        envs[0].set_env_attr("size", 1, 0)
    envs[1].set_env_attr("size", 1, 0)
    assert envs[1].get_env_attr("size") == [1] + [7] * (n - 1)
    for v in envs:
        v.close()


def test_attr_unwrapped():
    envs = make_tianshou_env(ID, 1)
    envs.set_env_attr("test_attribute", 1337)
    assert envs.get_env_attr("test_attribute") == [1337]
    assert envs.venv.unwrapped.test_attribute == 1337
    envs.close()


def test_env_reset_optional_kwargs():
    envs = make_tianshou_env(ID, 3)
    _, info = envs.reset(seed=1)
    assert len(info) == 3 and isinstance(info[0], dict)
    envs.close()


def test_venv_wrapper_gym():
    envs = VectorEnvNormObs(make_tianshou_env(ID, 3))
    obs, info = envs.reset()
    assert isinstance(obs, np.ndarray) and isinstance(info, np.ndarray) and isinstance(info[0], dict)
    assert obs.shape[0] == len(info) == 3
    envs.close()


def _run(env, actions):
    """Observations of ``env`` under ``actions``, resetting finished envs by index (as Tianshou's test)."""
    obs, _ = env.reset()
    seen = [obs]
    for act in actions:
        obs, _, terminated, truncated, _ = env.step(act)
        seen.append(obs)
        done = terminated | truncated
        if done.any():
            seen.append(env.reset(np.flatnonzero(done))[0])
    return seen


def test_venv_norm_obs():
    n, actions = 3, [np.full((3, 12), 0.5, dtype=np.float32)] * 30
    raw = make_tianshou_env(ID, n, seed=0, **SHORT)
    train = VectorEnvNormObs(make_tianshou_env(ID, n, seed=0, **SHORT))
    test = VectorEnvNormObs(make_tianshou_env(ID, n, seed=0, **SHORT), update_obs_rms=False)
    test.set_obs_rms(train.get_obs_rms())
    eps = np.finfo(np.float32).eps.item()
    raw_obs, train_obs = _run(raw, actions), _run(train, actions)
    ref = RunningMeanStd()
    for r, t in zip(raw_obs, train_obs, strict=True):
        ref.update(r)
        assert np.allclose((r - ref.mean) / np.sqrt(ref.var + eps), t)
    for env in (train, test):
        assert np.allclose(ref.mean, env.get_obs_rms().mean) and np.allclose(ref.var, env.get_obs_rms().var)
    raw = make_tianshou_env(ID, n, seed=0, **SHORT)  # the same episodes again
    for r, t in zip(_run(raw, actions), _run(test, actions), strict=True):
        assert np.allclose((r - ref.mean) / np.sqrt(ref.var + eps), t)
    for env in (raw, train, test):
        env.close()
