"""Robustness report CLI: grid parsing, a tiny report with a freshly initialized policy, replay of a failure."""

import json
import subprocess
import sys

import numpy as np
import pytest

from unilab_gym.cli.robustness import AXIS_ALIASES, main, parse_grid, wilson_interval


def test_parse_grid_values_and_alias():
    axes = parse_grid("friction=0.3:1.2:4, mass=-1:3:3,latency=0:4:3")
    assert [a.name for a in axes] == ["friction", "added_mass", "latency"]
    np.testing.assert_allclose(axes[0].values, [0.3, 0.6, 0.9, 1.2])
    assert axes[1].values == (-1.0, 1.0, 3.0) and axes[2].values == (0.0, 2.0, 4.0)
    assert AXIS_ALIASES == {"mass": "added_mass"}


def test_wilson_interval():
    lo, hi = wilson_interval(13, 20)  # the closed form of Wilson (1927), 95 %
    assert lo == pytest.approx(0.4329, abs=1e-4) and hi == pytest.approx(0.8188, abs=1e-4)
    assert wilson_interval(20, 20)[1] == 1.0 and wilson_interval(0, 5)[0] == 0.0


@pytest.mark.parametrize(
    "text, message",
    [
        ("gravity=0:1:2", r"unknown grid axis 'gravity'; valid names: \[.*'friction'.*'mass'.*'push_velocity'"),
        ("friction=0.3:1.2", "name=low:high:n"),
        ("friction=0.3:1.2:x", "integer"),
        ("friction=1.2:0.3:4", "low <= high"),
        ("friction=0.3:1.2:0", "n >= 1"),
        ("mass=0:1:2,added_mass=0:1:2", "twice"),
        ("latency=0:3:3", "latency.*integers"),
        ("friction=-1:1:3", "friction"),
        ("", "at least one axis"),
    ],
)
def test_bad_grid_raises_clearly(text, message):
    with pytest.raises(ValueError, match=message):
        parse_grid(text)


def test_cli_rejects_unknown_axis_listing_valid_ones(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--model", str(tmp_path / "m.zip"), "--algo", "ppo", "--grid", "speed=0:1:2"])
    assert exit_info.value.code == 2
    assert "valid names" in capsys.readouterr().err


@pytest.fixture(scope="module")
def fresh_ppo(tmp_path_factory):
    """A freshly initialized PPO policy saved with VecNormalize statistics, as examples/train_ppo_dr.py saves them."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import VecNormalize

    from unilab_gym.integrations.sb3 import make_sb3_env

    out = tmp_path_factory.mktemp("policy")
    env = VecNormalize(make_sb3_env("UniLab/Quadruped-v0", 2, seed=0))
    env.reset()
    for _ in range(5):  # non-trivial observation statistics
        env.step(np.zeros((2, 12), np.float32))
    model = PPO("MlpPolicy", env, n_steps=8, batch_size=16, seed=0, device="cpu")
    model.save(out / "model")
    env.save(str(out / "model_vecnormalize.pkl"))
    env.close()
    return out / "model.zip"


def test_report_on_tiny_grid_then_replay_a_failure(fresh_ppo, tmp_path):
    import matplotlib.image

    out = tmp_path / "report"
    # kp_factor 0.1 leaves the PD too weak to hold the robot up: those cells fail, the others stand
    main(
        [
            "--model",
            str(fresh_ppo),
            "--algo",
            "ppo",
            "--episodes",
            "8",
            "--grid",
            "kp_factor=0.1:1:2,mass=-1:2:2",
            "--max-episode-steps",
            "20",
            "--num-envs",
            "3",
            "--out",
            str(out),
            "--no-progress",
            "--sibling-vecnormalize",
        ]
    )
    results = json.loads((out / "results.json").read_text())
    assert results["vecnormalize"].endswith("model_vecnormalize.pkl")  # found next to the model, as asked
    assert len(results["episodes"]) == 8 and results["episodes_per_cell"] == 2
    cells = results["cells"]
    assert len(cells) == 4 and all(c["episodes"] == 2 for c in cells)
    keys = [(c["success_rate"], c["mean_return"]) for c in cells]
    assert keys == sorted(keys), "worst cells first"
    weak = {c["cell"]["kp_factor"]: c["success_rate"] for c in cells}
    assert weak[0.1] == 0.0 and weak[1.0] == 1.0
    assert all(c["fall_rate"] == 1.0 - c["success_rate"] for c in cells)
    assert all(lo <= c["success_rate"] <= hi for c in cells for lo, hi in [c["success_ci95"]])
    # evaluate_gait's figures, per episode and per cell: a PD too weak to stand sinks and tilts
    gait = {"tracking_error_mps", "duty_factor", "base_height_m", "tilt_rad"}
    assert all(gait <= set(r) for r in results["episodes"]) and all(gait <= set(c) for c in cells)
    weak_heights = [c["base_height_m"] for c in cells if c["cell"]["kp_factor"] == 0.1]
    assert max(weak_heights) < min(c["base_height_m"] for c in cells if c["cell"]["kp_factor"] == 1.0)
    assert all(0.0 <= c["duty_factor"] <= 1.0 for c in cells)
    for c in cells:
        rs = [r for r in results["episodes"] if r["cell"] == c["cell"]]
        assert c["tilt_rad"] == pytest.approx(sum(r["tilt_rad"] for r in rs) / len(rs))
    for r in results["episodes"]:
        assert set(r["cell"]) == {"kp_factor", "added_mass"}
        assert r["parameters"]["kp_factor"] == r["cell"]["kp_factor"] and r["parameters"]["friction"] == 0.5
    # every cell sees the same episode seeds
    seeds = {
        json.dumps(c["cell"]): sorted(r["episode_seed"] for r in results["episodes"] if r["cell"] == c["cell"])
        for c in cells
    }
    assert len({json.dumps(v) for v in seeds.values()}) == 1

    report = (out / "report.md").read_text()
    assert "Success: the episode reaches the time limit" in report
    assert "| tracking error (m/s) | duty factor | base height (m) | tilt (rad) |" in report
    table = [line for line in report.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(table) == 4 and table[0].split("|")[2].strip() == "0.1"  # rank 1 is a weak-PD cell
    assert "--replay" in report
    image = matplotlib.image.imread(out / "heatmap.png")
    assert image.ndim == 3 and image.shape[0] > 100 and image.std() > 0.05

    # replay the first failure of the worst cell: same actions, same outcome, and a video
    video = tmp_path / "failure.gif"
    policy = ["--model", str(fresh_ppo), "--vecnormalize", results["vecnormalize"]]  # named, never read from the JSON
    outcome = main(["--replay", str(out / "results.json"), *policy, "--video", str(video)])
    assert outcome["matches"] and outcome["termination"] == "fall"
    assert video.stat().st_size > 0
    success = next(k for k, r in enumerate(results["episodes"]) if r["termination"] == "time_limit")
    assert main(["--replay", f"{out / 'results.json'}:{success}", *policy])["matches"]


def test_importing_the_module_stays_light():
    code = (
        "import sys, unilab_gym.cli.robustness; "
        "print([m for m in ('torch', 'stable_baselines3', 'matplotlib') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.slow
def test_train_ppo_dr_example_writes_model_stats_and_trace(tmp_path):
    from pathlib import Path

    from unilab_gym.trace import read_jsonl

    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [
            sys.executable,
            str(root / "examples" / "train_ppo_dr.py"),
            "--total-steps",
            "512",
            "--num-envs",
            "4",
            "--n-steps",
            "64",
            "--seed",
            "1",
            "--save-path",
            str(tmp_path / "ppo_dr"),
            "--no-progress",
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "ppo_dr.zip").exists() and (tmp_path / "ppo_dr_vecnormalize.pkl").exists()
    header, records = read_jsonl(tmp_path / "ppo_dr_trace.jsonl")  # 128 steps per env: few or no finished episodes
    assert header["env"]["domain_randomization"]["friction"] == [0.4, 1.0]
    assert f"{len(records)} episodes in" in proc.stdout


def test_cli_refuses_a_wrong_algo_and_bad_counts_with_a_usage_error(tmp_path, capsys):
    from stable_baselines3 import PPO

    from unilab_gym.integrations.sb3 import make_sb3_env

    venv = make_sb3_env("UniLab/Quadruped-v0", 1)
    PPO("MlpPolicy", venv, n_steps=8, batch_size=8).save(tmp_path / "ppo")
    venv.close()
    base = ["--model", str(tmp_path / "ppo.zip"), "--grid", "friction=0.5:1:2", "--out", str(tmp_path / "r")]
    for extra, message in (
        (["--algo", "sac"], "saved by PPO: pass --algo ppo"),
        (["--algo", "ppo", "--threads", "0"], "--threads"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(base + extra)
        assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_play_refuses_a_non_positive_step_count(tmp_path):
    from stable_baselines3 import PPO

    from unilab_gym.cli.play import main as play
    from unilab_gym.integrations.sb3 import make_sb3_env

    venv = make_sb3_env("UniLab/Quadruped-v0", 1)
    PPO("MlpPolicy", venv, n_steps=8, batch_size=8).save(tmp_path / "ppo")
    venv.close()
    with pytest.raises(SystemExit, match="--steps must be a positive int, got -3"):
        play([str(tmp_path / "ppo.zip"), "--steps", "-3", "--out", str(tmp_path / "x.gif")])
    assert not (tmp_path / "x.gif").exists()
