"""benchmarks/learning_check.py: the time-to-threshold arithmetic, and --smoke writing all three outputs."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "learning_check.py")
SUMMARY_KEYS = {
    "algo",
    "runner",
    "config",
    "seeds",
    "threshold",
    "time_to_threshold_s",
    "final_return",
    "tracking_error_mps",
    "fall_rate",
}


def _module():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    spec = importlib.util.spec_from_file_location("learning_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["learning_check"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


lc = _module()


def _curve(*points: tuple[float, float]) -> list[dict[str, float]]:
    return [{"t_s": t, "return_mean": r, "tracking_error_mps": 0.2, "fall_rate": 0.0} for t, r in points]


def _run(key: str, seed: int, curve: list[dict[str, float]]) -> dict:
    config = lc.CONFIGS[key]
    return {
        "key": key,
        "seed": seed,
        "algo": config.algo,
        "runner": config.runner,
        "config": config.label(64),
        "trained_s": curve[-1]["t_s"],
        "env_steps": 1000,
        "env_steps_per_s": 10.0,
        "curve": curve,
    }


def test_time_to_threshold_interpolates_between_evaluations():
    assert lc.time_to_threshold(_curve((0, 17), (60, 21), (120, 29)), 25) == pytest.approx(90.0)
    assert lc.time_to_threshold(_curve((0, 26), (60, 20)), 25) == 0.0
    assert lc.time_to_threshold(_curve((0, 17), (60, 24.9)), 25) == math.inf
    assert lc.time_to_threshold(_curve((0, 17), (60, 25), (120, 30)), 25) == 60.0  # reaching counts


def test_summary_takes_medians_over_seeds_and_ratios_to_stock():
    stock = [_run("ppo-stock", s, _curve((0, 17), (100, 25), (180, 27))) for s in range(3)]
    lag0 = [  # two seeds reach at 50 s and 70 s, one never: the median is 70 s
        _run("ppo-async-lag0", 0, _curve((0, 17), (50, 25), (180, 28))),
        _run("ppo-async-lag0", 1, _curve((0, 17), (70, 25), (180, 26))),
        _run("ppo-async-lag0", 2, _curve((0, 17), (180, 20))),
    ]
    lag1 = [_run("ppo-async-lag1", s, _curve((0, 17), (180, 20 + s))) for s in range(3)]  # never
    summary = {
        e["key"]: e for e in lc.summarize({"ppo-stock": stock, "ppo-async-lag0": lag0, "ppo-async-lag1": lag1}, 25)
    }
    assert all(set(e) >= SUMMARY_KEYS for e in summary.values())
    assert summary["ppo-stock"]["time_to_threshold_s"] == pytest.approx(100.0)
    assert summary["ppo-async-lag0"]["time_to_threshold_s"] == pytest.approx(70.0)
    assert summary["ppo-async-lag0"]["time_to_threshold_per_seed_s"] == [50.0, 70.0, None]
    assert summary["ppo-async-lag0"]["time_to_threshold_vs_stock"] == pytest.approx(0.7)
    assert summary["ppo-async-lag1"]["time_to_threshold_s"] is None
    assert summary["ppo-async-lag1"]["time_to_threshold_vs_stock"] is None
    assert summary["ppo-async-lag1"]["time_to_threshold_vs_stock_text"] == "> 1.80×"  # stock 100 s, budget 180 s
    assert summary["ppo-async-lag1"]["final_return"] == 21
    assert summary["ppo-async-lag0"]["seeds"] == [0, 1, 2]
    # stock never reaches, async does: the ratio is bounded by the budget
    never = [_run("ppo-stock", s, _curve((0, 17), (200, 22))) for s in range(3)]
    bound = {e["key"]: e for e in lc.summarize({"ppo-stock": never, "ppo-async-lag0": lag0}, 25)}
    assert bound["ppo-stock"]["time_to_threshold_s"] is None
    assert bound["ppo-async-lag0"]["time_to_threshold_vs_stock_text"] == "< 0.35×"


def test_segments_grow_at_most_fourfold_in_whole_units():
    assert lc.next_segment(4096, None, 0, 45.0) == 4096  # probe
    assert lc.next_segment(4096, 3000.0, 4096, 45.0) == 4 * 4096
    assert lc.next_segment(4096, 3000.0, 10**6, 2.5) == 2 * 4096  # 7500 steps: the nearest whole rollouts
    assert lc.next_segment(4096, 3000.0, 10**6, 2.0) == 4096  # 6000
    assert lc.next_segment(64, 300.0, 512, 0.01) == 64


def test_only_selects_algorithms_and_keys_in_order():
    assert lc.select(None) == list(lc.CONFIGS)
    assert lc.select("ppo") == ["ppo-stock", "ppo-async-lag0", "ppo-async-lag1"]
    assert lc.select("sac-async,ppo-stock") == ["ppo-stock", "sac-async"]
    with pytest.raises(ValueError, match="'td3'"):
        lc.select("td3")


@pytest.mark.slow  # ~40 s of CPU, 105 s on a busy 2-core machine: imports, spawned collectors, 16 evaluations
@pytest.mark.timeout(600)
def test_smoke_mode_writes_json_markdown_and_plot(tmp_path):
    out = subprocess.run(
        # --smoke with 1.8 s of training per configuration (smoke's 9 s otherwise), still an evaluation at 0 and
        # at the end of each: every output and every key is written the same way
        [sys.executable, SCRIPT, "--smoke", "--minutes", "0.03", "--eval-every", "1", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((tmp_path / "learning_check.json").read_text())
    assert {"cpu", "cores", "ram_gb", "versions"} <= set(report["machine"])
    assert [e["key"] for e in report["summary"]] == list(lc.CONFIGS)
    for entry in report["summary"]:
        assert set(entry) >= SUMMARY_KEYS, entry
        config = lc.CONFIGS[entry["key"]]
        assert (entry["algo"], entry["runner"]) == (config.algo, config.runner)
        assert entry["seeds"] == [0] and entry["threshold"] == lc.DEFAULT_THRESHOLD
        assert entry["time_to_threshold_s"] is None or entry["time_to_threshold_s"] >= 0
        assert math.isfinite(entry["final_return"])
        assert entry["tracking_error_mps"] >= 0 and 0 <= entry["fall_rate"] <= 1
        (run,) = report["runs"][entry["key"]]
        assert run["curve"][0]["t_s"] == 0 and run["curve"][-1]["t_s"] == pytest.approx(run["trained_s"])
        assert run["env_steps"] > 0 and run["trained_s"] > 0
    table = (tmp_path / "learning_check.md").read_text()
    for entry in report["summary"]:
        assert f"| {entry['config']} |" in table
    assert table in out.stdout
    png = (tmp_path / "learning_check.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"

    # a new threshold re-summarizes the stored curves: every run starts at or above -100
    out = subprocess.run(
        [sys.executable, SCRIPT, "--plot-only", "--threshold", "-100", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((tmp_path / "learning_check.json").read_text())
    assert all(e["threshold"] == -100 and e["time_to_threshold_s"] == 0 for e in report["summary"])
