"""Issue 27 item 4: ``UniLab/PandaReach-v0`` and ``UniLab/PandaPick-v0`` on the Franka Panda (fixed base), the
object layer of the physics (``sim/objects.py``) and the seam hooks they use."""

import gymnasium as gym
import numpy as np
import pybullet as p
import pytest
from gymnasium.utils.env_checker import check_env
from gymnasium.vector import SyncVectorEnv

import unilab_gym  # noqa: F401  (registers the ids)
from unilab_gym.envs_panda import PandaPickEnv, PandaPickVectorEnv, PandaReachEnv, PandaReachVectorEnv
from unilab_gym.robots import PANDA, ROBOTS
from unilab_gym.sim.world import RobotState
from unilab_gym.tasks.panda import (
    OBJECT_PARAMETERS,
    SUCCESS_DISTANCE,
    PandaPickConfig,
    PandaPickTask,
    PandaReachConfig,
    PandaReachTask,
)

REACH, PICK = "UniLab/PandaReach-v0", "UniLab/PandaPick-v0"
IDS = [REACH, PICK]
MODES = ["NextStep", "SameStep", "Disabled"]


def _actions(env, steps, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, (steps, env.num_envs, env.task.act_dim))


@pytest.mark.parametrize("env_id", IDS)
def test_registered_single_and_vector_envs_with_their_spaces(closing, env_id):
    single = closing(gym.make(env_id))
    vec = closing(gym.make(env_id, num_envs=3))
    made = closing(gym.make_vec(env_id, num_envs=2, max_episode_steps=4))
    reach = env_id == REACH
    assert isinstance(single.unwrapped, PandaReachEnv if reach else PandaPickEnv)
    assert isinstance(vec, PandaReachVectorEnv if reach else PandaPickVectorEnv)
    assert made.max_episode_steps == 4
    obs_dim, act_dim = (33, 7) if reach else (53, 4)
    assert single.observation_space.shape == (obs_dim,) and single.action_space.shape == (act_dim,)
    assert vec.observation_space.shape == (3, obs_dim) and vec.action_space.shape == (3, act_dim)
    with pytest.raises(ValueError, match="make_vec"):
        gym.make(env_id, num_envs=2, max_episode_steps=3)


def test_panda_is_not_a_robot_choice_of_quadruped_v0():
    assert "panda" not in ROBOTS and PANDA.fixed_base and PANDA.end_effector_link == "panda_grasptarget"
    with pytest.raises(ValueError, match="12 joint"):
        gym.make("UniLab/Quadruped-v0", num_envs=1, robot=PANDA)


@pytest.mark.parametrize("env_id", IDS)
def test_single_env_passes_gymnasium_check_env(closing, env_id):
    env = closing(gym.make(env_id))
    check_env(env.unwrapped, skip_render_check=True)
    _, info = env.reset(seed=3)
    _, _, _, _, info = env.step(env.action_space.sample())
    assert isinstance(info["is_success"], bool) and set(info["reward_terms"])


@pytest.mark.parametrize("mode", MODES)
def test_infos_key_for_key_like_sync_vector_env_with_autoresets(closing, mode):
    kwargs = dict(max_episode_steps=3)
    ours = closing(PandaPickVectorEnv(3, autoreset_mode=mode, **kwargs))
    ref = closing(SyncVectorEnv([lambda: gym.make(PICK, **kwargs)] * 3, autoreset_mode=mode))
    obs, info = ours.reset(seed=1)
    obs_r, info_r = ref.reset(seed=1)
    np.testing.assert_array_equal(obs, obs_r)
    done, seen = np.zeros(3, bool), False
    for t, action in enumerate(_actions(ours, 8)):
        if mode == "Disabled" and done.any():
            ours.reset(options={"reset_mask": done})
            ref.reset(options={"reset_mask": done.copy()})
        action = action.astype(np.float32)
        step, step_r = ours.step(action), ref.step(action)
        for a, b in zip(step[:4], step_r[:4]):
            np.testing.assert_array_equal(a, b, err_msg=f"step {t}")
        info, info_r = step[4], step_r[4]
        assert sorted(info) == sorted(info_r), t
        for key in ("is_success", "_is_success"):
            if key in info_r:
                np.testing.assert_array_equal(info[key], info_r[key])
        if "final_info" in info_r:
            np.testing.assert_array_equal(info["final_info"]["is_success"], info_r["final_info"]["is_success"])
        done = step[2] | step[3]
        seen = seen or "is_success" in info
    assert seen


@pytest.mark.parametrize("env_cls", [PandaReachVectorEnv, PandaPickVectorEnv])
def test_env_i_matches_alone_with_neighbours_in_its_lane_and_autoresets(closing, env_cls):
    """Every env starts from the same episode seed: the same lane and (Pick) the same object at the same spot, so
    arms and objects of 4 envs overlap; each follows its own actions exactly as it does alone, whatever the
    grouping; short episodes rebuild the objects mid-run."""
    n, steps = 4, 14
    rng = np.random.default_rng(7)
    act_dim = 7 if env_cls is PandaReachVectorEnv else 4
    actions = rng.uniform(-1, 1, (steps, n, act_dim))
    kwargs = {}
    if env_cls is PandaPickVectorEnv:  # first episode: envs 0 and 1 drive the hand into the object, 2 and 3 away
        kwargs = {"ee_max_step": 0.1}
        probe = closing(env_cls(1))
        probe.reset(options={"episode_seed": 1234})
        st = probe.robot_state
        into = (st.object_pos[0] - st.end_effector_pos[0]) / 0.3
        actions[:5, :, :3] = np.clip([into, into, -into, -into], -1, 1)
    runs = {}
    for epc in (4, 3, 1):
        env = closing(env_cls(n, envs_per_cluster=epc, max_episode_steps=5, **kwargs))
        obs, _ = env.reset(seed=11, options={"episode_seed": 1234})
        out = [np.concatenate([obs, np.zeros((n, 3))], axis=1)]
        for a in actions:
            obs, reward, term, trunc, _ = env.step(a)
            out.append(np.concatenate([obs, reward[:, None], term[:, None], trunc[:, None]], axis=1))
        runs[epc] = np.array(out)
    assert runs[4].shape == runs[3].shape
    np.testing.assert_array_equal(runs[4], runs[3])
    np.testing.assert_array_equal(runs[4], runs[1])
    for i in (0, 2):
        alone = closing(env_cls(1, max_episode_steps=5, **kwargs))
        obs, _ = alone.reset(seed=11 + i, options={"episode_seed": 1234})
        np.testing.assert_array_equal(obs[0], runs[4][0, i, : obs.shape[1]])
        for t, a in enumerate(actions):
            obs, reward, term, trunc, _ = alone.step(a[i : i + 1])
            row = np.concatenate([obs[0], reward, term, trunc])
            np.testing.assert_array_equal(row, runs[4][t + 1, i], err_msg=f"env {i} step {t}")
    # the envs did differ (their actions differ), so equality above is not trivial
    assert not np.array_equal(runs[4][-1, 0], runs[4][-1, 2])
    if env_cls is PandaPickVectorEnv:  # in the shared first episode an arm knocked its own object, not the others'
        start = runs[4][0, :, 24:27]  # object positions (PICK_OBS_LAYOUT)
        moved = np.abs(runs[4][1:6, :, 24:27] - start).max(axis=(0, 2)) > 1e-3
        assert moved.any() and not moved.all(), moved


def test_pick_objects_are_drawn_per_episode_from_the_seed_within_the_ranges_and_traced(closing):
    env = closing(PandaPickVectorEnv(6, max_episode_steps=2))
    env.reset(seed=0)
    for _ in range(18):  # 6 episodes of 2 steps (+ the restart step) per env
        env.step(np.zeros((6, 4)))
    records = env.parameter_trace()
    assert len(records) >= 30
    c = PandaPickConfig()
    shapes, sizes = set(), []
    for r in records:
        params = r["parameters"]
        assert set(OBJECT_PARAMETERS) <= set(params)
        shapes.add(params["object_shape"])
        sizes.append(params["object_size"])
        assert c.object_size_range[0] <= params["object_size"] <= c.object_size_range[1]
        assert c.object_mass_range[0] <= params["object_mass"] <= c.object_mass_range[1]
        assert c.object_friction_range[0] <= params["object_friction"] <= c.object_friction_range[1]
        assert abs(params["object_size"] * 1000 - round(params["object_size"] * 1000)) < 1e-9  # whole mm
    assert shapes == {0.0, 1.0, 2.0} and len(set(sizes)) > 5
    # an episode seed gives the same object again, and the physics object is the one drawn: it rests on the ground
    # with its centre at half its size (box edge, cylinder height, sphere diameter)
    seed = records[-1]["episode_seed"]
    again = closing(PandaPickVectorEnv(1))
    again.reset(options={"episode_seed": seed})
    np.testing.assert_array_equal(
        again.task.episode_parameters[0], [records[-1]["parameters"][k] for k in OBJECT_PARAMETERS]
    )
    size = again.task.episode_parameters[0, 1]
    assert again.robot_state.object_pos[0, 2] == pytest.approx(size / 2, abs=1e-9)
    again.step(np.zeros((1, 4)))
    assert again.robot_state.object_pos[0, 2] == pytest.approx(size / 2, abs=2e-3)  # settled where it was put


def _state(n, ee, obj=None):
    state = RobotState.zeros(n, PANDA)
    state.end_effector_pos[:] = ee
    if obj is not None:
        state.object_pos[:] = obj
    return state


def test_is_success_is_gymnasium_robotics_5_cm_rule_on_hand_made_states():
    reach = PandaReachTask(2, PandaReachConfig())
    reach.command[:] = [0.5, 0.0, 0.2]
    state = _state(2, [[0.5, 0.0, 0.2 + 0.049], [0.5, 0.0, 0.2 + 0.051]])
    zero = np.zeros((2, 7))
    terms, conditions = reach.evaluate(state, zero, zero, np.zeros(2, bool))
    np.testing.assert_array_equal(reach.step_info()["is_success"], [True, False])
    np.testing.assert_allclose(terms["distance"], [-0.049, -0.051])
    assert conditions.shape == (2, 0) and SUCCESS_DISTANCE == 0.05

    pick = PandaPickTask(3, PandaPickConfig())
    pick.command[:] = [0.5, 0.0, 0.2]
    obj = [[0.5, 0.04, 0.2], [0.5, 0.0, 0.26], [1.5, 0.0, 0.0]]
    terms, conditions = pick.evaluate(
        _state(3, [0.5, 0.0, 0.2], obj), np.zeros((3, 4)), np.zeros((3, 4)), np.zeros(3, bool)
    )
    np.testing.assert_array_equal(pick.step_info()["is_success"], [True, False, False])
    np.testing.assert_array_equal(conditions[:, 0], [False, False, True])  # object_lost: > 1 m from the base
    assert list(terms) == ["reach", "grasp", "lift", "goal", "success", "action_rate"]


def test_pick_staged_reward_reach_grasp_lift_goal_on_hand_made_states():
    """robosuite Lift's staged terms: reaching 1 - tanh(10 d), grasping (object between closed fingers), lifting
    (only while held, the height gained as a fraction of the goal's), and the goal term."""
    pick = PandaPickTask(3, PandaPickConfig())
    size = 0.04
    pick.episode_parameters[:] = [0, size, 0.1, 1.0]
    pick._rest_z[:] = size / 2
    pick.command[:] = [0.5, 0.0, size / 2 + 0.2]
    obj = np.array([[0.5, 0.0, size / 2 + 0.1], [0.5, 0.0, size / 2 + 0.1], [0.5, 0.0, size / 2]])
    ee = obj + np.array([[0.0, 0.0, 0.01], [0.0, 0.0, 0.01], [0.0, 0.0, 0.1]])
    state = _state(3, ee, obj)
    state.joint_pos[:, 7:9] = [[0.02, 0.02], [0.04, 0.04], [0.02, 0.02]]  # closed on it, open, closed above it
    terms, _ = pick.evaluate(state, np.zeros((3, 4)), np.zeros((3, 4)), np.zeros(3, bool))
    np.testing.assert_array_equal(pick.grasped(state), [True, False, False])
    w = PandaPickConfig().reward_weights
    np.testing.assert_allclose(terms["reach"], w.reach * (1.0 - np.tanh(10.0 * np.array([0.01, 0.01, 0.1]))))
    np.testing.assert_allclose(terms["grasp"], [w.grasp, 0.0, 0.0])
    np.testing.assert_allclose(terms["lift"], [0.5 * w.lift, 0.0, 0.0])  # halfway to the goal, held
    np.testing.assert_allclose(terms["goal"], w.goal * (1.0 - np.tanh(10.0 * np.array([0.1, 0.1, 0.2]))))
    np.testing.assert_array_equal(terms["success"], 0.0)


def test_reach_actions_map_to_arm_targets_within_limits():
    reach = PandaReachTask(3, PandaReachConfig())
    action = np.zeros((3, 7))
    action[0, 1] = action[0, 5] = 1.0
    action[1, 3], action[2, 3] = -1.0, 1.0
    targets = reach.joint_targets(action, 2.0)  # action_scale 2 rad: past the limits
    assert targets[0, 1] == 1.8326 and targets[0, 5] == 3.8223  # 0.41 + 2 and 2.26 + 2, clipped to the upper limits
    assert targets[1, 3] == -3.1416 and targets[2, 3] == 0.0  # -1.85 -+ 2, clipped to joint 4's limits
    np.testing.assert_array_equal(targets[1, :3], PANDA.nominal_joint_pos[:3])
    np.testing.assert_array_equal(targets[:, 7:], 0.04)  # the fingers stay open
    np.testing.assert_array_equal(reach.joint_targets(np.zeros((3, 7)), 1.0)[:1], [PANDA.nominal_joint_pos])
    assert reach.act_dim == 7


def test_pick_end_effector_actions_move_the_grasp_point_with_the_hand_down(closing):
    """Pick's actions are panda-gym's end-effector control: the commanded grasp point moves ee_max_step per unit
    (kept in the workspace), the IK joint targets put the grasp point there with the hand down, and the 4th action
    is the gripper."""
    from unilab_gym.tasks.panda_kinematics import BASE_COM_OFFSET, forward_kinematics

    env = closing(PandaPickVectorEnv(3, init_joint_noise=0.0))
    env.reset(seed=0)
    task = env.task
    start = task._point.copy()
    action = np.array([[1.0, 0.0, 0.0, -1.0], [0.0, -0.5, 0.0, 0.0], [0.0, 0.0, -1.0, 1.0]])
    targets = task.joint_targets(action, 1.0)
    np.testing.assert_allclose(task._point - start, 0.05 * action[:, :3])
    np.testing.assert_allclose(targets[:, 7], [0.0, 0.02, 0.04])
    np.testing.assert_array_equal(targets[:, 7], targets[:, 8])
    for _ in range(20):  # the IK converges onto the commanded point (two steps per control step)
        targets = task.joint_targets(np.zeros((3, 4)), 1.0)
    pos, rot, _, _ = forward_kinematics(targets[:, :7])
    np.testing.assert_allclose(pos - BASE_COM_OFFSET, task._point, atol=1e-6)
    np.testing.assert_allclose(rot, np.broadcast_to(task.HAND_DOWN, rot.shape), atol=1e-5)
    for _ in range(40):  # pushed far down: the workspace keeps the point above the ground
        task.joint_targets(np.array([[0.0, 0.0, -1.0, 0.0]] * 3), 1.0)
    np.testing.assert_array_equal(task._point[:, 2], 0.0)
    assert task.act_dim == 4


def test_numpy_kinematics_match_pybullet_and_do_not_depend_on_the_batch():
    from unilab_gym.tasks.panda_kinematics import forward_kinematics, ik_step

    client = p.connect(p.DIRECT)
    try:
        arm = p.loadURDF(PANDA.urdf_path, [0, 0, 0], useFixedBase=True, physicsClientId=client)
        q = np.array(PANDA.nominal_joint_pos[:7]) + np.random.default_rng(0).uniform(-0.8, 0.8, (5, 7))
        pos, rot, _, _ = forward_kinematics(q)
        for i in range(5):
            for j in range(7):
                p.resetJointState(arm, j, q[i, j], physicsClientId=client)
            link = p.getLinkState(arm, 11, computeForwardKinematics=True, physicsClientId=client)  # grasptarget
            np.testing.assert_allclose(pos[i], link[4], atol=1e-6)
            np.testing.assert_allclose(rot[i], np.reshape(p.getMatrixFromQuaternion(link[5]), (3, 3)), atol=1e-6)
    finally:
        p.disconnect(client)
    down = np.diag([1.0, -1.0, -1.0])
    target = np.tile([0.5, 0.1, 0.1], (5, 1))
    batch = ik_step(q, target, down)
    for i in range(5):  # env i's IK step alone is bit-identical to its row of the batch
        np.testing.assert_array_equal(ik_step(q[i : i + 1], target[:1], down)[0], batch[i])


def test_a_scripted_grasp_lifts_objects_to_the_goal_so_pick_is_solvable(closing):
    """Above the object, down, close, lift to the goal, with Pick's own end-effector actions: the arm touches, grips
    and lifts its own object; is_success follows the object."""
    n = 6
    env = closing(PandaPickVectorEnv(n))
    env.reset(seed=0)
    state, task = env.robot_state, env.task
    lifted, grasped = np.zeros(n), np.zeros(n, bool)
    for t in range(50):
        obj = state.object_pos - state.base_pos
        target = obj + np.array([0.0, 0.0, 0.06]) if t < 12 else obj if t < 27 else env.command.copy()
        action = np.zeros((n, 4))
        action[:, :3] = np.clip((target - task._point) / 0.05, -1, 1)
        action[:, 3] = 1.0 if t < 22 else -1.0
        _, _, _, _, info = env.step(action)
        grasped |= info["reward_terms"]["grasp"] > 0
        lifted = np.maximum(lifted, state.object_pos[:, 2] - env.task.episode_parameters[:, 1] / 2)
    assert info["is_success"].sum() >= 4, info["is_success"]  # 16 of 16 envs in the run that set the bound
    assert (lifted > 0.05).sum() >= 4 and grasped[info["is_success"]].all()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"object_shapes": ("cube",)}, "object_shapes"),
        ({"object_shapes": ()}, "object_shapes"),
        ({"object_size_range": (0.05, 0.1)}, "object_size_range"),
        ({"object_mass_range": (0.0, 0.1)}, "object_mass_range"),
        ({"object_friction_range": (1.0, 0.5)}, "object_friction_range"),
        ({"reward_weights": {"reech": 1.0}}, "reech"),
        ({"robot": "a1"}, "9 joint_names"),
    ],
)
def test_bad_pick_configuration_raises_naming_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PandaPickVectorEnv(1, **kwargs)


def test_bad_reach_configuration_raises_and_unknown_keys_are_type_errors():
    with pytest.raises(ValueError, match="target_range"):
        PandaReachVectorEnv(1, target_range=((0.6, 0, 0), (0.5, 0.1, 0.1)))
    with pytest.raises(TypeError, match="object_shapes"):
        PandaReachVectorEnv(1, object_shapes=("box",))


@pytest.mark.parametrize("config_type", [PandaReachConfig, PandaPickConfig])
def test_task_config_round_trips(closing, config_type):
    config = config_type()
    assert config_type(**config.to_dict()) == config
    assert config.to_dict()["robot"] == "panda"


def test_sb3_adapter_gives_is_success_in_the_info_of_every_finished_episode():
    """SB3 reads ``infos[i]["is_success"]`` of finished episodes for its ``rollout/success_rate``."""
    from unilab_gym.sb3.vec_env import make_sb3_env

    venv = make_sb3_env(REACH, 2, seed=0, max_episode_steps=3)
    try:
        venv.reset()
        steps = [venv.step(np.zeros((2, 7))) for _ in range(3)]
        assert not steps[1][2].any()
        _, _, dones, infos = steps[2]
        assert dones.all()
        assert all(isinstance(info["is_success"], bool) and "terminal_observation" in info for info in infos)
    finally:
        venv.close()
