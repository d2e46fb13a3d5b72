"""unilab_gym.sb3.models: what the tools (play, robustness, export) read from saved SB3 models (issue 28 item 1)."""

import zipfile

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("stable_baselines3")
from stable_baselines3 import A2C, DDPG, PPO, SAC, TD3
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize
from torch import nn

from unilab_gym.sb3.models import (
    algorithm_of,
    deterministic_actor,
    load_model,
    load_vec_normalize,
    original_rewards,
)


def pendulum():
    return DummyVecEnv([lambda: gym.make("Pendulum-v1")])


def small(cls):
    if cls in (SAC, TD3, DDPG):
        extra = dict(buffer_size=100, learning_starts=0)
    else:
        extra = dict(n_steps=8) if cls is A2C else dict(n_steps=8, batch_size=8)
    extra["policy_kwargs"] = dict(net_arch=[8])  # a fresh dict: SB3 writes into policy_kwargs
    return cls("MlpPolicy", pendulum(), seed=0, device="cpu", **extra)


@pytest.mark.parametrize("cls, read", [(SAC, SAC), (PPO, PPO), (TD3, TD3), (A2C, A2C), (DDPG, TD3)])
def test_the_algorithm_is_read_from_the_saved_file(tmp_path, cls, read):
    path = tmp_path / "model.zip"
    small(cls).save(path)
    assert algorithm_of(path) is read  # DDPG saves TD3's hyperparameters: it loads as a TD3
    loaded = load_model(path)
    assert type(loaded) is read and loaded.device.type == "cpu"
    assert type(load_model(str(path), cls.__name__.lower())) is cls  # a named algorithm is loaded as named


def test_a_zip_without_model_data_is_refused_naming_it(tmp_path):
    path = tmp_path / "empty.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("other.txt", "not a model")
    with pytest.raises(ValueError, match=r"empty\.zip holds no SB3 model data"):
        algorithm_of(path)


@pytest.mark.parametrize("cls, squash", [(SAC, True), (TD3, True), (PPO, False)])
def test_the_deterministic_actor_gives_the_models_deterministic_action(cls, squash):
    model = small(cls)
    actor = deterministic_actor(model)
    assert actor.obs_dim == 3 and actor.actor_key is None and actor.squash_output is squash
    np.testing.assert_array_equal(actor.action_low, [-2.0])
    np.testing.assert_array_equal(actor.action_high, [2.0])
    obs = np.random.default_rng(0).uniform(-1, 1, (5, 3)).astype(np.float32)
    import torch

    with torch.no_grad():
        a = nn.Sequential(*actor.layers)(torch.as_tensor(obs)).numpy()
    if squash:
        a = actor.action_low + 0.5 * (a + 1.0) * (actor.action_high - actor.action_low)  # SB3's unscale_action
    else:
        a = np.clip(a, actor.action_low, actor.action_high)
    np.testing.assert_allclose(a, model.predict(obs, deterministic=True)[0], rtol=1e-5, atol=1e-6)


def test_what_is_not_an_sb3_model_is_refused():
    with pytest.raises(ValueError, match=r"model must be a SAC, TD3, DDPG, PPO or A2C model \(SB3\); got Linear"):
        deterministic_actor(nn.Linear(3, 1))


def test_saved_statistics_are_loaded_frozen_and_rewards_read_raw(tmp_path):
    env = VecNormalize(pendulum(), norm_reward=True)
    env.reset()
    normalized = env.step(np.zeros((1, 1), np.float32))[1]
    env.save(tmp_path / "stats.pkl")
    loaded = load_vec_normalize(tmp_path / "stats.pkl", pendulum())
    assert loaded.training is False and loaded.norm_reward is False
    assert loaded.obs_rms.count == env.obs_rms.count  # the saved statistics
    raw = original_rewards(env, normalized)  # under a VecNormalize: its raw rewards, not the normalized ones
    np.testing.assert_array_equal(raw, env.get_original_reward())
    assert not np.array_equal(raw, normalized)
    plain = np.array([1.5])
    assert original_rewards(pendulum(), plain) is plain  # no VecNormalize: the rewards as given
