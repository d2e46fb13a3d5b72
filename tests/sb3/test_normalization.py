"""VecNormalize split between collectors and the learner (unilab_gym.runtime.normalization), without processes."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from stable_baselines3.common.running_mean_std import RunningMeanStd
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

from unilab_gym.runtime.normalization import CollectorNormalizer, Moments, NormalizationSpec
from unilab_gym.sb3.normalization import merge_moments, normalization_spec, pack_statistics

OBS_DIM = 5


class _Env(gym.Env):
    """A tiny gymnasium env, only for VecNormalize's constructor."""

    observation_space = spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float32)
    action_space = spaces.Box(-1, 1, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        return np.zeros(self.observation_space.shape, np.float32), {}

    def step(self, action):
        return np.zeros(self.observation_space.shape, np.float32), 0.0, False, False, {}


def _vec_normalize(**kwargs) -> VecNormalize:
    return VecNormalize(DummyVecEnv([_Env]), gamma=0.97, **kwargs)


def test_merged_moments_equal_a_single_stream_over_the_same_data():
    rng = np.random.default_rng(0)
    streams = [rng.normal(loc=3.0 + c, scale=0.5 + c, size=(rng.integers(50, 400), 4, OBS_DIM)) for c in range(3)]
    # single stream: one RunningMeanStd updated step by step, as VecNormalize does in one process
    single = RunningMeanStd(shape=(OBS_DIM,))
    for stream in streams:
        for step in stream:
            single.update(step)
    # three collectors, each accumulating its own steps in chunks, merged into the learner's statistics
    learner = RunningMeanStd(shape=(OBS_DIM,))
    spec = NormalizationSpec(OBS_DIM, True, False, 10.0, 10.0, 1e-8, 0.99)
    collectors = [CollectorNormalizer(spec, 4) for _ in streams]
    for t in range(max(len(s) for s in streams)):
        for stream, col in zip(streams, collectors):
            if t < len(stream):
                col.observe(stream[t])
            if t % 37 == 0:
                col.take_moments()[0].merge_into(learner)
    for col in collectors:
        col.take_moments()[0].merge_into(learner)
    assert learner.count == pytest.approx(single.count, abs=0)
    assert learner.count - 1e-4 == pytest.approx(sum(s.shape[0] * s.shape[1] for s in streams), abs=1e-6)  # obs stepped
    np.testing.assert_allclose(learner.mean, single.mean, rtol=0, atol=1e-6)
    np.testing.assert_allclose(learner.var, single.var, rtol=0, atol=1e-6)
    data = np.concatenate([s.reshape(-1, OBS_DIM) for s in streams])
    np.testing.assert_allclose(learner.mean, data.mean(axis=0), atol=1e-6)
    np.testing.assert_allclose(learner.var, data.var(axis=0), atol=1e-6)


def test_empty_moments_change_nothing():
    rms = RunningMeanStd(shape=(OBS_DIM,))
    Moments(0.0, np.zeros(OBS_DIM), np.ones(OBS_DIM)).merge_into(rms)
    assert rms.count == 1e-4 and np.all(rms.mean == 0)


def test_packed_statistics_round_trip_bit_for_bit_and_normalize_as_vecnormalize():
    vn = _vec_normalize()
    rng = np.random.default_rng(1)
    vn.obs_rms.update(rng.normal(2.0, 3.0, (100, OBS_DIM)))
    vn.ret_rms.update(rng.normal(0.0, 5.0, 100))
    spec = normalization_spec(vn)
    assert spec == NormalizationSpec(OBS_DIM, True, True, 10.0, 10.0, 1e-8, 0.97)
    packed = np.empty(spec.size, np.float32)
    pack_statistics(vn, packed)
    col = CollectorNormalizer(spec, 3)
    col.load(packed.copy())  # what a collector reads out of shared memory
    obs = rng.normal(2.0, 30.0, (3, OBS_DIM))  # some beyond clip_obs
    expected = vn.normalize_obs(obs)
    got = col.normalize_obs(obs)
    assert got.dtype == np.float32 and np.array_equal(got, expected)


def test_reward_normalization_matches_vecnormalize_step_by_step():
    """With frozen statistics, rewards are normalized as VecNormalize does, returns reset where episodes end."""
    vn = _vec_normalize()
    vn.ret_rms.update(np.array([0.3, -1.2, 2.0]))
    spec = normalization_spec(vn)
    packed = np.empty(spec.size, np.float32)
    pack_statistics(vn, packed)
    col = CollectorNormalizer(spec, 2)
    col.load(packed)
    rng = np.random.default_rng(2)
    returns = np.zeros(2)
    for t in range(20):
        reward = rng.normal(size=2)
        dones = np.array([t % 7 == 6, t % 5 == 4])
        got = col.normalize_reward(reward, dones)
        returns = returns * 0.97 + reward
        expected = np.clip(reward / np.sqrt(vn.ret_rms.var + vn.epsilon), -10, 10)
        np.testing.assert_array_equal(got, expected)
        returns[dones] = 0.0
    obs_moments, ret_moments = col.take_moments()
    assert obs_moments.count == 0 and ret_moments.count == 40  # 20 steps x 2 envs of returns


def test_merge_moments_updates_both_statistics_of_the_model_env():
    vn = _vec_normalize()
    spec = normalization_spec(vn)
    col = CollectorNormalizer(spec, 2)
    col.observe(np.ones((2, OBS_DIM)))
    col.normalize_reward(np.array([1.0, 2.0]), np.array([False, False]))
    merge_moments(vn, *col.take_moments())
    assert vn.obs_rms.count == pytest.approx(2 + 1e-4) and vn.ret_rms.count == pytest.approx(2 + 1e-4)


def test_dict_or_image_observations_are_refused_with_the_fix():
    class Image(_Env):
        observation_space = spaces.Box(0, 1, (2, 3), np.float32)

    vn = VecNormalize(DummyVecEnv([Image]))
    with pytest.raises(ValueError, match="FlattenObservation"):
        normalization_spec(vn)


def test_collector_moments_are_bit_for_bit_those_of_sb3_running_mean_std():
    # the collector side accumulates without importing SB3; it must agree with RunningMeanStd(epsilon=0) exactly
    spec = NormalizationSpec(OBS_DIM, True, True, 10.0, 10.0, 1e-8, 0.99)
    col = CollectorNormalizer(spec, num_envs=3)
    obs_ref, ret_ref = RunningMeanStd(epsilon=0.0, shape=(OBS_DIM,)), RunningMeanStd(epsilon=0.0, shape=())
    rng = np.random.default_rng(3)
    returns = np.zeros(3)
    for _ in range(6):
        obs = rng.normal(2.0, 3.0, (3, OBS_DIM))
        reward = rng.normal(size=3)
        dones = rng.random(3) < 0.3
        col.observe(obs)
        obs_ref.update(obs)
        col.normalize_reward(reward, dones)
        returns = returns * 0.99 + reward
        ret_ref.update(returns)
        returns[dones] = 0.0
    obs_m, ret_m = col.take_moments()
    for got, ref in ((obs_m, obs_ref), (ret_m, ret_ref)):
        assert got.count == ref.count
        assert np.array_equal(got.mean, ref.mean) and np.array_equal(got.var, ref.var)
    empty, _ = col.take_moments()
    assert empty.count == 0.0
