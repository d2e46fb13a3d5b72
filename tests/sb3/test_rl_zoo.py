"""rl-zoo3 trains on UniLab/Quadruped-v0 with the hyperparameter files we ship."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import yaml

import unilab_gym.sb3.zoo as hyperparams

# rl-zoo3 runs in a subprocess only: importing it here would patch gymnasium's TimeLimit for
# every later test of this process (rl_zoo3.gym_patches adds "TimeLimit.truncated" to infos).
if importlib.util.find_spec("rl_zoo3") is None:
    pytest.skip("rl_zoo3 is not installed", allow_module_level=True)


@pytest.mark.parametrize("algo", hyperparams.ALGOS)
def test_shipped_yaml_names_the_env_and_the_algorithm_settings(algo):
    config = yaml.safe_load(hyperparams.path(algo).read_text())
    assert list(config) == ["UniLab/Quadruped-v0"]
    assert config["UniLab/Quadruped-v0"]["policy"] == "MlpPolicy"


def test_unknown_algorithm_is_refused_with_the_choices():
    with pytest.raises(ValueError, match=r"available: \['ppo', 'sac'\]"):
        hyperparams.path("dqn")


@pytest.mark.parametrize(
    ("algo", "overrides"),
    [
        ("ppo", ["n_envs:4", "n_steps:64", "batch_size:64"]),
        ("sac", ["n_envs:4", "learning_starts:100", "gradient_steps:1", "buffer_size:10000"]),
    ],
)
def test_rl_zoo_trains_a_few_hundred_steps_with_our_conf_file(tmp_path, algo, overrides):
    cmd = [
        sys.executable, "-m", "rl_zoo3.train", "--algo", algo, "--env", "UniLab/Quadruped-v0",
        "--gym-packages", "unilab_gym", "--conf-file", str(hyperparams.path(algo)), "-n", "300", "--seed", "0",
        "--env-kwargs", "max_episode_steps:50", "-f", str(tmp_path), "--hyperparams", *overrides,
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=420, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    run = tmp_path / algo / "UniLab-Quadruped-v0_1"
    assert (run / "UniLab-Quadruped-v0.zip").exists()
    if algo == "ppo":  # normalize: true in the YAML -> VecNormalize statistics next to the model
        assert (run / "UniLab-Quadruped-v0" / "vecnormalize.pkl").exists()
