"""The control HTTP API with a stock SB3 model (issue 16, items 3, 4, 5): auth, errors, live requests, the port."""

import stat
import threading
import time

import psutil
import pytest
import torch

pytest.importorskip("stable_baselines3")
pytest.importorskip("fastapi")
pytest.importorskip("httpx")

import httpx
from _ports import port_is_free
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback

from unilab_gym.sb3.control import ControlCallback

torch.set_num_threads(1)


def ppo():
    return PPO(
        "MlpPolicy", "Pendulum-v1", seed=0, n_steps=64, batch_size=32, n_epochs=1, policy_kwargs=dict(net_arch=[16])
    )


def api(cb, path):
    return f"{cb.control_url}/api/v1/{path}"


def auth(cb):
    return {"Authorization": f"Bearer {cb.control_token}"}


def test_token_auth_errors_and_port(tmp_path, monkeypatch):
    monkeypatch.setenv("UNILAB_CONTROL_TOKEN", "s3cret-token")
    model = ppo()
    with ControlCallback(port=0, snapshot_dir=tmp_path) as cb:
        port = int(cb.control_url.rsplit(":", 1)[1])
        assert cb.control_url.startswith("http://127.0.0.1:") and not port_is_free(port)
        listening = [c for c in psutil.Process().net_connections("tcp") if c.status == psutil.CONN_LISTEN]
        assert [c.laddr.ip for c in listening if c.laddr.port == port] == ["127.0.0.1"]  # loopback only
        assert cb.control_token == "s3cret-token"
        token_file = tmp_path / "control_token"
        assert token_file.read_text() == "s3cret-token"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        model.learn(64, callback=cb)
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret-token"}):
            for method, path in [("GET", "hyperparams"), ("POST", "snapshots"), ("GET", "status")]:
                r = httpx.request(method, api(cb, path), headers=headers)
                assert r.status_code == 401, (method, path, headers)
        assert cb.snapshots() == []  # the refused POST took none
        h = auth(cb)
        before = httpx.get(api(cb, "hyperparams"), headers=h).json()
        assert before["learning_rate"] == 3e-4 and "clip_range" in before
        bad = [
            ({"name": "learning_rate", "value": -1}, 400, "learning_rate"),
            ({"values": {"n_epochs": 2, "nope": 1}}, 400, "nope"),
            ({"values": {"n_epochs": "2"}}, 400, "n_epochs"),
            ({"name": "gamma", "value": 0.9, "values": {"gamma": 0.9}}, 422, None),
            ({"gamma": 0.9}, 422, None),
        ]
        for body, code, field in bad:
            r = httpx.post(api(cb, "hyperparams"), headers=h, json=body)
            assert r.status_code == code, (body, r.text)
            if field is not None:
                assert r.json()["field"] == field and field in r.json()["detail"]
        r = httpx.post(api(cb, "snapshots"), headers=h, json={"include_replay": "yes"})
        assert r.status_code == 422 and "include_replay" in r.text
        r = httpx.post(api(cb, "snapshots/0001-t64/restore"), headers=h)
        assert r.status_code == 404 and "0001-t64" in r.json()["detail"]
        assert httpx.get(api(cb, "hyperparams"), headers=h).json() == before
        assert cb.hyperparameter_history() == [] and cb.snapshots() == []
        # good requests
        r = httpx.post(api(cb, "hyperparams"), headers=h, json={"name": "learning_rate", "value": 1e-3})
        assert r.status_code == 200 and r.json()["learning_rate"] == 1e-3
        r = httpx.post(api(cb, "snapshots"), headers=h)  # no body: include_replay=False
        sid = r.json()["id"]
        assert [s["id"] for s in httpx.get(api(cb, "snapshots"), headers=h).json()] == [sid]
        r = httpx.post(api(cb, f"snapshots/{sid}/restore"), headers=h)
        assert r.status_code == 200 and r.json()["hyperparameters"]["learning_rate"] == 1e-3
        (entry,) = httpx.get(api(cb, "hyperparams/history"), headers=h).json()
        assert entry["source"] == "http" and entry["new"] == 1e-3
        status = httpx.get(api(cb, "status"), headers=h).json()
        assert status["num_timesteps"] == 64 and status["learning"] is False
        assert httpx.get(f"{cb.control_url}/openapi.json").json()["paths"]["/api/v1/hyperparams"]
    assert cb.control_url is None and port_is_free(port)


class Waiter(BaseCallback):
    """At step ``at``: signal, then hold the learner until a request is queued (so it lands mid-run)."""

    def __init__(self, control, at):
        super().__init__()
        self.control, self.at, self.started = control, at, threading.Event()

    def _on_step(self):
        if self.n_calls == self.at:
            self.started.set()
            deadline = time.monotonic() + 30
            while not self.control.controller._queue and time.monotonic() < deadline:
                time.sleep(0.001)
        return True


def test_requests_are_served_and_applied_while_training(tmp_path):
    model = ppo()
    with ControlCallback(port=0, snapshot_dir=tmp_path) as cb:
        model.learn(64, callback=cb)  # attach
        waiter = Waiter(cb, at=10)
        replies = {}

        def client():
            waiter.started.wait(60)
            h = auth(cb)
            replies["status"] = httpx.get(api(cb, "status"), headers=h, timeout=60).json()
            replies["post"] = httpx.post(
                api(cb, "hyperparams"), headers=h, json={"values": {"learning_rate": 2e-3}}, timeout=60
            )

        thread = threading.Thread(target=client)
        thread.start()
        model.learn(128, callback=[waiter, cb], reset_num_timesteps=False)
        thread.join(60)
        assert replies["status"]["learning"] is True
        assert replies["post"].status_code == 200 and replies["post"].json()["learning_rate"] == 2e-3
        (entry,) = cb.hyperparameter_history()
        assert 64 < entry["num_timesteps"] < 192  # applied mid-run, at a step boundary
        assert model.policy.optimizer.param_groups[0]["lr"] == 2e-3


def test_control_callback_without_a_model_or_server(tmp_path):
    cb = ControlCallback(port=None, snapshot_dir=tmp_path)
    assert cb.control_url is None and cb.control_token is None
    with pytest.raises(RuntimeError, match=r"model\.learn"):
        cb.hyperparameters()
    with ControlCallback(port=0, snapshot_dir=tmp_path) as served:
        r = httpx.get(api(served, "hyperparams"), headers=auth(served))
        assert r.status_code == 503 and "model.learn" in r.json()["detail"]


def test_unmatched_api_paths_need_the_token_and_metrics_answer_without_a_redirect():
    from fastapi.testclient import TestClient
    from prometheus_client import CollectorRegistry, Counter, make_asgi_app

    from unilab_gym.sb3.control.server import make_app

    registry = CollectorRegistry()
    Counter("unilab_probe", "a probe", registry=registry).inc()

    class Controller:
        def hyperparameters(self):
            return {"learning_rate": 3e-4}

    client = TestClient(make_app(Controller(), "secret", make_asgi_app(registry)))
    good, bad = {"Authorization": "Bearer secret"}, {"Authorization": "Bearer wrong"}
    for path in ("/api/v1/hyperparams", "/api/v1/no-such-route", "/api/other"):
        assert client.get(path).status_code == 401
        assert client.get(path, headers=bad).status_code == 401
    assert client.get("/api/v1/hyperparams", headers=good).json() == {"learning_rate": 3e-4}
    assert client.get("/api/v1/no-such-route", headers=good).status_code == 404
    metrics = client.get("/metrics", follow_redirects=False)  # Prometheus does not follow a /metrics/ redirect
    assert metrics.status_code == 200 and "unilab_probe_total 1.0" in metrics.text
