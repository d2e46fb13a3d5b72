"""``AsymmetricSACPolicy`` / ``AsymmetricActorCriticPolicy``: the actor reads "policy", the critic "critic"."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from stable_baselines3 import PPO, SAC
from stable_baselines3.common.vec_env import DummyVecEnv

from unilab_gym.sb3.vec_env import AsymmetricActorCriticPolicy, AsymmetricSACPolicy, make_sb3_env

ID = "UniLab/Quadruped-v0"
SMALL_ENV = dict(max_episode_steps=10, envs_per_cluster=4, privileged_obs=True)


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Small networks: one thread is fastest, and the AsyncRunner test compares with a collector's one thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class Target(gym.Env):
    """One-step task: act ``a = x`` for ``x`` in ``obs["policy"]``; reward ``-|a - x|^2 + h``, where ``h`` is seen
    only in ``obs["critic"]`` (so only an asymmetric critic can predict the return)."""

    observation_space = spaces.Dict(
        {"policy": spaces.Box(-1, 1, (2,), np.float32), "critic": spaces.Box(-1, 1, (3,), np.float32)}
    )
    action_space = spaces.Box(-1, 1, (2,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._x = self.np_random.uniform(-0.8, 0.8, 2).astype(np.float32)
        self._h = np.float32(self.np_random.choice([-1.0, 1.0]))
        return {"policy": self._x.copy(), "critic": np.append(self._x, self._h)}, {}

    def step(self, action):
        reward = -float(np.sum((np.asarray(action) - self._x) ** 2)) + float(self._h)
        obs, _ = self.reset()
        return obs, reward, True, False, {}


def target_env(n=4, seed=0):
    env = DummyVecEnv([Target for _ in range(n)])
    env.seed(seed)
    return env


def action_error(model, n=200):
    x = np.random.default_rng(1).uniform(-0.8, 0.8, (n, 2)).astype(np.float32)
    return float(np.mean(np.sum((model.predict(x, deterministic=True)[0] - x) ** 2, axis=1)))


# ----------------------------------------------------------------------------- learning
def test_ppo_learns_the_target_and_its_value_net_reads_the_privileged_term():
    torch.manual_seed(0)
    model = PPO(
        AsymmetricActorCriticPolicy, target_env(), n_steps=64, batch_size=64, n_epochs=10, learning_rate=3e-3, seed=0
    )
    before = action_error(model)
    model.learn(1536)
    assert action_error(model) < 0.5 * before
    x = torch.zeros(2, 2)
    values = model.policy.predict_values({"policy": x, "critic": torch.tensor([[0, 0, -1.0], [0, 0, 1.0]])})
    assert values[1] - values[0] > 0.5  # the value net learnt the reward term h that only it sees
    values = model.policy.predict_values({"policy": torch.ones(2, 2), "critic": torch.tensor([[0, 0, 1.0]] * 2)})
    assert values[0] == values[1]


def test_sac_learns_the_target_and_its_q_nets_read_the_privileged_term():
    model = SAC(
        AsymmetricSACPolicy, target_env(), learning_starts=100, batch_size=64, learning_rate=3e-3, seed=0,
        policy_kwargs=dict(net_arch=[64, 64]),
    )  # fmt: skip
    before = action_error(model)
    model.learn(700)
    assert action_error(model) < 0.5 * before
    a = torch.zeros(2, 2)
    q = model.critic({"policy": torch.zeros(2, 2), "critic": torch.tensor([[0, 0, -1.0], [0, 0, 1.0]])}, a)[0]
    assert q[1] - q[0] > 0.5


# ----------------------------------------------------------------------------- structure
@pytest.mark.parametrize("algo, policy", [(SAC, AsymmetricSACPolicy), (PPO, AsymmetricActorCriticPolicy)])
def test_actor_reads_only_policy_and_predict_takes_either_form(algo, policy, tmp_path):
    env = make_sb3_env(ID, 2, seed=0, **SMALL_ENV)
    kwargs = dict(n_steps=8, batch_size=16) if algo is PPO else dict(learning_starts=4, batch_size=8)
    model = algo(policy, env, seed=0, policy_kwargs=dict(net_arch=[16]), **kwargs)
    model.learn(16)
    obs = env.reset()
    noisy = {"policy": obs["policy"], "critic": np.random.default_rng(0).normal(size=obs["critic"].shape)}
    a = model.predict(obs, deterministic=True)[0]
    np.testing.assert_array_equal(model.predict(noisy, deterministic=True)[0], a)  # the critic key is not read
    np.testing.assert_array_equal(model.predict(obs["policy"], deterministic=True)[0], a)  # the policy obs alone
    one = model.predict(obs["policy"][1], deterministic=True)[0]  # one obs (a batch of 1 may round differently)
    np.testing.assert_allclose(one, a[1], rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match=r"observation of shape \(48,\).*got an array of shape \(2, 68\)"):
        model.predict(obs["critic"])
    extractors = (
        (model.policy.actor.features_extractor, model.policy.critic.features_extractor)
        if algo is SAC
        else (model.policy.pi_features_extractor, model.policy.vf_features_extractor)
    )
    assert [e.key for e in extractors] == ["policy", "critic"]
    assert [e.features_dim for e in extractors] == [48, 68]
    model.save(tmp_path / "m.zip")
    loaded = algo.load(tmp_path / "m.zip")
    assert (loaded.policy.actor_key, loaded.policy.critic_key) == ("policy", "critic")
    np.testing.assert_array_equal(loaded.predict(obs, deterministic=True)[0], a)
    env.close()


def test_symmetric_critic_on_the_same_env_reads_policy():
    env = make_sb3_env(ID, 2, seed=0, **SMALL_ENV)
    model = PPO(AsymmetricActorCriticPolicy, env, n_steps=8, batch_size=16, policy_kwargs=dict(critic_key="policy"))
    assert model.policy.vf_features_extractor.features_dim == 48
    env.close()


def test_bad_spaces_and_options_name_the_problem():
    env = make_sb3_env(ID, 1, seed=0, max_episode_steps=10)
    with pytest.raises(ValueError, match="need a Dict observation space"):
        PPO(AsymmetricActorCriticPolicy, env)
    env.close()
    env = make_sb3_env(ID, 1, seed=0, **SMALL_ENV)
    with pytest.raises(ValueError, match=r"no key 'privileged'; its keys: \['critic', 'policy'\]"):
        SAC(AsymmetricSACPolicy, env, policy_kwargs=dict(critic_key="privileged"))
    with pytest.raises(ValueError, match="cannot share a features extractor"):
        SAC(AsymmetricSACPolicy, env, policy_kwargs=dict(share_features_extractor=True))
    env.close()


# ----------------------------------------------------------------------------- export: the actor alone
def test_export_takes_the_48_policy_values(tmp_path, monkeypatch):
    pytest.importorskip("onnxruntime")
    from unilab_gym.export import export_c_header, export_onnx, to_onnx
    from unilab_gym.export.policy import policy_net
    from unilab_gym.export.to_onnx import run_onnx

    env = make_sb3_env(ID, 2, seed=0, **SMALL_ENV)
    model = PPO(AsymmetricActorCriticPolicy, env, n_steps=8, batch_size=16, seed=0, policy_kwargs=dict(net_arch=[16]))
    net = policy_net(model)
    assert net.layers[0].in_features == 48
    obs = env.reset()
    expected = model.predict(obs, deterministic=True)[0]
    np.testing.assert_allclose(net.act(obs["policy"]), expected, atol=1e-6)
    parity = np.random.default_rng(0).normal(size=(256, 48)).astype(np.float32)  # fast: not 10,000 env observations
    monkeypatch.setattr(to_onnx, "env_observations", lambda *args, **kwargs: parity)
    path = export_onnx(model, tmp_path / "actor.onnx")
    np.testing.assert_allclose(run_onnx(path, obs["policy"]), expected, atol=1e-5)
    header = export_c_header(model, tmp_path / "actor.h").read_text()
    assert "#define UNILAB_OBS_DIM 48" in header
    env.close()


# ----------------------------------------------------------------------------- AsyncRunner
def test_async_runner_ppo_with_the_dict_equals_stock_sb3_bit_for_bit():
    """One collector of 8 envs with env_kwargs={"privileged_obs": True} trains what stock SB3 PPO trains."""
    from unilab_gym import AsyncRunner

    def make():
        env = make_sb3_env(ID, 8, seed=3, **SMALL_ENV)
        return PPO(
            AsymmetricActorCriticPolicy, env, n_steps=16, batch_size=64, n_epochs=2, seed=3,
            policy_kwargs=dict(net_arch=[32, 32]),
        )  # fmt: skip

    stock = make()
    torch.manual_seed(3)  # the collector seeds torch with seed + 0 before its first action
    stock.learn(2 * 128)
    model = make()
    with AsyncRunner(
        model, env_id=ID, num_collectors=1, envs_per_collector=8, env_kwargs=SMALL_ENV, collector_timeout_s=300
    ) as runner:  # a generous timeout: a spawned collector starts slowly on a busy machine
        runner.learn(2 * 128)
    assert model._n_updates == stock._n_updates == 2 * 2
    for (name, ours), theirs in zip(model.policy.state_dict().items(), stock.policy.state_dict().values()):
        assert torch.equal(ours, theirs), name


# ----------------------------------------------------------------------------- SharedReplayBuffer
def test_sac_on_shared_replay_buffer_samples_both_keys():
    from stable_baselines3.common.type_aliases import DictReplayBufferSamples

    from unilab_gym import SharedReplayBuffer

    env = make_sb3_env(ID, 2, seed=0, **SMALL_ENV)
    model = SAC(
        AsymmetricSACPolicy, env, replay_buffer_class=SharedReplayBuffer, learning_starts=20, batch_size=16,
        buffer_size=1000, seed=0, policy_kwargs=dict(net_arch=[16]),
    )  # fmt: skip
    try:
        model.learn(60)
        assert model._n_updates > 0
        samples = model.replay_buffer.sample(8)
        assert isinstance(samples, DictReplayBufferSamples)
        assert samples.observations["critic"].shape == samples.next_observations["critic"].shape == (8, 68)
        assert samples.observations["policy"].shape == (8, 48)
        np.testing.assert_array_equal(samples.observations["critic"][:, :48], samples.observations["policy"])
    finally:
        model.replay_buffer.close()
        env.close()


def test_async_runner_sac_collectors_act_with_the_actor_on_the_dict():
    from unilab_gym import AsyncRunner, SharedReplayBuffer

    env = make_sb3_env(ID, 1, seed=0, **SMALL_ENV)
    model = SAC(
        AsymmetricSACPolicy, env, replay_buffer_class=SharedReplayBuffer, learning_starts=50, batch_size=16,
        buffer_size=2000, seed=0, policy_kwargs=dict(net_arch=[16]),
    )  # fmt: skip
    try:
        with AsyncRunner(
            model, env_id=ID, num_collectors=2, envs_per_collector=2, env_kwargs=SMALL_ENV, replay_ratio=0.25,
            collector_timeout_s=300,
        ) as runner:  # fmt: skip
            runner.learn(300)
        assert model.num_timesteps == 300 and model._n_updates == (300 - 50) // 4
        samples = model.replay_buffer.sample(16)
        critic = samples.observations["critic"].numpy()
        assert critic.shape == (16, 68) and (critic[:, 48] == 0.5).all()  # nominal friction, from the collectors' envs
        np.testing.assert_array_equal(critic[:, :48], samples.observations["policy"].numpy())
    finally:
        model.replay_buffer.close()
        env.close()
