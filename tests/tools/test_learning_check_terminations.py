"""learning_check.py --task's evaluation counts terminated episodes and their lengths (issue 27, item 7: falls)."""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import learning_check as lc


class _Zero:
    def predict(self, obs, deterministic=True):
        return np.zeros((obs.shape[0], 12), dtype=np.float32), None


class _Kick:
    """Full-scale alternating joint targets: the Laikago falls within a few dozen steps."""

    def __init__(self):
        self.t = 0

    def predict(self, obs, deterministic=True):
        self.t += 1
        return np.full((obs.shape[0], 12), 1.0 if self.t % 8 < 4 else -1.0, dtype=np.float32), None


def test_standing_episodes_are_truncated_at_full_length():
    figures = lc.evaluate_task(_Zero(), "UniLab/Quadruped-v0", 2, {"max_episode_steps": 5})
    assert figures["termination_rate"] == 0.0
    assert figures["episode_length_mean"] == 5.0


def test_falls_are_counted_and_end_the_episode_early():
    figures = lc.evaluate_task(_Kick(), "UniLab/Quadruped-v0", 2, {"robot": "laikago", "max_episode_steps": 200})
    assert figures["termination_rate"] > 0.0
    assert figures["episode_length_mean"] < 200.0


def test_the_table_has_a_terminated_column_and_a_dash_for_old_entries():
    entry = {
        "task": "T",
        "robot": "r",
        "algo": "ppo",
        "env_steps": 1,
        "wall_clock_s": 1.0,
        "return_random": 0.0,
        "return_trained": 1.0,
    }
    old = lc.task_markdown({"tasks": [entry]}).splitlines()
    new = lc.task_markdown({"tasks": [{**entry, "termination_rate_random": 1.0, "termination_rate_trained": 0.25}]})
    assert "terminated episodes, random → trained" in old[0]
    assert old[2].endswith("| — |")
    assert new.splitlines()[2].endswith("| 100% → 25% |")
