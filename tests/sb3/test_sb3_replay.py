"""SharedReplayBuffer: SB3 semantics, equivalence with SB3's ReplayBuffer, training, sharing."""

from __future__ import annotations

import copy
import gc
import multiprocessing as mp
import os
import pickle
from unittest import mock

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from _replay_workers import seeded_batch
from gymnasium import spaces
from stable_baselines3 import DDPG, DQN, SAC, TD3
from stable_baselines3.common.buffers import ReplayBuffer
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

import unilab_gym
from unilab_gym.replay import ReplayStorage
from unilab_gym.sb3.replay_buffer import SharedReplayBuffer

CTX = mp.get_context("spawn")
BOX_OBS = spaces.Box(-10, 10, (5,), np.float32)
BOX_ACT = spaces.Box(-1, 1, (2,), np.float32)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def random_steps(obs_space, act_space, n_envs, steps, seed):
    """``steps`` SB3-style add() arguments with dones, time-limit ends and terminal obs."""
    rng = np.random.default_rng(seed)
    act_space.seed(seed)
    obs_space.seed(seed)
    out = []
    for _ in range(steps):
        obs = np.stack([obs_space.sample() for _ in range(n_envs)])
        next_obs = np.stack([obs_space.sample() for _ in range(n_envs)])
        action = np.stack([act_space.sample() for _ in range(n_envs)])
        reward = rng.standard_normal(n_envs).astype(np.float32)
        done = rng.random(n_envs) < 0.3
        infos = [{"TimeLimit.truncated": bool(d and rng.random() < 0.5)} for d in done]
        out.append((obs, next_obs, action, reward, done, infos))
    return out


def assert_samples_equal(ours, theirs):
    for field in ("observations", "actions", "next_observations", "dones", "rewards"):
        a, b = getattr(ours, field), getattr(theirs, field)
        assert a.dtype == b.dtype, (field, a.dtype, b.dtype)
        assert a.shape == b.shape, (field, a.shape, b.shape)
        assert a.device == b.device
        assert th.equal(a, b), field


def both(obs_space, act_space, buffer_size, n_envs, handle_timeout_termination=True):
    kw = dict(device="cpu", n_envs=n_envs, handle_timeout_termination=handle_timeout_termination)
    return (
        SharedReplayBuffer(buffer_size, obs_space, act_space, seed=0, **kw),
        ReplayBuffer(buffer_size, obs_space, act_space, **kw),
    )


# ---- construction --------------------------------------------------------------------------------
def test_sb3_constructor_arguments_and_lazy_export():
    buf = SharedReplayBuffer(100, BOX_OBS, BOX_ACT, "cpu", 4, False, True)
    assert isinstance(buf, ReplayBuffer) and unilab_gym.SharedReplayBuffer is SharedReplayBuffer
    assert (buf.buffer_size, buf.n_envs, buf.pos, buf.full, buf.size()) == (25, 4, 0, False, 0)
    assert buf.storage.capacity == 100 and buf.layout.width == 2 * 5 + 2 + 3
    assert buf.handle.name == buf.storage.name and buf.handle.capacity == 100
    buf.close()


def test_optimize_memory_usage_is_accepted_through_sb3s_flag():
    # issue 18 item 2: accepted now, also with handle_timeout_termination (tests/replay/test_replay_optimized.py)
    buf = SharedReplayBuffer(100, BOX_OBS, BOX_ACT, optimize_memory_usage=True, handle_timeout_termination=True)
    assert buf.optimize_memory_usage and buf.next_observations is None and buf.layout.final_obs > 0
    buf.close()
    model = DQN(
        "MlpPolicy",
        "CartPole-v1",
        replay_buffer_class=SharedReplayBuffer,
        optimize_memory_usage=True,
        replay_buffer_kwargs={"handle_timeout_termination": True},
    )
    assert isinstance(model.replay_buffer, SharedReplayBuffer) and model.replay_buffer.optimize_memory_usage
    model.replay_buffer.close()


@pytest.mark.parametrize(
    "obs_space, act_space, match",
    [
        # issue 18: every SB3 space is supported now (tests/sb3/test_sb3_buffer_suite.py); these are not
        (spaces.Tuple((BOX_OBS,)), BOX_ACT, "Tuple"),
        (spaces.Dict({"a": spaces.Dict({"b": BOX_OBS})}), BOX_ACT, "Dict"),
        (spaces.Dict({}), BOX_ACT, "Dict"),
        (spaces.Text(5), BOX_ACT, "Text"),
        (BOX_OBS, spaces.Tuple((spaces.Discrete(2),)), "Tuple"),
    ],
)
def test_unsupported_spaces_are_refused_naming_the_space(obs_space, act_space, match):
    with pytest.raises(ValueError, match=match):
        SharedReplayBuffer(100, obs_space, act_space)


# ---- equivalence with SB3's ReplayBuffer -------------------------------------------------------------
@pytest.mark.parametrize(
    "obs_space, act_space, n_envs, handle_timeouts",
    [
        (BOX_OBS, BOX_ACT, 3, True),
        (BOX_OBS, BOX_ACT, 1, False),
        (spaces.Box(-1, 1, (2, 3), np.float32), spaces.Box(-1, 1, (2,), np.float64), 2, True),
        (spaces.Box(-1, 1, (4,), np.float32), spaces.Discrete(3), 2, True),
        (BOX_OBS, spaces.MultiDiscrete([3, 5]), 2, True),
        (BOX_OBS, spaces.MultiBinary(3), 1, True),
    ],
)
def test_same_adds_and_indices_give_equal_tensors(obs_space, act_space, n_envs, handle_timeouts):
    ours, sb3 = both(obs_space, act_space, 10 * n_envs, n_envs, handle_timeouts)
    for step, args in enumerate(random_steps(obs_space, act_space, n_envs, 23, seed=1)):
        ours.add(*args)
        sb3.add(*args)
        assert (ours.pos, ours.full, ours.size()) == (sb3.pos, sb3.full, sb3.size()), step
        # SB3's hook: same batch indices, same env indices (numpy global RNG)
        inds = np.random.default_rng(step).integers(0, sb3.size(), 16)
        np.random.seed(step)
        a = ours._get_samples(inds)
        np.random.seed(step)
        assert_samples_equal(a, sb3._get_samples(inds))
    # sample(): our seeded draw, mapped to SB3's (step, env) slot
    rng_copy = copy.deepcopy(ours.rng)
    seq = ours.storage.sample_indices(64, rng_copy)
    rows = seq % ours.storage.capacity
    drawn = ours.sample(64)
    with mock.patch.object(np.random, "randint", return_value=rows % n_envs):
        assert_samples_equal(drawn, sb3._get_samples(rows // n_envs))
    ours.close()


def test_vecnormalize_normalization_matches_sb3():
    venv = VecNormalize(DummyVecEnv([lambda: gym.make("Pendulum-v1")]), norm_obs=True, norm_reward=True)
    venv.obs_rms.mean[:] = [0.5, -0.2, 1.0]
    venv.obs_rms.var[:] = [2.0, 0.5, 3.0]
    venv.ret_rms.var = np.array(4.0)
    obs_space, act_space = venv.observation_space, venv.action_space
    ours, sb3 = both(obs_space, act_space, 50, 1)
    for args in random_steps(obs_space, act_space, 1, 30, seed=2):
        ours.add(*args)
        sb3.add(*args)
    inds = np.arange(30)
    np.random.seed(0)
    a = ours._get_samples(inds, env=venv)
    np.random.seed(0)
    assert_samples_equal(a, sb3._get_samples(inds, env=venv))
    assert not th.equal(a.observations, ours._get_samples(inds).observations)  # it did normalize
    rng_copy = copy.deepcopy(ours.rng)
    seq = ours.storage.sample_indices(8, rng_copy)
    with mock.patch.object(np.random, "randint", return_value=np.zeros(8, int)):
        assert_samples_equal(ours.sample(8, env=venv), sb3._get_samples(seq, env=venv))
    ours.close()
    venv.close()


def test_timeouts_do_not_cut_the_bootstrap():
    obs = np.zeros((3, 5), np.float32)
    done = np.array([True, True, False])
    infos = [{"TimeLimit.truncated": True}, {}, {"TimeLimit.truncated": False}]
    for handle, expected in ((True, [0.0, 1.0, 0.0]), (False, [1.0, 1.0, 0.0])):
        buf = SharedReplayBuffer(9, BOX_OBS, BOX_ACT, "cpu", n_envs=3, handle_timeout_termination=handle)
        buf.add(obs, obs, np.zeros((3, 2)), np.zeros(3), done, infos)
        np.random.seed(0)
        with mock.patch.object(np.random, "randint", return_value=np.arange(3)):
            dones = buf._get_samples(np.zeros(3, int)).dones
        assert dones.flatten().tolist() == expected
        L = buf.layout
        truncated = buf.storage.gather(np.arange(3))[:, L.truncated]
        assert truncated.tolist() == [1.0, 0.0, 0.0]  # the time-limit end is kept for reference
        buf.close()


def test_off_policy_collection_stores_what_sb3_stores():
    """End to end: terminal_observation, timeouts, pos / full, through SB3's own loop."""
    buffers = {}
    for cls in (SharedReplayBuffer, ReplayBuffer):
        env = make_vec_env("Pendulum-v1", n_envs=2, seed=3, env_kwargs={"max_episode_steps": 7})
        model = SAC("MlpPolicy", env, buffer_size=40, learning_starts=10_000, replay_buffer_class=cls, seed=3)
        model.learn(52)  # 26 steps x 2 envs: wraps the 20-step ring, 3 time-limit ends per env
        buffers[cls] = model.replay_buffer
    ours, sb3 = buffers[SharedReplayBuffer], buffers[ReplayBuffer]
    assert (ours.pos, ours.full, ours.size()) == (sb3.pos, sb3.full, sb3.size()) == (6, True, 20)
    block = ours.storage.block.reshape(20, 2, -1)
    L = ours.layout
    np.testing.assert_array_equal(block[..., L.obs], sb3.observations)
    np.testing.assert_array_equal(block[..., L.next_obs], sb3.next_observations)  # terminal obs included
    np.testing.assert_array_equal(block[..., L.action], sb3.actions)
    np.testing.assert_array_equal(block[..., L.reward], sb3.rewards)
    np.testing.assert_array_equal(block[..., L.terminated], sb3.dones * (1 - sb3.timeouts))
    assert sb3.timeouts.sum() > 0 and (block[..., L.truncated] == sb3.timeouts).all()
    # next_obs at a time-limit end is the terminal observation, not the reset one
    step, env_i = np.argwhere(sb3.timeouts)[0]
    assert not np.array_equal(block[step, env_i, L.next_obs], block[(step + 1) % 20, env_i, L.obs])
    del block
    ours.close()


# ---- bad input ---------------------------------------------------------------------------------------
def test_bad_adds_raise_and_add_nothing():
    buf = SharedReplayBuffer(20, BOX_OBS, BOX_ACT, "cpu", n_envs=2)
    ok = (np.zeros((2, 5)), np.zeros((2, 5)), np.zeros((2, 2)), np.zeros(2), np.zeros(2), [{}, {}])
    buf.add(*ok)
    bad = {
        0: np.zeros((2, 4)),  # obs shape
        1: np.zeros((3, 5)),  # next_obs shape
        2: np.zeros((2, 3)),  # action size
        3: np.zeros(3),  # reward size
        4: np.zeros((2, 2)),  # done size
        5: [{}],  # infos length
    }
    for i, value in bad.items():
        args = list(ok)
        args[i] = value
        with pytest.raises(ValueError):
            buf.add(*args)
    for i, value in ((0, np.full((2, 5), "x")), (2, np.zeros((2, 2), complex)), (3, np.array([None, None]))):
        args = list(ok)
        args[i] = value
        with pytest.raises(ValueError, match="real numbers"):
            buf.add(*args)
    assert buf.size() == 1 and buf.storage.committed == 2
    buf.close()


def test_sample_on_an_empty_buffer_raises():
    buf = SharedReplayBuffer(20, BOX_OBS, BOX_ACT, "cpu")
    with pytest.raises(ValueError, match="no committed transition"):
        buf.sample(4)
    buf.close()


def test_pos_and_full_are_derived_not_settable():
    buf = SharedReplayBuffer(4, BOX_OBS, BOX_ACT, "cpu")
    buf.pos = 0  # SB3's own initialisation assigns the current values: allowed
    with pytest.raises(AttributeError, match="reset"):
        buf.pos = 3
    # issue 18: SB3's own tests set full = True on an empty buffer and sample its zero rows
    buf.full = True
    assert buf.full and buf.size() == 4 and len(buf.storage) == 4
    assert buf.sample(8).observations.abs().sum() == 0
    with pytest.raises(AttributeError, match="reset"):
        buf.full = False
    buf.close()


# ---- saving / pickling --------------------------------------------------------------------------------
def _pendulum_sac():
    """SAC on Pendulum with a 30-transition SharedReplayBuffer that only collects (learning_starts 10k)."""
    kwargs = dict(buffer_size=30, learning_starts=10_000, replay_buffer_class=SharedReplayBuffer, seed=0)
    return SAC("MlpPolicy", "Pendulum-v1", **kwargs)


def test_save_and_load_replay_buffer_round_trip(tmp_path):
    model = _pendulum_sac()
    model.learn(45)  # wraps
    original = model.replay_buffer
    model.save_replay_buffer(tmp_path / "rb.pkl")
    model.load_replay_buffer(tmp_path / "rb.pkl")
    loaded = model.replay_buffer
    assert isinstance(loaded, SharedReplayBuffer) and loaded is not original
    assert loaded.storage.name != original.storage.name and loaded.storage.is_owner
    assert (loaded.pos, loaded.full, loaded.size()) == (original.pos, original.full, original.size()) == (15, True, 30)
    np.testing.assert_array_equal(loaded.storage.block, original.storage.block)
    assert loaded.device == model.device
    assert_samples_equal(loaded.sample(16), original.sample(16))  # the rng state travels too
    model.learn(10, reset_num_timesteps=False)  # trains on with the loaded buffer
    assert loaded.storage.committed == 55 and original.storage.committed == 45
    name = original.storage.name
    original.close()
    assert not os.path.exists(f"/dev/shm/{name}")
    loaded.close()


def test_a_corrupted_saved_buffer_is_refused_and_the_model_keeps_its_buffer(tmp_path):
    model = _pendulum_sac()
    model.learn(20)
    original = model.replay_buffer
    block = original.storage.block.copy()
    model.save_replay_buffer(tmp_path / "rb.pkl")
    data = (tmp_path / "rb.pkl").read_bytes()
    at = data.index(original.storage.block[:10].tobytes())  # 64 bytes flipped inside the rows
    corrupted = bytearray(data)
    corrupted[at + 40 : at + 104] = bytes(b ^ 0xFF for b in corrupted[at + 40 : at + 104])
    (tmp_path / "bad.pkl").write_bytes(bytes(corrupted))
    with pytest.raises(ValueError, match="corrupted"):
        model.load_replay_buffer(tmp_path / "bad.pkl")
    assert model.replay_buffer is original and original.size() == 20
    np.testing.assert_array_equal(original.storage.block, block)
    original.close()


def test_a_pickled_buffer_whose_storage_does_not_match_is_refused():
    buf = SharedReplayBuffer(10, BOX_OBS, BOX_ACT, "cpu")
    state = buf.__getstate__()
    state["obs_dim"] = 4
    fresh = SharedReplayBuffer.__new__(SharedReplayBuffer)
    with pytest.raises(ValueError, match=r"\(obs_dim, act_dim, capacity\) = \(5, 2, 10\).*\(4, 2, 10\)"):
        fresh.__setstate__(state)
    buf.close()


def test_pickle_gives_an_independent_plain_copy():
    buf = SharedReplayBuffer(10, BOX_OBS, BOX_ACT, "cpu")
    for args in random_steps(BOX_OBS, BOX_ACT, 1, 4, seed=0):
        buf.add(*args)
    data = pickle.dumps(buf)
    assert buf.storage.name.encode() not in data  # no reference to the segment
    copy_ = pickle.loads(data)
    assert copy_.storage.name != buf.storage.name
    for args in random_steps(BOX_OBS, BOX_ACT, 1, 2, seed=1):
        copy_.add(*args)
    assert (buf.size(), copy_.size()) == (4, 6)
    np.testing.assert_array_equal(copy_.storage.block[:4], buf.storage.block[:4])
    deep = copy.deepcopy(buf)
    assert deep.storage.name not in (buf.storage.name, copy_.storage.name)
    for b in (buf, copy_, deep):
        b.close()


def test_a_closed_buffer_refuses_to_pickle_and_add():
    buf = SharedReplayBuffer(10, BOX_OBS, BOX_ACT, "cpu")
    buf.close()
    assert "closed" in repr(buf)
    with pytest.raises(ValueError, match="closed"):
        pickle.dumps(buf)
    with pytest.raises(RuntimeError, match="closed"):
        buf.add(np.zeros((1, 5)), np.zeros((1, 5)), np.zeros((1, 2)), np.zeros(1), np.zeros(1), [{}])


def test_buffer_close_and_garbage_collection_unlink():
    buf = SharedReplayBuffer(10, BOX_OBS, BOX_ACT, "cpu")
    path = f"/dev/shm/{buf.storage.name}"
    assert os.path.exists(path)
    del buf
    gc.collect()
    assert not os.path.exists(path)


# ---- sharing with collectors ---------------------------------------------------------------------------
def test_collector_writes_are_seen_by_pos_size_and_sample():
    buf = SharedReplayBuffer(12, BOX_OBS, BOX_ACT, "cpu", n_envs=2)
    collector = ReplayStorage.attach(buf.handle)  # in-process stand-in for a collector
    b = seeded_batch(buf.layout, 6, seed=5)
    collector.add(**b)
    assert (buf.pos, buf.full, buf.size()) == (3, False, 3)
    s = buf.sample(32)
    obs = s.observations.numpy()
    assert all(any(np.array_equal(o, row) for row in b["obs"]) for o in obs)
    collector.add(**seeded_batch(buf.layout, 6, seed=6))
    assert (buf.pos, buf.full, buf.size()) == (0, True, 6)
    collector.close()
    buf.close()


def test_collector_process_adds_and_the_learner_samples():
    from _replay_workers import add_seeded

    buf = SharedReplayBuffer(1000, spaces.Box(-1, 1, (48,), np.float32), spaces.Box(-1, 1, (12,), np.float32), "cpu")
    handles, replies = CTX.Queue(), CTX.Queue()
    child = CTX.Process(target=add_seeded, args=(handles, replies, 64, 9))
    child.start()
    handles.put(buf.handle)
    assert replies.get(timeout=60) == ("ok", 0)
    child.join(60)
    assert child.exitcode == 0 and buf.size() == 64
    expected = seeded_batch(buf.layout, 64, 9)
    rng_copy = copy.deepcopy(buf.rng)
    seq = buf.storage.sample_indices(128, rng_copy)
    s = buf.sample(128)
    np.testing.assert_array_equal(s.observations.numpy(), expected["obs"][seq])
    np.testing.assert_array_equal(s.actions.numpy(), expected["action"][seq])
    np.testing.assert_array_equal(s.dones.numpy()[:, 0], expected["terminated"][seq])
    buf.close()


@pytest.mark.skipif(not th.cuda.is_available(), reason="no CUDA device")
def test_cuda_device_samples_match_cpu():
    buf = SharedReplayBuffer(100, BOX_OBS, BOX_ACT, "cuda")
    for args in random_steps(BOX_OBS, BOX_ACT, 1, 50, seed=0):
        buf.add(*args)
    rng_copy = copy.deepcopy(buf.rng)
    s = buf.sample(32)
    assert s.observations.is_cuda and s.actions.is_cuda
    seq = buf.storage.sample_indices(32, rng_copy)
    rows = buf.storage.gather(seq)
    np.testing.assert_array_equal(s.observations.cpu().numpy(), rows[:, buf.layout.obs])
    buf.close()


# ---- training ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "algo, env_id",
    [(SAC, "Pendulum-v1"), (TD3, "Pendulum-v1"), (DDPG, "Pendulum-v1"), (DQN, "CartPole-v1")],
)
def test_algorithms_train_with_the_shared_buffer(algo, env_id):
    kwargs = dict(learning_starts=64, batch_size=32, buffer_size=500, seed=0, replay_buffer_class=SharedReplayBuffer)
    if algo is not DQN:
        kwargs["policy_kwargs"] = {"net_arch": [32, 32]}
    else:
        kwargs.update(train_freq=1, policy_kwargs={"net_arch": [32]})
    model = algo("MlpPolicy", env_id, **kwargs)
    params = [p.detach().clone() for p in model.policy.parameters()]
    model.learn(200)
    assert isinstance(model.replay_buffer, SharedReplayBuffer) and model.replay_buffer.size() == 200
    assert model._n_updates > 0
    assert any(not th.equal(a, b) for a, b in zip(params, model.policy.parameters()))
    model.replay_buffer.close()


def test_example_trains_sac_on_the_quadruped_with_a_collector_process(tmp_path, monkeypatch):
    pytest.importorskip("pybullet")
    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
    import train_sac_shared_replay as example

    args = [
        "--total-steps",
        "128",
        "--num-envs",
        "4",
        "--prefill",
        "64",
        "--gradient-steps",
        "1",
        "--seed",
        "3",
        "--save-path",
        str(tmp_path / "model"),
        "--save-replay",
    ]
    saved = example.main(args)
    model = SAC.load(saved)
    assert model.num_timesteps == 128 and model._n_updates > 0
    model.load_replay_buffer(tmp_path / "model_replay.pkl")
    replay = model.replay_buffer
    assert isinstance(replay, SharedReplayBuffer)
    assert replay.storage.committed == 64 + 128  # the collector's rows, then SAC's own
    rows = replay.storage.block[:64]
    assert np.abs(rows[:, replay.layout.action]).max() <= 1.0  # stored scaled, as SAC does
    del rows
    replay.close()


def test_sb3_seed_fixes_sampling_and_the_global_rng_is_left_alone():
    draws = []
    for _ in range(2):
        np.random.seed(5)
        state = np.random.get_state()[1].copy()
        buf = SharedReplayBuffer(50, BOX_OBS, BOX_ACT, "cpu")
        np.testing.assert_array_equal(np.random.get_state()[1], state)  # construction draws nothing
        for args in random_steps(BOX_OBS, BOX_ACT, 1, 20, seed=0):
            buf.add(*args)
        np.random.seed(6)
        draws.append(buf.sample(8).observations)
        assert np.random.randint(1 << 30) == np.random.RandomState(6).randint(1 << 30)  # sample() neither
        buf.close()
    assert th.equal(draws[0], draws[1])
