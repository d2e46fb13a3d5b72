"""benchmarks/bench_export.py (the figures of docs/export.md and privileged-observations.md) runs from a clone:
its ``--quick`` mode writes every part's figures, and a bad ``--only`` or ``--teacher`` is refused up front."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_export.py"


def run(*args, cwd=ROOT):
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_quick_run_writes_every_part_and_the_parities_hold(tmp_path):
    proc = run("--quick", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "bench_export.json").read_text())
    assert report["quick"] is True and report["machine"]["cores"] >= 1
    assert not [p for p in ("teacher", "nanrule", "untrained", "asym") if "error" in report[p]]
    teacher = report["teacher"]
    assert teacher["teacher_parity"] <= 1e-5 and teacher["student_parity"] <= 1e-5
    assert teacher["teacher_weight_bytes"] > teacher["student_weight_bytes"] > 0
    assert set(teacher["gait_seed20000"]) == {"episodes", "teacher", "student", "zero_action"}
    assert max(report["untrained"].values()) <= 1e-5 and set(report["untrained"]) == {
        "SAC",
        "TD3",
        "DDPG",
        "PPO",
        "A2C",
    }
    rule, no_rule = report["nanrule"]["rule"], report["nanrule"]["no_rule"]
    assert rule["nodes"] > no_rule["nodes"] and rule["p50_us"] > 0
    rows = [v for k, v in report["asym"].items() if k.startswith(("SAC", "PPO"))]
    assert len(rows) == 4 and 0.15 < report["asym"]["clipped_share_clip3"] < 0.3
    for row in rows:
        assert row["PolicyNet"] == row["PolicyNet_from_pkl"] == 0.0 and row["ONNX"] <= 1e-5
    if shutil.which("cc"):  # the C figures need a compiler; without one the report says why they are missing
        assert all(row["C"] <= 1e-5 for row in rows)
        assert teacher["teacher_c"]["c_vs_onnxruntime"] <= 1e-5 and teacher["student_c"]["header_bytes"] > 0
    else:
        assert "c_error" in teacher and all("c_error" in row for row in rows)
    assert (tmp_path / "teacher" / "policy.onnx").is_file() and (
        tmp_path / "asym" / "sac_untrained" / "stats.pkl"
    ).is_file()


def test_bad_parts_and_a_missing_teacher_are_refused_before_any_work(tmp_path):
    proc = run("--only", "teacher,speed", "--out", str(tmp_path / "a"))
    assert proc.returncode == 2 and "unknown part(s) ['speed']" in proc.stderr
    proc = run("--only", "nanrule", "--teacher", str(tmp_path / "nothing"), "--out", str(tmp_path / "b"))
    assert proc.returncode == 2 and "nothing.zip does not exist" in proc.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
