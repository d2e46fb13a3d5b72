"""Pure task math (no physics): frames, observation layout, reward terms, termination."""

import numpy as np
import pybullet as p
import pytest

from unilab_gym.sim.rotation import quat_rotate
from unilab_gym.tasks import quadruped as task


def fallen(base_height, base_quat, trunk_contact, cfg):
    """(N,) bool: which robots have fallen (the ``terminated`` flag), any of ``task.fall_conditions``."""
    return task.fall_conditions(base_height, base_quat, trunk_contact, cfg).any(axis=1)


def _random_quats(n, seed=0):
    q = np.random.default_rng(seed).normal(size=(n, 4))
    return q / np.linalg.norm(q, axis=1, keepdims=True)


def test_quat_rotate_inverse_matches_pybullet_rotation_matrix():
    quats = _random_quats(20)
    vecs = np.random.default_rng(1).normal(size=(20, 3))
    out = task.quat_rotate_inverse(quats, vecs)
    for q, v, o in zip(quats, vecs, out):
        rot = np.array(p.getMatrixFromQuaternion(q.tolist())).reshape(3, 3)  # body -> world
        np.testing.assert_allclose(o, rot.T @ v, atol=1e-12)


def test_quat_rotate_matches_pybullet_rotation_matrix_and_inverts():
    quats = _random_quats(20, seed=3)
    vecs = np.random.default_rng(4).normal(size=(20, 3))
    out = quat_rotate(quats, vecs)
    for q, v, o in zip(quats, vecs, out):
        rot = np.array(p.getMatrixFromQuaternion(q.tolist())).reshape(3, 3)  # body -> world
        np.testing.assert_allclose(o, rot @ v, atol=1e-12)
    np.testing.assert_allclose(task.quat_rotate_inverse(quats, out), vecs, atol=1e-12)


def test_roll_pitch_match_pybullet_euler():
    quats = _random_quats(20, seed=2)
    roll, pitch = task.roll_pitch(quats)
    for q, r, pt in zip(quats, roll, pitch):
        euler = p.getEulerFromQuaternion(q.tolist())
        assert r == pytest.approx(euler[0], abs=1e-9)
        assert pt == pytest.approx(euler[1], abs=1e-9)


def test_observation_layout_is_documented_and_filled_in_order():
    assert task.OBS_DIM == 48 and max(stop for _, stop in task.OBS_LAYOUT.values()) == 48
    n = 3
    identity = np.tile([0.0, 0.0, 0.0, 1.0], (n, 1))
    out = np.zeros((n, 48), np.float32)
    command = np.array([[0.5, 0.1, 0.2]] * n)
    joint_pos = np.full((n, 12), 0.3)
    nominal = np.full((n, 12), 0.1)
    last_action = np.full((n, 12), -0.5)
    task.observation(
        identity,
        np.ones((n, 3)),
        2 * np.ones((n, 3)),
        command,
        joint_pos,
        nominal,
        3 * np.ones((n, 12)),
        last_action,
        out,
    )
    L = task.OBS_LAYOUT
    np.testing.assert_allclose(out[:, slice(*L["base_lin_vel"])], 1.0)
    np.testing.assert_allclose(out[:, slice(*L["base_ang_vel"])], 2.0)
    np.testing.assert_allclose(out[:, slice(*L["projected_gravity"])], [[0, 0, -1]] * n)
    np.testing.assert_allclose(out[:, slice(*L["command"])], command)
    np.testing.assert_allclose(out[:, slice(*L["joint_pos"])], 0.2, rtol=1e-6)
    np.testing.assert_allclose(out[:, slice(*L["joint_vel"])], 3.0)
    np.testing.assert_allclose(out[:, slice(*L["last_action"])], -0.5)


def gait_inputs(n, **overrides):
    """Keyword arguments of ``task.reward_terms`` for the gait terms: upright at the target height, no touchdown."""
    kw = dict(
        projected_gravity=np.tile([0.0, 0.0, -1.0], (n, 1)),
        base_height=np.full(n, 0.27),
        touchdown_air_time=np.zeros((n, 4)),
        leg_contact=np.zeros((n, 8), bool),
        base_height_target=0.27,
        feet_air_time_target=0.5,
        feet_air_time_max=1000.0,
    )
    return {**kw, **overrides}


def test_reward_terms_perfect_tracking_and_penalties():
    n = 2
    w = task.RewardWeights()
    dt = 0.02
    cmd = np.array([[0.5, 0.0, 0.1], [0.5, 0.0, 0.1]])
    lin = np.array([[0.5, 0.0, 0.0], [0.0, 0.0, 1.0]])  # env 0 tracks, env 1 stands and bounces
    ang = np.array([[0.0, 0.0, 0.1], [1.0, 1.0, 0.0]])
    terms = task.reward_terms(
        lin, ang, cmd, np.zeros((n, 12)), np.zeros((n, 12)), np.zeros((n, 12)), w, dt, **gait_inputs(n)
    )
    assert terms["tracking_lin_vel"][0] == pytest.approx(w.tracking_lin_vel * dt)
    assert terms["tracking_ang_vel"][0] == pytest.approx(w.tracking_ang_vel * dt)
    assert terms["tracking_lin_vel"][1] == pytest.approx(w.tracking_lin_vel * dt * np.exp(-0.25 / task.TRACKING_SIGMA))
    assert terms["lin_vel_z"][1] == pytest.approx(w.lin_vel_z * dt * 1.0) and terms["lin_vel_z"][0] == 0
    assert terms["ang_vel_xy"][1] == pytest.approx(w.ang_vel_xy * dt * 2.0)
    torques = np.zeros((n, 12))
    torques[1, 0] = 10.0
    action = np.zeros((n, 12))
    action[1, :] = 1.0
    terms = task.reward_terms(lin, ang, cmd, torques, action, np.zeros((n, 12)), w, dt, **gait_inputs(n))
    assert terms["torques"][1] == pytest.approx(w.torques * dt * 100.0) and terms["torques"][0] == 0
    assert terms["action_rate"][1] == pytest.approx(w.action_rate * dt * 12.0)
    assert terms["alive"] == pytest.approx([w.alive * dt] * 2)


def test_reward_weights_unknown_term_raises():
    with pytest.raises(ValueError, match=r"unknown reward term.*'bogus'"):
        task.RewardWeights.from_dict({"bogus": 1.0})
    assert task.RewardWeights.from_dict({"alive": 0.0}).alive == 0.0


def test_fallen_each_cause():
    cfg = task.TerminationConfig()
    upright = np.tile([0.0, 0.0, 0.0, 1.0], (4, 1))
    tilted = p.getQuaternionFromEuler([cfg.max_tilt + 0.1, 0.0, 0.0])
    pitched = p.getQuaternionFromEuler([0.0, cfg.max_tilt + 0.1, 0.0])
    quats = np.array([upright[0], tilted, pitched, upright[0]])
    heights = np.array([0.3, 0.3, 0.3, cfg.min_base_height - 0.01])
    out = fallen(heights, quats, np.zeros(4, bool), cfg)
    assert out.tolist() == [False, True, True, True]
    contact = np.array([True, False, False, False])
    assert fallen(np.full(4, 0.3), upright, contact, cfg).tolist() == [True, False, False, False]
    no_contact = task.TerminationConfig(trunk_contact=False)
    assert not fallen(np.full(4, 0.3), upright, contact, no_contact).any()
