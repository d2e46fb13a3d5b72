"""``unilab-gym play`` on every task: ``--env-id``, the task's episode length, ``VecNormalize`` statistics, frame
size and stride, random actions, and a clear refusal of a model trained on another task."""

from __future__ import annotations

import imageio.v3 as iio
import pytest
from stable_baselines3 import PPO
from stable_baselines3.common.vec_env import VecNormalize

from unilab_gym.cli.play import main as play
from unilab_gym.sb3.vec_env import make_sb3_env

REACH = "UniLab/PandaReach-v0"  # 50 control steps an episode


@pytest.fixture(scope="module")
def reach_model(tmp_path_factory):
    """An untrained PPO on PandaReach-v0 and its VecNormalize statistics, saved as learning_check.py saves them."""
    folder = tmp_path_factory.mktemp("models")
    env = VecNormalize(make_sb3_env(REACH, 2, seed=0))
    model = PPO("MlpPolicy", env, n_steps=8, batch_size=16, device="cpu", seed=0)
    model.save(folder / "PandaReach-v0_panda.zip")
    env.save(str(folder / "PandaReach-v0_panda_vecnormalize.pkl"))
    env.close()
    return folder / "PandaReach-v0_panda.zip"


def test_plays_one_episode_of_the_task_with_its_statistics(reach_model, tmp_path, capsys):
    """Default ``--steps``: one episode (50 steps); ``--every 10`` keeps 1 + 5 frames of ``--width`` x ``--height``."""
    out = tmp_path / "reach.gif"
    size = ["--every", "10", "--width", "64", "--height", "48", "--no-progress"]
    play([str(reach_model), "--env-id", REACH, "--sibling-vecnormalize", "--out", str(out), *size])
    frames = iio.imread(out, index=None)
    assert frames.shape[:3] == (6, 48, 64)
    printed = capsys.readouterr().out
    assert "over 50 steps (1 episode ends)" in printed and "at 2.5 fps" in printed  # 25 Hz / 10


def test_refuses_a_model_of_another_task(reach_model, tmp_path):
    with pytest.raises(SystemExit, match="--env-id") as caught:
        play([str(reach_model), "--env-id", "UniLab/Quadrotor-v0", "--out", str(tmp_path / "x.gif"), "--steps", "1"])
    assert "(7,)" in str(caught.value) and "(4,)" in str(caught.value)  # both action spaces named


@pytest.mark.parametrize("env_id", ["UniLab/QuadrupedRough-v0", "UniLab/Quadrotor-v0", "UniLab/PandaPick-v0"])
def test_random_actions_on_any_task(env_id, tmp_path, capsys):
    out = tmp_path / "random.gif"
    play(["--random", "--env-id", env_id, "--steps", "4", "--out", str(out), "--width", "32", "--height", "24"])
    assert iio.imread(out, index=None).shape[:3] == (5, 24, 32)
    assert "random actions" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--env-id", REACH, "--out", "x.gif"], "give a model .zip or --random"),
        (["--random", "--env-id", "UniLab/Nope-v0", "--out", "x.gif"], "not registered"),
        (["--random", "--env-id", REACH], "--random needs --out"),
        (["--random", "--env-id", REACH, "--out", "x.gif", "--every", "0"], "--every must be a positive int"),
        (["--random", "--env-id", REACH, "--out", "x.gif", "--env-kwargs", "[1]"], "--env-kwargs must be a JSON"),
        (["--random", "--env-id", REACH, "--out", "x.gif", "--robot", "a1"], "UniLab/PandaReach-v0 with"),
    ],
)
def test_bad_options_are_refused(argv, message):
    with pytest.raises(SystemExit, match=message):
        play([*argv, "--no-progress"])
