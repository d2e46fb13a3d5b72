"""Per-robot settings of a robot description (issue 27, item 2): ``reward_weights`` overrides, ``joint_damping``."""

import dataclasses
import pickle

import gymnasium as gym
import numpy as np
import pytest

import unilab_gym  # noqa: F401  (registers the ids)
from unilab_gym.robots import A1, LAIKAGO, ROBOTS, RobotDescription, get_robot
from unilab_gym.tasks.panda import PandaPickConfig, PickRewardWeights
from unilab_gym.tasks.quadruped import QuadrupedConfig, RewardWeights


def _a1(**changes):
    return dataclasses.replace(A1, name="my_a1", **changes)


def test_a1_has_no_overrides_and_its_task_keeps_the_default_weights():
    assert dict(A1.reward_weights) == {} and A1.joint_damping is None
    assert QuadrupedConfig().reward_weights == RewardWeights()


def test_the_laikago_ships_its_own_torque_weight():
    """The Laikago's overrides are valid term names of the Quadruped task and change its weights from the A1's."""
    assert set(LAIKAGO.reward_weights) <= {f.name for f in dataclasses.fields(RewardWeights)}
    weights = QuadrupedConfig(robot="laikago").reward_weights
    for name, value in LAIKAGO.reward_weights.items():
        assert getattr(weights, name) == value
    assert weights != RewardWeights()


def test_robot_overrides_apply_under_the_callers_weights():
    robot = _a1(reward_weights={"torques": -1e-5, "alive": 0.5})
    config = QuadrupedConfig(robot=robot)
    assert config.reward_weights == dataclasses.replace(RewardWeights(), torques=-1e-5, alive=0.5)
    config = QuadrupedConfig(robot=robot, reward_weights={"alive": 0.2})  # the caller's dict wins, per term
    assert config.reward_weights.alive == 0.2 and config.reward_weights.torques == -1e-5
    given = RewardWeights(torques=-3e-4)  # a full RewardWeights is used as it is
    assert QuadrupedConfig(robot=robot, reward_weights=given).reward_weights is given


def test_config_round_trip_keeps_the_resolved_weights():
    config = QuadrupedConfig(robot=_a1(reward_weights={"torques": -1e-5}), reward_weights={"alive": 0.3})
    assert QuadrupedConfig(**config.to_dict()) == config


def test_an_unknown_term_name_on_the_robot_is_refused_naming_the_field():
    robot = _a1(reward_weights={"torque": -1e-5})  # the term is "torques"
    with pytest.raises(ValueError, match=r"robot 'my_a1': reward_weights .*\['torque'\].*torques"):
        QuadrupedConfig(robot=robot)
    with pytest.raises(ValueError, match="reward_weights"):
        gym.make("UniLab/Quadruped-v0", robot=robot)


def test_another_tasks_terms_are_refused_on_a_task_without_them():
    panda = dataclasses.replace(get_robot(PandaPickConfig().robot), reward_weights={"torques": -1e-5})
    with pytest.raises(ValueError, match=r"robot 'panda': reward_weights .*\['torques'\]"):
        PandaPickConfig(robot=panda)
    panda = dataclasses.replace(panda, reward_weights={"lift": 3.0})
    assert PandaPickConfig(robot=panda).reward_weights == PickRewardWeights(lift=3.0)


@pytest.mark.parametrize(
    "value, message",
    [
        ([("torques", -1e-5)], "reward_weights must be a dict"),
        ({"torques": float("nan")}, r"reward_weights\['torques'\]"),
        ({"torques": "small"}, r"reward_weights\['torques'\]"),
        ({"": 1.0}, "reward_weights keys"),
        ({3: 1.0}, "reward_weights keys"),
    ],
)
def test_bad_reward_weights_are_refused_when_the_description_is_made(value, message):
    with pytest.raises(ValueError, match=message):
        _a1(reward_weights=value)


@pytest.mark.parametrize(
    "value, message",
    [((0.1,) * 11, "joint_damping must have 12 values"), (-0.1, "joint_damping"), ("x", "joint_damping")],
)
def test_bad_joint_damping_is_refused_naming_the_field(value, message):
    with pytest.raises(ValueError, match=message):
        _a1(joint_damping=value)


def test_new_fields_survive_dict_pickle_and_hash():
    robot = _a1(reward_weights={"torques": -1e-5}, joint_damping=0.2)
    assert robot.joint_damping == (0.2,) * 12
    assert RobotDescription.from_dict(robot.to_dict()) == robot
    assert robot.to_dict()["reward_weights"] == {"torques": -1e-5}
    assert pickle.loads(pickle.dumps(robot)) == robot
    assert hash(robot) == hash(_a1(reward_weights={"torques": -1e-5}, joint_damping=0.2))
    assert all(isinstance(hash(r), int) for r in ROBOTS.values())


def _rollout(robot, steps=40):
    env = gym.make_vec("UniLab/Quadruped-v0", num_envs=2, robot=robot)
    try:
        env.reset(seed=5)
        actions = np.random.default_rng(0).uniform(-1, 1, (steps, 2, 12)).astype(np.float32)
        return np.stack([env.step(a)[0] for a in actions])
    finally:
        env.close()


def test_joint_damping_replaces_the_urdf_damping():
    """The A1's URDF damps its joints with 0: ``joint_damping=0`` is the same rollout, 1 N·m·s/rad is another."""
    default = _rollout(A1)
    assert np.array_equal(_rollout(_a1(joint_damping=0.0)), default)
    assert not np.allclose(_rollout(_a1(joint_damping=1.0)), default)
