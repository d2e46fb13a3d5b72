"""SB3 adapter: same behaviour as SB3's DummyVecEnv over single envs, wrappers, attributes, rendering, algorithms."""

import gymnasium as gym
import numpy as np
import pytest
from stable_baselines3 import PPO, SAC
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, VecMonitor, VecNormalize

import unilab_gym  # noqa: F401  (registers the id)
from unilab_gym import UniLabVectorEnv
from unilab_gym.sb3.vec_env import SB3VecEnv, make_sb3_env

ID = "UniLab/Quadruped-v0"
# short episodes that end both ways: falls (tilt > 0.1 rad) and time limits (40 steps)
ENDS_BOTH_WAYS = dict(max_episode_steps=40, termination={"max_tilt": 0.1})


def _pair(n, mode="NextStep", **kwargs):
    ours = SB3VecEnv(UniLabVectorEnv(n, autoreset_mode=mode, **kwargs))
    ref = DummyVecEnv([lambda: gym.make(ID, **kwargs) for _ in range(n)])
    return ours, ref


def _assert_same_reset(ours, ref, obs, obs_ref):
    np.testing.assert_array_equal(obs, obs_ref)
    assert obs.dtype == obs_ref.dtype == np.float32
    for mine, theirs in zip(ours.reset_infos, ref.reset_infos):
        assert "command" in theirs and mine.keys() >= theirs.keys()
        for key in theirs:
            np.testing.assert_array_equal(mine[key], theirs[key])


@pytest.mark.parametrize("mode", ["NextStep", "Disabled"])
def test_steps_like_dummy_vec_env_over_single_envs(mode):
    n = 4
    ours, ref = _pair(n, mode, **ENDS_BOTH_WAYS)
    rng = np.random.default_rng(0)
    assert ours.seed(11) == ref.seed(11) == [11, 12, 13, 14]
    _assert_same_reset(ours, ref, ours.reset(), ref.reset())
    ends = {"terminated": 0, "truncated": 0}
    for t in range(150):
        if t == 75:  # new seeds apply at the next reset, then are forgotten
            ours.seed(99), ref.seed(99)
            _assert_same_reset(ours, ref, ours.reset(), ref.reset())
        actions = rng.uniform(-1, 1, (n, 12)).astype(np.float32)
        obs, rew, done, infos = ours.step(actions)
        obs_r, rew_r, done_r, infos_r = ref.step(actions)
        np.testing.assert_array_equal(obs, obs_r)
        np.testing.assert_array_equal(rew, rew_r)
        assert rew.dtype == rew_r.dtype == np.float32
        np.testing.assert_array_equal(done, done_r)
        assert done.dtype == np.bool_
        for i in range(n):
            assert infos[i].keys() == infos_r[i].keys()
            assert infos[i]["TimeLimit.truncated"] == infos_r[i]["TimeLimit.truncated"]
            assert infos[i]["reward_terms"] == infos_r[i]["reward_terms"]
            if done[i]:
                np.testing.assert_array_equal(infos[i]["terminal_observation"], infos_r[i]["terminal_observation"])
                assert not np.array_equal(infos[i]["terminal_observation"], obs[i])  # obs is the next episode's
                np.testing.assert_array_equal(ours.reset_infos[i]["command"], ref.reset_infos[i]["command"])
                ends["truncated" if infos[i]["TimeLimit.truncated"] else "terminated"] += 1
    assert ends["terminated"] > 0 and ends["truncated"] > 0, ends  # both paths were exercised
    ours.close(), ref.close()


def test_per_env_options_reset_like_dummy_vec_env():
    ours, ref = _pair(4)
    options = [{}, {"episode_seed": 7}, {}, {"episode_seed": 7}]  # two groups: reset separately
    for env in (ours, ref):
        env.seed(5)
        env.set_options(options)
    _assert_same_reset(ours, ref, ours.reset(), ref.reset())
    assert ours._options == [{}] * 4  # options are used once
    ours.set_options({"reset_mask": np.ones(4, bool)})
    with pytest.raises(ValueError, match="reset_mask"):
        ours.reset()
    ours.close(), ref.close()


def test_rejects_bad_envs_and_calls():
    single = gym.make(ID)
    with pytest.raises(TypeError, match="UniLabVectorEnv"):
        SB3VecEnv(single)
    single.close()
    same_step = UniLabVectorEnv(2, autoreset_mode="SameStep")
    with pytest.raises(ValueError, match="SameStep"):
        SB3VecEnv(same_step)
    same_step.close()
    with pytest.raises(TypeError, match="make_vec_env"):
        make_sb3_env("CartPole-v1", 2)

    env = SB3VecEnv(UniLabVectorEnv(2))
    env.seed(0)
    env.reset()
    with pytest.raises(RuntimeError, match="step_async"):
        env.step_wait()
    bad = np.zeros((2, 12), np.float32)
    bad[1, 3] = np.nan
    with pytest.raises(ValueError, match=r"NaN or inf for env indices \[1\]"):
        env.step(bad)
    with pytest.raises(ValueError, match="shape"):
        env.step(np.zeros((3, 12), np.float32))
    # nothing was stepped or corrupted: the env continues like a fresh one with the same seed
    ref = SB3VecEnv(UniLabVectorEnv(2))
    ref.seed(0)
    ref.reset()
    np.testing.assert_array_equal(env.step(np.ones((2, 12)) * 0.3)[0], ref.step(np.ones((2, 12)) * 0.3)[0])
    env.close(), ref.close()


def test_attributes_and_methods_reach_the_vector_env():
    env = SB3VecEnv(UniLabVectorEnv(3, max_episode_steps=50))
    assert env.get_attr("max_episode_steps") == [50, 50, 50]
    assert env.get_attr("max_episode_steps", indices=[0, 2]) == [50, 50]
    assert env.has_attr("kp") and not env.has_attr("no_such_attribute")
    with pytest.raises(AttributeError):
        env.get_attr("no_such_attribute")
    env.set_attr("max_episode_steps", 3)
    assert env.venv.max_episode_steps == 3
    with pytest.raises(ValueError, match="subset"):
        env.set_attr("max_episode_steps", 7, indices=[1])
    assert env.venv.max_episode_steps == 3  # unchanged by the refused call
    env.reset()
    dones = [env.step(np.zeros((3, 12)))[2] for _ in range(3)]
    assert not dones[0].any() and not dones[1].any() and dones[2].all()  # the new limit is used
    assert env.env_method("get_attr", "num_envs", indices=[1, 2]) == [(3, 3, 3), (3, 3, 3)]
    assert env.env_is_wrapped(Monitor) == [False, False, False]
    env.close()


def test_render_gives_env_zero_frames():
    env = make_sb3_env(ID, 2, seed=0, render_mode="rgb_array", monitor=False)
    assert env.render_mode == "rgb_array" and env.metadata["render_fps"] == 50
    env.reset()
    frame = env.render()
    assert frame.shape == (240, 320, 3) and frame.dtype == np.uint8
    np.testing.assert_array_equal(frame, env.venv.render_env(0))
    images = env.get_images()
    assert len(images) == 2
    np.testing.assert_array_equal(images[0], frame)
    assert env.env_method("render_env", 1, 64, 48)[0].shape == (48, 64, 3)
    env.close()
    no_render = make_sb3_env(ID, 2, seed=0, monitor=False)
    with pytest.warns(UserWarning):
        assert no_render.render() is None
    no_render.close()


def test_vec_monitor_and_vec_normalize_on_top():
    env = VecNormalize(make_sb3_env(ID, 3, seed=1, max_episode_steps=10), gamma=0.99)
    assert isinstance(env.venv, VecMonitor) and isinstance(env.unwrapped, SB3VecEnv)
    env.reset()
    total = np.zeros(3)
    for _ in range(10):
        _, _, done, infos = env.step(np.zeros((3, 12), np.float32))
        total += env.get_original_reward()
    assert done.all()
    for i, info in enumerate(infos):
        assert info["episode"]["l"] == 10
        assert info["episode"]["r"] == pytest.approx(total[i], rel=1e-5)  # VecMonitor sees raw rewards
        # VecNormalize normalized the terminal observation as it does the observations
        assert info["terminal_observation"].shape == (48,)
        assert np.abs(info["terminal_observation"]).max() <= env.clip_obs
    assert env.obs_rms.count > 10
    env.close()


def test_make_sb3_env_seeds_first_reset():
    a = make_sb3_env(ID, 2, seed=7, monitor=False)
    single = gym.make(ID)
    obs = a.reset()
    for i in range(2):
        np.testing.assert_array_equal(obs[i], single.reset(seed=7 + i)[0])
    # seed=None draws a fresh seed, as make_vec_env does
    b, c = make_sb3_env(ID, 2, monitor=False), make_sb3_env(ID, 2, monitor=False)
    assert b._seeds != c._seeds and None not in b._seeds
    for env in (a, b, c, single):
        env.close()


def test_ppo_learns_saves_and_loads(tmp_path):
    env = make_sb3_env(ID, 4, seed=0, max_episode_steps=30)
    model = PPO("MlpPolicy", env, n_steps=16, batch_size=32, n_epochs=1, seed=0, device="cpu")
    model.learn(total_timesteps=128)
    assert model.num_timesteps == 128
    # VecMonitor fed SB3's episode stats (episodes end by a fall or at the 30-step limit)
    assert len(model.ep_info_buffer) >= 4 and all(1 <= ep["l"] <= 30 for ep in model.ep_info_buffer)
    obs = env.reset()
    action, _ = model.predict(obs, deterministic=True)
    assert action.shape == (4, 12)
    model.save(tmp_path / "ppo")
    loaded = PPO.load(tmp_path / "ppo", env=env, device="cpu")
    np.testing.assert_array_equal(loaded.predict(obs, deterministic=True)[0], action)
    env.close()


def test_sac_from_registered_id_goes_through_dummy_vec_env():
    model = SAC("MlpPolicy", ID, learning_starts=20, batch_size=16, seed=0, device="cpu")
    assert isinstance(model.env, DummyVecEnv) and model.env.num_envs == 1
    model.learn(total_timesteps=40)
    assert model.num_timesteps == 40 and model.replay_buffer.size() == 40
    model.env.close()


def test_headline_sac_with_shared_replay_stores_true_terminal_observations():
    from unilab_gym import SharedReplayBuffer

    n = 8
    env = make_sb3_env(ID, n, seed=0, max_episode_steps=20)
    model = SAC(
        "MlpPolicy",
        env,
        replay_buffer_class=SharedReplayBuffer,
        learning_starts=64,
        batch_size=32,
        seed=0,
        device="cpu",
    )
    model.learn(total_timesteps=40 * n)
    buf = model.replay_buffer
    assert isinstance(buf, SharedReplayBuffer) and buf.size() == 40 and model._n_updates > 0
    L, rows = buf.layout, buf.storage.block[: 40 * n]  # row = step * n_envs + env
    obs, next_obs = rows[:, L.obs], rows[:, L.next_obs]
    ended = (rows[:, L.truncated] == 1) | (rows[:, L.terminated] == 1)
    assert ended.sum() >= n  # every env hit the 20-step limit at least once
    for r in range(39 * n):  # compare with the same env's next row
        if ended[r]:  # the stored next_obs is the episode's last obs, not the next episode's first
            assert not np.array_equal(next_obs[r], obs[r + n])
        else:
            np.testing.assert_array_equal(next_obs[r], obs[r + n])
    env.close()


def test_vec_video_recorder_records_env_zero(tmp_path):
    pytest.importorskip("moviepy")
    from stable_baselines3.common.vec_env import VecVideoRecorder

    env = VecVideoRecorder(
        make_sb3_env(ID, 2, seed=0, render_mode="rgb_array"),
        str(tmp_path),
        record_video_trigger=lambda step: step == 0,
        video_length=5,
    )
    env.reset()
    for _ in range(6):
        env.step(np.zeros((2, 12), np.float32))
    env.close()
    videos = list(tmp_path.glob("*.mp4"))
    assert len(videos) == 1 and videos[0].stat().st_size > 0
