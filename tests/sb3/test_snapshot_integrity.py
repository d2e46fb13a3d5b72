"""Snapshots are files this run wrote, and nothing else (issue 29, items 1-5).

A restore loads only the bytes it wrote (SHA-256 kept in memory), refuses a changed file before
deserializing anything, and changes everything or nothing; runs sharing a directory never touch
each other's files; the token file is never written through a link.
"""

import base64
import io
import json
import os
import pickle
import stat
import zipfile

import pytest
import torch

pytest.importorskip("stable_baselines3")

from stable_baselines3.common.save_util import load_from_zip_file
from test_control_hyperparams import sac

import unilab_gym.sb3.control.snapshots as snapshots
from unilab_gym import SharedReplayBuffer
from unilab_gym.sb3.control import Controller
from unilab_gym.sb3.control.snapshots import SnapshotIntegrityError

torch.set_num_threads(1)


class Payload:
    """Unpickling it creates ``marker`` (``open(marker, "w")``): what a replaced snapshot file could run."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def params(model):
    return {k: v.clone() for k, v in model.policy.state_dict().items()}


def same(model, saved):
    return all(torch.equal(v, saved[k]) for k, v in model.policy.state_dict().items())


def rewrite_zip_data(path, marker):
    """Replace ``path`` with a zip whose ``data`` carries a ``:serialized:`` payload that creates ``marker``."""
    with zipfile.ZipFile(path) as archive:
        entries = {name: archive.read(name) for name in archive.namelist()}
    data = json.loads(entries["data"])
    data["lr_schedule"][":serialized:"] = base64.b64encode(pickle.dumps(Payload(marker))).decode()
    entries["data"] = json.dumps(data).encode()
    replacement = path.with_name("replacement.zip")
    with zipfile.ZipFile(replacement, "w") as archive:
        for name, content in entries.items():
            archive.writestr(name, content)
    os.replace(replacement, path)


def trained(tmp_path, **kwargs):
    model = sac(**kwargs)
    model.learn(24)
    return model, Controller(model, snapshot_dir=tmp_path)


def test_a_replaced_zip_is_refused_before_anything_is_deserialized(tmp_path):
    model, control = trained(tmp_path)
    sid = control.snapshot()
    control.set_hyperparameters({"learning_rate": 1e-2, "gamma": 0.9})
    model.learn(8, reset_num_timesteps=False)
    before, weights, history = control.hyperparameters(), params(model), control.hyperparameter_history()
    marker = tmp_path / "ran"
    rewrite_zip_data(tmp_path / f"{sid}.zip", marker)
    with pytest.raises(SnapshotIntegrityError, match=rf"{sid}\.zip is not the file this run wrote"):
        control.restore(sid)
    assert not marker.exists()
    assert control.hyperparameters() == before and same(model, weights)
    assert control.hyperparameter_history() == history
    # the payload is real: SB3's own loader runs it
    rewrite_zip_data(tmp_path / f"{sid}.zip", tmp_path / "ran-by-sb3")
    load_from_zip_file(tmp_path / f"{sid}.zip")
    assert (tmp_path / "ran-by-sb3").exists()


@pytest.mark.parametrize("how", ["one byte", "symlink", "removed"])
def test_any_other_change_to_a_snapshot_file_is_refused_and_named(tmp_path, how):
    model, control = trained(tmp_path)
    sid = control.snapshot()
    path = tmp_path / f"{sid}.zip"
    original = path.read_bytes()
    if how == "one byte":  # same size, same name: only the digest tells
        path.write_bytes(original[:100] + bytes([original[100] ^ 1]) + original[101:])
    elif how == "symlink":  # a link to a copy of the very bytes: still not the file this run wrote
        (tmp_path / "copy.zip").write_bytes(original)
        path.unlink()
        path.symlink_to(tmp_path / "copy.zip")
    else:
        path.unlink()
    weights = params(model)
    with torch.no_grad():
        next(model.policy.parameters()).add_(1.0)
    changed = params(model)
    with pytest.raises(SnapshotIntegrityError, match=rf"{sid}\.zip") as info:
        control.restore(sid)
    assert info.value.path == path and isinstance(info.value, ValueError)
    assert same(model, changed) and not same(model, weights)


def test_a_replaced_replay_file_is_refused_before_anything_is_deserialized(tmp_path):
    model, control = trained(tmp_path)
    sid = control.snapshot(include_replay=True)
    (record,) = control.snapshots()
    assert set(record["sha256"]) == {f"{sid}.zip", f"{sid}.replay.pkl"} == set(record["files"])
    assert record["sha256"] == json.loads((tmp_path / f"{sid}.json").read_text())["sha256"]
    control.set_hyperparameters({"learning_rate": 1e-2})
    model.learn(8, reset_num_timesteps=False)
    before, weights, size = control.hyperparameters(), params(model), model.replay_buffer.size()
    marker = tmp_path / "ran"
    (tmp_path / f"{sid}.replay.pkl").write_bytes(pickle.dumps(Payload(marker)))
    with pytest.raises(SnapshotIntegrityError, match=rf"{sid}\.replay\.pkl"):
        control.restore(sid)
    assert not marker.exists()
    assert control.hyperparameters() == before and same(model, weights) and model.replay_buffer.size() == size


def test_two_runs_sharing_a_directory_keep_their_own_snapshots(tmp_path):
    first, second = sac(seed=1), sac(seed=2)
    one, two = Controller(first, snapshot_dir=tmp_path), Controller(second, snapshot_dir=tmp_path)
    assert one.store.run_id != two.store.run_id
    s1, s2 = one.snapshot(), two.snapshot()  # same step count (0): the old ids were both "0001-t0"
    assert s1 != s2 and s1.startswith(one.store.run_id) and s2.startswith(two.store.run_id)
    assert not same(first, params(second))
    saved = params(first)
    # a file already at the next name is never overwritten: the run picks a fresh one
    squatter = tmp_path / f"{one.store.run_id}-0002-t0.zip"
    squatter.write_bytes(b"someone else's")
    s3 = one.snapshot()
    assert squatter.read_bytes() == b"someone else's" and s3 != squatter.stem
    with torch.no_grad():
        next(first.policy.parameters()).add_(1.0)
    one.restore(s1)
    assert same(first, saved)  # its own weights, not the other run's
    assert len(list(tmp_path.glob("*.zip"))) == 4


def test_a_restore_that_fails_midway_changes_nothing(tmp_path, monkeypatch):
    model, control = trained(tmp_path, ent_coef="auto_0.1", replay_buffer_class=SharedReplayBuffer)
    try:
        sid = control.snapshot(include_replay=True)
        saved, saved_size = params(model), model.replay_buffer.size()
        control.set_hyperparameters({"learning_rate": 1e-2, "gamma": 0.9, "batch_size": 8})
        model.learn(16, reset_num_timesteps=False)
        before, weights = control.hyperparameters(), params(model)
        adam = model.actor.optimizer.state_dict()["state"][0]["exp_avg"].clone()
        log_ent, history = model.log_ent_coef.detach().clone(), control.hyperparameter_history()
        size = model.replay_buffer.size()
        # a collector hung between reserving and committing rows: the replay step, the last, fails
        monkeypatch.setattr(snapshots, "REPLAY_RESTORE_TIMEOUT_S", 0.01)
        storage = model.replay_buffer.storage
        held = storage.reserve(1)
        with pytest.raises(RuntimeError, match="is writing rows"):
            control.restore(sid)
        assert control.hyperparameters() == before and before["learning_rate"] == 1e-2
        assert model.gamma == 0.9 and model.actor.optimizer.param_groups[0]["lr"] == 1e-2
        assert same(model, weights) and torch.equal(model.log_ent_coef.detach(), log_ent)
        assert torch.equal(model.actor.optimizer.state_dict()["state"][0]["exp_avg"], adam)
        assert model.replay_buffer.size() == size and control.hyperparameter_history() == history
        storage.abort(held)
        assert control.restore(sid)["learning_rate"] == 3e-4  # once the rows are released, it all applies
        assert same(model, saved) and model.gamma == 0.99 and model.replay_buffer.size() == saved_size
    finally:
        model.replay_buffer.close()


def test_vecnormalize_statistics_are_part_of_a_snapshot(tmp_path):
    from stable_baselines3 import SAC
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    env = VecNormalize(make_vec_env("Pendulum-v1", 1, seed=0))
    model = SAC("MlpPolicy", env, seed=0, learning_starts=16, batch_size=16, policy_kwargs=dict(net_arch=[16]))
    model.learn(24)
    control = Controller(model, snapshot_dir=tmp_path)
    sid = control.snapshot()
    assert f"{sid}.statistics.npz" in control.snapshots()[0]["sha256"]
    mean, count = env.obs_rms.mean.copy(), env.obs_rms.count
    model.learn(24, reset_num_timesteps=False)
    assert env.obs_rms.count > count
    control.restore(sid)
    assert env.obs_rms.count == count and (env.obs_rms.mean == mean).all()
    with zipfile.ZipFile(io.BytesIO((tmp_path / f"{sid}.zip").read_bytes())) as archive:
        assert "data" in archive.namelist()  # still an ordinary SB3 file


def _mode(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_token_file_two_live_runs_a_resumed_run_and_a_symlink(tmp_path, monkeypatch):
    pytest.importorskip("fastapi")
    from unilab_gym.sb3.control import ControlCallback

    monkeypatch.delenv("UNILAB_CONTROL_TOKEN", raising=False)
    token_path = tmp_path / "control_token"
    with ControlCallback(port=0, snapshot_dir=tmp_path) as first:
        assert first.control_token_path == token_path and _mode(token_path) == 0o600
        with pytest.warns(UserWarning, match="belongs to another live run"):
            second = ControlCallback(port=0, snapshot_dir=tmp_path)
        with second:
            assert token_path.read_text() == first.control_token  # not overwritten by the second run
            assert second.control_token_path != token_path
            assert second.control_token_path.read_text() == second.control_token != first.control_token
            assert _mode(second.control_token_path) == 0o600
    with ControlCallback(port=0, snapshot_dir=tmp_path) as resumed:  # no live run holds the old file
        assert resumed.control_token_path == token_path and token_path.read_text() == resumed.control_token


def test_token_file_is_never_written_through_a_symlink(tmp_path, monkeypatch):
    pytest.importorskip("fastapi")
    from unilab_gym.sb3.control import ControlCallback

    monkeypatch.delenv("UNILAB_CONTROL_TOKEN", raising=False)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target, missing = elsewhere / "precious", elsewhere / "created"
    target.write_text("precious")
    run = tmp_path / "run"
    run.mkdir()
    for aim in (target, missing):
        (run / "control_token").unlink(missing_ok=True)
        (run / "control_token").symlink_to(aim)
        with ControlCallback(port=0, snapshot_dir=run) as cb:
            path = cb.control_token_path
            assert not path.is_symlink() and stat.S_ISREG(os.lstat(path).st_mode) and _mode(path) == 0o600
            assert path.read_text() == cb.control_token
        assert target.read_text() == "precious" and not missing.exists()
