"""Every SB3 space in its own dtype, and Dict observations (issue 18 item 1, issue 21 item 2)."""

from __future__ import annotations

import multiprocessing as mp
import pickle

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from _replay_workers import write_uniform
from gymnasium import spaces
from stable_baselines3 import SAC
from stable_baselines3.common.buffers import DictReplayBuffer, ReplayBuffer
from stable_baselines3.common.type_aliases import DictReplayBufferSamples

from unilab_gym.replay import ReplayLayout, ReplayStorage
from unilab_gym.sb3.replay_buffer import SharedReplayBuffer

CTX = mp.get_context("spawn")
ACT = spaces.Box(-1, 1, (2,), np.float32)
PRIV = spaces.Dict({"policy": spaces.Box(-5, 5, (48,), np.float32), "critic": spaces.Box(-5, 5, (7,), np.float32)})
IMAGE = spaces.Box(0, 255, (4, 4, 3), np.uint8)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def random_steps(obs_space, act_space, n_envs, steps, seed):
    rng = np.random.default_rng(seed)
    obs_space.seed(seed)
    act_space.seed(seed)

    def batch():
        items = [obs_space.sample() for _ in range(n_envs)]
        if isinstance(obs_space, spaces.Dict):
            return {k: np.stack([np.asarray(i[k]) for i in items]) for k in obs_space.spaces}
        return np.stack([np.asarray(i) for i in items])

    out = []
    for _ in range(steps):
        done = rng.random(n_envs) < 0.3
        infos = [{"TimeLimit.truncated": bool(d and rng.random() < 0.5)} for d in done]
        action = np.stack([np.asarray(act_space.sample()) for _ in range(n_envs)])
        out.append((batch(), batch(), action, rng.standard_normal(n_envs).astype(np.float32), done, infos))
    return out


def assert_tensors_equal(a, b, what):
    if isinstance(b, dict):
        assert isinstance(a, dict) and a.keys() == b.keys(), what
        for k in b:
            assert_tensors_equal(a[k], b[k], f"{what}[{k}]")
        return
    assert a.dtype == b.dtype and a.shape == b.shape, (what, a.dtype, b.dtype, a.shape, b.shape)
    assert th.equal(a, b), what


@pytest.mark.parametrize(
    "obs_space, act_space",
    [
        (IMAGE, spaces.Discrete(4)),
        (spaces.Box(-1, 1, (3,), np.float64), ACT),
        (spaces.Discrete(5), ACT),
        (spaces.MultiDiscrete([3, 4]), spaces.MultiDiscrete([2, 3])),
        (spaces.MultiBinary(5), spaces.MultiBinary(2)),
        (PRIV, ACT),
        (spaces.Dict({"image": IMAGE, "state": spaces.Box(-1, 1, (3,), np.float32)}), spaces.Discrete(3)),
    ],
)
def test_same_adds_and_indices_give_what_sb3s_buffers_give(obs_space, act_space):
    n_envs, size = 2, 20
    sb3_cls = DictReplayBuffer if isinstance(obs_space, spaces.Dict) else ReplayBuffer
    ours = SharedReplayBuffer(size, obs_space, act_space, device="cpu", n_envs=n_envs, seed=0)
    sb3 = sb3_cls(size, obs_space, act_space, device="cpu", n_envs=n_envs)
    for step, args in enumerate(random_steps(obs_space, act_space, n_envs, 14, seed=1)):
        ours.add(*args)
        sb3.add(*args)
        inds = np.random.default_rng(step).integers(0, sb3.size(), 8)
        np.random.seed(step)
        a = ours._get_samples(inds)
        np.random.seed(step)
        b = sb3._get_samples(inds)
        assert type(a) is type(b)
        for field in ("observations", "actions", "next_observations", "dones", "rewards"):
            assert_tensors_equal(getattr(a, field), getattr(b, field), field)
    # SB3's public arrays: same dtypes, shapes and values, views of the shared block
    for name in ("observations", "next_observations", "actions", "rewards", "timeouts", "dones"):
        mine, theirs = getattr(ours, name), getattr(sb3, name)
        if isinstance(theirs, dict):
            for k in theirs:
                assert mine[k].dtype == theirs[k].dtype and mine[k].shape == theirs[k].shape, (name, k)
                np.testing.assert_array_equal(mine[k], theirs[k])
        else:
            assert mine.dtype == theirs.dtype and mine.shape == theirs.shape, name
            np.testing.assert_array_equal(mine, theirs, err_msg=name)
    obs = ours.observations
    first = next(iter(obs.values())) if isinstance(obs, dict) else obs
    assert np.shares_memory(first, ours.storage.block)
    assert isinstance(ours.sample(16), type(b))
    ours.close()


def test_images_are_stored_as_bytes():
    image = spaces.Box(0, 255, (84, 84, 3), np.uint8)
    buf = SharedReplayBuffer(10, image, ACT)
    assert buf.layout.row_nbytes == 2 * 84 * 84 * 3 + 8 + 12  # not 4x as float32
    assert buf.storage.block.dtype == np.uint8 and buf.observations.dtype == np.uint8
    buf.close()


def test_dict_layout_packs_both_keys_in_one_float32_block_as_the_seed():
    buf = SharedReplayBuffer(64, PRIV, spaces.Box(-1, 1, (12,), np.float32), n_envs=4)
    L = buf.layout
    assert L.float32_columns and L.width == 2 * 48 + 12 + 3 + 2 * 7
    keys = list(PRIV.spaces)  # Gymnasium's Dict order: one field per key, for obs then next_obs
    assert [f[0] for f in L.fields[:4]] == [f"obs.{k}" for k in keys] + [f"next_obs.{k}" for k in keys]
    steps = random_steps(PRIV, buf.action_space, 4, 20, seed=0)
    for args in steps:
        buf.add(*args)
    s = buf.sample(32)
    assert isinstance(s, DictReplayBufferSamples)
    assert s.observations["policy"].shape == (32, 48) and s.next_observations["critic"].shape == (32, 7)
    buf.close()


def test_dict_save_load_round_trip():
    buf = SharedReplayBuffer(40, PRIV, ACT, n_envs=2, seed=0)
    for args in random_steps(PRIV, ACT, 2, 25, seed=3):
        buf.add(*args)
    copy_ = pickle.loads(pickle.dumps(buf))
    for k in ("policy", "critic"):
        np.testing.assert_array_equal(copy_.observations[k], buf.observations[k])
        np.testing.assert_array_equal(copy_.next_observations[k], buf.next_observations[k])
    assert copy_.storage.name != buf.storage.name
    copy_.close()
    buf.close()


def test_dict_rows_are_never_torn_with_concurrent_writers():
    layout = ReplayLayout({"policy": 48, "critic": 7}, 12)
    batches, batch_rows = 200, 7
    with ReplayStorage(layout, 400) as s:
        start, replies = CTX.Event(), CTX.Queue()
        writers = [
            CTX.Process(target=write_uniform, args=(s.handle, w, batches, batch_rows, start, replies)) for w in (1, 2)
        ]
        for p in writers:
            p.start()
        s.add(**{k: v for k, v in _uniform(layout, [0.5]).items()})
        start.set()
        rng, done = np.random.default_rng(0), 0
        while done < 2:
            _, fields = s.sample_fields(16, rng)
            value = fields["reward"]
            for name, arr in fields.items():
                flat = arr.reshape(16, -1)
                np.testing.assert_array_equal(flat, np.repeat(value[:, None], flat.shape[1], 1), err_msg=name)
            while not replies.empty():
                replies.get()
                done += 1
            if any(p.exitcode not in (None, 0) for p in writers):
                pytest.fail(f"a writer died: {[p.exitcode for p in writers]}")
        for p in writers:
            p.join(30)
        assert s.committed == 1 + 2 * batches * batch_rows


def _uniform(layout, values):
    from _replay_workers import uniform_rows

    return uniform_rows(layout, values)


class _DictPendulum(gym.Wrapper):
    """Pendulum with a Dict observation: the policy part and a privileged critic part."""

    def __init__(self) -> None:
        super().__init__(gym.make("Pendulum-v1", max_episode_steps=20))
        box = self.env.observation_space
        self.observation_space = spaces.Dict({"policy": box, "critic": spaces.Box(-np.inf, np.inf, (2,), np.float32)})

    def _obs(self, obs):
        return {"policy": obs, "critic": np.array([obs[2], 1.0], np.float32)}

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return self._obs(obs), info

    def step(self, action):
        obs, *rest = self.env.step(action)
        return (self._obs(obs), *rest)


@pytest.mark.parametrize("optimize", [False, True])
def test_sac_multi_input_trains_on_a_dict_env(optimize):
    model = SAC(
        "MultiInputPolicy", _DictPendulum(), buffer_size=200, learning_starts=32, batch_size=16, seed=0,
        policy_kwargs={"net_arch": [16]}, replay_buffer_class=SharedReplayBuffer, optimize_memory_usage=optimize,
    )  # fmt: skip
    model.learn(60)
    assert isinstance(model.replay_buffer, SharedReplayBuffer) and model._n_updates > 0
    model.replay_buffer.close()
