"""benchmarks/compare_sb3.py --smoke: every configuration runs and lands in all three outputs."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ENV = [
    "raw pybullet (physics limit)",
    "UniLabVectorEnv (1 process)",
    "AsyncRunner collectors (2 processes)",
    "SB3 DummyVecEnv",
    "SB3 SubprocVecEnv (2 workers)",
    "gymnasium AsyncVectorEnv (2 workers)",
]
SAC = ["stock SB3 SAC", "SB3 SAC + SharedReplayBuffer", "AsyncRunner SAC (2 collectors)"]
PPO = [
    "stock SB3 PPO (1 process)",
    "stock SB3 PPO (SubprocVecEnv)",
    "AsyncRunner PPO (lag 0)",
    "AsyncRunner PPO (lag 1)",
]
REPLAY = ["sb3", "shared", "tianshou"]


@pytest.mark.timeout(600)
def test_smoke_mode_writes_every_configuration(tmp_path):
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "compare_sb3.py"), "--smoke", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((tmp_path / "compare_sb3.json").read_text())
    assert {"cpu", "cores", "ram_gb", "versions"} <= set(report["machine"])
    assert report["machine"]["versions"]["pybullet"]
    sections = report["sections"]
    assert list(sections["env"]["runs"]) == ENV
    assert list(sections["sac"]["runs"]) == SAC
    assert list(sections["ppo"]["runs"]) == PPO
    assert list(sections["replay"]["results"]) == REPLAY
    for section in ("env", "sac", "ppo"):
        for name, runs in sections[section]["runs"].items():
            assert runs and all(r["env_steps_per_s"] > 0 for r in runs), name
    for name in SAC:
        assert sections["sac"]["runs"][name][0]["grad_steps"] > 0
    for name in PPO:  # every PPO configuration trained on all the env steps
        run = sections["ppo"]["runs"][name][0]
        assert run["grad_steps"] > 0 and run["env_steps"] >= report["config"]["rl_steps"]
    table = (tmp_path / "compare_sb3.md").read_text()
    for name in ENV + SAC + PPO + REPLAY:
        assert f"| {name} |" in table, name
    png = (tmp_path / "compare_sb3.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
