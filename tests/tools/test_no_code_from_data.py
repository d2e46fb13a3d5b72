"""Data files never run code (issue 19, item 1).

A ``results.json`` names the model and the ``VecNormalize`` statistics an evaluation used, and the
training examples save ``<model>_vecnormalize.pkl`` next to a model. Both are pickles, which run
code when loaded. Here each of them is a pickle that creates a marker file when it is loaded:
``unilab-gym robustness --replay``, ``unilab-gym robustness --model`` and ``unilab-gym play`` must
never load them unless the user names them.
"""

from __future__ import annotations

import base64
import json
import pickle
import shutil
import zipfile
from pathlib import Path

import pytest

from unilab_gym.cli.play import main as play
from unilab_gym.cli.robustness import main as robustness


class _CreatesMarker:
    """Unpickles to ``open(path, "w")``: loading the pickle creates the file at ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _evil_pickle(path: Path, marker: Path) -> Path:
    path.write_bytes(pickle.dumps(_CreatesMarker(marker)))
    return path


def _evil_model(good: Path, path: Path, marker: Path) -> Path:
    """A copy of the SB3 model ``good`` whose data holds a cloudpickled object that creates ``marker``."""
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(path, "w") as dst:
        for item in src.infolist():
            payload = src.read(item)
            if item.filename == "data":
                data = json.loads(payload)
                blob = base64.b64encode(pickle.dumps(_CreatesMarker(marker))).decode()
                data["evil"] = {":type:": "<class 'object'>", ":serialized:": blob}
                payload = json.dumps(data).encode()
            dst.writestr(item, payload)
    return path


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A fresh PPO model with a booby-trapped sibling statistics file, and a report on it."""
    from stable_baselines3 import PPO

    from unilab_gym.sb3.vec_env import make_sb3_env

    root = tmp_path_factory.mktemp("data")
    markers = {name: root / f"ran_{name}" for name in ("sibling", "recorded_stats", "recorded_model")}
    venv = make_sb3_env("UniLab/Quadruped-v0", 1)
    PPO("MlpPolicy", venv, n_steps=8, batch_size=8, seed=0, device="cpu").save(root / "model")
    venv.close()
    model = root / "model.zip"
    _evil_pickle(root / "model_vecnormalize.pkl", markers["sibling"])  # as the training examples name it
    out = root / "report"
    robustness(
        [
            *("--model", str(model), "--algo", "ppo", "--episodes", "2", "--grid", "kp_factor=0.1:0.1:1"),
            *("--max-episode-steps", "5", "--num-envs", "2", "--out", str(out), "--no-progress"),
        ]
    )
    results = json.loads((out / "results.json").read_text())
    assert results["vecnormalize"] is None  # the sibling was not asked for
    # a shared results.json that names booby-trapped files
    results["vecnormalize"] = str(_evil_pickle(root / "stats.pkl", markers["recorded_stats"]))
    results["model"] = str(_evil_model(model, root / "evil_model.zip", markers["recorded_model"]))
    (out / "results.json").write_text(json.dumps(results))
    return model, out / "results.json", markers


def _assert_nothing_ran(markers: dict[str, Path]) -> None:
    ran = [name for name, marker in markers.items() if marker.exists()]
    assert not ran, f"a pickle ran: {ran}"


def test_robustness_report_does_not_load_a_sibling_pickle(setup):
    _, results_path, markers = setup
    _assert_nothing_ran(markers)  # the report in the fixture ran with the sibling next to the model
    assert "--vecnormalize" not in (results_path.parent / "report.md").read_text()


def test_replay_without_model_refuses_and_loads_nothing(setup, capsys):
    _, results_path, markers = setup
    with pytest.raises(SystemExit) as exit_info:
        robustness(["--replay", f"{results_path}:0"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--replay needs the policy: pass --model" in err and "code" in err
    _assert_nothing_ran(markers)


def test_replay_with_the_users_model_ignores_the_files_the_json_names(setup, capsys):
    model, results_path, markers = setup
    outcome = robustness(["--replay", f"{results_path}:0", "--model", str(model)])
    assert outcome["matches"]
    assert "this replay does not" in capsys.readouterr().err  # the recorded statistics are named, not loaded
    _assert_nothing_ran(markers)


def test_play_does_not_load_a_sibling_pickle_unless_asked(setup, tmp_path, capsys):
    model, _, markers = setup
    video = tmp_path / "walk.gif"
    play([str(model), "--steps", "2", "--out", str(video)])
    assert video.stat().st_size > 0
    assert "is not loaded" in capsys.readouterr().err
    _assert_nothing_ran(markers)
    # asked for explicitly, it is loaded and says so (this one is the booby trap: it runs)
    copy = tmp_path / "model.zip"
    shutil.copy(model, copy)
    _evil_pickle(tmp_path / "model_vecnormalize.pkl", tmp_path / "asked")
    with pytest.raises(AttributeError):  # the trap is a file object, not a VecNormalize
        play([str(copy), "--steps", "2", "--out", str(video), "--sibling-vecnormalize"])
    assert "loading VecNormalize statistics" in capsys.readouterr().err and (tmp_path / "asked").exists()
