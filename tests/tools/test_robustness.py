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

    from unilab_gym.sb3.vec_env import make_sb3_env

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

    root = Path(__file__).resolve().parents[2]
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

    from unilab_gym.sb3.vec_env import make_sb3_env

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
    from unilab_gym.sb3.vec_env import make_sb3_env

    venv = make_sb3_env("UniLab/Quadruped-v0", 1)
    PPO("MlpPolicy", venv, n_steps=8, batch_size=8).save(tmp_path / "ppo")
    venv.close()
    with pytest.raises(SystemExit, match="--steps must be a positive int, got -3"):
        play([str(tmp_path / "ppo.zip"), "--steps", "-3", "--out", str(tmp_path / "x.gif")])
    assert not (tmp_path / "x.gif").exists()


PICK = "UniLab/PandaPick-v0"


def test_pandapick_task_axes_set_the_config_range_and_bad_names_raise_clearly():
    from unilab_gym.cli.robustness import task_axes

    axes = parse_grid("object_size=0.02:0.07:6, object_friction=0.3:1.5:2, friction=0.5:1:2", PICK)
    assert [(a.name, a.field) for a in axes] == [
        ("object_size", "object_size_range"),
        ("object_friction", "object_friction_range"),
        ("friction", None),  # the physics parameter (the fingers'), not the object's
    ]
    np.testing.assert_allclose(axes[0].values, [0.02, 0.03, 0.04, 0.05, 0.06, 0.07])
    assert {"object_size", "object_mass", "object_friction"} <= set(task_axes(PICK))
    with pytest.raises(
        ValueError,
        match=r"unknown grid axis 'object_colour'; valid names: \[.*'object_friction'.*'object_size'.*\] "
        r"\(for UniLab/PandaPick-v0\)",
    ):
        parse_grid("object_colour=0:1:2", PICK)
    with pytest.raises(ValueError, match=r"unknown grid axis 'object_size'; .*\(for UniLab/Quadruped-v0\)"):
        parse_grid("object_size=0.02:0.07:2")  # the quadruped has no object
    with pytest.raises(ValueError, match="object_size_range"):  # the task's own validation: the gripper opens 8 cm
        parse_grid("object_size=0.05:0.1:2", PICK)
    with pytest.raises(ValueError, match=r"NoSuchTask-v0. is not registered"):
        parse_grid("friction=0.5:1:2", "UniLab/NoSuchTask-v0")


class _ScriptedGrasp:
    """Above the object, down, close, lift to the goal, through Pick's end-effector actions (from the observation:
    PICK_OBS_LAYOUT); the step count restarts with each batch (a fresh env's last action is all zero)."""

    def __init__(self):
        self.t = 0

    def __call__(self, obs):
        from unilab_gym.tasks.panda import PICK_OBS_LAYOUT as L

        def col(name):
            return obs[:, slice(*L[name])].astype(np.float64)

        if not obs[:, slice(*L["last_action"])].any():
            self.t = 0
        obj, point = col("object_pos"), col("grasp_point_command")
        t, self.t = self.t, self.t + 1
        target = obj + np.array([0.0, 0.0, 0.06]) if t < 12 else obj if t < 27 else col("goal")
        action = np.zeros((len(obs), 4), np.float32)
        action[:, :3] = np.clip((target - point) / 0.05, -1, 1)
        action[:, 3] = 1.0 if t < 22 else -1.0
        return action


def test_pandapick_success_is_is_success_per_object_friction_cell():
    """A scripted grasp lifts the objects that have friction and none that have not: the report's success is
    ``info["is_success"]`` at the episode's last step, with no gait figures (not a quadruped)."""
    from unilab_gym.cli.robustness import evaluate, summarize

    axes = parse_grid("object_friction=0:1:2", PICK)
    records = evaluate(_ScriptedGrasp(), axes, 6, env_id=PICK, num_envs=3, progress=False)
    assert len(records) == 6
    for r in records:
        assert r["parameters"]["object_friction"] == r["cell"]["object_friction"]  # the cell's value, drawn exactly
        assert isinstance(r["is_success"], bool) and "duty_factor" not in r
    cells = {c["cell"]["object_friction"]: c for c in summarize(records, axes, ("object_lost",))}
    assert cells[0.0]["success_rate"] == 0.0 and cells[1.0]["success_rate"] >= 2 / 3
    assert cells[1.0]["success_rate"] == np.mean([r["is_success"] for r in records if r["cell"]["object_friction"]])
    assert set(cells[0.0]["fall_conditions"]) == {"object_lost"} and cells[0.0]["duty_factor"] is None


def test_pandapick_report_marks_held_out_sizes_draws_the_figure_and_replays(tmp_path):
    import gymnasium as gym
    import matplotlib.image
    from stable_baselines3 import PPO

    model = tmp_path / "pick.zip"
    env = gym.make(PICK, max_episode_steps=5)
    PPO("MlpPolicy", env, n_steps=8, batch_size=8, seed=0, device="cpu").save(model)
    env.close()
    out = tmp_path / "report"
    args = ["--model", str(model), "--algo", "ppo", "--env-id", PICK, "--grid", "object_size=0.02:0.06:3"]
    args += ["--train-ranges", "object_size=0.03:0.05", "--episodes", "6", "--max-episode-steps", "5"]
    main([*args, "--num-envs", "2", "--out", str(out), "--no-progress"])
    results = json.loads((out / "results.json").read_text())
    assert results["env_id"] == PICK and results["success_rule"] == "is_success"
    assert results["task_axes"] == {"object_size": "object_size_range"}
    assert results["env"]["max_episode_steps"] == 5 and results["condition_names"] == ["object_lost"]
    held = {round(c["cell"]["object_size"], 9): c["held_out"] for c in results["cells"]}
    assert held == {0.02: True, 0.04: False, 0.06: True}
    for r in results["episodes"]:
        assert r["parameters"]["object_size"] == pytest.approx(r["cell"]["object_size"]) and "is_success" in r
    report = (out / "report.md").read_text()
    assert 'Success: `info["is_success"]`' in report and "object_size sets" not in report
    assert "`object_size` sets `object_size_range` = (v, v)" in report and "Trained on: object_size 0.03-0.05" in report
    assert "tracking error" not in report and "| held out |" in report and "generalization.png" in report
    image = matplotlib.image.imread(out / "generalization.png")
    assert image.ndim == 3 and image.std() > 0.05
    # a failure replays exactly, in its cell's object size
    outcome = main(["--replay", str(out / "results.json"), "--model", str(model)])
    assert outcome["matches"] and outcome["is_success"] is False


def test_train_ranges_must_name_grid_axes(tmp_path, capsys):
    from unilab_gym.cli.robustness import parse_train_ranges

    axes = parse_grid("object_size=0.02:0.06:3", PICK)
    assert parse_train_ranges("object_size=0.03:0.05", axes) == {"object_size": (0.03, 0.05)}
    with pytest.raises(ValueError, match=r"'object_mass' is not a grid axis; the grid's axes: \['object_size'\]"):
        parse_train_ranges("object_mass=0.1:0.2", axes)
    with pytest.raises(ValueError, match="low <= high"):
        parse_train_ranges("object_size=0.05:0.03", axes)
