"""``UniLab/QuadrupedRough-v0`` (issue 27, item 3): heightfield tiles per env, the terrain curriculum, height samples,
and determinism per env whatever the grouping."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env, data_equivalence
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from unilab_gym.envs_rough import QuadrupedRoughEnv, QuadrupedRoughVectorEnv
from unilab_gym.registration import QUADRUPED_ROUGH_ID
from unilab_gym.tasks.rough import RoughConfig, RoughTask
from unilab_gym.tasks.terrain import (
    NUM_HEIGHT_POINTS,
    TERRAIN_TYPES,
    curriculum_step,
    make_tile,
    sample_heights,
    tile_cells,
)

STAIRS_DOWN = TERRAIN_TYPES.index("stairs_down")
ONLY = {name: tuple(float(k == i) for k in range(len(TERRAIN_TYPES))) for i, name in enumerate(TERRAIN_TYPES)}


# ------------------------------------------------------------------ pure numpy: tiles, samples, curriculum
@pytest.mark.parametrize("kind", range(len(TERRAIN_TYPES)))
def test_a_tile_is_a_function_of_its_seed_with_a_flat_border_and_centre(kind):
    a = make_tile(kind, 0.7, np.random.default_rng(5))
    b = make_tile(kind, 0.7, np.random.default_rng(5))
    n = tile_cells(8.0, 1.0)
    assert a.shape == (n, n) and a.dtype == np.float32
    np.testing.assert_array_equal(a, b)
    border = round(1.0 / 0.1)
    for edge in (a[:border], a[-border:], a[:, :border], a[:, -border:]):
        assert np.all(edge == 0.0)
    c = (n - 1) // 2
    centre = a[c - 5 : c + 6, c - 5 : c + 6]  # inside the 3 m platform
    assert np.ptp(centre) <= 0.1 + 1e-6 if TERRAIN_TYPES[kind] == "rough_slope" else np.ptp(centre) == 0.0
    assert np.abs(a).max() > 0.04, "a 0.7 difficulty tile is not flat"


def test_difficulty_scales_the_tiles_as_legged_gym():
    rng = np.random.default_rng
    assert np.all(make_tile(TERRAIN_TYPES.index("smooth_slope"), 0.0, rng(1)) == 0.0)
    n = tile_cells(8.0, 1.0)
    c = (n - 1) // 2
    for d in (0.0, 0.5, 1.0):
        down = make_tile(STAIRS_DOWN, d, rng(1))
        up = make_tile(TERRAIN_TYPES.index("stairs_up"), d, rng(1))
        step = 0.05 + 0.18 * d
        steps = int(np.floor((4.0 - 1.5) / 0.31))
        assert down[c, c] == pytest.approx(steps * step, rel=1e-6)  # the robot starts on the top platform
        assert up[c, c] == pytest.approx(-steps * step, rel=1e-6)  # ... or at the bottom
        levels = np.unique(np.round(down / step, 4))
        np.testing.assert_allclose(levels, np.arange(steps + 1), atol=1e-3)
    obstacles = make_tile(TERRAIN_TYPES.index("discrete_obstacles"), 1.0, rng(2))
    assert set(np.round(np.unique(obstacles), 4)) <= {0.0, -0.25, -0.125, 0.125, 0.25}


def test_height_samples_are_bilinear_on_the_grid():
    n = 21
    axis = (np.arange(n) - 10) * 0.1
    xx, yy = np.meshgrid(axis, axis, indexing="xy")
    plane = (0.3 * xx - 0.2 * yy + 1.0).astype(np.float32)[None]  # rows y, columns x
    points = np.array([[[0.0, 0.0], [0.55, -0.33], [-0.91, 0.47]]])
    expected = 0.3 * points[..., 0] - 0.2 * points[..., 1] + 1.0
    np.testing.assert_allclose(sample_heights(plane, 0.1, points), expected, atol=1e-6)


def test_curriculum_step_is_legged_gyms_rule():
    level = np.array([0, 3, 3, 3, 9, 0])
    distance = np.array([5.0, 4.5, 1.0, 3.0, 4.1, 0.0])
    commanded = np.array([10.0, 10.0, 4.0, 4.0, 4.0, 4.0])
    new = curriculum_step(level, distance, commanded, 8.0, 10, np.full(6, 7))
    # up (> 4 m), up, down (< 2 m), stays (2 m <= 3 < 4 m), past the hardest -> the random level, never under 0
    np.testing.assert_array_equal(new, [1, 4, 2, 3, 7, 0])


def test_the_task_moves_an_env_up_after_it_walked_more_than_half_a_tile_and_down_when_it_did_not():
    task = RoughTask(3, RoughConfig(init_terrain_level=4))
    rng = np.random.default_rng(0)
    for env in range(3):
        task.sample_episode(env, rng)
    task.command[:, :2] = [0.5, 0.0]  # 0.5 m/s for 20 s: 10 m commanded, half of it 5 m
    task._steps[:] = 100  # the episodes had steps
    task._final_xy[:] = task._tiles.origin + np.array([[4.5, 0.0], [4.2, 0.0], [1.0, 0.0]])
    for env in range(3):
        task.sample_episode(env, rng)
    np.testing.assert_array_equal(task.terrain_level, [5, 5, 3])
    np.testing.assert_array_equal(task.episode_parameters[:, 0], [5, 5, 3])


# ------------------------------------------------------------------ the env
def test_registered_single_and_vector_env_and_check_env(closing):
    single = closing(gym.make(QUADRUPED_ROUGH_ID))
    assert isinstance(single.unwrapped, QuadrupedRoughEnv)
    check_env(single.unwrapped, skip_render_check=True)
    vec = closing(gym.make(QUADRUPED_ROUGH_ID, num_envs=3))
    assert isinstance(vec, QuadrupedRoughVectorEnv) and vec.observation_space.shape == (3, 48)
    vec2 = closing(gym.make_vec(QUADRUPED_ROUGH_ID, num_envs=2, max_episode_steps=7))
    assert vec2.max_episode_steps == 7


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_the_vector_env_equals_gymnasiums_sync_vector_env_of_single_envs(closing, mode):
    # tests/env/test_gym_vector_suite.py::test_vector_env_equal on this id: short episodes, falls, new tiles, levels
    short = dict(max_episode_steps=4, init_terrain_level=5, termination={"min_base_height": 0.27})
    ours = closing(QuadrupedRoughVectorEnv(3, autoreset_mode=mode, **short))
    ref = closing(SyncVectorEnv([lambda: gym.make(QUADRUPED_ROUGH_ID, **short)] * 3, autoreset_mode=mode))
    assert ours.single_observation_space == ref.single_observation_space
    assert ours.single_action_space == ref.single_action_space
    obs, info = ours.reset(seed=0)
    obs_r, info_r = ref.reset(seed=0)
    assert np.all(obs == obs_r) and data_equivalence(info, info_r, exact=True)
    ours.action_space.seed(0)
    for step in range(12):
        actions = ours.action_space.sample()
        for name, x, y in zip(
            ("obs", "reward", "terminated", "truncated", "info"), ours.step(actions), ref.step(actions)
        ):
            assert data_equivalence(x, y, exact=True), f"step {step}: {name} differs"


def test_the_robot_stands_on_its_tile_at_the_tiles_height(closing):
    # level 9 of 10 stairs down: the robot starts on a platform 8 steps of 0.23 m above the border
    env = closing(QuadrupedRoughVectorEnv(2, init_terrain_level=9, terrain_curriculum=False, **_only("stairs_down")))
    platform = 8 * (0.05 + 0.18)
    for seed in (3, 4):  # the second reset moves each tile to its robot's new lane, with new data
        env.reset(seed=seed)
        for _ in range(50):
            env.step(np.zeros((2, 12)))
        z = env.robot_state.base_pos[:, 2]
        assert np.all(np.abs(z - platform - 0.268) < 0.03), z
        assert np.all(env.robot_state.foot_contact), "the feet touch the tile"
        np.testing.assert_allclose(env.task._base_height, z - platform, atol=1e-6)


def test_height_samples_in_the_critic_by_default_and_in_the_policy_with_height_obs(closing):
    env = closing(QuadrupedRoughVectorEnv(2, privileged_obs=True, init_terrain_level=9, **_only("stairs_down")))
    obs, _ = env.reset(seed=1)
    assert obs["policy"].shape == (2, 48) and obs["critic"].shape == (2, 68 + NUM_HEIGHT_POINTS)
    samples = obs["critic"][:, slice(*env.task.critic_obs_layout["critic_height_samples"])]
    np.testing.assert_allclose(samples, 0.32, atol=1e-6)  # on the platform, spawned 0.32 m above it
    env_h = closing(QuadrupedRoughVectorEnv(2, privileged_obs=True, height_obs=True, **_only("stairs_down")))
    obs_h, _ = env_h.reset(seed=1)
    assert obs_h["policy"].shape == (2, 48 + NUM_HEIGHT_POINTS)
    a, b = env_h.task.obs_layout["height_samples"]
    c, d = env_h.task.critic_obs_layout["critic_height_samples"]
    np.testing.assert_array_equal(obs_h["policy"][:, a:b], obs_h["critic"][:, c:d])
    np.testing.assert_array_equal(obs_h["policy"][:, :48], obs["policy"])  # the same 48 columns first


def test_terrain_level_in_info_and_trace_and_levels_go_down_when_robots_do_not_walk(closing):
    env = closing(QuadrupedRoughVectorEnv(2, init_terrain_level=3, max_episode_steps=5))
    env.reset(seed=0)
    levels = []
    for _ in range(18):  # three 5-step episodes (and the restarting steps between them)
        _, _, _, _, info = env.step(np.zeros((2, 12)))
        if "terrain_level" in info:
            levels.append(info["terrain_level"][info["_terrain_level"]].tolist())
    assert levels == [[3, 3]] * 5 + [[2, 2]] * 5 + [[1, 1]] * 5, levels
    records = env.parameter_trace()
    assert [r["parameters"]["terrain_level"] for r in records if r["env"] == 0][:2] == [3, 2]


# ------------------------------------------------------------------ determinism
TASK = dict(max_episode_steps=15, init_terrain_level=6, termination={"min_base_height": 0.25})


def _actions(env, steps):
    return np.random.default_rng(10_000 + env).uniform(-1, 1, (steps, 12))


def _rollout(num_envs, envs_per_cluster, steps, first=0):
    """Envs ``first`` .. ``first + num_envs - 1`` (seeds 50 + i, their own action streams)."""
    env = QuadrupedRoughVectorEnv(num_envs, envs_per_cluster=envs_per_cluster, privileged_obs=True, **TASK)
    acts = np.stack([_actions(first + i, steps) for i in range(num_envs)], axis=1)
    obs, _ = env.reset(seed=50 + first)
    out = {"obs": [obs["critic"]], "rew": [], "done": [], "level": []}
    for t in range(steps):
        obs, rew, term, trunc, _ = env.step(acts[t])
        out["obs"].append(obs["critic"])
        out["rew"].append(rew)
        out["done"].append(term | trunc)
        out["level"].append(env.task.terrain_level.copy())
    env.close()
    return {k: np.stack(v) for k, v in out.items()}


def test_env_i_is_identical_alone_and_in_any_grouping():
    steps = 40
    group = _rollout(4, 3, steps)
    assert group["done"].sum() >= 6, "the scenario should hold several episodes (new tiles) per env"
    assert len(np.unique(group["level"])) >= 2, "the curriculum should move levels"
    other = _rollout(4, 2, steps)
    for key in group:
        np.testing.assert_array_equal(group[key], other[key], err_msg=key)
    for i in (0, 3):
        solo = _rollout(1, 1, steps, first=i)
        for key in group:
            np.testing.assert_array_equal(group[key][:, i], solo[key][:, 0], err_msg=f"{key} of env {i}")


def _only(name):
    return {"terrain_proportions": ONLY[name]}
