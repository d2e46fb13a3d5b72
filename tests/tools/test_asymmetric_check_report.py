"""asymmetric_check.py's report survives runs whose evaluation has falls (it crashed after 7 min of training)."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import asymmetric_check as ac

GRID = "friction=0.3:1.2:2,mass=-1:3:2"


def _record(cell, fell):
    """A record as ``unilab_gym.cli.robustness.evaluate`` writes it, with the keys the check keeps."""
    full = {
        "cell": cell,
        "return": 1.0 if fell else 5.0,
        "length": 40 if fell else 500,
        "termination": "fall" if fell else "time_limit",
        "fall_conditions": ["height"] if fell else [],
        "episode_seed": 7,  # dropped: not one of RECORD_KEYS
    }
    return {k: full[k] for k in ac.RECORD_KEYS if k in full}


def test_report_writes_json_markdown_and_heat_maps_when_episodes_fall(tmp_path):
    cells = [{"friction": f, "added_mass": m} for f in (0.3, 1.2) for m in (-1.0, 3.0)]
    runs = []
    for config in ac.CONFIGS:
        records = [_record(c, fell=(c["added_mass"] == 3.0 and config == "symmetric")) for c in cells]
        successes = [r["termination"] != "fall" for r in records]
        runs.append(
            {
                "config": config,
                "seed": 0,
                "env_steps": 1000,
                "train_wall_s": 1.0,
                "train_cpu_s": 1.0,
                "train_ep_return": 2.0,
                "success_rate": sum(successes) / len(successes),
                "mean_return": sum(r["return"] for r in records) / len(records),
                "records": records,
            }
        )
    settings = {"minutes": 0.1, "seeds": 1, "num_envs": 8, "episodes": 4, "eval_steps": 50, "grid": GRID}
    settings.update(dr={}, quick=False, wall_clock=False, parallel=1)
    load = {"load_average": [0.0, 0.0, 0.0], "busy_cores": 0.0, "cores": 2.0}
    payload = {"settings": settings, "load_start": load, "load_end": load, "runs": runs}

    ac.report(payload, tmp_path)

    saved = json.loads((tmp_path / "results.json").read_text())
    falls = [r for r in saved["runs"][1]["records"] if r["termination"] == "fall"]
    assert len(falls) == 2 and all(r["fall_conditions"] == ["height"] for r in falls)
    assert "episode_seed" not in saved["runs"][0]["records"][0]
    assert "| symmetric | 1 |" in (tmp_path / "results.md").read_text()
    for config in ac.CONFIGS:
        assert (tmp_path / f"heatmap_{config}.png").stat().st_size > 0
