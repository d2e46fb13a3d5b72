"""UniLab/Quadrotor-v0 (issue 27, item 5): the rotor model, the external-force actuation hook, the task math, the
Gymnasium contract and determinism per env."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env, data_equivalence
from gymnasium.vector import AutoresetMode, SyncVectorEnv

import unilab_gym
from unilab_gym.envs_quadrotor import QuadrotorEnv, QuadrotorVectorEnv
from unilab_gym.registration import QUADROTOR_ID
from unilab_gym.robots import A1, RobotDescription
from unilab_gym.robots.quadrotors import CF2X
from unilab_gym.sim import rotor, world
from unilab_gym.sim.rotation import quat_rotate_inverse
from unilab_gym.tasks.quadrotor import OBS_LAYOUT, QuadrotorConfig, QuadrotorTask, motor_rpm

# short episodes that often crash (a high floor): autoresets every few steps
SHORT = dict(max_episode_steps=6, termination={"min_height": 0.99})


def test_rotor_constants_are_gym_pybullet_drones_cf2x_and_hover_carries_the_weight():
    model = rotor.CF2X
    assert (model.mass, model.kf, model.km, model.thrust_to_weight) == (0.027, 3.16e-10, 7.94e-12, 2.25)
    np.testing.assert_allclose(np.hypot(*np.array(model.rotor_xy).T), 0.0397, rtol=3e-3)  # the URDF's arm
    assert rotor.GRAVITY == world.GRAVITY
    hover = model.wrench(np.full((1, 4), model.hover_rpm))[0]
    np.testing.assert_allclose(hover, [0, 0, model.mass * world.GRAVITY, 0, 0, 0], atol=1e-15)
    np.testing.assert_allclose(model.max_rpm / model.hover_rpm, 1.5)  # sqrt(2.25)
    # left rotors (0, 1: y > 0) faster: +x torque; front (0, 3) faster: -y torque; rotors 1, 3 faster: +z torque
    w = model.wrench(model.hover_rpm * (1 + 0.1 * np.array([[1, 1, -1, -1], [1, -1, -1, 1], [-1, 1, -1, 1.0]])))
    assert w[0, 3] > 0 and w[1, 4] < 0 and w[2, 5] > 0
    assert np.count_nonzero(np.abs(w[:, 3:]) > 1e-12) == 3  # each command moves one axis only
    with pytest.raises(ValueError, match="kf"):
        rotor.RotorModel(0.027, 0.0, 1e-12, model.rotor_xy, model.spin, 2.25)


def test_zero_action_hovers_in_place_and_the_observation_says_where_the_target_is(closing):
    env = closing(QuadrotorVectorEnv(3, envs_per_cluster=2))
    obs, info = env.reset(seed=0)
    start = env.robot_state.base_pos.copy()
    assert env.single_action_space.shape == (4,) and obs.shape == (3, 22)
    np.testing.assert_array_equal(start[:, [0, 2]], [[0.0, 1.0]] * 3)  # lanes from the episode seed, 1 m up
    np.testing.assert_allclose(obs[:, slice(*OBS_LAYOUT["position_error"])], -info["command"], rtol=1e-6)
    for _ in range(30):
        obs, _, terminated, truncated, info = env.step(np.zeros((3, 4)))
    np.testing.assert_allclose(env.robot_state.base_pos, start, atol=1e-9)  # thrust = weight exactly
    np.testing.assert_allclose(obs[:, slice(*OBS_LAYOUT["rotation"])], np.tile(np.eye(3).ravel(), (3, 1)), atol=1e-6)
    distance = np.linalg.norm(env.command, axis=1)
    np.testing.assert_allclose(-info["reward_terms"]["distance"], distance * env.control_dt, rtol=1e-6)
    assert info["is_success"].dtype == bool and not terminated.any() and not truncated.any()
    np.testing.assert_array_equal(info["is_success"], distance < 0.1)


def test_rotor_wrench_turns_the_body_at_torque_over_the_urdf_inertia(closing):
    """The engine applies the task's wrench in the body frame every substep, on the URDF's inertia (1.4e-5 kg·m^2
    about x; pybullet's own estimate from the collision disc is 2.7x that), also after a mass change."""
    action = np.array([[0.1, 0.1, -0.1, -0.1]])
    torque = rotor.CF2X.wrench(motor_rpm(action, 0.2))[0, 3]
    for added, inertia in ((0.0, 1.4e-5), (0.027, 2.8e-5)):  # doubling the mass doubles the inertia
        env = closing(QuadrotorVectorEnv(1, domain_randomization={"added_mass": added}))
        env.reset(seed=1)
        env.step(action)
        omega = env.robot_state.ang_vel[0]
        np.testing.assert_allclose(omega[0], torque / inertia * env.control_dt, rtol=2e-3)  # pybullet's damping
        np.testing.assert_allclose(omega[1:], 0.0, atol=1e-12)


def _task_on(positions, velocities, up=None):
    """A QuadrotorTask of N envs observing hand-made states at ``positions`` (relative to the start + target)."""
    n = len(positions)
    task = QuadrotorTask(n, QuadrotorConfig())
    task.command[:] = [0.1, -0.2, 0.3]
    state = world.RobotState.zeros(n, CF2X)
    state.base_quat[:] = [0, 0, 0, 1.0] if up is None else up
    state.base_pos[:] = [0.0, 5.0, 1.0]
    task.observe(state, np.zeros((n, 4)), np.zeros((n, 22), dtype=np.float32))  # the start is read here
    state.base_pos[:] = np.array([0.0, 5.0, 1.0]) + task.command + np.asarray(positions)
    state.lin_vel[:] = velocities
    obs = np.zeros((n, 22), dtype=np.float32)
    task.observe(state, np.zeros((n, 4)), obs)
    return task, state, obs


def test_success_is_near_and_slow_and_crashes_are_low_tilted_or_far():
    positions = [[0.05, 0, 0], [0.05, 0, 0], [0.2, 0, 0], [0, 0, -1.2], [2.1, 0, 0]]
    velocities = [[0, 0.1, 0], [0, 0.3, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0]]
    task, state, obs = _task_on(positions, velocities)
    np.testing.assert_allclose(obs[:, :3], positions, atol=1e-6)
    terms, conditions = task.evaluate(state, np.zeros((5, 4)), np.zeros((5, 4)), np.zeros(5, dtype=bool))
    assert task.step_info()["is_success"].tolist() == [True, False, False, False, False]
    assert task.termination_names == ("too_low", "too_tilted", "too_far")
    np.testing.assert_array_equal(conditions[:, 0], [False, False, False, True, False])  # z = 1.3 - 1.2 < 0.2
    np.testing.assert_array_equal(conditions[:, 2], [False, False, False, False, True])  # > 2 m away
    assert list(terms) == ["distance", "velocity", "angular_rate", "action_rate", "alive"]
    tilt = np.array([np.sin(0.6), 0, 0, np.cos(0.6)])  # 1.2 rad about x: over the 1.0 rad limit
    task, state, _ = _task_on([[0, 0, 0]] * 2, [[0, 0, 0]] * 2, up=[tilt, [0, 0, np.sin(0.4), np.cos(0.4)]])
    _, conditions = task.evaluate(state, np.zeros((2, 4)), np.zeros((2, 4)), np.zeros(2, dtype=bool))
    assert conditions[:, 1].tolist() == [True, False]  # a yaw is no tilt


def test_registered_single_and_vector_envs_pass_the_checkers(closing):
    single = closing(gym.make(QUADROTOR_ID))
    assert isinstance(single, QuadrotorEnv)
    check_env(single, skip_render_check=True)
    assert closing(gym.make(QUADROTOR_ID, num_envs=3)).num_envs == 3
    vec = closing(gym.make_vec(QUADROTOR_ID, num_envs=2, max_episode_steps=5))
    assert isinstance(vec, QuadrotorVectorEnv) and vec.max_episode_steps == 5
    single.reset(seed=0)
    _, _, _, _, info = single.step(np.zeros(4))
    assert isinstance(info["is_success"], bool) and set(info["reward_terms"]) >= {"distance", "alive"}
    assert vec.task_config["robot"] == "cf2x"
    with pytest.raises(ValueError, match="joint_names"):
        QuadrotorVectorEnv(1, robot=A1)
    with pytest.raises(TypeError, match="lin_vel_x_range"):  # the Quadruped's arguments are not this task's
        QuadrotorVectorEnv(1, lin_vel_x_range=(0, 1))


@pytest.mark.parametrize("autoreset_mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_vector_env_equals_sync_vector_env_over_single_envs(closing, autoreset_mode):
    ours = closing(QuadrotorVectorEnv(3, autoreset_mode=autoreset_mode, **SHORT))
    ref = closing(SyncVectorEnv([lambda: gym.make(QUADROTOR_ID, **SHORT)] * 3, autoreset_mode=autoreset_mode))
    obs, info = ours.reset(seed=0)
    obs_r, info_r = ref.reset(seed=0)
    assert np.all(obs == obs_r) and data_equivalence(info, info_r, exact=True)
    ours.action_space.seed(0)
    ends = 0
    for step in range(14):
        actions = ours.action_space.sample()
        a, b = ours.step(actions), ref.step(actions)
        ends += int(a[2].sum() + a[3].sum())
        for name, x, y in zip(("obs", "reward", "terminated", "truncated", "info"), a, b):
            assert data_equivalence(x, y, exact=True), f"step {step}: {name} differs"
    assert ends >= 3


def _rollout(num_envs, envs_per_cluster, action_mode, seed=7, steps=25):
    env = QuadrotorVectorEnv(num_envs, envs_per_cluster=envs_per_cluster, max_episode_steps=12, action_mode=action_mode)
    try:
        obs, _ = env.reset(seed=seed)
        rng = np.random.default_rng(3)
        out = [obs]
        for _ in range(steps):
            obs, reward, terminated, truncated, info = env.step(rng.uniform(-1, 1, (8, 4))[:num_envs])
            success = info.get("is_success", np.zeros(num_envs, dtype=bool))
            out += [obs, reward, terminated, truncated, success]
        return out
    finally:
        env.close()


@pytest.mark.parametrize("action_mode", ["motor_speed", "thrust_rates"])
def test_env_i_matches_alone_whatever_envs_per_cluster(action_mode):
    """Bit for bit: 8 envs in 1, 3 or 8 worlds; env 5 alone (seeded 7 + 5) follows row 5 (lanes from the episode
    seed, no collisions between quadrotors)."""
    grouped = [_rollout(8, epc, action_mode) for epc in (8, 3, 1)]
    for other in grouped[1:]:
        for x, y in zip(grouped[0], other):
            np.testing.assert_array_equal(x, y)
    alone_env = QuadrotorVectorEnv(1, max_episode_steps=12, action_mode=action_mode)
    try:
        obs, _ = alone_env.reset(seed=12)
        rng = np.random.default_rng(3)
        np.testing.assert_array_equal(obs[0], grouped[0][0][5])
        for k in range(25):
            obs, reward, *_ = alone_env.step(rng.uniform(-1, 1, (8, 4))[5:6])
            np.testing.assert_array_equal(obs[0], grouped[0][1 + 5 * k][5])
            np.testing.assert_array_equal(reward[0], grouped[0][2 + 5 * k][5])
    finally:
        alone_env.close()


def test_zero_joint_descriptions_are_accepted_and_quadruped_tasks_still_refuse_them():
    assert CF2X.num_joints == 0 and CF2X.use_urdf_inertia and not A1.use_urdf_inertia
    assert RobotDescription.from_dict(CF2X.to_dict()) == CF2X
    with pytest.raises(ValueError, match="use_urdf_inertia"):
        RobotDescription(**{**CF2X.to_dict(), "use_urdf_inertia": "yes"})
    with pytest.raises(ValueError, match="12"):
        unilab_gym.UniLabVectorEnv(1, robot=CF2X)


def test_thrust_and_body_rates_mode_hovers_at_zero_and_tracks_a_rate_command_in_one_step(closing):
    env = closing(QuadrotorVectorEnv(3, action_mode="thrust_rates", max_body_rate=3.0))
    env.reset(seed=0)
    start = env.robot_state.base_pos.copy()
    for _ in range(10):
        env.step(np.zeros((3, 4)))
    np.testing.assert_allclose(env.robot_state.base_pos, start, atol=1e-9)
    action = np.array([[0.1, 0.5, 0, 0], [0.1, 0, -0.5, 0], [0.1, 0, 0, 0.5]])
    env.step(action)
    state = env.robot_state
    body_rates = quat_rotate_inverse(state.base_quat, state.ang_vel)
    np.testing.assert_allclose(body_rates, np.diag([1.5, -1.5, 1.5]), atol=1.5 * 2e-3)  # pybullet's damping
    with pytest.raises(ValueError, match="action_mode"):
        QuadrotorVectorEnv(1, action_mode="attitude")


def test_rotor_speeds_for_a_wrench_invert_the_wrench_and_saturate():
    model = rotor.CF2X
    weight = model.mass * world.GRAVITY
    torque = np.array([[1e-4, -2e-4, 3e-6], [0.0, 0.0, 0.0]])
    rpm = model.rotor_rpm(np.array([weight, 3 * weight]), torque)
    np.testing.assert_allclose(model.wrench(rpm[:1])[0], [0, 0, weight, *torque[0]], rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(rpm[1], model.max_rpm)  # 3 x the weight is over the 2.25 the rotors have
