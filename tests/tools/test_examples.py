"""The examples run end to end in a short mode (as CI runs them): train, save, reload, record a video."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


#: Tianshou's VectorReplayBuffer compiles two numba functions in every new process (half of the Tianshou
#: example's run on 2 cores); the scripts' tests run them as plain Python, the in-process Tianshou tests
#: (tests/tianshou/) with numba.
NO_JIT = {**os.environ, "NUMBA_DISABLE_JIT": "1"}


def _run(script, *args, timeout=240, env=None):
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
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
        "--gradient-steps",  # 1 per vector step (default 8) into a small replay: the same code path, seconds
        1,
        "--buffer-size",
        1000,
        "--max-episode-steps",
        30,
        "--seed",
        1,
        "--save-path",
        tmp_path / "sac.pt",
        "--no-progress",
        env=NO_JIT,
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
    """One run for both checks of this example (it was also run by tests/sb3/test_async_runner.py)."""
    out = _run(
        "train_ppo_async.py",
        *("--total-steps", 1024, "--num-collectors", 2, "--envs-per-collector", 4, "--n-steps", 32),
        *("--max-episode-steps", 50, "--seed", 1, "--save-path", tmp_path / "ppo_async", "--no-progress"),
    )
    assert "trained 1024 env steps" in out
    assert "unilab/" in out and "policy_lag" in out and "ep_rew_mean" in out
    stats = tmp_path / "ppo_async_vecnormalize.pkl"
    assert (tmp_path / "ppo_async.zip").exists() and stats.exists()
    from stable_baselines3 import PPO

    model = PPO.load(tmp_path / "ppo_async.zip", device="cpu")
    assert model.num_timesteps == 1024 and model._n_updates == 4 * 5  # 4 rollouts of 32 x 8, 5 epochs each
    from stable_baselines3.common.vec_env import VecNormalize

    from unilab_gym.sb3.vec_env import make_sb3_env

    venv = make_sb3_env("UniLab/Quadruped-v0", 1)
    loaded = VecNormalize.load(str(stats), venv)
    assert loaded.obs_rms.count == pytest.approx(1024 + 8 + 1e-4)  # every observation the collector stepped
    venv.close()
    out = _run("play.py", tmp_path / "ppo_async.zip", "--steps", 5, "--out", tmp_path / "ppo_async.gif")
    assert (tmp_path / "ppo_async.gif").stat().st_size > 0


#: Runs an example with SB3's progress bar raising KeyboardInterrupt (what Ctrl-C raises) once it has
#: counted ``STOP_AT`` env steps: the interrupt arrives while the bar is live, with no signal and no timing.
_INTERRUPTING_DRIVER = """
import runpy, sys
from stable_baselines3.common.callbacks import ProgressBarCallback

STOP_AT = 40
on_step = ProgressBarCallback._on_step


def interrupting_on_step(self):
    on_step(self)
    if self.num_timesteps >= STOP_AT:
        raise KeyboardInterrupt
    return True


if __name__ == "__main__":
    ProgressBarCallback._on_step = interrupting_on_step
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize(
    "script, args",
    [
        ("train_sac_sb3.py", ["--num-envs", 4, "--gradient-steps", 1]),  # stock SB3 model.learn
        ("train_sac_async.py", ["--envs-per-collector", 4]),  # AsyncRunner.learn
    ],
)
def test_ctrl_c_during_training_exits_without_a_progress_bar_error(tmp_path, script, args):
    """SB3 closes its rich progress bar only when training ends; left open, a Ctrl-C ended in
    ``Exception ignored in: <function tqdm.__del__>`` ... ``ImportError: sys.meta_path is None``."""
    driver = tmp_path / "driver.py"
    driver.write_text(_INTERRUPTING_DRIVER)
    common = ["--total-steps", 600, "--learning-starts", 200, "--save-path", tmp_path / "model"]
    proc = subprocess.run(
        [sys.executable, str(driver), str(EXAMPLES / script), *map(str, common + args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == -signal.SIGINT, proc.stderr[-3000:]  # Python re-raises SIGINT on itself
    assert proc.stderr.rstrip().endswith("KeyboardInterrupt"), proc.stderr[-3000:]
    assert "Exception ignored" not in proc.stderr and "ImportError" not in proc.stderr, proc.stderr[-3000:]
    assert not (tmp_path / "model.zip").exists()  # interrupted before the save


@pytest.mark.slow
def test_shared_replay_hypotheses_compares_every_variant_on_the_same_data(tmp_path):
    import csv
    import math

    out = _run(
        "shared_replay_hypotheses.py",
        *("--gammas", 0.99, 0.5, 0.99, "--learning-rates", 3e-4, 3e-4, 0.0, "--seed", 0),
        *("--total-steps", 600, "--learning-starts", 200, "--replay-ratio", 0.05, "--holdout", 64),
        *("--envs-per-collector", 4, "--eval-episodes", 2, "--log-every", 5, "--log-dir", tmp_path),
        timeout=400,
    )
    names = ["A_gamma0.99_lr0.0003", "B_gamma0.5_lr0.0003", "C_gamma0.99_lr0"]
    with open(tmp_path / "comparison.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["learner"] for r in rows] == names  # one row per variant, in order
    metrics = ("return_mean", "tracking_error_mps", "td_error", "q_mean")
    for r in rows:
        assert int(r["gradient_steps"]) == (600 - 200) * 0.05  # every learner the same number of steps
        assert all(math.isfinite(float(r[m])) for m in metrics), r
    printed = [line for line in out.splitlines() if line.startswith(tuple(f"| {n} |" for n in names))]
    assert len(printed) == 3, out
    # each variant measured with its own critics and gamma (not one model three times)
    assert len({r["td_error"] for r in rows}) == 3 and len({r["q_mean"] for r in rows}) == 3
    # the same evaluation episodes: learning rate 0 leaves C's actor at the shared initial weights, so
    # its return is the untrained policy's on those seeds, bit for bit (the same machine computes both)
    from stable_baselines3 import SAC

    from unilab_gym.evaluation import evaluate_gait
    from unilab_gym.sb3.vec_env import make_sb3_env

    untrained = SAC("MlpPolicy", make_sb3_env("UniLab/Quadruped-v0", 1, seed=0), seed=0, device="cpu")
    gait = evaluate_gait(untrained, n_episodes=2, seed=1000)
    assert float(rows[2]["return_mean"]) == gait["return_mean"]
    assert float(rows[0]["return_mean"]) != gait["return_mean"]  # A trained
    # learner A's log is written as the readers' logs: a row every 5 gradient steps
    for name in names:
        with open(tmp_path / name / "progress.csv", newline="") as f:
            log = list(csv.DictReader(f))
        assert [int(float(r["train/n_updates"])) for r in log] == [5, 10, 15, 20], name
        assert all(r["train/critic_loss"] for r in log), name


def test_shared_replay_hypotheses_needs_one_gamma_and_learning_rate_per_variant():
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "shared_replay_hypotheses.py"), "--gammas", "0.99", "0.5"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "--gammas and --learning-rates need one value per variant" in proc.stderr


def _parsers_and_arguments(path: Path):
    """``(ArgumentParser calls, add_argument calls)`` of a script, as AST nodes."""
    import ast

    calls = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)]
    named = [(n, n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", None)) for n in calls]
    return [n for n, name in named if name == "ArgumentParser"], [n for n, name in named if name == "add_argument"]


SCRIPTS = sorted([*EXAMPLES.glob("*.py"), *(ROOT / "benchmarks").glob("*.py")])


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_script_option_shows_its_default_in_help(path):
    """Each parser formats with unilab_gym.cli.HelpFormatter (``(default: X)``), and each option has a help
    text: argparse prints the default only next to a help text."""
    parsers, arguments = _parsers_and_arguments(path)
    for call in parsers:
        formatter = {k.arg: k.value for k in call.keywords}.get("formatter_class")
        assert formatter is not None and getattr(formatter, "id", getattr(formatter, "attr", None)) in (
            "HelpFormatter",
            "ArgumentDefaultsHelpFormatter",
        ), f"{path.name}:{call.lineno}: ArgumentParser without formatter_class=HelpFormatter"
    missing = [call.lineno for call in arguments if "help" not in {k.arg for k in call.keywords}]
    assert not missing, f"{path.name}: add_argument without help= at lines {missing}"


def test_help_shows_the_step_budget_and_what_it_costs():
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "train_ppo_sb3.py"), "--help"], capture_output=True, text=True, check=True
    ).stdout
    text = " ".join(out.split())  # argparse wraps lines
    assert "(default: 1000000)" in text and "~5 min on 2 idle cores" in text
    assert "(default: runs/ppo_sb3/model)" in text
    assert "(default: None)" not in text and "(default: False)" not in text  # HelpFormatter leaves those out


def test_help_formatter_shows_defaults_but_not_none_or_flags():
    import argparse

    from unilab_gym.cli import HelpFormatter

    parser = argparse.ArgumentParser(prog="x", formatter_class=HelpFormatter)
    parser.add_argument("--steps", type=int, default=500, help="control steps")
    parser.add_argument("--out", default=None, help="video file")
    parser.add_argument("--no-progress", action="store_true", help="no bar")
    text = " ".join(parser.format_help().split())
    assert "control steps (default: 500)" in text
    assert "video file" in text and "no bar" in text and "default: None" not in text and "default: False" not in text


@pytest.mark.parametrize("progress", [True, False])
def test_play_shows_a_progress_bar_of_the_recorded_steps(tmp_path, capsys, progress):
    from unilab_gym.cli import play

    model = EXAMPLES / "pretrained" / "ppo_quadruped.zip"
    out = play.main(
        [str(model), "--steps", "3", "--out", str(tmp_path / "walk.gif")] + ([] if progress else ["--no-progress"])
    )
    err = capsys.readouterr().err
    assert out.exists()
    assert ("play: 100%" in err and "3/3" in err) is progress, err


def test_export_shows_a_progress_bar_of_its_stages(tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    from unilab_gym.cli import export

    model = EXAMPLES / "pretrained" / "ppo_quadruped.zip"
    header = tmp_path / "policy.h"
    export.main([str(model), "--out", str(tmp_path / "policy.onnx"), "--c-header", str(header)])
    captured = capsys.readouterr()
    assert "export: 100%" in captured.err and "5/5" in captured.err, captured.err
    assert "parity max |diff|" in captured.out and header.exists()  # the figures still go to stdout
