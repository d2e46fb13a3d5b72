"""SB3 conformance: cases of SB3's ``tests/test_vec_envs.py`` and ``tests/test_vec_monitor.py``, written for
``make_sb3_env`` with ``DummyVecEnv`` over single ``gym.make`` envs as the reference.

Cases parametrized over ``kind`` run on both; the reference must pass them as SB3's own tests assert. Cases
that do not apply are listed, with the reason, in docs/conformance.md. Also issue 20 items 7 (a raw vector env
given to an algorithm) and 9 (``check_env`` with its render check).
"""

import json
import warnings

import gymnasium as gym
import numpy as np
import pandas
import pytest
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, VecEnvWrapper, VecFrameStack, VecMonitor, VecNormalize

import unilab_gym  # noqa: F401  (registers the id)
from unilab_gym.sb3.vec_env import make_sb3_env

ID = "UniLab/Quadruped-v0"
N = 3
KINDS = ["ours", "reference"]


def _make(kind, n=N, seed=None, **kwargs):
    kwargs = {"max_episode_steps": 20, **kwargs}
    if kind == "ours":
        return make_sb3_env(ID, n, seed=seed, monitor=False, **kwargs)
    env = DummyVecEnv([lambda: gym.make(ID, **kwargs) for _ in range(n)])
    if seed is not None:
        env.seed(seed)
        env.action_space.seed(seed)
    return env


@pytest.mark.parametrize("kind", KINDS)
def test_vecenv_custom_calls(kind):
    env = _make(kind, render_mode="rgb_array")
    env.seed(0)
    env.reset()
    explicit, implicit = env.render(mode="rgb_array"), env.render()
    assert np.array_equal(implicit, explicit)
    with pytest.warns(UserWarning):
        env.render(mode="something_else")
    assert not env.has_attr("dummy")
    env.set_attr("dummy", 12)
    assert env.get_attr("dummy") == [12] * N
    assert env.has_attr("dummy")
    assert not env.has_attr("dummy2")
    assert env.env_method("set_wrapper_attr", "dummy2", 2) == [True] * N
    assert env.get_attr("dummy2") == [2] * N
    subset = env.env_method("get_wrapper_attr", "render_mode", indices=[0, 2])
    assert subset == ["rgb_array"] * 2
    assert env.get_attr("dummy2", indices=[-1]) == [2]
    assert env.set_attr("dummy1", 42, indices=None) is None
    assert env.get_attr("dummy1") == [42] * N
    assert env.get_attr("dummy1", indices=[0, 2]) == [42, 42]
    if kind == "ours":  # documented: the N envs are one object, set_attr on a subset is refused
        with pytest.raises(ValueError, match="subset"):
            env.set_attr("dummy1", 0, indices=0)
    else:
        for i in range(N):
            assert env.set_attr("dummy1", i, indices=i) is None
        assert env.get_attr("dummy1") == list(range(N))
    env.close()


@pytest.mark.parametrize("wrapper", [None, VecNormalize, VecFrameStack])
def test_vecenv_terminal_obs(wrapper):
    """``terminal_observation`` only at the step an episode ends; the returned obs is the next episode's."""
    envs = [_make(kind, seed=0, max_episode_steps=5) for kind in KINDS]
    if wrapper is VecFrameStack:
        envs = [VecFrameStack(e, n_stack=2) for e in envs]
    elif wrapper is VecNormalize:
        envs = [VecNormalize(e) for e in envs]
    first = [e.reset() for e in envs]
    np.testing.assert_allclose(first[0], first[1], rtol=1e-5)
    zeros = np.zeros((N, 12), dtype=np.float32)
    for step in range(1, 11):
        out = [e.step(zeros) for e in envs]
        for obs, _, done, infos in out:
            assert len(obs) == len(done) == len(infos) == N
            assert done.tolist() == [step % 5 == 0] * N
            for i in range(N):
                assert ("terminal_observation" in infos[i]) == done[i]
                if done[i] and wrapper is None:
                    assert not np.array_equal(infos[i]["terminal_observation"], obs[i])
        (obs, _, done, infos), (obs_r, _, _, infos_r) = out
        np.testing.assert_allclose(obs, obs_r, rtol=1e-5, atol=1e-6)
        for i in np.flatnonzero(done):
            np.testing.assert_allclose(
                infos[i]["terminal_observation"], infos_r[i]["terminal_observation"], rtol=1e-5, atol=1e-6
            )
    for e in envs:
        e.close()


@pytest.mark.parametrize("kind", KINDS)
def test_vecenv_single_space(kind):
    env = _make(kind, seed=0)
    space = env.observation_space
    obs = env.reset()
    assert obs.shape[0] == N and all(space.contains(o) for o in obs)
    dones = np.zeros(N, bool)
    while not dones.any():
        obs, _, dones, _ = env.step(np.array([env.action_space.sample() for _ in range(N)]))
        assert obs.shape[0] == N and all(space.contains(o) for o in obs)
    env.close()


class _WrapperA(VecEnvWrapper):
    def __init__(self, venv):
        super().__init__(venv)
        self.var_a = "a"

    def reset(self):
        return self.venv.reset()

    def step_wait(self):
        return self.venv.step_wait()


class _WrapperB(_WrapperA):
    def __init__(self, venv):
        super().__init__(venv)
        self.var_b = "b"

    def func_b(self):
        return self.var_b


class _WrapperBB(_WrapperB):
    def __init__(self, venv):
        super().__init__(venv)
        self.var_bb = "bb"


def test_vecenv_wrapper_getattr():
    wrapped = _WrapperA(_WrapperBB(_make("ours")))
    assert (wrapped.var_a, wrapped.var_b, wrapped.var_bb, wrapped.func_b()) == ("a", "b", "bb", "b")
    assert wrapped.num_envs == N
    double = _WrapperA(_WrapperB(wrapped))
    assert double.var_a == "a"
    with pytest.raises(AttributeError):  # ambiguous: two wrappers define it
        _ = double.var_b
    with pytest.raises(AttributeError):
        _ = double.nonexistent_attribute
    double.close()


@pytest.mark.parametrize("kind", KINDS)
def test_vec_env_is_wrapped(kind):
    env = _make(kind)
    assert env.env_is_wrapped(Monitor) == [False] * N  # neither wraps its envs in Monitor
    assert VecFrameStack(env, n_stack=2).env_is_wrapped(Monitor) == [False] * N
    env.close()


@pytest.mark.parametrize("kind", KINDS)
def test_vec_deterministic(kind):
    env = _make(kind)
    env.seed(3)
    obs = env.reset()
    env.seed(3)
    assert np.allclose(env.reset(), obs)
    norm = VecNormalize(env)  # VecEnvWrapper.seed reaches the env
    norm.seed(3)
    obs = env.reset()
    norm.seed(3)
    assert np.allclose(env.reset(), obs)
    norm.close()
    a, b = _make(kind, seed=0), _make(kind, seed=0)
    assert np.allclose(a.reset(), b.reset())
    actions = np.array([a.action_space.sample() for _ in range(N)])
    assert np.allclose(a.step(actions)[0], b.step(actions)[0])
    a.close(), b.close()


@pytest.mark.parametrize("kind", KINDS)
def test_vec_seeding(kind):
    env = _make(kind)
    env.seed()
    obs = env.reset()
    _, rewards, _, _ = env.step(np.array([env.action_space.sample() for _ in range(N)]))
    for i in range(N - 1):  # every env gets its own seed
        assert not np.allclose(obs[i], obs[i + 1])
        assert not np.allclose(rewards[i], rewards[i + 1])
    env.close()


@pytest.mark.parametrize("kind", KINDS)
def test_vec_monitor(kind, tmp_path):
    env = _make(kind, n=1, seed=0, termination={"max_tilt": 0.1})
    path = str(tmp_path / "test.monitor.csv")
    monitored = VecMonitor(env, path)
    monitored.reset()
    ep_len, ep_reward, episodes = 0, 0.0, 0
    for _ in range(60):
        _, rewards, dones, infos = monitored.step(np.array([monitored.action_space.sample()]))
        ep_len += 1
        ep_reward += rewards[0]
        if dones[0]:
            assert infos[0]["episode"]["r"] == pytest.approx(ep_reward, abs=1e-5)
            assert infos[0]["episode"]["l"] == ep_len
            ep_len, ep_reward, episodes = 0, 0.0, episodes + 1
    assert episodes >= 2
    monitored.close()
    with open(path) as f:
        first = f.readline()
        assert first.startswith("#")
        assert set(json.loads(first[1:])) == {"t_start", "env_id"}
        assert set(pandas.read_csv(f, index_col=None).keys()) == {"l", "t", "r"}


# ---------------------------------------------------------------------------------------- test_vec_normalize.py
def _check_vec_norm_equal(a, b):
    assert a.observation_space == b.observation_space and a.action_space == b.action_space
    assert a.num_envs == b.num_envs
    for rms_a, rms_b in ((a.obs_rms, b.obs_rms), (a.ret_rms, b.ret_rms)):
        assert np.allclose(rms_a.mean, rms_b.mean) and np.allclose(rms_a.var, rms_b.var)
        assert rms_a.count == rms_b.count
    for key in ("clip_obs", "clip_reward", "norm_obs", "norm_reward", "gamma", "epsilon", "training"):
        assert getattr(a, key) == getattr(b, key), key
    assert np.all(a.returns == b.returns)


def test_obs_rms_vec_normalize():
    """Running statistics after reset and after a step equal the reference's (SB3's case uses a toy env)."""
    envs = [VecNormalize(_make(kind, seed=0)) for kind in KINDS]
    for e in envs:
        e.reset()
    actions = np.array([envs[0].action_space.sample() for _ in range(N)])
    for _ in range(3):
        for e in envs:
            e.step(actions)
    a, b = envs
    np.testing.assert_allclose(a.obs_rms.mean, b.obs_rms.mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(a.ret_rms.mean, b.ret_rms.mean, rtol=1e-5, atol=1e-7)
    for e in envs:
        e.close()


@pytest.mark.parametrize("kind", KINDS)
def test_vec_env_normalize_save_load(kind, tmp_path):
    clip_obs, clip_reward = 0.5, 5.0
    orig = _make(kind, n=1, seed=0)
    norm = VecNormalize(orig, norm_obs=True, norm_reward=True, clip_obs=clip_obs, clip_reward=clip_reward)
    assert orig.render_mode is None and norm.render_mode is None
    norm.reset()
    done = [False]
    while not done[0]:
        obs, rew, done, _ = norm.step(np.array([norm.action_space.sample()]))
        assert np.max(np.abs(obs)) <= clip_obs and np.max(np.abs(rew)) <= clip_reward
    path = tmp_path / "vec_normalize"
    norm.save(path)
    loaded = VecNormalize.load(path, venv=orig)
    assert loaded.render_mode is None
    _check_vec_norm_equal(norm, loaded)
    rendering = _make(kind, n=1, render_mode="rgb_array")
    assert rendering.render_mode == "rgb_array"
    assert VecNormalize.load(path, venv=rendering).render_mode == "rgb_array"
    assert VecNormalize(rendering).render_mode == "rgb_array"
    rendering.close(), orig.close()


def test_get_original():
    envs = [VecNormalize(_make(kind, seed=0)) for kind in KINDS]
    raw = _make("reference", seed=0)
    for e in (*envs, raw):
        e.reset()
    for _ in range(4):
        actions = np.array([envs[0].action_space.sample() for _ in range(N)])
        _, raw_rewards, _, _ = raw.step(actions)
        for venv in envs:
            obs, rewards, _, _ = venv.step(actions)
            orig_obs, orig_rewards = venv.get_original_obs(), venv.get_original_reward()
            np.testing.assert_allclose(orig_rewards, raw_rewards, rtol=1e-6)
            assert orig_obs.shape == obs.shape and orig_rewards.dtype == rewards.dtype
            assert not np.array_equal(orig_obs, obs) and not np.array_equal(orig_rewards, rewards)
            np.testing.assert_allclose(venv.normalize_obs(orig_obs), obs, rtol=1e-6)
            np.testing.assert_allclose(venv.normalize_reward(orig_rewards), rewards, atol=1e-6)
    for e in (*envs, raw):
        e.close()


@pytest.mark.parametrize("kind", KINDS)
def test_sync_vec_normalize(kind):
    from stable_baselines3.common.vec_env import sync_envs_normalization, unwrap_vec_normalize

    original = _make(kind, n=1)
    assert unwrap_vec_normalize(original) is None
    env = VecNormalize(original, norm_obs=True, norm_reward=True, clip_obs=100.0, clip_reward=100.0)
    assert isinstance(unwrap_vec_normalize(env), VecNormalize)
    env = VecFrameStack(env, 1)
    assert isinstance(unwrap_vec_normalize(env), VecNormalize)
    eval_env = VecNormalize(_make(kind, n=1), training=False, clip_obs=100.0, clip_reward=100.0)
    eval_env = VecFrameStack(eval_env, 1)
    env.seed(0)
    env.action_space.seed(0)
    env.reset()
    for _ in range(30):
        _, latest_reward, _, _ = env.step(np.array([env.action_space.sample()]))
    assert np.allclose(env.get_original_reward(), env.unnormalize_reward(latest_reward))
    obs = env.reset()
    original_obs = env.get_original_obs()
    assert np.allclose(original_obs, env.unnormalize_obs(obs), atol=1e-5)
    assert not np.allclose(obs, eval_env.normalize_obs(original_obs))
    sync_envs_normalization(env, eval_env)
    assert np.allclose(obs, eval_env.normalize_obs(original_obs))
    dummy = np.random.default_rng(0).random(10)
    assert np.allclose(env.normalize_reward(dummy), eval_env.normalize_reward(dummy))
    env.close(), eval_env.close()


def test_offpolicy_normalization():
    from stable_baselines3 import SAC

    env = VecNormalize(_make("ours", n=2, seed=0), clip_obs=10.0, clip_reward=10.0)
    eval_env = VecNormalize(_make("ours", n=2, seed=1), training=False, norm_reward=False)
    model = SAC("MlpPolicy", env, learning_starts=40, policy_kwargs=dict(net_arch=[16]), seed=0)
    assert model.get_vec_normalize_env() is env
    model.set_env(eval_env)
    assert model.get_vec_normalize_env() is eval_env
    model.learn(total_timesteps=10)
    model.set_env(env)
    model.learn(total_timesteps=60)
    assert isinstance(model.get_vec_normalize_env(), VecNormalize)
    env.close(), eval_env.close()


# ---------------------------------------------------------------------------------------- rendering, monitor
@pytest.mark.parametrize("kind", KINDS)
def test_render_rgb_array(kind):
    """The ``rgb_array`` half of SB3's test_render (its ``human`` half needs an X server and is skipped there)."""
    import warnings

    env = _make(kind, n=2, render_mode="rgb_array")
    env.reset()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert env.render().ndim == 3
        assert env.render("rgb_array").ndim == 3
    assert [str(w.message) for w in record if w.category is UserWarning] == []
    with pytest.warns(UserWarning):
        env.render(mode="blah")
    env.step(np.array([env.action_space.sample() for _ in range(2)]))
    env.render()
    env = VecFrameStack(env, 2)
    env.render()
    assert env.render_mode == "rgb_array"
    env = VecNormalize(env)
    assert env.render_mode == "rgb_array"
    env.render()
    env.close()


@pytest.mark.parametrize("kind", KINDS)
def test_vec_monitor_info_keywords(kind, tmp_path):
    import csv

    path = str(tmp_path / "test.monitor.csv")
    monitored = VecMonitor(
        _make(kind, n=1, seed=0, max_episode_steps=10), info_keywords=("TimeLimit.truncated",), filename=path
    )
    monitored.reset()
    for _ in range(30):
        _, _, dones, infos = monitored.step(np.array([monitored.action_space.sample()]))
        if dones[0]:
            assert "TimeLimit.truncated" in infos[0]["episode"]
    monitored.close()
    with open(path) as f:
        lines = list(csv.reader(f))[2:]
    assert len(lines) == 3 and all(len(line) == 4 and line[3] in ("False", "True") for line in lines)


@pytest.mark.parametrize("kind", KINDS)
def test_vec_monitor_load_results(kind, tmp_path):
    from stable_baselines3.common.monitor import get_monitor_files, load_results

    total = 0
    for k in (1, 2):
        path = str(tmp_path / f"run{k}.monitor.csv")
        monitored = VecMonitor(_make(kind, n=1, seed=k, max_episode_steps=10), path)
        assert len(get_monitor_files(str(tmp_path))) == k and path in get_monitor_files(str(tmp_path))
        monitored.reset()
        episodes = 0
        for _ in range(35):
            _, _, dones, _ = monitored.step(np.array([monitored.action_space.sample()]))
            if dones[0]:
                episodes += 1
                monitored.reset()
        total += episodes
        assert len(load_results(str(tmp_path)).index) == total
        monitored.close()


def test_vec_monitor_ppo(recwarn):
    from stable_baselines3 import PPO
    from stable_baselines3.common.evaluation import evaluate_policy

    env = make_sb3_env(ID, 2, seed=0, max_episode_steps=10)  # VecMonitor(SB3VecEnv(...))
    model = PPO(
        "MlpPolicy", env, n_steps=16, batch_size=32, n_epochs=1, policy_kwargs=dict(net_arch=[16]), device="cpu"
    )
    model.learn(total_timesteps=32)
    evaluate_policy(model, env, n_eval_episodes=2)
    assert len(recwarn) == 0, [str(w.message) for w in recwarn]
    env.close()


# --------------------------------------------------------------------------- issue 20, items 7 and 9
@pytest.mark.parametrize("algo", ["SAC", "PPO"])
def test_raw_vector_env_given_to_an_algorithm_names_make_sb3_env(algo):
    import stable_baselines3

    venv = gym.make(ID, num_envs=4)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(TypeError, match=r"make_sb3_env\('UniLab/Quadruped-v0', 4\)"):
                getattr(stable_baselines3, algo)("MlpPolicy", venv)
        # raised when SB3's DummyVecEnv reads `unwrapped`, before any replay buffer estimates its memory
        assert not [w for w in caught if "memory" in str(w.message)]
    finally:
        venv.close()


def test_sb3_make_vec_env_over_the_vector_env_names_make_sb3_env():
    from stable_baselines3.common.env_util import make_vec_env

    envs = []
    with pytest.raises(TypeError, match="make_sb3_env"):
        make_vec_env(lambda: envs.append(gym.make(ID, num_envs=2)) or envs[-1], n_envs=1)
    for env in envs:
        env.close()


@pytest.mark.parametrize("render_mode", [None, "rgb_array"])
def test_check_env_with_the_render_check(render_mode):
    # SB3's check_env closes the env after its render check, then steps it on: the env reconnects at reset()
    from stable_baselines3.common.env_checker import check_env

    env = gym.make(ID, render_mode=render_mode)
    try:
        check_env(env, skip_render_check=False)
    finally:
        env.close()
