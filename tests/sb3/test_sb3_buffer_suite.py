"""SB3's own replay-buffer test cases, run on ``SharedReplayBuffer`` (issue 18, item 1).

Written from what Stable-Baselines3's ``tests/test_buffers.py``, ``tests/test_n_step_replay.py``
and the replay cases of ``tests/test_save_load.py`` assert (SB3 2.9, commit e05d2dbe), with
``ReplayBuffer`` / ``DictReplayBuffer`` replaced by ``SharedReplayBuffer``. CI cannot reach
GitHub, so the cases live here. Cases that need a GPU are skipped on CPU-only machines:
``test_device_buffer[cuda-*]``. SB3's ``NStepReplayBuffer`` cases exercise SB3's own class (it
is not a ``ReplayBuffer`` alias); the one that compares it with a plain buffer runs on ours.
"""

from __future__ import annotations

import pathlib
import warnings
from copy import deepcopy

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from stable_baselines3 import DQN, SAC, TD3
from stable_baselines3.common.buffers import NStepReplayBuffer, ReplayBuffer
from stable_baselines3.common.env_checker import check_env
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.envs import IdentityEnv, IdentityEnvBox
from stable_baselines3.common.type_aliases import DictReplayBufferSamples, ReplayBufferSamples
from stable_baselines3.common.utils import get_device
from stable_baselines3.common.vec_env import VecNormalize

from unilab_gym.sb3.replay_buffer import SharedReplayBuffer

VALUES = np.arange(1.0, 6.0, dtype=np.float32).reshape(5, 1)  # observations cycle through 1..5


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


class CyclingEnv(gym.Env):
    """Box(1, 5, (1,)) observations and rewards cycling through 1..5; 100-step episodes."""

    def __init__(self, dict_obs: bool = False) -> None:
        box = spaces.Box(1, 5, (1,))
        self.dict_obs = dict_obs
        if dict_obs:  # a multi-dim action space too
            self.action_space = spaces.Box(1, 5, shape=(10, 7))
            self.observation_space = spaces.Dict({"observation": box, "achieved_goal": box, "desired_goal": box})
        else:
            self.action_space = box
            self.observation_space = box
        self._t = 0

    def _obs(self):
        value = VALUES[self._t % 5]
        return {key: value.copy() for key in self.observation_space.spaces} if self.dict_obs else value.copy()

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return self._obs(), {}

    def step(self, action):
        self._t += 1
        return self._obs(), float(VALUES[self._t % 5, 0]), False, self._t >= 100, {}


def shared_factory(dict_obs: bool):
    return lambda: CyclingEnv(dict_obs)


# ---- tests/test_buffers.py ----------------------------------------------------------------------------
@pytest.mark.parametrize("dict_obs", [False, True])
def test_env(dict_obs):
    check_env(CyclingEnv(dict_obs), warn=False, skip_render_check=True)


@pytest.mark.parametrize("dict_obs", [False, True])
def test_replay_buffer_normalization(dict_obs):
    env = VecNormalize(make_vec_env(shared_factory(dict_obs)))
    buffer = SharedReplayBuffer(100, env.observation_space, env.action_space, device="cpu")
    env.reset()
    obs = env.get_original_obs()
    for _ in range(100):
        action = env.action_space.sample()
        _, _, done, info = env.step(action)
        next_obs = env.get_original_obs()
        buffer.add(obs, next_obs, action, env.get_original_reward(), done, info)
        obs = next_obs
    sample = buffer.sample(50, env)
    assert isinstance(sample, DictReplayBufferSamples if dict_obs else ReplayBufferSamples)
    for observations in (sample.observations, sample.next_observations):
        if dict_obs:
            for key in observations:
                assert th.allclose(observations[key].mean(0), th.zeros(1), atol=1)
        else:
            assert th.allclose(observations.mean(0), th.zeros(1), atol=1)
    assert np.allclose(sample.rewards.mean(0), np.zeros(1), atol=1)
    buffer.close()
    env.close()


@pytest.mark.parametrize("dict_obs", [False, True])
@pytest.mark.parametrize("device", ["cpu", "cuda", "auto"])
def test_device_buffer(dict_obs, device):
    if device == "cuda" and not th.cuda.is_available():
        pytest.skip("needs a GPU (CUDA not available)")
    env = make_vec_env(shared_factory(dict_obs))
    buffer = SharedReplayBuffer(100, env.observation_space, env.action_space, device=device)
    obs = env.reset()
    for _ in range(100):
        action = env.action_space.sample()
        next_obs, reward, done, info = env.step(action)
        buffer.add(obs, next_obs, action, reward, done, info)
        obs = next_obs
    desired = get_device(device).type
    for value in buffer.sample(50):
        if value is None:  # discounts: set by SB3's n-step buffer only
            continue
        tensors = value.values() if isinstance(value, dict) else [value]
        for tensor in tensors:
            assert isinstance(tensor, th.Tensor) and tensor.device.type == desired
    buffer.close()
    env.close()


OBS_DTYPES = [np.uint8, np.int8, np.uint16, np.int16, np.uint32, np.int32, np.uint64, np.int64]
OBS_DTYPES += [np.float16, np.float32, np.float64]
ACTION_SPACES = [
    spaces.Discrete(10),
    spaces.Box(low=-1.0, high=1.0, dtype=np.float32),
    spaces.Box(low=-1.0, high=1.0, dtype=np.float64),
]


@pytest.mark.parametrize("obs_dtype", [np.dtype(d) for d in OBS_DTYPES])
@pytest.mark.parametrize("use_dict", [False, True])
@pytest.mark.parametrize("action_space", ACTION_SPACES)
def test_buffer_dtypes(obs_dtype, use_dict, action_space):
    obs_space = spaces.Box(0, 100, dtype=obs_dtype)
    if use_dict:
        obs_space = spaces.Dict({"obs": obs_space, "obs_2": spaces.Box(0, 100, dtype=np.uint8)})
    buffer = SharedReplayBuffer(buffer_size=1, observation_space=obs_space, action_space=action_space)
    replay_action_dtype = ReplayBuffer._maybe_cast_dtype(action_space.dtype)  # float64 -> float32, SB3 GH#1145
    if use_dict:
        assert buffer.observations["obs"].dtype == obs_dtype
        assert buffer.observations["obs_2"].dtype == np.uint8
    else:
        assert buffer.observations.dtype == obs_dtype
    assert buffer.actions.dtype == replay_action_dtype
    buffer.full = True
    data = buffer.sample(batch_size=64)
    assert data.actions.numpy().dtype == replay_action_dtype
    if use_dict:
        assert data.observations["obs"].numpy().dtype == obs_dtype
        assert data.observations["obs_2"].numpy().dtype == np.uint8
    else:
        assert data.observations.numpy().dtype == obs_dtype
    buffer.close()


# ---- tests/test_n_step_replay.py -------------------------------------------------------------------------
def _box(shape):
    return spaces.Box(low=0, high=1, shape=shape, dtype=np.float32)


def _fill(buffer, length):
    """reward 1, observation = index, no episode end."""
    for i in range(length):
        obs, next_obs = np.full((1, 4), i, np.float32), np.full((1, 4), i + 1, np.float32)
        buffer.add(obs, next_obs, np.zeros((1, 2), np.float32), np.array([1.0]), np.array([0.0]), [{}])


def test_match_normal_buffer():
    kw = dict(buffer_size=10, observation_space=_box((4,)), action_space=_box((2,)), device="cpu", n_envs=1)
    nstep = NStepReplayBuffer(**kw, n_steps=1, gamma=0.99)
    ours = SharedReplayBuffer(**kw)
    _fill(nstep, 10)
    _fill(ours, 10)
    batch1, batch2 = nstep._get_samples(np.array([3])), ours._get_samples(np.array([3]))
    np.testing.assert_allclose(batch1.rewards.item(), 1.0, rtol=1e-6)
    assert batch1.dones.item() == 0.0
    np.testing.assert_allclose(batch1.rewards.numpy(), batch2.rewards.numpy(), rtol=1e-6)
    ours.close()


# ---- tests/test_save_load.py: the replay cases -----------------------------------------------------------
def select_env(model_class):
    return IdentityEnv(10) if model_class is DQN else IdentityEnvBox(-10, 10)


@pytest.mark.parametrize("model_class", [SAC, TD3, DQN])
def test_save_load_replay_buffer(tmp_path, model_class):
    path = pathlib.Path(tmp_path / "logs/replay_buffer.pkl")
    path.parent.mkdir(exist_ok=True, parents=True)
    model = model_class(
        "MlpPolicy",
        select_env(model_class),
        buffer_size=1000,
        policy_kwargs=dict(net_arch=[64]),
        learning_starts=100,
        replay_buffer_class=SharedReplayBuffer,
    )
    model.learn(150)
    old = deepcopy(model.replay_buffer)
    model.save_replay_buffer(path)
    model.replay_buffer = None
    for device in ["cpu", "cuda"]:  # cuda falls back to cpu on a CPU-only machine, as in SB3
        model.device = th.device(device)
        model.load_replay_buffer(path)
        assert model.replay_buffer.device.type == model.device.type
    new = model.replay_buffer
    assert isinstance(new, SharedReplayBuffer)
    for name in ("observations", "actions", "rewards", "dones", "timeouts"):
        assert np.allclose(getattr(old, name), getattr(new, name)), name
    infos = [[{"TimeLimit.truncated": truncated}] for truncated in old.timeouts]
    new.extend(old.observations, old.observations, old.actions, old.rewards, old.dones, infos)
    old.close()
    new.close()


@pytest.mark.parametrize("model_class", [DQN, SAC, TD3])
@pytest.mark.parametrize("optimize_memory_usage", [False, True])
def test_warn_buffer(recwarn, model_class, optimize_memory_usage):
    warnings.filterwarnings(action="ignore", category=DeprecationWarning)
    model = model_class(
        "MlpPolicy",
        select_env(model_class),
        buffer_size=100,
        optimize_memory_usage=optimize_memory_usage,
        replay_buffer_kwargs={"handle_timeout_termination": not optimize_memory_usage},
        replay_buffer_class=SharedReplayBuffer,
        policy_kwargs=dict(net_arch=[64]),
        learning_starts=10,
    )
    model.learn(50)
    model.learn(50, reset_num_timesteps=False)
    assert len(recwarn) == 0
    model.learn(50)
    if optimize_memory_usage:
        assert len(recwarn) == 1
        warning = recwarn.pop(UserWarning)
        assert "The last trajectory in the replay buffer will be truncated" in str(warning.message)
    else:
        assert len(recwarn) == 0
    model.replay_buffer.close()


def test_no_resource_warning(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = SAC("MlpPolicy", "Pendulum-v1", buffer_size=200, replay_buffer_class=SharedReplayBuffer)
        model.save_replay_buffer(tmp_path / "replay")
        model.load_replay_buffer(tmp_path / "replay")
        model.save_replay_buffer(str(tmp_path / "replay"))
        model.load_replay_buffer(str(tmp_path / "replay"))
        import tempfile

        with tempfile.TemporaryFile() as fp:
            model.save_replay_buffer(fp)
            fp.seek(0)
            model.load_replay_buffer(fp)
            assert not fp.closed
        model.replay_buffer.close()
