"""Gymnasium's vector-env tests (``tests/vector/``, ``tests/wrappers/vector/``), ported to ``UniLabVectorEnv``.

Each test is named after the Gymnasium test it ports and asserts what that test asserts, with
``SyncVectorEnv`` over single ``gym.make("UniLab/Quadruped-v0")`` envs (or ``gym.make_vec(...,
vectorization_mode="sync", wrappers=...)``) as the reference where Gymnasium compares implementations. Our
envs follow the reference bit for bit (env ``i`` seeded ``s + i`` either way), so most cases compare every
array. The cases that do not apply, with the reason, are listed in ``docs/conformance.md``.
"""

import re
from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.error import ClosedEnvironmentError
from gymnasium.utils.env_checker import data_equivalence
from gymnasium.vector import AutoresetMode, SyncVectorEnv, VectorEnv, VectorWrapper
from gymnasium.wrappers import vector as vector_wrappers

import unilab_gym  # noqa: F401  (registers the id)
from unilab_gym import UniLabVectorEnv

ID = "UniLab/Quadruped-v0"
# episodes of at most 3 steps that often end earlier by a "fall" (a high fall height): autoresets every few steps
SHORT = dict(max_episode_steps=3, termination={"min_base_height": 0.27})
MODES = list(AutoresetMode)


@pytest.fixture(scope="module")
def pair():
    """Ours and the reference, 3 envs each, default task, NextStep; every test resets them with a seed first."""
    ours, ref = UniLabVectorEnv(3), _reference(3, AutoresetMode.NEXT_STEP)
    yield ours, ref
    ours.close()
    ref.close()


def _reference(n, mode, **kwargs):
    return SyncVectorEnv([lambda: gym.make(ID, **kwargs)] * n, autoreset_mode=mode)


def _sync_with_wrappers(n, *wrappers, **kwargs):
    """Gymnasium's own reference for a vector wrapper: the single-env wrappers inside a ``SyncVectorEnv``."""
    return gym.make_vec(ID, num_envs=n, vectorization_mode="sync", wrappers=wrappers, **kwargs)


def _assert_same_step(a, b, where=""):
    for name, x, y in zip(("obs", "reward", "terminated", "truncated", "info"), a, b):
        assert data_equivalence(x, y, exact=True), f"{where}: {name} differs"


# ============================================================== tests/vector/test_sync_vector_env.py
def test_create_sync_vector_env(pair):
    ours, ref = pair
    assert ours.num_envs == 3
    assert ours.observation_space == ref.observation_space
    assert ours.single_observation_space == ref.single_observation_space
    assert ours.action_space == ref.action_space
    assert ours.single_action_space == ref.single_action_space


def test_metadata_sync_vector_env(closing):
    next_step = closing(UniLabVectorEnv(1, autoreset_mode=AutoresetMode.NEXT_STEP))
    same_step = closing(UniLabVectorEnv(1, autoreset_mode=AutoresetMode.SAME_STEP))
    assert next_step.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
    assert same_step.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    # the instance's metadata does not leak into the class's, nor into the single env's
    assert "autoreset_mode" not in UniLabVectorEnv.metadata
    single = closing(gym.make(ID))
    assert "autoreset_mode" not in single.metadata


def test_reset_sync_vector_env(pair):
    ours, ref = pair
    obs, _ = ours.reset(seed=0)
    assert isinstance(ours.observation_space, spaces.Box)
    assert isinstance(obs, np.ndarray)
    assert obs.dtype == ours.observation_space.dtype
    assert obs.shape == (3, *ours.single_observation_space.shape) == ours.observation_space.shape
    np.testing.assert_array_equal(obs, ref.reset(seed=0)[0])


@pytest.mark.parametrize("use_single_action_space", [True, False])
def test_step_sync_vector_env(pair, use_single_action_space):
    ours, ref = pair
    ours.reset(seed=1)
    ref.reset(seed=1)
    ours.action_space.seed(1)
    ours.single_action_space.seed(1)
    if use_single_action_space:
        actions = [ours.single_action_space.sample() for _ in range(3)]
    else:
        actions = ours.action_space.sample()
    step = ours.step(actions)
    obs, rewards, terminations, truncations, _ = step
    assert isinstance(obs, np.ndarray) and obs.dtype == ours.observation_space.dtype
    assert obs.shape == (3, *ours.single_observation_space.shape) == ours.observation_space.shape
    assert isinstance(rewards, np.ndarray) and isinstance(rewards[0], (float, np.floating))
    assert rewards.ndim == 1 and rewards.size == 3
    for flags in (terminations, truncations):
        assert isinstance(flags, np.ndarray) and flags.dtype == np.bool_ and flags.ndim == 1 and flags.size == 3
    _assert_same_step(step, ref.step(actions))


def test_render_sync_vector(closing, pair):
    envs = closing(UniLabVectorEnv(2, render_mode="rgb_array"))
    assert envs.render_mode == "rgb_array"
    envs.reset(seed=0)
    frames = envs.render()
    # SyncVectorEnv gives a tuple; ours is a lazy Sequence (env i is drawn when indexed): docs/conformance.md
    assert isinstance(frames, Sequence)
    assert len(frames) == envs.num_envs
    assert all(isinstance(frame, np.ndarray) and frame.shape == (240, 320, 3) for frame in frames)
    assert pair[0].render_mode is None


def test_call_sync_vector_env(pair):
    ours, ref = pair
    configs = ours.call("task_config")
    assert isinstance(configs, tuple) and len(configs) == 3
    assert configs == ref.call("task_config")
    assert ours.call("render_mode") == ref.call("render_mode") == (None, None, None)


def test_set_attr_sync_vector_env(pair):
    ours, _ = pair
    before = ours.get_attr("max_episode_steps")
    ours.set_attr("max_episode_steps", [50, 50, 50])
    assert ours.get_attr("max_episode_steps") == (50, 50, 50)
    # different values per env: the documented limitation (the N envs are one object), and nothing changes
    with pytest.raises(ValueError, match="max_episode_steps"):
        ours.set_attr("max_episode_steps", [9.81, 3.72, 8.87])
    assert ours.get_attr("max_episode_steps") == (50, 50, 50)
    ours.set_attr("max_episode_steps", list(before))
    assert ours.get_attr("max_episode_steps") == before


def test_sync_vector_determinism(closing):
    env_1, env_2 = closing(UniLabVectorEnv(2)), closing(UniLabVectorEnv(2))
    env_1.action_space.seed(123)
    env_2.action_space.seed(123)
    for _ in range(100):
        assert np.all(env_1.action_space.sample() == env_2.action_space.sample())


# ============================================================== tests/vector/test_vector_env.py
@pytest.mark.parametrize("autoreset_mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_vector_env_equal(closing, autoreset_mode):
    ours = closing(UniLabVectorEnv(3, autoreset_mode=autoreset_mode, **SHORT))
    ref = closing(_reference(3, autoreset_mode, **SHORT))
    assert ours.num_envs == ref.num_envs
    assert ours.observation_space == ref.observation_space
    assert ours.single_observation_space == ref.single_observation_space
    assert ours.action_space == ref.action_space
    assert ours.single_action_space == ref.single_action_space
    obs, info = ours.reset(seed=0)
    obs_r, info_r = ref.reset(seed=0)
    assert np.all(obs == obs_r) and data_equivalence(info, info_r, exact=True)
    ours.action_space.seed(0)
    for step in range(12):
        actions = ours.action_space.sample()
        assert actions in ref.action_space
        _assert_same_step(ours.step(actions), ref.step(actions), f"step {step}")


def test_vector_obs_action_spaces(pair):
    ours, _ = pair
    obs, _ = ours.reset(seed=2)
    assert obs in ours.observation_space
    obs, *_ = ours.step(ours.action_space.sample())
    assert obs in ours.observation_space


@pytest.mark.parametrize("autoreset_mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_final_obs_info(closing, autoreset_mode):
    env = closing(UniLabVectorEnv(1, autoreset_mode=autoreset_mode, max_episode_steps=2))
    _, info = env.reset(seed=0)
    assert set(info) >= {"command", "_command"} and info["_command"].tolist() == [True]
    info = env.step(np.zeros((1, 12)))[4]
    assert set(info) == {"reward_terms", "_reward_terms"}
    last, _, _, truncated, info = env.step(np.zeros((1, 12)))  # the 2nd step ends the episode
    assert truncated.tolist() == [True]
    if autoreset_mode == AutoresetMode.SAME_STEP:
        # the new episode's first obs is returned; the last one and its info are in final_obs / final_info
        assert info["final_obs"][0] in env.single_observation_space
        assert not np.array_equal(info["final_obs"][0], last[0])
        assert info["_final_obs"].tolist() == [True] and "reward_terms" in info["final_info"]
        assert "reward_terms" not in info and info["_command"].tolist() == [True]
    else:
        assert set(info) == {"reward_terms", "_reward_terms"}
        _, reward, terminated, truncated, info = env.step(np.zeros((1, 12)))  # the restart step
        assert reward.tolist() == [0.0] and not terminated[0] and not truncated[0]
        assert "reward_terms" not in info and info["_command"].tolist() == [True]


def test_random_seeding_basics(pair):
    # SyncVectorEnv gives a tuple of the N seeds; ours gives the int passed to reset, as the VectorEnv base class
    # does (env i is seeded seed + i): a documented limitation (docs/conformance.md)
    ours, _ = pair
    ours.reset(seed=42)
    assert ours.np_random_seed == 42
    ours.reset(seed=None)
    assert ours.np_random_seed == 42


def test_partial_reset(closing):
    envs = closing(UniLabVectorEnv(3, autoreset_mode=AutoresetMode.DISABLED))
    reset_obs, _ = envs.reset(seed=[0, 1, 2])
    envs.action_space.seed(123)
    envs.step(envs.action_space.sample())
    envs.step(envs.action_space.sample())
    step_obs, *_ = envs.step(envs.action_space.sample())
    reset_mask_obs, _ = envs.reset(seed=[0, 1, 0], options={"reset_mask": np.array([True, True, False])})
    assert np.all(reset_mask_obs[:2] == reset_obs[:2])
    assert np.all(reset_mask_obs[2] == step_obs[2])


def test_partial_reset_failure(closing):
    envs = closing(UniLabVectorEnv(3, autoreset_mode=AutoresetMode.DISABLED))
    envs.reset(options={"reset_mask": np.array([True, True, True])})
    for mask, shape in (([True], "(1,)"), ([True, True, False, False], "(4,)"), ([[True, True, True]], "(1, 3)")):
        with pytest.raises(ValueError, match=re.escape(f"`options['reset_mask']` must have shape `(3,)`, got {shape}")):
            envs.reset(options={"reset_mask": np.array(mask)})
    with pytest.raises(
        ValueError,
        match=re.escape(
            "`options['reset_mask']` must contain a boolean array with at least one True value, "
            "got reset_mask=[False False False]"
        ),
    ):
        envs.reset(options={"reset_mask": np.array([False, False, False])})
    for mask, dtype in (([1, 1, 0], "int64"), ([1.0, 1.0, 0.0], "float64")):
        with pytest.raises(
            TypeError, match=re.escape(f"`options['reset_mask']` must have `dtype=np.bool_`, got {dtype}")
        ):
            envs.reset(options={"reset_mask": np.array(mask)})


def test_action_count_compatibility(pair):
    envs, _ = pair
    envs.reset(seed=3)
    correct_actions = envs.action_space.sample()
    assert len(correct_actions) == envs.num_envs
    obs, rewards, terminations, truncations, _ = envs.step(correct_actions)
    assert len(obs) == len(rewards) == len(terminations) == len(truncations) == envs.num_envs
    with pytest.raises(ValueError):
        envs.step(correct_actions[: envs.num_envs - 1])
    with pytest.raises(ValueError):
        envs.step(np.concatenate([correct_actions, correct_actions[:1]]))
    with pytest.raises(TypeError):
        envs.step(0)


# ============================================================== tests/vector/test_autoreset_mode.py
def _run_modes(closing, mode, steps=10):
    """Ours and the reference side by side, short episodes, Disabled resetting what finished as Gymnasium's test."""
    ours = closing(UniLabVectorEnv(3, autoreset_mode=mode, **SHORT))
    ref = closing(_reference(3, mode, **SHORT))
    assert ours.metadata["autoreset_mode"] == mode
    obs, _ = ours.reset(seed=5)
    assert np.all(obs == ref.reset(seed=5)[0])
    ours.action_space.seed(5)
    previous_done = np.zeros(3, dtype=bool)
    history = []
    for step in range(steps):
        actions = ours.action_space.sample()
        result = ours.step(actions)
        _assert_same_step(result, ref.step(actions), f"step {step}")
        history.append((previous_done, result))
        done = result[2] | result[3]
        if mode == AutoresetMode.DISABLED and done.any():
            reset = ours.reset(options={"reset_mask": done.copy()})
            reset_r = ref.reset(options={"reset_mask": done.copy()})
            assert data_equivalence(reset, reset_r, exact=True)
            assert np.all(reset[0][~done] == result[0][~done])  # the others keep their obs
            done = np.zeros(3, dtype=bool)
        previous_done = done
    assert any(r[2].any() or r[3].any() for _, r in history), "no episode ended: the case tested nothing"
    return history


def test_autoreset_next_step(closing):
    for previous_done, (_, reward, terminated, truncated, info) in _run_modes(closing, AutoresetMode.NEXT_STEP):
        # an env that finished at the previous step restarts now: reward 0, neither flag, only its reset info
        assert np.all(reward[previous_done] == 0.0)
        assert not terminated[previous_done].any() and not truncated[previous_done].any()
        if previous_done.any():
            assert np.all(info["_command"] == previous_done)
            assert not info.get("_reward_terms", np.zeros(3, dtype=bool))[previous_done].any()


def test_autoreset_within_step(closing):
    for _, (obs, _, terminated, truncated, info) in _run_modes(closing, AutoresetMode.SAME_STEP):
        done = terminated | truncated
        if done.any():
            assert np.all(info["_final_obs"] == done) and np.all(info["_final_info"] == done)
            for i in np.flatnonzero(done):
                assert info["final_obs"][i] in gym.spaces.Box(-np.inf, np.inf, (48,), np.float32)
                assert not np.array_equal(info["final_obs"][i], obs[i])  # obs is the new episode's first
            assert all(x is None for x in info["final_obs"][~done])
        else:
            assert "final_obs" not in info


def test_autoreset_disabled(closing):
    _run_modes(closing, AutoresetMode.DISABLED)


@pytest.mark.parametrize("autoreset_mode", MODES)
def test_autoreset_metadata(closing, autoreset_mode):
    assert closing(UniLabVectorEnv(1, autoreset_mode=autoreset_mode)).metadata["autoreset_mode"] == autoreset_mode
    assert closing(UniLabVectorEnv(1, autoreset_mode=autoreset_mode.value)).metadata["autoreset_mode"] == autoreset_mode


@pytest.mark.parametrize("autoreset_mode", MODES)
def test_make_vec_autoreset(closing, autoreset_mode):
    # a custom vector entry point takes its arguments as kwargs: Gymnasium refuses vector_kwargs for it
    for value in (autoreset_mode, autoreset_mode.value):
        envs = closing(gym.make_vec(ID, num_envs=1, autoreset_mode=value))
        assert envs.metadata["autoreset_mode"] == autoreset_mode
    with pytest.raises(gym.error.Error, match="vector_kwargs"):
        gym.make_vec(ID, num_envs=1, vector_kwargs={"autoreset_mode": autoreset_mode})


def test_same_step_final_obs(closing):
    history = _run_modes(closing, AutoresetMode.SAME_STEP, steps=6)
    for _, (_, _, terminated, truncated, info) in history:
        for i in np.flatnonzero(terminated | truncated):
            assert info["final_obs"][i] in spaces.Box(-np.inf, np.inf, (48,), np.float32)


# ============================================================== tests/vector/test_vector_env_info.py
def test_vector_add_info(pair):
    ours, _ = pair  # num_envs == 3, as the 3-env half of Gymnasium's case
    assert UniLabVectorEnv._add_info is VectorEnv._add_info  # infos are merged the way SyncVectorEnv merges them
    infos = {}
    for i, info in enumerate([{"a": 1, "b": 1.0}, {"c": None, "d": np.zeros((2,))}, {"e": spaces.Discrete(3)}]):
        infos = ours._add_info(infos, info, i)
    expected = {
        "a": np.array([1, 0, 0]),
        "b": np.array([1.0, 0.0, 0.0]),
        "c": np.array([None, None, None], dtype=object),
        "d": np.zeros((3, 2)),
        "e": np.array([None, None, spaces.Discrete(3)], dtype=object),
        "_a": np.array([True, False, False]),
        "_b": np.array([True, False, False]),
        "_c": np.array([False, True, False]),
        "_d": np.array([False, True, False]),
        "_e": np.array([False, False, True]),
    }
    assert data_equivalence(infos, expected)


def test_vector_return_info(pair):
    ours, ref = pair
    _, info = ours.reset(seed=4)
    assert data_equivalence(info, ref.reset(seed=4)[1], exact=True)
    assert all(np.all(info[f"_{key}"]) for key in info if not key.startswith("_"))
    ours.action_space.seed(4)
    actions = ours.action_space.sample()
    step_info = ours.step(actions)[4]
    assert data_equivalence(step_info, ref.step(actions)[4], exact=True)
    assert set(step_info) == {"reward_terms", "_reward_terms"} and np.all(step_info["_reward_terms"])


# ============================================================== tests/vector/test_vector_wrapper.py
class _CountingWrapper(VectorWrapper):
    counter = 0

    def reset(self, *, seed=None, options=None):
        self.counter += 1
        return super().reset(seed=seed, options=options)


def test_vector_env_wrapper_inheritance(pair):
    wrapped = _CountingWrapper(pair[0])
    wrapped.reset(seed=0)
    assert wrapped.counter == 1


def test_vector_env_wrapper_attributes(pair):
    ours, _ = pair
    wrapped = _CountingWrapper(ours)
    assert wrapped.env.call("max_episode_steps") == ours.call("max_episode_steps")
    before = ours.get_attr("max_episode_steps")
    wrapped.env.set_attr("max_episode_steps", [20, 20, 20])
    assert wrapped.env.get_attr("max_episode_steps") == ours.get_attr("max_episode_steps") == (20, 20, 20)
    ours.set_attr("max_episode_steps", list(before))


def test_vector_env_metadata(pair):
    ours, _ = pair
    wrapped = _CountingWrapper(ours)
    assert wrapped.metadata == ours.metadata
    wrapped.metadata = {"render_modes": ["rgb_array"]}  # the wrapper's own now
    assert wrapped.metadata != ours.metadata


# ============================================================== tests/vector/test_async_vector_env.py (env half)
def test_already_closed_async_vector_env(closing):
    envs = closing(UniLabVectorEnv(1))
    envs.close()
    with pytest.raises(ClosedEnvironmentError):
        envs.reset()
    with pytest.raises(ClosedEnvironmentError):
        envs.step(np.zeros((1, 12)))


def test_copy_async_vector_env(pair):
    # copy=True: what reset / step return is the caller's, never a view of the env's buffers
    ours, _ = pair
    obs, _ = ours.reset(seed=6)
    kept = obs.copy()
    obs_2, *_ = ours.step(np.zeros((3, 12)))
    assert not np.shares_memory(obs, obs_2)
    np.testing.assert_array_equal(obs, kept)


# ============================================================== tests/wrappers/vector/
@pytest.mark.parametrize("num_envs", [1, 3])
def test_record_episode_statistics(closing, num_envs):
    wrapper_vector = closing(vector_wrappers.RecordEpisodeStatistics(UniLabVectorEnv(num_envs, **SHORT)))
    vector_wrapper = closing(_sync_with_wrappers(num_envs, gym.wrappers.RecordEpisodeStatistics, **SHORT))
    assert wrapper_vector.action_space == vector_wrapper.action_space
    assert wrapper_vector.observation_space == vector_wrapper.observation_space
    assert wrapper_vector.num_envs == vector_wrapper.num_envs
    assert data_equivalence(wrapper_vector.reset(seed=123), vector_wrapper.reset(seed=123), exact=True)
    wrapper_vector.action_space.seed(123)
    episodes = 0
    for _ in range(8):
        action = wrapper_vector.action_space.sample()
        *mine, info = wrapper_vector.step(action)
        *theirs, info_r = vector_wrapper.step(action)
        assert data_equivalence(mine, theirs, exact=True)
        if "episode" in info:
            episodes += 1
            t, t_r = info["episode"].pop("t"), info_r["episode"].pop("t")
            assert t.shape == t_r.shape and t.dtype == t_r.dtype
            for key in ("_l", "_r", "_t"):
                info_r["episode"].pop(key)
        assert data_equivalence(info, info_r, exact=True)
    assert episodes


@pytest.mark.parametrize("autoreset_mode", MODES)
def test_episode_statistics_with_autoreset_mode(closing, autoreset_mode, episode_length=3):
    envs = closing(
        vector_wrappers.RecordEpisodeStatistics(
            UniLabVectorEnv(2, autoreset_mode=autoreset_mode, max_episode_steps=episode_length)
        )
    )
    envs.reset(seed=123)
    returns = np.zeros(2)
    for _ in range(10):
        _, reward, terminations, truncations, infos = envs.step(np.zeros((2, 12)))
        returns += reward
        dones = np.logical_or(terminations, truncations)
        if np.any(dones):
            assert "episode" in infos
            assert np.all(infos["episode"]["l"][dones] == episode_length)
            np.testing.assert_allclose(infos["episode"]["r"][dones], returns[dones], rtol=1e-6)
            returns[dones] = 0.0
            if autoreset_mode == AutoresetMode.DISABLED:
                envs.reset(options={"reset_mask": np.copy(dones)})
        if autoreset_mode == AutoresetMode.NEXT_STEP:
            returns[dones] = 0.0  # the restart step's reward (0) belongs to no episode
    assert envs.episode_count >= 2 * 2
    assert np.all(np.array(envs.length_queue) == episode_length)


@pytest.mark.parametrize(
    "wrapper_name, kwargs",
    [
        ("ClipAction", {}),
        ("RescaleAction", {"min_action": 1, "max_action": 2}),
        ("ClipReward", {"min_reward": -0.01, "max_reward": 0.01}),
        ("DtypeObservation", {"dtype": np.float64}),
        ("FlattenObservation", {}),
    ],
)
def test_vector_wrapper_equivalence(closing, wrapper_name, kwargs, num_envs=2, num_steps=5):
    wrapper_vector = closing(getattr(vector_wrappers, wrapper_name)(UniLabVectorEnv(num_envs, **SHORT), **kwargs))
    single = getattr(gym.wrappers, wrapper_name)
    vector_wrapper = closing(_sync_with_wrappers(num_envs, lambda env: single(env, **kwargs), **SHORT))
    assert wrapper_vector.action_space == vector_wrapper.action_space
    assert wrapper_vector.observation_space == vector_wrapper.observation_space
    assert wrapper_vector.single_action_space == vector_wrapper.single_action_space
    assert wrapper_vector.single_observation_space == vector_wrapper.single_observation_space
    assert data_equivalence(wrapper_vector.reset(seed=123), vector_wrapper.reset(seed=123), exact=True)
    wrapper_vector.action_space.seed(123)
    for _ in range(num_steps):
        action = 3 * wrapper_vector.action_space.sample()  # out of range too, for the clipping wrappers
        _assert_same_step(wrapper_vector.step(action), vector_wrapper.step(action), wrapper_name)


def test_dict_info_to_list_usage_in_vector_env(closing):
    ours = closing(vector_wrappers.DictInfoToList(UniLabVectorEnv(2, **SHORT)))
    ref = closing(vector_wrappers.DictInfoToList(_reference(2, AutoresetMode.NEXT_STEP, **SHORT)))
    _, infos = ours.reset(seed=7)
    assert isinstance(infos, list) and len(infos) == 2
    assert data_equivalence(infos, ref.reset(seed=7)[1], exact=True)
    for _ in range(5):
        _assert_same_step(ours.step(np.zeros((2, 12))), ref.step(np.zeros((2, 12))))
    with pytest.raises(TypeError):
        vector_wrappers.DictInfoToList(closing(gym.make(ID)))


def test_normalize_observation_wrapper_equivalence(closing):
    ours = closing(vector_wrappers.NormalizeObservation(UniLabVectorEnv(2, **SHORT)))
    ref = closing(vector_wrappers.NormalizeObservation(_reference(2, AutoresetMode.NEXT_STEP, **SHORT)))
    assert ours.observation_space == ref.observation_space and ours.observation_space.dtype == np.float32
    obs, _ = ours.reset(seed=8)
    assert obs.dtype == np.float32 and np.array_equal(obs, ref.reset(seed=8)[0])
    ours.action_space.seed(8)
    for _ in range(6):
        action = ours.action_space.sample()
        _assert_same_step(ours.step(action), ref.step(action))
    np.testing.assert_array_equal(ours.obs_rms.mean, ref.obs_rms.mean)
    np.testing.assert_array_equal(ours.obs_rms.var, ref.obs_rms.var)


@pytest.mark.parametrize("autoreset_mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_normalize_reward_equivalence_with_wrapper(closing, autoreset_mode, n_steps=8):
    ours = closing(vector_wrappers.NormalizeReward(UniLabVectorEnv(2, autoreset_mode=autoreset_mode, **SHORT)))
    ref = closing(vector_wrappers.NormalizeReward(_reference(2, autoreset_mode, **SHORT)))
    ours.reset(seed=9)
    ref.reset(seed=9)
    ours.action_space.seed(9)
    for _ in range(n_steps):
        action = ours.action_space.sample()
        _assert_same_step(ours.step(action), ref.step(action))
    assert ours.return_rms.count == ref.return_rms.count
    np.testing.assert_allclose(ours.return_rms.mean, ref.return_rms.mean, rtol=1e-12)
    np.testing.assert_allclose(ours.return_rms.var, ref.return_rms.var, rtol=1e-12)


def test_transform_action_from_single_action_space(closing):
    envs = closing(
        vector_wrappers.TransformAction(
            UniLabVectorEnv(2),
            func=lambda x: x - 100,
            single_action_space=spaces.Box(99.0, 101.0, (12,), np.float32),
        )
    )
    assert envs.action_space.shape == (2, 12) and envs.action_space.dtype == np.float32
    assert np.all(envs.action_space.low == 99.0) and np.all(envs.action_space.high == 101.0)
    envs.reset(seed=0)
    envs.step(envs.action_space.sample())


def test_transform_observation(closing):
    envs = closing(
        vector_wrappers.TransformObservation(
            UniLabVectorEnv(2),
            func=lambda x: np.clip(x, -1, 1) + 100,
            single_observation_space=spaces.Box(99.0, 101.0, (48,), np.float32),
        )
    )
    obs, _ = envs.reset(seed=123)
    assert (obs >= 99).all() and (obs <= 101).all()
    obs, *_ = envs.step(envs.action_space.sample())
    assert (obs >= 99).all() and (obs <= 101).all()
    assert envs.observation_space.shape == (2, 48)


def test_record_video_folder_and_filenames(closing, tmp_path):
    folder = tmp_path / "videos"
    envs = vector_wrappers.RecordVideo(
        UniLabVectorEnv(2, render_mode="rgb_array", **SHORT),
        video_folder=str(folder),
        name_prefix="video-prefix",
        episode_trigger=lambda x: x == 1,
        step_trigger=lambda x: x == 0,
        video_length=2,
    )
    closing(envs)
    envs.reset(seed=123)
    for _ in range(8):
        envs.step(np.zeros((2, 12)))
    envs.close()
    assert {f.name for f in folder.glob("*.mp4")} == {"video-prefix-step-0.mp4", "video-prefix-episode-1.mp4"}


def test_record_video_incompatible_render_mode(closing):
    with pytest.raises(ValueError):
        vector_wrappers.RecordVideo(closing(UniLabVectorEnv(1)), video_folder="never")
