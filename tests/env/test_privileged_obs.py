"""``privileged_obs=True``: the Dict observation, its critic layout, and every adapter and storage carrying it."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

import unilab_gym  # noqa: F401  (registers the ids)
from unilab_gym import QuadrupedEnv, UniLabVectorEnv
from unilab_gym.randomization import NOMINAL, PARAMETER_NAMES
from unilab_gym.tasks.quadruped import CRITIC_OBS_DIM, CRITIC_OBS_LAYOUT, OBS_DIM, OBS_LAYOUT

ID = "UniLab/Quadruped-v0"
DR = {"friction": (0.4, 1.2), "added_mass": (-1.0, 2.0), "com_x": (-0.02, 0.02), "latency": (0, 2)}
TASK = dict(max_episode_steps=12, envs_per_cluster=2, termination={"min_base_height": 0.27}, domain_randomization=DR)


def actions(steps, n, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, (steps, n, 12))


def col(name):
    return slice(*CRITIC_OBS_LAYOUT[name])


# ----------------------------------------------------------------------------- layout and space
def test_critic_layout_is_the_policy_layout_then_privileged_terms_without_gaps():
    assert list(CRITIC_OBS_LAYOUT)[: len(OBS_LAYOUT)] == list(OBS_LAYOUT)
    assert all(CRITIC_OBS_LAYOUT[k] == v for k, v in OBS_LAYOUT.items())
    stops = 0
    for start, stop in CRITIC_OBS_LAYOUT.values():
        assert start == stops and stop > start
        stops = stop
    assert stops == CRITIC_OBS_DIM == 68 and OBS_DIM == 48


def test_default_is_unchanged_and_make_vec_gives_the_dict_space():
    plain = gym.make_vec(ID, num_envs=2)
    assert plain.single_observation_space == spaces.Box(-np.inf, np.inf, (48,), np.float32)
    plain.close()
    env = gym.make_vec(ID, num_envs=3, privileged_obs=True)
    assert isinstance(env, UniLabVectorEnv) and env.privileged_obs
    space = env.single_observation_space
    assert isinstance(space, spaces.Dict) and set(space.spaces) == {"policy", "critic"}
    assert space["policy"].shape == (48,) and space["critic"].shape == (68,)
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    assert obs["policy"].dtype == obs["critic"].dtype == np.float32
    env.close()


def test_privileged_obs_must_be_a_bool():
    with pytest.raises(ValueError, match="privileged_obs must be True or False, got 'yes'"):
        UniLabVectorEnv(1, privileged_obs="yes")


# ----------------------------------------------------------------------------- values
def test_critic_columns_hold_the_policy_obs_parameters_height_contacts_and_air_time():
    env = UniLabVectorEnv(4, privileged_obs=True, **TASK)
    plain = UniLabVectorEnv(4, **TASK)
    obs, info = env.reset(seed=3)
    ref, _ = plain.reset(seed=3)
    acts = actions(30, 4)
    for t in range(30):
        critic = obs["critic"]
        np.testing.assert_array_equal(obs["policy"], ref)  # the same trajectory as without privileged_obs
        np.testing.assert_array_equal(critic[:, :48], obs["policy"])
        np.testing.assert_array_equal(critic[:, 48:59], env.parameters.astype(np.float32))
        np.testing.assert_array_equal(
            critic[:, col("base_height")][:, 0], env.robot_state.base_pos[:, 2].astype(np.float32)
        )
        np.testing.assert_array_equal(critic[:, col("foot_contact")], env.robot_state.foot_contact.astype(np.float32))
        np.testing.assert_array_equal(critic[:, col("feet_air_time")], env.feet_air_time.astype(np.float32))
        obs, *_ = env.step(acts[t])
        ref, *_ = plain.step(acts[t])
    assert env.robot_state.foot_contact.any()
    # the parameters are the episode's (reset info), in PARAMETER_NAMES order
    _, info = env.reset(seed=5)
    critic = env._observation()["critic"]
    for k, name in enumerate(PARAMETER_NAMES):
        np.testing.assert_array_equal(critic[:, 48 + k], info["parameters"][name].astype(np.float32))
    env.close()
    plain.close()


def test_nominal_parameters_when_randomization_is_off():
    env = UniLabVectorEnv(2, privileged_obs=True)
    obs, _ = env.reset(seed=0)
    np.testing.assert_array_equal(obs["critic"][:, 48:59], np.tile(NOMINAL.astype(np.float32), (2, 1)))
    env.close()


def test_same_step_final_obs_and_next_step_carry_the_dict():
    same = UniLabVectorEnv(3, privileged_obs=True, autoreset_mode="SameStep", **TASK)
    nxt = UniLabVectorEnv(3, privileged_obs=True, **TASK)
    o1, _ = same.reset(seed=1)
    o2, _ = nxt.reset(seed=1)
    ended = np.zeros(3, bool)  # after its first episode an env's two runs differ (SAME_STEP steps on at once)
    finals = 0
    for a in actions(25, 3):
        o1, _, te1, tr1, info1 = same.step(a)
        o2, *_ = nxt.step(a.copy())
        for key in ("policy", "critic"):  # NEXT_STEP returns the final obs where SAME_STEP returns the reset one
            np.testing.assert_array_equal(o2[key][~ended & ~(te1 | tr1)], o1[key][~ended & ~(te1 | tr1)])
        for i in np.flatnonzero((te1 | tr1) & ~ended):
            final = info1["final_obs"][i]
            assert isinstance(final, dict) and final["critic"].shape == (68,) and final["policy"].shape == (48,)
            np.testing.assert_array_equal(final["critic"], o2["critic"][i])
            np.testing.assert_array_equal(final["policy"], o2["policy"][i])
            finals += 1
        ended |= te1 | tr1
    assert finals >= 3
    same.close()
    nxt.close()


def test_single_env_gives_one_dict():
    env = gym.make(ID, privileged_obs=True)
    assert isinstance(env.unwrapped, QuadrupedEnv)
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    obs, *_ = env.step(np.zeros(12, np.float32))
    assert obs["critic"].shape == (68,) and env.observation_space.contains(obs)
    env.close()


# ----------------------------------------------------------------------------- adapters
def test_sb3_vecenv_carries_the_dict_and_dict_terminal_observations():
    from unilab_gym.sb3.vec_env import make_sb3_env

    env = make_sb3_env(ID, 3, seed=0, privileged_obs=True, **TASK)
    assert isinstance(env.observation_space, spaces.Dict)
    obs = env.reset()
    assert obs["policy"].shape == (3, 48) and obs["critic"].shape == (3, 68)
    terminal = 0
    for a in actions(15, 3):
        obs, _, dones, infos = env.step(a)
        for i in np.flatnonzero(dones):
            t = infos[i]["terminal_observation"]
            assert set(t) == {"policy", "critic"} and t["critic"].shape == (68,)
            terminal += 1
    assert terminal >= 3
    env.close()


def test_tianshou_env_gives_dicts_per_env_as_dummy_vector_env():
    pytest.importorskip("tianshou")
    from tianshou.data import Batch

    from unilab_gym.tianshou import make_tianshou_env

    env = make_tianshou_env(ID, 3, seed=0, privileged_obs=True)
    obs, _ = env.reset()
    assert obs.shape == (3,) and obs[0]["critic"].shape == (68,)
    obs, *_ = env.step(np.zeros((2, 12)), id=[0, 2])
    assert obs.shape == (2,) and obs[1]["policy"].shape == (48,)
    batch = Batch(obs=obs)
    assert batch.obs.critic.shape == (2, 68)
    env.close()


# ----------------------------------------------------------------------------- on-policy rollout storage
def test_rollout_storage_round_trip_into_sb3_dict_rollout_buffer():
    import torch
    from stable_baselines3.common.buffers import DictRolloutBuffer

    from unilab_gym.runtime.rollout import RolloutStorage, put_obs

    space = spaces.Dict({"critic": spaces.Box(-np.inf, np.inf, (68,)), "policy": spaces.Box(-np.inf, np.inf, (48,))})
    steps, n = 4, 3
    storage = RolloutStorage.create(steps, n, {k: s.shape for k, s in space.items()}, 12, 1)
    try:
        assert set(storage.observations) == {"critic", "policy"}
        reference = DictRolloutBuffer(steps, space, spaces.Box(-1, 1, (12,)), n_envs=n)
        rng = np.random.default_rng(0)
        for t in range(steps):
            obs = {k: rng.normal(size=(n, *s.shape)).astype(np.float32) for k, s in space.items()}
            act, rew = rng.normal(size=(n, 12)).astype(np.float32), rng.normal(size=n).astype(np.float32)
            start, val, logp = np.float32(t == 0) * np.ones(n, np.float32), rng.normal(size=n), rng.normal(size=n)
            put_obs(storage.observations, (1, t, slice(0, n)), obs)
            storage.actions[1, t], storage.rewards[1, t], storage.episode_starts[1, t] = act, rew, start
            storage.values[1, t], storage.log_probs[1, t] = val, logp
            reference.add(obs, act, rew, start, torch.as_tensor(val), torch.as_tensor(logp))
        storage.last_values[1], storage.last_dones[1] = 0.5, 0.0
        put_obs(storage.last_obs, (1, slice(0, n)), {k: np.ones((n, *s.shape), np.float32) for k, s in space.items()})
        reference.compute_returns_and_advantage(torch.full((n,), 0.5), np.zeros(n, np.float32))
        ours = DictRolloutBuffer(steps, space, spaces.Box(-1, 1, (12,)), n_envs=n)
        storage.fill(ours, 1)
        for key in space.spaces:
            np.testing.assert_array_equal(ours.observations[key], reference.observations[key])
        for name in ("actions", "rewards", "episode_starts", "values", "log_probs", "advantages", "returns"):
            np.testing.assert_array_equal(getattr(ours, name), getattr(reference, name), err_msg=name)
        assert storage.last_obs["critic"][1].sum() == n * 68
    finally:
        storage.close()
