"""The control API on AsyncRunner (issue 16): live changes mid-run over HTTP, snapshots, rollback, one port."""

import gc
import os
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
import weakref

import numpy as np
import pytest
import torch

pytest.importorskip("stable_baselines3")
pytest.importorskip("fastapi")
pytest.importorskip("httpx")

import httpx
from _paths import ROOT
from _ports import port_is_free
from _runner_common import ID, SMALL_ENV, assert_no_children, make_ppo, make_sac, release, runner_segments
from stable_baselines3.common.callbacks import BaseCallback

from unilab_gym import AsyncRunner


class Waiter(BaseCallback):
    """At on_step ``at``: signal, then hold the learner until a control request is queued (so it lands mid-run)."""

    def __init__(self, runner, at):
        super().__init__()
        self.runner, self.at, self.started = runner, at, threading.Event()

    def _on_step(self):
        if self.n_calls == self.at:
            self.started.set()
            deadline = time.monotonic() + 60
            while not self.runner.control.controller._queue and time.monotonic() < deadline:
                time.sleep(0.001)
        return True


def params(model):
    return {k: v.clone() for k, v in model.policy.state_dict().items()}


def test_sac_runner_http_changes_mid_run_snapshot_restore_and_one_port(tmp_path):
    model = make_sac(learning_starts=10)
    runner = AsyncRunner(
        model,
        env_id=ID,
        num_collectors=1,
        envs_per_collector=4,
        env_kwargs=SMALL_ENV,
        replay_ratio=0.25,
        control_port=0,
        metrics_port=0,
        snapshot_dir=str(tmp_path),
        collector_timeout_s=300,  # a loaded CI machine may take long to import torch in a collector
    )
    with runner:
        url, h = runner.control_url, {"Authorization": f"Bearer {runner.control_token}"}
        port = int(url.rsplit(":", 1)[1])
        assert runner.metrics_url == f"{url}/metrics"  # one port per runner
        with urllib.request.urlopen(runner.metrics_url, timeout=10) as r:
            assert "unilab_" in r.read().decode()
        assert httpx.get(f"{url}/api/v1/status").status_code == 401
        assert runner.hyperparameters()["replay_ratio"] == 0.25 and runner.max_policy_lag == 4
        waiter, replies = Waiter(runner, at=40), {}

        def client():
            waiter.started.wait(120)
            replies["status"] = httpx.get(f"{url}/api/v1/status", headers=h, timeout=60).json()
            values = {"learning_rate": 1e-3, "replay_ratio": 0.5, "max_policy_lag": 2}
            replies["post"] = httpx.post(f"{url}/api/v1/hyperparams", headers=h, json={"values": values}, timeout=60)

        thread = threading.Thread(target=client)
        thread.start()
        runner.learn(200, callback=waiter)
        thread.join(60)
        status = replies["status"]
        assert status["learning"] and len(status["collectors"]) == 1 and status["weight_version"] >= 1
        assert replies["post"].status_code == 200, replies["post"].text
        history = runner.hyperparameter_history()
        assert {e["name"] for e in history} == {"learning_rate", "replay_ratio", "max_policy_lag"}
        changed_at = history[0]["num_timesteps"]
        assert 40 <= changed_at < 200 and all(e["source"] == "http" for e in history)
        assert (
            model.actor.optimizer.param_groups[0]["lr"] == 1e-3 and model.critic.optimizer.param_groups[0]["lr"] == 1e-3
        )
        assert runner.replay_ratio == 0.5 and runner.max_policy_lag == 2
        # the new ratio counts from the change: steps before it stand
        assert model._n_updates <= (changed_at - 10) * 0.25 + (200 - changed_at) * 0.5 + 1

        sid = httpx.post(f"{url}/api/v1/snapshots", headers=h, json={"include_replay": True}).json()["id"]
        saved = params(model)
        replay = model.replay_buffer
        saved_rows, saved_size = replay.storage.block.copy(), replay.storage.committed
        runner.learn(40, reset_num_timesteps=False)
        assert replay.storage.committed > saved_size
        version = runner._pool.weight_version
        runner.set_hyperparameters(learning_rate=5e-3)
        r = httpx.post(f"{url}/api/v1/snapshots/{sid}/restore", headers=h)
        assert r.status_code == 200 and r.json()["hyperparameters"]["learning_rate"] == 1e-3
        assert all(torch.equal(v, saved[k]) for k, v in model.policy.state_dict().items())
        assert runner._pool.weight_version == version + 1  # collectors get the restored weights
        # the replay is rolled back in place: the same segment, the snapshot's transitions
        assert model.replay_buffer is replay and replay.storage.committed == saved_size
        np.testing.assert_array_equal(replay.storage.block[:saved_size], saved_rows[:saved_size])
        runner.learn(20, reset_num_timesteps=False)  # collectors write on into the restored replay
        assert replay.storage.committed > saved_size
        (snap,) = runner.snapshots()
        assert snap["hyperparameters"]["replay_ratio"] == 0.5 and snap["num_timesteps"] == 200
    assert runner.control_url is None and port_is_free(port)
    assert_no_children()
    release(model)
    code = textwrap.dedent(f"""
        import sys
        sys.modules["unilab_gym"] = None  # importing it now fails
        from stable_baselines3 import SAC
        print(SAC.load({str(tmp_path / f"{sid}.zip")!r}, device="cpu").num_timesteps)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "200"


def test_ppo_runner_python_api_gamma_clip_range_lag_and_rollback(tmp_path):
    model = make_ppo(4)
    with AsyncRunner(
        model,
        env_id=ID,
        num_collectors=1,
        envs_per_collector=4,
        env_kwargs=SMALL_ENV,
        snapshot_dir=str(tmp_path),
        snapshot_on_change=True,
        collector_timeout_s=300,
        backend="inline",  # live control is the learner's: no collector process needed
    ) as runner:
        assert runner.control_url is None and runner.control_token is None
        runner.learn(64)
        before = runner.hyperparameters()
        assert "replay_ratio" not in before and before["max_policy_lag"] == 0
        for bad, match in [
            ({"max_policy_lag": 2}, r"max_policy_lag must be an int in \[0, 1\]"),
            ({"replay_ratio": 1.0}, "not live for this model"),
            ({"gamma": 0.9, "n_epochs": -1}, "n_epochs"),
        ]:
            with pytest.raises(ValueError, match=match):
                runner.set_hyperparameters(**bad)
        assert runner.hyperparameters() == before and runner.snapshots() == []
        saved = params(model)
        with pytest.warns(UserWarning, match="bootstrap"):
            runner.set_hyperparameters(gamma=0.9, clip_range=0.1, max_policy_lag=1)
        assert runner.max_policy_lag == 1 and model.rollout_buffer.gamma == 0.9
        runner.learn(64, reset_num_timesteps=False)
        (snap,) = runner.snapshots()  # snapshot_on_change: taken before the change
        assert snap["hyperparameters"]["gamma"] == 0.99
        with pytest.warns(UserWarning, match="bootstrap"):  # gamma goes back to 0.99
            runner.restore(snap["id"])
        assert all(torch.equal(v, saved[k]) for k, v in model.policy.state_dict().items())
        assert runner.hyperparameters() == before
    assert model.rollout_buffer.gamma == 0.99  # the model's own buffer, given back, has the restored gamma
    assert_no_children()


@pytest.mark.slow
def test_live_tuning_example_changes_the_learning_rate_and_snapshots_halfway(tmp_path):
    script = os.path.join(ROOT, "examples", "live_tuning.py")
    args = ["--total-steps", "400", "--num-collectors", "1", "--envs-per-collector", "4", "--run-dir", tmp_path]
    args += ["--collector-timeout-s", 300]
    out = subprocess.run(
        [sys.executable, script, *map(str, args)], capture_output=True, text=True, timeout=600, check=True
    ).stdout
    assert "curl -s -X POST" in out and '"learning_rate": 0.0001' in out
    (snap,) = [p for p in os.listdir(tmp_path) if p.endswith(".zip")]
    assert "SAC.load: num_timesteps=" in out and snap in out
    assert oct(os.stat(tmp_path / "control_token").st_mode & 0o777) == "0o600"


def test_a_batch_larger_than_the_replay_gets_400_over_http_and_the_run_trains_on(tmp_path):
    model = make_sac(learning_starts=10)  # a replay of 5000 transitions
    replies = {}

    class Post(BaseCallback):  # from the learner's thread: a refused value never waits for a boundary
        def _on_step(self):
            if self.n_calls == 40:
                replies["updates"] = self.model._n_updates
                body = {"name": "batch_size", "value": 1_000_000_000}
                replies["post"] = httpx.post(f"{url}/api/v1/hyperparams", headers=h, json=body, timeout=60)
            return True

    with AsyncRunner(
        model,
        env_id=ID,
        num_collectors=1,
        envs_per_collector=4,
        env_kwargs=SMALL_ENV,
        control_port=0,
        snapshot_dir=str(tmp_path),
        collector_timeout_s=300,
    ) as runner:
        url, h = runner.control_url, {"Authorization": f"Bearer {runner.control_token}"}
        runner.learn(120, callback=Post())
        reply = replies["post"]
        assert reply.status_code == 400 and reply.json()["field"] == "batch_size"
        assert "batch_size must be an int in [1, 5000]" in reply.json()["detail"]
        assert model.batch_size == 32 and runner.hyperparameter_history() == []
        assert model.num_timesteps == 120 and model._n_updates > replies["updates"] > 0
    release(model)


def test_restore_records_only_the_values_it_changed(tmp_path):
    model = make_sac()  # gradient_steps=1 maps to a replay ratio of 1.0; the runner's is 0.125
    with AsyncRunner(
        model,
        env_id=ID,
        num_collectors=1,
        envs_per_collector=4,
        env_kwargs=SMALL_ENV,
        replay_ratio=0.125,
        snapshot_dir=str(tmp_path),
    ) as runner:
        sid = runner.snapshot()
        runner.restore(sid)
        assert runner.hyperparameter_history() == [] and runner.replay_ratio == 0.125
        runner.set_hyperparameters(replay_ratio=0.5, tau=0.01)
        runner.restore(sid)
        restored = [(e["name"], e["old"], e["new"]) for e in runner.hyperparameter_history()[2:]]
        assert restored == [("tau", 0.01, 0.005), ("replay_ratio", 0.5, 0.125)]
        assert runner.replay_ratio == 0.125
    release(model)


def test_a_closed_runner_with_live_control_frees_its_model(tmp_path):
    model = make_sac()
    ref, replay = weakref.ref(model), f"/dev/shm/{model.replay_buffer.storage.name}"
    with AsyncRunner(
        model,
        env_id=ID,
        num_collectors=1,
        envs_per_collector=4,
        env_kwargs=SMALL_ENV,
        control_port=0,
        metrics_port=0,
        snapshot_dir=str(tmp_path),
    ) as runner:
        headers = {"Authorization": f"Bearer {runner.control_token}"}
        assert httpx.get(f"{runner.control_url}/api/v1/status", headers=headers).status_code == 200
        assert httpx.get(runner.metrics_url).status_code == 200
        segments = runner_segments(runner)
    assert os.path.exists(replay)
    del runner, model
    gc.collect()
    assert ref() is None  # nothing of the server, its app or its thread holds it
    assert [s for s in [replay, *segments] if os.path.exists(s)] == []
