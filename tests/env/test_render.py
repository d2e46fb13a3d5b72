"""Per-task cameras (``render_mode="rgb_array"``): every task's frame shows its robot, the rough terrain's tile is the
current episode's, frame shapes are as documented, and rendering never changes the physics."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import unilab_gym  # noqa: F401  # registers the ids
from unilab_gym.sim.camera import Camera
from unilab_gym.sim.world import _import_pybullet

p = _import_pybullet()

TASKS = [
    "UniLab/Quadruped-v0",
    "UniLab/QuadrupedRough-v0",
    "UniLab/PandaReach-v0",
    "UniLab/PandaPick-v0",
    "UniLab/Quadrotor-v0",
]


def _vec(env_id: str, n: int, **kwargs):
    return gym.make_vec(env_id, num_envs=n, vectorization_mode="vector_entry_point", **kwargs)


def _step(env, steps: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        env.step(rng.uniform(-0.3, 0.3, env.action_space.shape).astype(np.float32))


@pytest.mark.parametrize("env_id", TASKS)
def test_frame_shows_the_robot(env_id, closing):
    """The task's camera sees env 0's robot: moving the robot 50 m under the ground (the camera stays where it was,
    it reads the states of the last step) changes at least 100 pixels of the 320x240 frame."""
    env = closing(_vec(env_id, 2, render_mode="rgb_array"))
    env.reset(seed=3)
    _step(env, 5)
    frame = env.render()[0]
    assert frame.shape == (240, 320, 3) and frame.dtype == np.uint8
    _, world = env._cluster_of(0)
    p.resetBasePositionAndOrientation(world._robots[0], [0.0, 0.0, -50.0], [0, 0, 0, 1], physicsClientId=world._client)
    empty = env.render_env(0)
    changed = int(np.any(frame != empty, axis=-1).sum())
    assert changed >= 100, f"{env_id}: the robot covers only {changed} pixels of its camera's frame"


@pytest.mark.parametrize("env_id", TASKS)
def test_render_does_not_change_the_physics(env_id, closing):
    """Rendering every step (display tiles, the target marker) leaves the trajectories bit-identical to no render."""
    drawn = closing(_vec(env_id, 2, render_mode="rgb_array"))
    plain = closing(_vec(env_id, 2))
    obs = [env.reset(seed=5)[0] for env in (drawn, plain)]
    rng = np.random.default_rng(0)
    for _ in range(15):
        action = rng.uniform(-1, 1, drawn.action_space.shape).astype(np.float32)
        drawn.render()
        obs = [env.step(action)[0] for env in (drawn, plain)]
        np.testing.assert_array_equal(obs[0], obs[1])


def test_rough_tile_is_the_current_episodes(closing):
    """pybullet's TinyRenderer meshes a heightfield once; the display tile is rebuilt, so a frame after a second
    episode equals the frame of a fresh env reset straight into that episode (a stale mesh would show the first)."""
    env_id = "UniLab/QuadrupedRough-v0"
    env = closing(_vec(env_id, 1, render_mode="rgb_array", init_terrain_level=5))
    env.reset(seed=0, options={"episode_seed": 11})
    first = env.render_env(0)
    env.reset(options={"episode_seed": 12})
    second = env.render_env(0)
    fresh = closing(_vec(env_id, 1, render_mode="rgb_array", init_terrain_level=5))
    fresh.reset(seed=0, options={"episode_seed": 12})
    assert not np.array_equal(first, second)
    np.testing.assert_array_equal(second, fresh.render_env(0))


def test_render_env_size_and_camera(closing):
    """``render_env`` gives (height, width, 3) uint8 and takes another camera."""
    env = closing(_vec("UniLab/PandaReach-v0", 1, render_mode="rgb_array"))
    env.reset(seed=0)
    small = env.render_env(0, width=64, height=48)
    assert small.shape == (48, 64, 3) and small.dtype == np.uint8
    away = env.render_env(0, width=64, height=48, camera=Camera(follow="spawn", offset=(30.0, 0.0, 0.0)))
    assert not np.array_equal(small, away)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"follow": "robot"}, "follow"),
        ({"offset": (0.0, 1.0)}, "offset"),
        ({"offset": (0.0, np.nan, 0.0)}, "offset"),
        ({"distance": 0.0}, "distance"),
        ({"pitch": -100.0}, "pitch"),
        ({"fov": 180.0}, "fov"),
        ({"near": 1.0, "far": 0.5}, "far"),
    ],
)
def test_camera_rejects_bad_fields(kwargs, field):
    with pytest.raises(ValueError, match=field):
        Camera(**kwargs)
