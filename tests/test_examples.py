"""The examples run end to end in a short mode (as CI runs them): train, save, reload, record a video."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def _run(script, *args, timeout=240):
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.mark.slow
def test_sac_sb3_trains_saves_and_plays(tmp_path):
    out = _run(
        "train_sac_sb3.py",
        "--total-steps",
        600,
        "--num-envs",
        4,
        "--learning-starts",
        200,
        "--gradient-steps",
        1,
        "--seed",
        1,
        "--save-path",
        tmp_path / "sac",
        "--no-progress",
    )
    assert (tmp_path / "sac.zip").exists() and "saved" in out
    from stable_baselines3 import SAC

    model = SAC.load(tmp_path / "sac.zip", device="cpu")
    assert model.num_timesteps == 600 and model._n_updates > 0  # it trained
    video = tmp_path / "sac.gif"
    out = _run("play.py", tmp_path / "sac.zip", "--steps", 10, "--out", video)
    import imageio.v3 as iio

    frames = iio.imread(video, index=None)
    assert frames.shape[0] == 11 and frames.shape[1:3] == (240, 320)
    assert frames.std() > 0  # not blank


@pytest.mark.slow
def test_ppo_sb3_trains_saves_and_plays_with_normalization(tmp_path):
    _run(
        "train_ppo_sb3.py",
        "--total-steps",
        512,
        "--num-envs",
        4,
        "--n-steps",
        32,
        "--seed",
        1,
        "--save-path",
        tmp_path / "ppo",
        "--no-progress",
    )
    assert (tmp_path / "ppo.zip").exists() and (tmp_path / "ppo_vecnormalize.pkl").exists()
    out = _run("play.py", tmp_path / "ppo.zip", "--steps", 5, "--out", tmp_path / "ppo.mp4")
    assert (tmp_path / "ppo.mp4").stat().st_size > 0 and "6 frames" in out


@pytest.mark.slow
def test_sac_tianshou_trains_with_shared_buffer_and_saves(tmp_path):
    out = _run(
        "train_sac_tianshou.py",
        "--total-steps",
        400,
        "--num-envs",
        4,
        "--test-envs",
        2,
        "--epochs",
        1,
        "--start-steps",
        200,
        "--max-episode-steps",
        30,
        "--seed",
        1,
        "--save-path",
        tmp_path / "sac.pt",
        "--no-progress",
    )
    assert "saved" in out and "gradient steps" in out
    import torch

    state = torch.load(tmp_path / "sac.pt", weights_only=False)
    assert any(key.startswith("policy.actor") for key in state)


def test_play_rejects_missing_model(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "play.py"), tmp_path / "nope.zip"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode != 0 and "no model" in proc.stderr


@pytest.mark.slow
def test_sac_async_trains_saves_and_plays(tmp_path):
    out = _run(
        "train_sac_async.py",
        "--total-steps",
        600,
        "--envs-per-collector",
        4,
        "--learning-starts",
        200,
        "--replay-ratio",
        0.25,
        "--seed",
        2,
        "--save-path",
        tmp_path / "sac_async",
        "--no-progress",
    )
    assert (tmp_path / "sac_async.zip").exists() and "saved" in out
    from stable_baselines3 import SAC

    model = SAC.load(tmp_path / "sac_async.zip", device="cpu")
    assert model.num_timesteps == 600 and model._n_updates == (600 - 200) // 4
    out = _run("play.py", tmp_path / "sac_async.zip", "--steps", 5, "--out", tmp_path / "sac_async.gif")
    assert (tmp_path / "sac_async.gif").stat().st_size > 0


@pytest.mark.slow
def test_ppo_async_trains_with_vecnormalize_saves_and_plays(tmp_path):
    out = _run(
        "train_ppo_async.py",
        *("--total-steps", 1024, "--num-collectors", 1, "--envs-per-collector", 8, "--n-steps", 64),
        *("--max-episode-steps", 50, "--save-path", tmp_path / "ppo_async", "--no-progress"),
    )
    assert "trained 1024 env steps" in out
    stats = tmp_path / "ppo_async_vecnormalize.pkl"
    assert (tmp_path / "ppo_async.zip").exists() and stats.exists()
    from stable_baselines3.common.vec_env import VecNormalize

    from unilab_gym.integrations.sb3 import make_sb3_env

    venv = make_sb3_env("UniLab/Quadruped-v0", 1)
    loaded = VecNormalize.load(str(stats), venv)
    assert loaded.obs_rms.count == pytest.approx(1024 + 8 + 1e-4)  # every observation the collector stepped
    venv.close()
    out = _run("play.py", tmp_path / "ppo_async.zip", "--steps", 5, "--out", tmp_path / "ppo_async.gif")
    assert (tmp_path / "ppo_async.gif").stat().st_size > 0
