"""Robots as data (issue 27, item 2): the four shipped quadrupeds, a user's RobotDescription, and clear errors."""

import dataclasses
import json
import re
import shutil
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import unilab_gym  # noqa: F401  (registers the ids)
from unilab_gym import UniLabVectorEnv
from unilab_gym.robots import A1, MINI_CHEETAH, ROBOTS, RobotDescription, get_robot
from unilab_gym.sim import world as world_module
from unilab_gym.sim.rotation import roll_pitch

NAMES = ["a1", "aliengo", "laikago", "mini_cheetah"]


def test_the_four_quadrupeds_ship_and_a1_is_the_default(closing):
    assert sorted(ROBOTS) == sorted(NAMES)
    env = closing(UniLabVectorEnv(1))
    assert env.robot is A1 and env.task_config["robot"] == "a1"


@pytest.mark.parametrize("name", NAMES)
def test_each_robot_stands_in_its_nominal_pose_under_zero_action_for_10_s(name, closing):
    """10 s of sim time (500 control steps of 20 ms) of zero actions from the reset distribution (nominal pose +
    0.05 rad noise): no fall, the base at the robot's standing height, level, on its four feet only."""
    env = closing(gym.make_vec("UniLab/Quadruped-v0", num_envs=2, envs_per_cluster=2, robot=name))
    robot = ROBOTS[name]
    env.reset(seed=3)
    assert env.unwrapped.control_dt * 500 == pytest.approx(10.0)
    heights = []
    for _ in range(500):
        _, _, terminated, truncated, _ = env.step(np.zeros((2, 12)))
        assert not terminated.any() and not truncated.any()
        heights.append(env.unwrapped.robot_state.base_pos[:, 2].copy())
    state = env.unwrapped.robot_state
    np.testing.assert_allclose(heights[-1], robot.standing_height, atol=0.02)
    assert min(h.min() for h in heights) > 0.8 * robot.standing_height
    roll, pitch = roll_pitch(state.base_quat)
    assert np.abs(roll).max() < 0.1 and np.abs(pitch).max() < 0.1
    assert state.foot_contact.all() and not state.leg_contact.any() and not state.trunk_contact.any()
    assert np.abs(state.base_pos[:, 0]).max() < 0.1  # stood still, did not walk off
    assert np.abs(state.joint_vel).max() < 0.1  # at rest: no PD chatter (kd 3.5 on the Aliengo chattered and slid)


@pytest.mark.parametrize("name", NAMES)
def test_robot_kwarg_reaches_the_worlds_and_the_task_config(name, closing):
    robot = ROBOTS[name]
    env = closing(gym.make("UniLab/Quadruped-v0", num_envs=3, envs_per_cluster=2, robot=name))
    assert env.robot is robot and env.task_config["robot"] == name
    np.testing.assert_array_equal(env.kp, np.tile(robot.kp, (3, 1)))
    np.testing.assert_array_equal(env.kd, np.tile(robot.kd, (3, 1)))
    np.testing.assert_array_equal(env.nominal_joint_pos[0], robot.nominal_joint_pos)
    assert env.action_scale == robot.action_scale and env.config.base_height_target == robot.standing_height
    if robot.torque_limits is not None:
        np.testing.assert_array_equal(env.torque_limits[0], robot.torque_limits)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (3, 48)
    np.testing.assert_allclose(obs[:, 12:24], 0.0, atol=env.config.init_joint_noise + 1e-6)  # near the nominal pose
    single = gym.make("UniLab/Quadruped-v0", robot=name)
    try:
        obs1, _ = single.reset(seed=0)
        assert obs1.shape == (48,) and single.unwrapped.task_config["robot"] == name
    finally:
        single.close()


def test_explicit_gains_override_the_robot_defaults(closing):
    env = closing(UniLabVectorEnv(1, robot="laikago", kp=50.0, kd=1.0, action_scale=0.1, base_height_target=0.45))
    assert env.task_config["kp"] == [50.0] * 12 and env.action_scale == 0.1 and env.config.base_height_target == 0.45


def test_a_user_description_works_and_its_task_config_rebuilds_it(tmp_path, closing):
    mine = dataclasses.replace(A1, name="my_a1", kp=(25.0,) * 12, standing_height=0.28)
    env = closing(UniLabVectorEnv(2, robot=mine, max_episode_steps=5))
    assert env.task_config["robot"] == mine.to_dict()  # not a shipped robot: the whole description
    json.dumps(env.task_config)
    env.reset(seed=1)
    for _ in range(5):
        env.step(np.zeros((2, 12)))
    path = env.save_parameter_trace(tmp_path / "trace.jsonl")
    header = json.loads(path.read_text().splitlines()[0])
    assert header["env"]["robot"]["name"] == "my_a1"
    again = closing(UniLabVectorEnv(2, **env.task_config))
    assert again.robot == mine and again.kp[0, 0] == 25.0
    assert RobotDescription.from_dict(mine.to_dict()) == mine


def test_a_user_urdf_given_by_absolute_path_loads(closing):
    mine = dataclasses.replace(A1, name="abs_a1", urdf=A1.urdf_path)
    env = closing(UniLabVectorEnv(1, robot=mine))
    assert env.robot.urdf_path == A1.urdf_path


def test_the_task_config_names_a_shipped_robot_in_the_trace_header(tmp_path, closing):
    env = closing(UniLabVectorEnv(1, robot="mini_cheetah", max_episode_steps=2))
    env.reset(seed=0)
    env.step(np.zeros((1, 12)))
    env.step(np.zeros((1, 12)))
    header = json.loads(env.save_parameter_trace(tmp_path / "t.jsonl").read_text().splitlines()[0])
    assert header["env"]["robot"] == "mini_cheetah"


# --------------------------------------------------------------------------------------- bad descriptions
def _bad(**changes):
    return dataclasses.replace(A1, name="bad", **changes)


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"urdf": "no/such/robot.urdf"}, ["urdf", "no/such/robot.urdf", "pybullet_data"]),
        ({"urdf": "/nonexistent/dir/robot.urdf"}, ["urdf", "/nonexistent/dir/robot.urdf"]),
        ({"kp": (20.0,) * 11}, ["kp", "12 values", "11"]),
        ({"kd": (0.5, -0.5) * 6}, ["kd", ">= 0"]),
        ({"nominal_joint_pos": (0.0,) * 13}, ["nominal_joint_pos", "12 values"]),
        ({"nominal_joint_pos": 0.1}, ["nominal_joint_pos", "sequence of 12"]),
        ({"torque_limits": (10.0,) * 12 + (1.0,)}, ["torque_limits", "12 values"]),
        ({"torque_limits": (0.0,) * 12}, ["torque_limits", "> 0"]),
        ({"joint_names": A1.joint_names[:11] + A1.joint_names[:1]}, ["joint_names", "more than once"]),
        ({"spawn_height": 0.0}, ["spawn_height"]),
        ({"foot_links": "FR_toe"}, ["foot_links", "sequence"]),
    ],
)
def test_a_bad_description_names_the_field(changes, words):
    with pytest.raises(ValueError) as raised:
        _bad(**changes)
    for word in words:
        assert word in str(raised.value)


@pytest.fixture
def clients(monkeypatch):
    """The ids of every pybullet client the physics layer connects during the test."""
    made = []
    connect = world_module.p.connect

    def recording(*args, **kwargs):
        made.append(connect(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(world_module.p, "connect", recording)
    return made


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"joint_names": ("FR_hip_jiont", *A1.joint_names[1:])}, ["joint_names", "FR_hip_jiont", "FR_upper_joint"]),
        ({"foot_links": ("FR_toe", "FL_toe", "RR_toe", "RL_foot")}, ["foot_links", "RL_foot", "RL_toe"]),
        ({"contact_links": ("FR_thigh",)}, ["contact_links", "FR_thigh", "FR_upper"]),
        ({"base_link": "base"}, ["base_link", "'base'", "'trunk'"]),
        ({"end_effector_link": "gripper"}, ["end_effector_link", "gripper"]),
    ],
)
def test_an_unknown_joint_or_link_name_is_named_with_the_urdf_and_the_valid_names(changes, words, clients):
    with pytest.raises(ValueError) as raised:
        UniLabVectorEnv(2, envs_per_cluster=1, robot=_bad(**changes))
    message = str(raised.value)
    for word in [*words, A1.urdf_path]:
        assert word in message
    assert clients and not any(world_module.p.isConnected(c) for c in clients)  # nothing left connected


def test_a_urdf_without_effort_limits_needs_torque_limits(clients):
    unlimited = dataclasses.replace(MINI_CHEETAH, name="mc_urdf_limits", torque_limits=None)
    with pytest.raises(ValueError, match="torque_limits") as raised:
        UniLabVectorEnv(1, robot=unlimited)
    assert "torso_to_abduct_fr_j" in str(raised.value)
    assert not any(world_module.p.isConnected(c) for c in clients)


def test_the_quadruped_task_refuses_a_robot_without_12_joints_and_4_feet():
    three_legs = dataclasses.replace(
        A1, name="tripod", joint_names=A1.joint_names[:9], nominal_joint_pos=A1.nominal_joint_pos[:9], kp=20.0, kd=0.5
    )
    with pytest.raises(ValueError, match="12 joint_names and 4 foot_links"):
        UniLabVectorEnv(1, robot=three_legs)


def test_an_unknown_robot_name_lists_the_shipped_ones():
    with pytest.raises(ValueError, match="robot must be one of") as raised:
        UniLabVectorEnv(1, robot="go2")
    assert all(name in str(raised.value) for name in NAMES)
    with pytest.raises(TypeError, match="robot must be"):
        get_robot(3)


def test_added_mass_is_checked_against_the_robots_own_trunk():
    """-4 kg is valid on the A1's 4.713 kg trunk but would leave the Mini Cheetah's 3.3 kg body no mass."""
    dr = {"added_mass": (-4.0, 0.0)}
    UniLabVectorEnv(1, domain_randomization=dr).close()
    with pytest.raises(ValueError, match=r"domain_randomization\['added_mass'\].*mini_cheetah"):
        UniLabVectorEnv(1, robot="mini_cheetah", domain_randomization=dr)


# --------------------------------------------------------------------------------------- determinism per robot
def _rollout(name, envs_per_cluster, steps=40):
    env = UniLabVectorEnv(
        4, envs_per_cluster=envs_per_cluster, robot=name, max_episode_steps=15, termination={"max_tilt": 0.3}
    )
    try:
        rng = np.random.default_rng(9)
        obs, _ = env.reset(seed=21)
        out = [obs]
        rew, term, trunc = [], [], []
        for _ in range(steps):
            obs, r, te, tr, _ = env.step(rng.uniform(-1, 1, (4, 12)))
            out.append(obs)
            rew.append(r)
            term.append(te)
            trunc.append(tr)
    finally:
        env.close()
    return np.stack(out), np.stack(rew), np.stack(term), np.stack(trunc)


@pytest.mark.parametrize("name", NAMES)
def test_each_robot_is_deterministic_per_env_whatever_envs_per_cluster(name):
    alone = _rollout(name, 1)
    grouped = _rollout(name, 4)
    assert alone[3].any(), "the scenario should contain truncations and autoresets"
    for a, b, what in zip(alone, grouped, ("obs", "reward", "terminated", "truncated")):
        np.testing.assert_array_equal(a, b, err_msg=f"{name}: {what} differs between envs_per_cluster 1 and 4")


def test_the_add_a_robot_page_runs():
    """docs/add-a-robot.md's code blocks, run in order in one namespace as a reader pastes them, with the worked
    example's training shortened (the page quotes what the full run gives): the user robot loads, the task passes
    Gymnasium's check_env, registers, trains with SB3 and is evaluated."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "add-a-robot.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    assert len(blocks) >= 5
    shorter = {"total_timesteps = 300_000": "total_timesteps = 256", "episodes=64": "episodes=16"}
    for text in shorter:
        assert sum(text in block for block in blocks) == 1, text
    namespace: dict = {}
    try:
        for block in blocks:
            for text, short in shorter.items():
                block = block.replace(text, short)
            exec(compile(block, "docs/add-a-robot.md", "exec"), namespace)
        assert 0.0 <= namespace["random"] <= 1.0 and 0.0 <= namespace["trained"] <= 1.0
        assert namespace["model"].num_timesteps >= 256
    finally:
        gym.registry.pop("MyLab/IiwaReach-v0", None)
        if "urdf" in namespace:  # the page's copy of the URDF, in a folder of its own
            shutil.rmtree(Path(namespace["urdf"]).parent)
