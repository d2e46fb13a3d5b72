"""benchmarks/bench_env.py --task and benchmarks/learning_check.py --task (issue 27, item 7): the per-task outputs.

Smoke-sized runs only (a few envs, seconds of training): the schema of ``tasks.json`` (the keys as the issue
spells them), the merge rule (rerunning a (task, robot) replaces its entry only), the raw physics loop of a
task on the seam and ``bench_env --task``'s entry.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
from types import SimpleNamespace

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "benchmarks")
QUADRUPED = "UniLab/Quadruped-v0"
#: The keys of a tasks.json entry, exactly as issue 27 item 7 spells them (success_rate: where the task defines it).
ISSUE_KEYS = {"task", "robot", "algo", "env_steps", "wall_clock_s", "return_random", "return_trained"}


def _load(name: str):
    sys.path.insert(0, BENCH)
    spec = importlib.util.spec_from_file_location(name, os.path.join(BENCH, f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


lc = _load("learning_check")
bench_env = _load("bench_env")
common = sys.modules["common"]


def _entry(robot: str, value: float, **extra) -> dict:
    return {
        "task": QUADRUPED,
        "robot": robot,
        "algo": "ppo",
        "env_steps": 1,
        "wall_clock_s": value,
        "return_random": value,
        "return_trained": value,
        **extra,
    }


def test_merge_replaces_only_the_entry_of_the_same_task_and_robot(tmp_path):
    path = str(tmp_path / "tasks.json")
    common.merge_task_results(path, [_entry("a1", 1.0), _entry("aliengo", 2.0)], date="old", details={"a": 1})
    written = common.merge_task_results(path, [_entry("aliengo", 3.0)], date="new", details={"b": 2})
    with open(path) as f:
        on_disk = json.load(f)
    assert on_disk == written
    assert on_disk["tasks"] == [_entry("a1", 1.0), _entry("aliengo", 3.0)]  # one entry per (task, robot), sorted
    assert on_disk["date"] == "new" and on_disk["details"] == {"a": 1, "b": 2}
    with pytest.raises(ValueError, match="lacks"):
        common.merge_task_results(path, [{"task": QUADRUPED}])


def test_merge_refuses_a_file_that_is_not_a_tasks_file(tmp_path):
    path = tmp_path / "tasks.json"
    path.write_text('{"summary": []}')
    with pytest.raises(ValueError, match=r"tasks\.json"):
        common.merge_task_results(str(path), [_entry("a1", 1.0)])
    assert path.read_text() == '{"summary": []}'


def test_task_entry_has_the_issue_keys_and_success_rate_only_where_defined():
    runs = [
        {"env_steps": s, "wall_clock_s": 2.0 * s, "return_random": -1.0, "return_trained": float(s), "success_rate": r}
        for s, r in ((1, None), (3, None), (2, None))
    ]
    entry = lc.task_entry(QUADRUPED, "a1", "ppo", runs)
    assert set(entry) == ISSUE_KEYS
    assert (entry["env_steps"], entry["wall_clock_s"], entry["return_trained"]) == (2, 4.0, 2.0)  # medians
    for r, rate in zip(runs, (0.0, 1.0, 0.5)):
        r["success_rate"] = rate
    entry = lc.task_entry("UniLab/PandaReach-v0", "panda", "sac", runs)
    assert set(entry) == ISSUE_KEYS | {"success_rate"} and entry["success_rate"] == 0.5


def test_evaluate_task_reports_success_where_the_info_has_it():
    """Random actions on the same evaluation seeds give the same returns; success only where info has is_success."""
    space = SimpleNamespace(low=-np.ones(7, np.float32), high=np.ones(7, np.float32))
    first = lc.evaluate_task(lc.RandomPolicy(space), "UniLab/PandaReach-v0", 2, {"max_episode_steps": 3})
    again = lc.evaluate_task(lc.RandomPolicy(space), "UniLab/PandaReach-v0", 2, {"max_episode_steps": 3})
    assert first == again and len(first["returns"]) == 2
    assert 0.0 <= first["success_rate"] <= 1.0
    space = SimpleNamespace(low=-np.ones(12, np.float32), high=np.ones(12, np.float32))
    quadruped = lc.evaluate_task(lc.RandomPolicy(space), QUADRUPED, 2, {"max_episode_steps": 3})
    assert quadruped["success_rate"] is None and math.isfinite(quadruped["return_mean"])


def test_evaluate_task_splits_the_return_into_reward_terms_and_measures_quadruped_tracking():
    """The terms' episode sums add up to the return; standing still, the tracking error is the commanded speed."""
    import gymnasium as gym

    class Zero:
        def predict(self, obs, deterministic=True):
            return np.zeros((len(obs), 12), np.float32), None

    figures = lc.evaluate_task(Zero(), QUADRUPED, 3, {"max_episode_steps": 4})
    assert {"tracking_lin_vel", "alive"} <= set(figures["reward_terms_mean"])
    assert sum(figures["reward_terms_mean"].values()) == pytest.approx(figures["return_mean"], rel=1e-9)
    env = gym.make_vec(QUADRUPED, num_envs=3)
    try:
        _, info = env.reset(seed=lc.EVAL_SEED)  # evaluate_task's episodes
        speed = np.hypot(info["command"][:, 0], info["command"][:, 1]).mean()
    finally:
        env.close()
    # the robot barely moves in 4 steps at zero action: the error is |command_xy| within a few cm/s
    assert speed > 0.1 and figures["lin_vel_tracking_error_mps"] == pytest.approx(speed, abs=0.05)
    space = SimpleNamespace(low=-np.ones(7, np.float32), high=np.ones(7, np.float32))
    reach = lc.evaluate_task(lc.RandomPolicy(space), "UniLab/PandaReach-v0", 2, {"max_episode_steps": 3})
    assert reach["lin_vel_tracking_error_mps"] is None  # no velocity command
    assert sum(reach["reward_terms_mean"].values()) == pytest.approx(reach["return_mean"], rel=1e-9)


def test_task_settings_are_the_shipped_ones_per_task():
    """Quadrupeds: examples/train_ppo_sb3.py's PPO; the arm and the quadrotor: their own rows, batch capped."""
    assert lc.task_ppo_kwargs(QUADRUPED, 64) == lc.ppo_kwargs(64)
    assert lc.task_ppo_kwargs("UniLab/QuadrupedRough-v0", 32) == lc.ppo_kwargs(32)
    reach = lc.task_ppo_kwargs("UniLab/PandaReach-v0", 16)
    assert (reach["gamma"], reach["n_steps"], reach["batch_size"]) == (0.95, 64, 256)
    assert reach["policy_kwargs"] == {"net_arch": [128, 128]}
    assert lc.task_ppo_kwargs("UniLab/Quadrotor-v0", 4)["batch_size"] == 128 * 4  # one rollout at most
    assert lc.task_settings("UniLab/PandaReach-v0")["normalize"] is False
    assert lc.task_settings("UniLab/Unknown-v0") == lc.DEFAULT_TASK_SETTINGS
    assert lc.model_stem(QUADRUPED, "aliengo") == "Quadruped-v0_aliengo"


@pytest.mark.timeout(300)
def test_learning_check_task_saves_the_model_and_states_its_settings(tmp_path):
    from stable_baselines3 import PPO

    models = tmp_path / "models"
    argv = ["--task", "UniLab/PandaReach-v0", "--smoke", "--minutes", "0.01", "--out", str(tmp_path)]
    payload = lc.main([*argv, "--save-model", str(models)])
    (entry,) = payload["tasks"]
    assert sorted(os.listdir(models)) == ["PandaReach-v0_panda.zip"]  # not normalized: no statistics file
    model = PPO.load(str(models / "PandaReach-v0_panda.zip"), device="cpu")
    assert model.num_timesteps == entry["env_steps"] and model.gamma == 0.95
    assert (entry["num_envs"], entry["vecnormalize"], entry["hyperparameters"]["gamma"]) == (8, False, 0.95)
    assert entry["budget_s"] == pytest.approx(0.6) and len(entry["load_average"]["start"]) == 3
    assert 0.0 <= entry["success_rate_random"] <= 1.0 and "lin_vel_tracking_error_mps_trained" not in entry
    details = payload["details"]["UniLab/PandaReach-v0 (panda)"]["runs"][0]
    assert entry["return_zero_action"] == details["zero_action"]["return_mean"]  # the nominal pose, same episodes
    assert entry["success_rate_zero_action"] == details["zero_action"]["success_rate"]


@pytest.mark.timeout(300)
def test_learning_check_task_smoke_writes_one_entry_per_task_and_robot(tmp_path, capsys):
    path = tmp_path / "tasks.json"
    earlier = _entry("a1", 7.0)
    common.merge_task_results(str(path), [earlier, _entry("aliengo", 123.0)], date="2000-01-01")
    argv = ["--task", QUADRUPED, "--robot", "aliengo", "--smoke", "--minutes", "0.02", "--out", str(tmp_path)]
    argv += ["--save-model", str(tmp_path / "models")]
    payload = lc.main(argv)
    report = json.loads(path.read_text())
    assert report == json.loads(json.dumps(payload))
    assert {"tasks", "machine", "load", "date"} <= set(report) and report["date"] != "2000-01-01"
    assert report["tasks"][0] == earlier  # the other robot's entry is kept as it was
    (entry,) = [e for e in report["tasks"] if e["robot"] == "aliengo"]  # replaced, not appended
    assert set(entry) >= ISSUE_KEYS and "success_rate" not in entry  # the quadruped defines no success
    assert (entry["task"], entry["algo"]) == (QUADRUPED, "ppo")
    assert entry["env_steps"] >= 8 * 64  # at least one PPO rollout of 8 envs x 64 steps
    assert 0 < entry["wall_clock_s"] < 123.0
    assert math.isfinite(entry["return_random"]) and math.isfinite(entry["return_trained"])
    details = report["details"][f"{QUADRUPED} (aliengo)"]
    assert details["mode"] == "smoke" and details["runs"][0]["env_steps"] == entry["env_steps"]
    assert f"| {QUADRUPED} | aliengo | ppo |" in capsys.readouterr().out
    assert entry["vecnormalize"] and entry["lin_vel_tracking_error_mps_trained"] > 0
    saved = tmp_path / "models" / "Quadruped-v0_aliengo"
    assert details["runs"][0]["saved"] == [f"{saved}.zip", f"{saved}_vecnormalize.pkl"]
    assert all(os.path.exists(f) for f in details["runs"][0]["saved"])


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--task", "UniLab/Nope-v0"], "UniLab/Nope-v0"),
        (["--task", QUADRUPED, "--robot", "spot"], "spot"),
        (["--task", QUADRUPED, "--algo", "td3"], "td3"),
        (["--task", QUADRUPED, "--only", "ppo"], "--only"),
        (["--robot", "aliengo"], "--robot needs --task"),
        (["--save-model", "m"], "--save-model needs --task"),
    ],
)
def test_learning_check_task_names_a_bad_argument_and_writes_nothing(tmp_path, capsys, argv, named):
    with pytest.raises(SystemExit) as exc:
        lc.main([*argv, "--smoke", "--out", str(tmp_path)])
    assert exc.value.code == 2
    assert named in capsys.readouterr().err
    assert not (tmp_path / "tasks.json").exists()


def test_raw_loop_of_an_external_actuation_task_applies_its_forces():
    """The quadrotor's raw loop steps ClusterWorld with the task's own forces: full thrust climbs, low thrust sinks."""
    import gymnasium as gym

    env = gym.make_vec("UniLab/Quadrotor-v0", num_envs=2)
    try:
        env.reset(seed=0)
        step, width, actuation = bench_env.raw_stepper(env)
        assert (width, actuation) == (4, "external")
        z0 = env.robot_state.base_pos[:, 2].copy()
        for _ in range(10):
            step(np.array([[1.0] * 4, [-1.0] * 4]))
        dz = env.robot_state.base_pos[:, 2] - z0
        assert dz[0] > 0 > dz[1]
    finally:
        env.close()
    assert bench_env.raw_stepper(SimpleNamespace(task=SimpleNamespace(actuation="tendons"), _clusters=[])) is None


@pytest.mark.timeout(300)
def test_bench_env_task_smoke_merges_its_entry(tmp_path, capsys):
    out = tmp_path / "bench_tasks.json"
    bench_env.main(["--task", QUADRUPED, "--robot", "aliengo", "--smoke", "--out", str(out)])
    report = json.loads(out.read_text())
    assert {"tasks", "machine", "load", "date"} <= set(report)
    (entry,) = report["tasks"]
    assert (entry["task"], entry["robot"], entry["raw_actuation"]) == (QUADRUPED, "aliengo", "joint_pd")
    assert (entry["num_envs"], entry["steps"], entry["repeats"]) == (4, 3, 1)
    for name in ("raw", "unilab", "dummy"):
        assert entry[f"env_steps_per_s_{name}"] > 0 and entry[f"rss_mb_{name}"] > 0
        assert len(entry["runs"][name]) == 1
    assert entry["unilab_vs_raw"] == pytest.approx(entry["env_steps_per_s_unilab"] / entry["env_steps_per_s_raw"])
    assert entry["unilab_vs_dummy"] == pytest.approx(entry["env_steps_per_s_unilab"] / entry["env_steps_per_s_dummy"])
    assert f"| {QUADRUPED} | aliengo | 4 |" in capsys.readouterr().out


def test_bench_env_task_arguments_are_checked(tmp_path, capsys):
    for argv, named in (
        (["--robot", "aliengo"], "--robot needs --task"),
        (["--task", QUADRUPED, "--sweep-cluster"], "--sweep-cluster"),
        (["--task", "UniLab/Nope-v0", "--smoke"], "UniLab/Nope-v0"),
    ):
        with pytest.raises(SystemExit):
            bench_env.main([*argv, "--out", str(tmp_path / "b.json")])
        assert named in capsys.readouterr().err
    assert not (tmp_path / "b.json").exists()
