"""The one table of SB3 algorithm names (unilab_gym.sb3.algorithms), shared by the tools and live control."""

from __future__ import annotations

from stable_baselines3 import A2C, DDPG, PPO, SAC, TD3

from unilab_gym.cli.play import ALGOS
from unilab_gym.sb3.algorithms import ALGORITHMS, algorithm_name
from unilab_gym.sb3.control.hyperparams import _kind


def test_the_table_names_every_algorithm_by_its_lower_case_class_name():
    assert ALGORITHMS == {"sac": SAC, "td3": TD3, "ddpg": DDPG, "ppo": PPO, "a2c": A2C}
    assert ALGOS is ALGORITHMS  # the tools' --algo choices are the table


def test_algorithm_name_is_the_nearest_class_of_the_table():
    class MySAC(SAC):
        pass

    # the name depends on the class only: instances made without __init__ (no env needed)
    assert algorithm_name(object.__new__(MySAC)) == "sac"
    assert algorithm_name(object.__new__(DDPG)) == "ddpg"  # not "td3", although DDPG is a TD3
    assert algorithm_name(object()) is None


def test_live_control_treats_ddpg_as_td3_and_unknown_models_as_other():
    assert _kind(object.__new__(DDPG)) == "td3"
    assert _kind(object.__new__(PPO)) == "ppo"
    assert _kind(object()) == "other"
