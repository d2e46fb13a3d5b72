"""UniLabVectorEnv: Gymnasium creation and contract, autoreset modes, seeding, bad input, rendering."""

import dataclasses
import json

import gymnasium as gym
import numpy as np
import pybullet as p
import pytest
from gymnasium.error import ClosedEnvironmentError, ResetNeeded
from gymnasium.vector import AutoresetMode

from unilab_gym import QuadrupedEnv, UniLabVectorEnv
from unilab_gym.tasks.config import QuadrupedConfig
from unilab_gym.tasks.quadruped import OBS_LAYOUT

ID = "UniLab/Quadruped-v0"
CMD = slice(*OBS_LAYOUT["command"])
LAST_ACTION = slice(*OBS_LAYOUT["last_action"])


@pytest.fixture
def make():
    envs = []

    def _make(num_envs=4, **kwargs):
        env = UniLabVectorEnv(num_envs, **kwargs)
        envs.append(env)
        return env

    yield _make
    for env in envs:
        env.close()


def _actions(n, seed=0, steps=1):
    return np.random.default_rng(seed).uniform(-1, 1, (steps, n, 12)).astype(np.float32)


# --------------------------------------------------------------------------- creation
def test_make_without_num_envs_is_single_env_passing_checkers():
    from gymnasium.utils.env_checker import check_env
    from stable_baselines3.common.env_checker import check_env as sb3_check_env

    env = gym.make(ID)
    assert isinstance(env, QuadrupedEnv) and isinstance(env, gym.Env)
    assert not isinstance(env, gym.vector.VectorEnv)
    check_env(env, skip_render_check=True)
    sb3_check_env(gym.make(ID), warn=False)
    env.close()


@pytest.mark.parametrize("maker", [lambda: gym.make(ID, num_envs=3), lambda: gym.make_vec(ID, num_envs=3)])
def test_make_with_num_envs_returns_vector_env(maker):
    env = maker()
    assert type(env) is UniLabVectorEnv
    assert isinstance(env, gym.vector.VectorEnv) and isinstance(env, gym.Env)
    assert env.num_envs == 3
    assert env.observation_space.shape == (3, 48) and env.action_space.shape == (3, 12)
    assert env.single_observation_space.dtype == np.float32
    obs, _ = env.reset(seed=0)
    assert obs.shape == (3, 48) and obs.dtype == np.float32
    env.close()


def test_make_vec_passes_env_kwargs():
    env = gym.make_vec(ID, num_envs=2, max_episode_steps=3, envs_per_cluster=1)
    env.reset(seed=0)
    for _ in range(2):
        _, _, _, trunc, _ = env.step(np.zeros((2, 12)))
        assert not trunc.any()
    _, _, _, trunc, _ = env.step(np.zeros((2, 12)))
    assert trunc.all()
    env.close()


@pytest.mark.parametrize(
    "maker",
    [
        lambda: gym.make(ID, num_envs=2, bogus=1),
        lambda: gym.make_vec(ID, num_envs=2, bogus=1),
        lambda: gym.make(ID, bogus=1),
        lambda: UniLabVectorEnv(2, bogus=1),
    ],
)
def test_unknown_argument_is_named_with_the_valid_ones(maker):
    with pytest.raises(
        TypeError, match=r"unexpected keyword argument.*\['bogus'\].*valid arguments.*max_episode_steps"
    ):
        maker()


def test_task_config_is_the_config_as_json(make):
    env = make(1, kp=30.0, lin_vel_x_range=[0.2, 0.4], reward_weights={"alive": 1.0}, termination={"max_tilt": 1})
    assert isinstance(env.config, QuadrupedConfig)
    assert list(env.task_config) == [f.name for f in dataclasses.fields(QuadrupedConfig)]
    assert env.task_config["kp"] == [30.0] * 12 and env.task_config["lin_vel_x_range"] == [0.2, 0.4]
    assert env.task_config["reward_weights"]["alive"] == 1.0 and env.task_config["termination"]["max_tilt"] == 1.0
    assert QuadrupedConfig(**json.loads(json.dumps(env.task_config))) == env.config
    assert make(1, **env.task_config).config == env.config
    with pytest.raises(dataclasses.FrozenInstanceError):
        env.config.dt = 0.01


def test_numpy_integers_are_accepted_for_counts(make):
    env = make(np.int64(2), envs_per_cluster=np.int32(1), max_episode_steps=np.int64(3), substeps=np.int16(2))
    assert env.num_envs == 2 and len(env._clusters) == 2 and env.max_episode_steps == 3 and env.substeps == 2
    assert type(env.num_envs) is int and type(env.task_config["max_episode_steps"]) is int


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"num_envs": True}, "num_envs"),
        ({"action_scale": 0.0}, "action_scale"),
        ({"solver_iterations": 2.5}, "solver_iterations"),
        ({"init_joint_noise": -0.1}, "init_joint_noise"),
        ({"yaw_rate_range": 0.5}, "yaw_rate_range"),
        ({"kp": [1.0] * 11 + [np.nan]}, "kp"),
        ({"reward_weights": {"alive": "high"}}, "alive"),
        ({"termination": {"trunk_contact": 1}}, "trunk_contact"),
        ({"termination": [("max_tilt", 1.0)]}, "termination"),
    ],
)
def test_bad_task_values_raise_naming_the_field_and_value(kwargs, name):
    kwargs = {"num_envs": 1, **kwargs}
    with pytest.raises(ValueError, match=name):
        UniLabVectorEnv(**kwargs)


# --------------------------------------------------------------------------- task wiring
def test_reset_obs_and_step_contents(make):
    env = make(3)
    obs, info = env.reset(seed=1)
    np.testing.assert_allclose(obs[:, 6:9], [[0, 0, -1]] * 3, atol=1e-6)  # upright at spawn
    np.testing.assert_array_equal(obs[:, 24:36], 0.0)  # at rest
    np.testing.assert_array_equal(obs[:, LAST_ACTION], 0.0)
    np.testing.assert_allclose(obs[:, CMD], info["command"].astype(np.float32))
    assert info["_command"].all()
    vx = info["command"][:, 0]
    assert ((vx >= 0.3) & (vx <= 1.0)).all() and (info["command"][:, 1:] == 0).all()
    action = _actions(3)[0]
    obs, reward, term, trunc, info = env.step(action)
    np.testing.assert_allclose(obs[:, LAST_ACTION], action)
    assert reward.shape == (3,) and reward.dtype == np.float64
    assert term.dtype == np.bool_ and trunc.dtype == np.bool_
    terms = {k: v for k, v in info["reward_terms"].items() if not k.startswith("_")}
    assert set(terms) == {
        "tracking_lin_vel",
        "tracking_ang_vel",
        "lin_vel_z",
        "ang_vel_xy",
        "torques",
        "action_rate",
        "alive",
        "feet_air_time",
        "base_height",
        "orientation",
        "collision",
    }
    np.testing.assert_allclose(sum(terms.values()), reward)
    assert (terms["torques"] < 0).all() and (terms["action_rate"] < 0).all()


def test_command_ranges_and_reward_weights_kwargs(make):
    env = make(4, lin_vel_x_range=(-0.5, -0.4), yaw_rate_range=(0.2, 0.3), reward_weights={"alive": 5.0})
    _, info = env.reset(seed=0)
    cmd = info["command"]
    assert ((cmd[:, 0] >= -0.5) & (cmd[:, 0] <= -0.4)).all() and ((cmd[:, 2] >= 0.2) & (cmd[:, 2] <= 0.3)).all()
    _, _, _, _, info = env.step(np.zeros((4, 12)))
    np.testing.assert_allclose(info["reward_terms"]["alive"], 5.0 * env.control_dt)


def test_pd_targets_move_joints_toward_action(make):
    env = make(2, kp=100.0, kd=2.0)
    env.reset(seed=0)
    action = np.zeros((2, 12))
    action[0, 0] = -1.0  # FR hip target: nominal - 0.25 rad
    for _ in range(10):
        obs, *_ = env.step(action)
    assert obs[0, 12] < -0.15 and abs(obs[1, 12]) < 0.05


def test_torques_clipped_to_urdf_limits(make):
    env = make(1, kp=1e4)
    env.reset(seed=0)
    env.step(np.ones((1, 12)))
    np.testing.assert_array_equal(env.torque_limits[0], [20.0, 55.0, 55.0] * 4)  # a1.urdf <limit effort>
    np.testing.assert_array_equal(np.abs(env.robot_state.torques[0]), env.torque_limits[0])


def test_zero_action_stands(make):
    env = make(4)
    env.reset(seed=0)
    for _ in range(100):
        _, _, term, _, _ = env.step(np.zeros((4, 12)))
        assert not term.any()
    assert (env.robot_state.base_pos[:, 2] > 0.25).all()


def test_robot_state_foot_and_trunk_contact(make):
    no_falls = {"min_base_height": 0.0, "max_tilt": 3.2, "trunk_contact": False}
    env = make(3, autoreset_mode="Disabled", termination=no_falls)
    env.reset(seed=0)
    state = env.robot_state
    assert state.foot_contact.shape == (3, 4) and state.foot_contact.dtype == np.bool_
    assert state.leg_contact.shape == (3, 8) and state.leg_contact.dtype == np.bool_
    assert not state.foot_contact.any() and not state.trunk_contact.any()  # no physics step saw the new pose yet
    for _ in range(20):
        env.step(np.zeros((3, 12)))
    assert state.foot_contact.all() and not state.trunk_contact.any()  # standing on its four feet
    assert not state.leg_contact.any()  # on its feet only: no thigh or calf touches the ground
    world = env._clusters[0][1]
    x, y, _ = state.base_pos[1]
    on_its_back = p.getQuaternionFromEuler([np.pi, 0.0, 0.0])
    p.resetBasePositionAndOrientation(world._robots[1], [x, y, 0.4], on_its_back, physicsClientId=world._client)
    x, y, _ = state.base_pos[2]
    p.resetBasePositionAndOrientation(world._robots[2], [x, y, 1.5], [0, 0, 0, 1], physicsClientId=world._client)
    env.step(np.zeros((3, 12)))
    assert not state.foot_contact[2].any() and not state.trunk_contact[2]  # dropped: in the air
    for _ in range(20):
        env.step(np.zeros((3, 12)))
    assert state.trunk_contact[1] and not state.foot_contact[1].all()  # fallen on its back
    assert state.foot_contact[0].all() and not state.trunk_contact[0]  # its neighbour still stands


def test_robot_state_is_read_only_and_current(make):
    env = make(2)
    env.reset(seed=0)
    state = env.robot_state
    for name in ("base_pos", "joint_pos", "torques", "foot_contact", "trunk_contact", "leg_contact"):
        with pytest.raises(ValueError, match="read-only"):
            getattr(state, name)[0] = 0
    before = state.joint_pos.copy()
    env.step(np.ones((2, 12)))
    assert env.robot_state is state and not np.array_equal(state.joint_pos, before)


def test_fall_terminates(make):
    env = make(2, termination={"min_base_height": 0.5})  # spawn height 0.32 < 0.5: "fallen"
    env.reset(seed=0)
    _, _, term, trunc, _ = env.step(np.zeros((2, 12)))
    assert term.all() and not trunc.any()


def test_truncation_at_max_episode_steps(make):
    env = make(2, max_episode_steps=5)
    env.reset(seed=0)
    truncs = [env.step(np.zeros((2, 12)))[3].copy() for _ in range(5)]
    assert not np.any(truncs[:4]) and truncs[4].all()


def test_default_episode_is_1000_steps_of_50_hz(make):
    env = make(1)
    assert env.max_episode_steps == 1000 and env.control_dt == pytest.approx(0.02)
    assert env.metadata["render_fps"] == 50


# --------------------------------------------------------------------------- autoreset
def test_next_step_autoreset(make):
    env = make(3, max_episode_steps=3)
    assert env.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
    env.reset(seed=0)
    acts = _actions(3, steps=5)
    for t in range(3):
        obs, rew, term, trunc, info = env.step(acts[t])
    assert trunc.all()
    final_cmd = obs[:, CMD].copy()
    obs, rew, term, trunc, info = env.step(acts[3])  # the restart step: actions ignored
    np.testing.assert_array_equal(rew, 0.0)
    assert not term.any() and not trunc.any()
    np.testing.assert_array_equal(obs[:, LAST_ACTION], 0.0)
    np.testing.assert_array_equal(obs[:, 24:36], 0.0)  # at rest
    assert info["_command"].all() and not np.array_equal(info["command"].astype(np.float32), final_cmd)
    np.testing.assert_allclose(obs[:, CMD], info["command"].astype(np.float32))
    truncs = [env.step(acts[4])[3] for _ in range(3)]
    assert not np.any(truncs[:2]) and truncs[2].all()  # the new episode has 3 steps after the restart


def test_same_step_autoreset_final_obs(make):
    env = make(3, max_episode_steps=2, autoreset_mode=AutoresetMode.SAME_STEP)
    env.reset(seed=0)
    env.step(np.zeros((3, 12)))
    action = _actions(3)[0]
    obs, rew, _, trunc, info = env.step(action)
    assert trunc.all()
    assert info["_final_obs"].all() and info["final_obs"].dtype == object
    final = np.stack(info["final_obs"])
    np.testing.assert_allclose(final[:, LAST_ACTION], action)
    np.testing.assert_array_equal(obs[:, LAST_ACTION], 0.0)  # obs is the reset obs
    assert "reward_terms" in info["final_info"] and info["final_info"]["_reward_terms"].all()
    assert (rew != 0).all()  # the reward of the final step is kept
    _, _, _, trunc, _ = env.step(np.zeros((3, 12)))
    assert not trunc.any()


def test_same_step_only_done_envs_get_final_obs(make):
    env = make(2, max_episode_steps=2, autoreset_mode="SameStep")
    env.reset(seed=0)
    env.reset(options={"reset_mask": np.array([False, True])})  # env 1 restarts its counter
    env.step(np.zeros((2, 12)))
    env.reset(options={"reset_mask": np.array([False, True])})
    _, _, _, trunc, info = env.step(np.zeros((2, 12)))
    assert trunc.tolist() == [True, False]
    assert info["_final_obs"].tolist() == [True, False] and info["final_obs"][1] is None


def test_disabled_autoreset_and_reset_mask(make):
    env = make(3, max_episode_steps=2, autoreset_mode=AutoresetMode.DISABLED)
    env.reset(seed=0)
    env.step(np.full((3, 12), 0.5))
    obs_done, _, _, trunc, _ = env.step(np.full((3, 12), 0.5))  # no autoreset: the envs wait for reset()
    assert trunc.all() and (obs_done[:, LAST_ACTION] == 0.5).all()
    with pytest.raises(AssertionError, match=r"envs \[0, 1, 2\]"):  # as SyncVectorEnv: a finished env is not stepped
        env.step(np.zeros((3, 12)))
    mask = np.array([True, False, True])
    obs, info = env.reset(options={"reset_mask": mask})
    assert info["_command"].tolist() == mask.tolist()
    np.testing.assert_array_equal(obs[1], obs_done[1])  # untouched env keeps its obs
    np.testing.assert_array_equal(obs[[0, 2], LAST_ACTION], 0.0)
    with pytest.raises(AssertionError, match=r"envs \[1\]"):
        env.step(np.zeros((3, 12)))
    obs, _ = env.reset(options={"reset_mask": np.array([False, True, False])})
    env.step(np.zeros((3, 12)))
    _, _, _, trunc, _ = env.step(np.zeros((3, 12)))
    assert trunc.all()


@pytest.mark.parametrize(
    "mask, error",
    [
        (np.array([1, 0, 1]), TypeError),
        ([True, False, True], TypeError),
        (np.array([True, False]), ValueError),
        (np.zeros(3, bool), ValueError),
    ],
)
def test_bad_reset_mask_raises(make, mask, error):
    env = make(3)
    env.reset(seed=0)
    with pytest.raises(error, match="reset_mask"):
        env.reset(options={"reset_mask": mask})


def test_invalid_autoreset_mode(make):
    with pytest.raises(ValueError, match="autoreset_mode"):
        make(1, autoreset_mode="sometimes")


# --------------------------------------------------------------------------- seeding
def test_seed_int_equals_seed_list_and_repeats(make):
    a = make(3)
    b = make(3)
    obs_a, _ = a.reset(seed=10)
    obs_b, _ = b.reset(seed=[10, 11, 12])
    np.testing.assert_array_equal(obs_a, obs_b)
    obs_c, _ = a.reset(seed=10)
    np.testing.assert_array_equal(obs_a, obs_c)
    obs_d, _ = a.reset(seed=11)
    np.testing.assert_array_equal(obs_d[:2], obs_a[1:])  # env i gets seed + i
    assert not np.array_equal(obs_d[2], obs_a[2])


def test_unseeded_reset_continues_each_stream(make):
    a = make(2)
    first, _ = a.reset(seed=3)
    second, _ = a.reset()
    assert not np.array_equal(first[:, CMD], second[:, CMD])
    b = make(2)
    b.reset(seed=3)
    again, _ = b.reset()
    np.testing.assert_array_equal(second, again)


def test_seed_list_with_none_keeps_that_env_stream(make):
    a = make(2)
    a.reset(seed=[5, 6])
    obs, _ = a.reset(seed=[None, 6])
    b = make(2)
    b.reset(seed=[5, 6])
    obs_b, _ = b.reset()
    np.testing.assert_array_equal(obs[0], obs_b[0])
    np.testing.assert_array_equal(obs[1], b.reset(seed=[None, 6])[0][1])


@pytest.mark.parametrize("seed", [[1, 2], [1, 2, 3, 4], "7", [1, -2, 3], [1.5, 2, 3], -1, 1.5, True, 2**63 - 2])
def test_bad_seed_raises(make, seed):
    env = make(3)
    with pytest.raises(ValueError, match="seed"):
        env.reset(seed=seed)


# --------------------------------------------------------------------------- bad input
def test_wrong_action_shape_raises_with_expected_shape(make):
    env = make(3)
    env.reset(seed=0)
    for bad in (np.zeros((3, 11)), np.zeros(12), np.zeros((2, 12)), [[0.0] * 12]):
        with pytest.raises(ValueError, match=r"\(3, 12\)"):
            env.step(bad)
    for bad in ([["a"] * 12] * 3, [["0.5"] * 12] * 3, np.zeros((3, 12), complex), 0.5):
        with pytest.raises(TypeError, match="actions"):
            env.step(bad)


@pytest.mark.parametrize("bad_value", [np.nan, np.inf, -np.inf])
def test_non_finite_actions_raise_naming_envs_and_do_not_step(make, bad_value):
    env = make(4)
    ref = make(4)
    env.reset(seed=0)
    ref.reset(seed=0)
    acts = _actions(4, steps=2)
    env.step(acts[0])
    ref.step(acts[0])
    bad = acts[1].copy()
    bad[1, 3] = bad_value
    bad[3, 0] = bad_value
    with pytest.raises(ValueError, match=r"\[1, 3\]"):
        env.step(bad)
    # nothing happened: the next valid step matches an env that never saw the bad actions
    out = env.step(acts[1])
    expected = ref.step(acts[1])
    for got, want in zip(out[:4], expected[:4]):
        np.testing.assert_array_equal(got, want)


def test_actions_outside_bounds_are_clipped(make):
    a = make(2)
    b = make(2)
    a.reset(seed=0)
    b.reset(seed=0)
    big = np.array([[5.0] * 12, [-3.0] * 12])
    obs_a, rew_a, *_ = a.step(big)
    obs_b, rew_b, *_ = b.step(np.clip(big, -1, 1))
    np.testing.assert_array_equal(obs_a, obs_b)
    np.testing.assert_array_equal(rew_a, rew_b)


def test_step_before_reset_and_after_close(make):
    env = make(2)
    with pytest.raises(ResetNeeded):
        env.step(np.zeros((2, 12)))
    env.reset(seed=0)
    env.close()
    env.close()  # idempotent
    assert env.closed
    with pytest.raises(ClosedEnvironmentError):
        env.step(np.zeros((2, 12)))
    with pytest.raises(ClosedEnvironmentError):
        env.reset()


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"num_envs": 0}, "num_envs"),
        ({"envs_per_cluster": 0}, "envs_per_cluster"),
        ({"dt": -0.01}, "dt"),
        ({"substeps": 0}, "substeps"),
        ({"max_episode_steps": 0}, "max_episode_steps"),
        ({"kp": -1.0}, "kp"),
        ({"kd": [0.5] * 11}, "kd"),
        ({"lin_vel_x_range": (1.0, 0.0)}, "lin_vel_x_range"),
        ({"render_mode": "human"}, "render_mode"),
        ({"reward_weights": {"speed": 1.0}}, "speed"),
        ({"termination": {"max_roll": 1.0}}, "termination"),
    ],
)
def test_bad_constructor_arguments_raise_naming_them(kwargs, name):
    kwargs = {"num_envs": 1, **kwargs}
    with pytest.raises(ValueError, match=name):
        UniLabVectorEnv(**kwargs)


def test_single_env_bad_action(make):
    env = QuadrupedEnv()
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"\(12,\)"):
        env.step(np.zeros(13))
    with pytest.raises(ValueError, match="NaN"):
        env.step(np.full(12, np.nan))
    env.close()


# --------------------------------------------------------------------------- rendering
def _mesh_count(world):
    """Visual shapes drawn from mesh files (geometry type 5); collision-derived ones have none."""
    return sum(
        sum(1 for shape in p.getVisualShapeData(r, physicsClientId=world._client) if shape[2] == p.GEOM_MESH)
        for r in world._robots
    )


def test_visual_shapes_load_only_for_rendering(make):
    plain = make(2)
    rendering = make(4, render_mode="rgb_array", envs_per_cluster=2)
    assert _mesh_count(plain._clusters[0][1]) == 0
    assert _mesh_count(rendering._clusters[0][1]) > 0
    assert _mesh_count(rendering._clusters[1][1]) == 0


def test_rgb_array_frames_of_env_0_and_same_physics(make):
    plain = make(2)
    rendering = make(2, render_mode="rgb_array")
    assert plain.render() is None
    plain.reset(seed=0)
    rendering.reset(seed=0)
    for action in _actions(2, steps=5):
        a = plain.step(action)
        b = rendering.step(action)
        np.testing.assert_array_equal(a[0], b[0])
    frames = rendering.render()
    assert len(frames) == 2
    frame = frames[0]
    assert frame.shape == (240, 320, 3) and frame.dtype == np.uint8
    assert frame.std() > 5  # a picture, not a blank image


def test_record_video_writes_a_file(tmp_path):
    env = gym.make_vec(ID, num_envs=2, render_mode="rgb_array", max_episode_steps=5)
    env = gym.wrappers.vector.RecordVideo(env, str(tmp_path), episode_trigger=lambda ep: ep == 0, disable_logger=True)
    env.reset(seed=0)
    for _ in range(7):
        env.step(np.zeros((2, 12)))
    env.close()
    assert list(tmp_path.glob("*.mp4"))

    single = gym.wrappers.RecordVideo(
        gym.make(ID, render_mode="rgb_array"), str(tmp_path / "single"), disable_logger=True
    )
    single.reset(seed=0)
    for _ in range(3):
        single.step(np.zeros(12))
    single.close()
    assert list((tmp_path / "single").glob("*.mp4"))


# --------------------------------------------------------------------------- vector API, wrappers
def test_call_get_attr_set_attr(make):
    env = make(3)
    assert env.get_attr("max_episode_steps") == (1000, 1000, 1000)
    assert env.call("render_mode") == (None, None, None)
    env.set_attr("max_episode_steps", 7)
    assert env.max_episode_steps == 7
    env.set_attr("max_episode_steps", [9, 9, 9])
    assert env.get_attr("max_episode_steps") == (9, 9, 9)
    with pytest.raises(ValueError, match="num_envs"):
        env.set_attr("max_episode_steps", [1, 2])
    with pytest.raises(ValueError, match="equal"):
        env.set_attr("max_episode_steps", [1, 2, 3])
    with pytest.raises(AttributeError):
        env.get_attr("no_such_attribute")


def test_gymnasium_vector_wrappers():
    from gymnasium.wrappers.vector import ClipAction, NormalizeObservation, RecordEpisodeStatistics

    env = gym.make_vec(ID, num_envs=3, max_episode_steps=4)
    env = RecordEpisodeStatistics(ClipAction(NormalizeObservation(env)))
    obs, _ = env.reset(seed=0)
    assert obs.shape == (3, 48)
    episodes = []
    for _ in range(5):
        obs, _, _, _, info = env.step(np.full((3, 12), 3.0))
        if "episode" in info:
            episodes.append(info["episode"])
    assert len(episodes) == 1 and (episodes[0]["l"] == 4).all()
    assert np.abs(obs).max() < 20  # normalized
    env.close()
