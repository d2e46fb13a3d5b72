"""``UniLabVectorEnv.step(actions, active=mask)``: the partial step, and the per-env random stream seam."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from unilab_gym.envs import QuadrupedEnv
from unilab_gym.vector_env import FinishedEnvError, UniLabVectorEnv

SHORT = {"max_episode_steps": 4}


@pytest.fixture
def closing():
    envs = []

    def make(env):
        envs.append(env)
        return env

    yield make
    for env in envs:
        env.close()


def _actions(rng, n):
    return rng.uniform(-1.0, 1.0, (n, 12))


def test_active_envs_follow_the_full_step_trajectory_bit_for_bit(closing):
    ref = closing(UniLabVectorEnv(3, **SHORT))
    part = closing(UniLabVectorEnv(3, **SHORT))
    ref.reset(seed=5)
    part.reset(seed=5)
    active = np.array([True, False, True])
    rng = np.random.default_rng(0)
    for step in range(7):  # across the autoreset of envs 0 and 2 (NEXT_STEP)
        actions = _actions(rng, 3)
        full = ref.step(actions)
        actions[1] = np.nan  # an idle env's row is ignored
        got = part.step(actions, active=active)
        for k in (0, 2):
            np.testing.assert_array_equal(got[0][k], full[0][k], err_msg=f"obs, step {step}")
            assert (got[1][k], got[2][k], got[3][k]) == (full[1][k], full[2][k], full[3][k]), step
        np.testing.assert_array_equal(part.episode_step[[0, 2]], ref.episode_step[[0, 2]])


def test_an_idle_env_reports_nothing_and_its_episode_does_not_advance(closing):
    env = closing(UniLabVectorEnv(2, **SHORT))
    env.reset(seed=0)
    before = env.step(np.zeros((2, 12)))[0]
    steps, episode = env.episode_step.copy(), env.episode_seed.copy()
    obs, reward, terminated, truncated, info = env.step(np.ones((2, 12)), active=np.array([True, False]))
    assert not np.array_equal(obs[1], before[1])  # its current observation: its robot moved (zero action)
    assert env.episode_step.tolist() == [steps[0] + 1, steps[1]]
    assert reward[1] == 0.0 and not terminated[1] and not truncated[1] and reward[0] != 0.0
    assert info["_reward_terms"].tolist() == [True, False]
    assert all(value[1] == 0.0 for key, value in info["reward_terms"].items() if not key.startswith("_"))
    for _ in range(SHORT["max_episode_steps"] + 2):  # idle longer than an episode: it never truncates
        _, _, _, truncated, _ = env.step(np.zeros((2, 12)), active=np.array([False, True]))
    assert env.episode_step[0] == steps[0] + 1 and env.episode_seed[0] == episode[0]
    assert not truncated[0] and len({r["env"] for r in env.parameter_trace()}) == 1  # only env 1 finished


def test_an_idle_env_keeps_its_next_step_restart_for_its_next_active_step(closing):
    env = closing(UniLabVectorEnv(2, max_episode_steps=1))
    env.reset(seed=0)
    assert env.step(np.zeros((2, 12)))[3].all()  # both truncate: both restart at their next step
    seed_before = env.episode_seed.copy()
    _, _, _, _, info = env.step(np.zeros((2, 12)), active=np.array([True, False]))
    assert info["_episode_seed"].tolist() == [True, False]  # env 0 restarted, env 1 waits
    assert env.episode_seed[0] != seed_before[0] and env.episode_seed[1] == seed_before[1]
    _, _, _, _, info = env.step(np.zeros((2, 12)), active=np.array([False, True]))
    assert info["_episode_seed"].tolist() == [False, True] and env.episode_seed[1] != seed_before[1]


def test_disabled_refuses_only_finished_envs_that_are_active(closing):
    env = closing(UniLabVectorEnv(2, autoreset_mode="Disabled", max_episode_steps=1))
    env.reset(seed=0)
    env.step(np.zeros((2, 12)))
    env.reset(options={"reset_mask": np.array([True, False])})
    env.step(np.zeros((2, 12)), active=np.array([True, False]))  # env 1 finished, but idle: not refused
    with pytest.raises(FinishedEnvError, match=r"envs \[1\].*active=mask"):
        env.step(np.zeros((2, 12)), active=np.array([False, True]))


@pytest.mark.parametrize(
    ("active", "match"),
    [
        ([True, False], "active must be None or a numpy array"),
        (np.array([1, 0]), "active must have dtype bool"),
        (np.array([True, False, True]), r"active must have shape \(2,\)"),
        (np.array([[True, False]]), r"active must have shape \(2,\)"),
    ],
)
def test_a_bad_active_mask_raises_value_error_and_steps_nothing(closing, active, match):
    env, ref = closing(UniLabVectorEnv(2)), closing(UniLabVectorEnv(2))
    env.reset(seed=0)
    ref.reset(seed=0)
    with pytest.raises(ValueError, match=match):
        env.step(np.zeros((2, 12)), active=active)
    assert env.episode_step.tolist() == [0, 0]
    np.testing.assert_array_equal(env.step(np.ones((2, 12)))[0], ref.step(np.ones((2, 12)))[0])  # nothing moved


def test_nan_in_an_active_row_is_still_refused(closing):
    env = closing(UniLabVectorEnv(2))
    env.reset(seed=0)
    actions = np.zeros((2, 12))
    actions[0, 3] = np.inf
    with pytest.raises(ValueError, match=r"env indices \[0\]"):
        env.step(actions, active=np.array([True, False]))
    assert env.episode_step.tolist() == [0, 0]


def test_set_env_rng_continues_a_stream_in_another_env(closing):
    a = closing(UniLabVectorEnv(1))
    b = closing(UniLabVectorEnv(1))
    assert a.env_rng(0) is None
    a.reset(seed=3)
    b.set_env_rng(0, copy.deepcopy(a.env_rng(0)))
    a.reset()
    b.reset()
    assert a.episode_seed[0] == b.episode_seed[0]
    with pytest.raises(TypeError, match=r"numpy\.random\.Generator"):
        b.set_env_rng(0, 3)
    with pytest.raises(IndexError, match=r"out of range \[0, 1\)"):
        b.env_rng(1)


def test_the_single_env_idles_after_its_end_with_reward_zero_and_the_end_flags(closing):
    env = closing(QuadrupedEnv(max_episode_steps=2))
    env.reset(seed=0)
    env.step(np.zeros(12))
    _, _, terminated, truncated, info = env.step(np.zeros(12))
    assert truncated and not terminated
    with pytest.warns(UserWarning, match="already returned"):
        _, reward, terminated, truncated, after = env.step(np.ones(12))
    assert (reward, terminated, truncated) == (0.0, False, True)
    assert set(after["reward_terms"]) == set(info["reward_terms"]) and not any(after["reward_terms"].values())
    with pytest.raises(ValueError, match="NaN"):
        env.step(np.full(12, np.nan))
