"""PandaPick-v0's ``grasped_start_fraction`` (issue 27, item 4): a reset distribution with the object in the hand."""

import gymnasium as gym
import numpy as np
import pytest

import unilab_gym  # noqa: F401  (registers the ids)
from unilab_gym.tasks.panda import PICK_OBS_LAYOUT, PandaPickConfig

_OBJ_MINUS_EE = slice(*PICK_OBS_LAYOUT["object_minus_end_effector"])
_JOINT_POS = slice(*PICK_OBS_LAYOUT["joint_pos"])
N = 8


def _reset(closing, seed=4, **kwargs):
    env = closing(gym.make_vec("UniLab/PandaPick-v0", num_envs=N, **kwargs))
    obs, _ = env.reset(seed=seed)
    return env, obs


def test_default_draws_as_before(closing):
    """0 (the default) draws nothing extra: the same resets as the task without the option."""
    assert PandaPickConfig().grasped_start_fraction == 0.0
    _, a = _reset(closing)
    _, b = _reset(closing, grasped_start_fraction=0.0)
    assert np.array_equal(a, b)
    assert (np.linalg.norm(a[:, _OBJ_MINUS_EE], axis=1) > 0.1).all()  # the hand starts far from every object


def test_fraction_one_starts_every_object_between_the_fingers_and_a_closed_lift_succeeds(closing):
    env, obs = _reset(closing, grasped_start_fraction=1.0)
    assert (np.linalg.norm(obs[:, _OBJ_MINUS_EE], axis=1) < 0.01).all()
    size = env.unwrapped.task.episode_parameters[:, 1]
    fingers = obs[:, _JOINT_POS][:, 7:9] + 0.04  # the observation is relative to the nominal (open, 0.04 m)
    np.testing.assert_allclose(fingers.sum(axis=1), size, atol=0.005)
    action = np.zeros((N, 4), dtype=np.float32)
    action[:, 3] = -1.0  # close
    success = np.zeros(N, dtype=bool)
    for step in range(40):
        action[:, 2] = 0.0 if step < 3 else 0.5  # then up
        obs, _, terminated, _, info = env.step(action)
        assert not terminated.any()
        success |= info["is_success"]
    assert success.all()


def test_a_fraction_mixes_both_starts_and_is_deterministic(closing):
    _, a = _reset(closing, seed=11, grasped_start_fraction=0.5)
    _, b = _reset(closing, seed=11, grasped_start_fraction=0.5)
    assert np.array_equal(a, b)
    held = np.linalg.norm(a[:, _OBJ_MINUS_EE], axis=1) < 0.01
    assert held.any() and not held.all()


@pytest.mark.parametrize("value", [-0.1, 1.5, float("nan"), "half"])
def test_a_bad_fraction_is_refused_naming_the_field(value):
    with pytest.raises(ValueError, match="grasped_start_fraction"):
        PandaPickConfig(grasped_start_fraction=value)
