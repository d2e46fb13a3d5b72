"""A NaN / inf from a user env (issue 29, item 13): the collector refuses it with a CollectorError naming the
collector, the env and the step, before anything of that step reaches the replay or rollout.

Before, a NaN observation surfaced as torch's ``Expected parameter loc ... found invalid values``, naming
neither env nor collector nor step, and NaN rows reached the replay first."""

import functools
import os

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")
import _runner_envs
from stable_baselines3 import PPO, SAC
from stable_baselines3.common.vec_env import DummyVecEnv

from unilab_gym import AsyncRunner, CollectorError, SharedReplayBuffer
from unilab_gym.runtime.collector import FiniteCheckedEnv


def net():
    """Small networks (a fresh dict each time: SB3 writes into policy_kwargs)."""
    return dict(net_arch=[16, 16])


def nonfinite_rows(replay):
    """Rows of ``replay`` (a SharedReplayBuffer) with a NaN / inf in any float field, among those written."""
    storage = replay.storage
    n = min(storage.committed, storage.capacity)
    bad = np.zeros(n, bool)
    for name, *_ in storage.layout.fields:
        values = np.asarray(storage.field(name)[:n])
        if values.dtype.kind == "f":
            bad |= ~np.isfinite(values.reshape(n, -1)).all(axis=1)
    return int(bad.sum()), n


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("nan_obs", r"collector 3: env 1 returned a non-finite observation \(observation\[2\] = nan\) at step 5;"),
        ("inf_reward", r"collector 3: env 1 returned a non-finite reward \(reward = inf\) at step 5;"),
        ("nan_final_obs", r"collector 3: env 1 returned a non-finite final_obs \(final_obs\[1\] = nan\) at step 5;"),
    ],
)
def test_the_checked_env_names_collector_env_and_step(tmp_path, fault, message):
    env = FiniteCheckedEnv(
        _runner_envs.tiny(3, claim_path=str(tmp_path / "claim"), fault=fault, fault_at=5, fault_env=1), collector=3
    )
    obs, _ = env.reset(seed=0)
    assert env.num_envs == 3 and env.single_action_space.shape == (2,)  # the env's own attributes
    actions = np.zeros((3, 2), np.float32)
    for _ in range(4):
        obs, reward, *_ = env.step(actions)
        assert np.isfinite(obs).all() and np.isfinite(reward).all()
    with pytest.raises(CollectorError, match=message) as info:
        env.step(actions)
    assert info.value.collector == 3 and info.value.pid == os.getpid()
    assert "nothing of this step was written to the replay or rollout" in str(info.value)


def test_a_nan_in_a_dict_observation_names_its_key():
    class DictObs:
        num_envs = 2

        def reset(self, **kwargs):
            return {"policy": np.zeros((2, 3), np.float32), "critic": np.array([[0.0], [np.inf]], np.float32)}, {}

    with pytest.raises(CollectorError, match=r"collector 0: env 1 .* observation 'critic' .* at step 0 \(its reset\)"):
        FiniteCheckedEnv(DictObs(), collector=0).reset(seed=0)


def tiny_sac():
    """SAC on a shared replay, sized for the tiny env: the model both NaN-observation tests drive."""
    return SAC(
        "MlpPolicy",
        DummyVecEnv([_runner_envs.TinyEnv]),
        replay_buffer_class=SharedReplayBuffer,
        learning_starts=20,
        batch_size=16,
        buffer_size=2_000,
        policy_kwargs=net(),
        seed=0,
    )


def test_sac_nan_observation_is_a_collector_error_and_never_reaches_the_replay(tmp_path, one_torch_thread):
    claim = tmp_path / "claim"
    env_fn = functools.partial(_runner_envs.tiny, claim_path=str(claim), fault="nan_obs", fault_at=30, fault_env=1)
    model = tiny_sac()
    try:
        runner = AsyncRunner(model, env_fn=env_fn, num_collectors=2, envs_per_collector=2)
        with pytest.raises(CollectorError) as info:
            runner.learn(10**6)
        assert runner.closed
        faulty_pid = int(claim.read_text())
        c = info.value.collector
        assert info.value.pid == faulty_pid
        text = str(info.value)
        assert f"collector {c}: env 1 returned a non-finite observation (observation[2] = nan) at step 30;" in text
        bad, written = nonfinite_rows(model.replay_buffer)
        assert written >= 2 * 29  # the faulty collector's 29 steps of 2 envs at least, all finite
        assert bad == 0, f"{bad} of {written} replay rows hold a NaN / inf"
    finally:
        model.replay_buffer.close()


def test_ppo_inf_reward_is_a_collector_error_naming_env_and_step(tmp_path, one_torch_thread):
    claim = tmp_path / "claim"
    env_fn = functools.partial(_runner_envs.tiny, claim_path=str(claim), fault="inf_reward", fault_at=21, fault_env=0)
    model = PPO(
        "MlpPolicy", DummyVecEnv([_runner_envs.TinyEnv] * 4), n_steps=8, batch_size=16, policy_kwargs=net(), seed=0
    )
    runner = AsyncRunner(model, env_fn=env_fn, num_collectors=2, envs_per_collector=2)
    with pytest.raises(CollectorError) as info:
        runner.learn(10**6)
    assert runner.closed and info.value.pid == int(claim.read_text())
    c = info.value.collector
    assert f"collector {c}: env 0 returned a non-finite reward (reward = inf) at step 21;" in str(info.value)
    # the learner took at least one whole rollout (8 steps of 4 envs) before it, without the inf
    assert model.num_timesteps >= 8 * 4
    assert np.isfinite(model.rollout_buffer.rewards).all() and np.isfinite(model.rollout_buffer.returns).all()


def test_ray_collectors_refuse_a_nan_observation_the_same_way(tmp_path, one_torch_thread, local_ray):
    """The check lives in the Collector that both backends build (a Ray actor's StagedCollector is one)."""
    claim = tmp_path / "claim"
    env_fn = functools.partial(_runner_envs.tiny, claim_path=str(claim), fault="nan_obs", fault_at=30, fault_env=1)
    model = tiny_sac()
    # the session's shared local Ray (tests/conftest.py); its workers import _runner_envs from tests/helpers/
    try:
        runner = AsyncRunner(model, env_fn=env_fn, num_collectors=1, envs_per_collector=2, backend="ray")
        with pytest.raises(CollectorError) as info:
            runner.learn(10**6)
        assert runner.closed and info.value.collector == 0
        assert "collector 0: env 1 returned a non-finite observation (observation[2] = nan) at step 30;" in str(
            info.value
        )
        bad, written = nonfinite_rows(model.replay_buffer)
        assert bad == 0, f"{bad} of {written} replay rows hold a NaN / inf"
    finally:
        model.replay_buffer.close()
