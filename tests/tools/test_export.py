"""unilab_gym.export: ONNX parity per algorithm, the C header vs onnxruntime, distillation, CLI, deploy example.

Models are untrained, with their weights perturbed so that the actions reach the bounds (clipping and
squashing are exercised); the observations are the env's (random actions), not noise.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

import torch  # noqa: E402
from _c_policy import SENTINEL, STRICT, compile_header, run_binary, run_header  # noqa: E402
from _export_setup import random_action_statistics  # noqa: E402
from stable_baselines3 import A2C, DDPG, PPO, SAC, TD3  # noqa: E402
from stable_baselines3.common.vec_env import VecNormalize  # noqa: E402

from unilab_gym.evaluation import record_gait  # noqa: E402
from unilab_gym.export import (  # noqa: E402
    PARITY_TOLERANCE,
    PolicyNet,
    distill,
    env_observations,
    export_c_header,
    export_onnx,
    onnx_metadata,
    policy_net,
    run_onnx,
)
from unilab_gym.sb3.vec_env import make_sb3_env  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ALGOS = {cls.__name__: cls for cls in (SAC, TD3, DDPG, PPO, A2C)}
METRIC_KEYS = {
    "action_mse",
    "teacher_return",
    "student_return",
    "return_ratio",
    "teacher_params",
    "student_params",
    "teacher_latency_us",
    "student_latency_us",
    "teacher_latency_p99_us",
    "student_latency_p99_us",
}


@pytest.fixture(scope="module")
def env():
    venv = make_sb3_env("UniLab/Quadruped-v0", 2, seed=0)
    yield venv
    venv.close()


@pytest.fixture(scope="module")
def vecnormalize():
    """VecNormalize statistics of 100 random-action steps (mean and variance far from 0 and 1)."""
    venv = random_action_statistics(VecNormalize(make_sb3_env("UniLab/Quadruped-v0", 4, seed=1), clip_obs=5.0), 100)
    yield venv
    venv.close()


def _model(name, env, scale=0.3):
    kwargs = {"activation_fn": torch.nn.ELU} if name in ("PPO", "A2C") else {}
    model = ALGOS[name]("MlpPolicy", env, device="cpu", seed=0, policy_kwargs={"net_arch": [32, 32], **kwargs})
    with torch.no_grad():  # spread the actions over (and past) [-1, 1]
        generator = torch.Generator().manual_seed(0)
        for p in model.policy.parameters():
            p.add_(scale * torch.randn(p.shape, generator=generator))
    return model


@pytest.fixture(scope="module")
def ppo(env):
    return _model("PPO", env)


def _expected(model, obs, vecnormalize):
    return model.predict(vecnormalize.normalize_obs(obs) if vecnormalize is not None else obs, deterministic=True)[0]


@pytest.mark.parametrize("name", sorted(ALGOS))
def test_onnx_matches_predict_on_env_observations(name, env, vecnormalize, tmp_path):
    model = _model(name, env)
    path = export_onnx(model, tmp_path / "policy.onnx", vecnormalize=vecnormalize)
    proto = onnx.load(path)
    onnx.checker.check_model(proto, full_check=True)
    (inp,), (out,) = proto.graph.input, proto.graph.output
    assert (inp.name, out.name) == ("obs", "action")
    assert inp.type.tensor_type.elem_type == out.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert [d.dim_param or d.dim_value for d in inp.type.tensor_type.shape.dim] == ["batch", 48]
    assert [d.dim_param or d.dim_value for d in out.type.tensor_type.shape.dim] == ["batch", 12]

    obs = env_observations()
    assert obs.shape == (10_000, 48) and obs.dtype == np.float32
    actions = run_onnx(path, obs)
    expected = _expected(model, obs, vecnormalize)
    assert actions.dtype == np.float32 and actions.shape == (10_000, 12)
    assert np.abs(actions - expected).max() <= PARITY_TOLERANCE
    assert np.abs(actions).max() <= 1.0 and (np.abs(expected) > 0.99).mean() > 0.01  # the bounds are reached
    assert np.abs(run_onnx(path, obs[:7]) - expected[:7]).max() <= PARITY_TOLERANCE  # dynamic batch
    assert np.abs(run_onnx(path, obs[:1]) - expected[:1]).max() <= PARITY_TOLERANCE

    meta = onnx_metadata(path)
    assert meta["env_id"] == "UniLab/Quadruped-v0" and meta["algo"] == name
    assert json.loads(meta["obs_layout"])["last_action"] == [36, 48]
    assert float(meta["action_scale"]) == 0.25 and float(meta["control_period"]) == pytest.approx(0.02)
    assert {"torch", "onnx", "stable-baselines3", "unilab-gym"} <= set(json.loads(meta["versions"]))
    assert float(meta["parity_max_abs_diff"]) <= PARITY_TOLERANCE and int(meta["parity_observations"]) >= 10_000


def test_vecnormalize_from_saved_statistics(ppo, vecnormalize, tmp_path):
    stats = tmp_path / "stats.pkl"
    vecnormalize.save(str(stats))
    a = run_onnx(export_onnx(ppo, tmp_path / "a.onnx", vecnormalize=stats), env_observations())
    b = run_onnx(export_onnx(ppo, tmp_path / "b.onnx", vecnormalize=vecnormalize), env_observations())
    np.testing.assert_array_equal(a, b)
    plain = run_onnx(export_onnx(ppo, tmp_path / "c.onnx"), env_observations())
    assert np.abs(plain - a).max() > 0.1  # the statistics are in the graph


def test_bad_input_names_the_value(ppo, vecnormalize, tmp_path):
    with pytest.raises(ValueError, match="SAC, TD3, DDPG, PPO or A2C"):
        export_onnx(object(), tmp_path / "x.onnx")
    with pytest.raises(ValueError, match="vecnormalize"):
        export_onnx(ppo, tmp_path / "x.onnx", vecnormalize=42)
    with pytest.raises(ValueError, match="vecnormalize=None"):
        export_onnx(policy_net(ppo), tmp_path / "x.onnx", vecnormalize=vecnormalize)
    with pytest.raises(ValueError, match="hidden"):
        distill(ppo, hidden=())
    with pytest.raises(ValueError, match="num_envs"):
        distill(ppo, num_envs=0)


def test_missing_onnx_raises_import_error_with_install_command(ppo, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnx", None)
    for call in (
        lambda: export_onnx(ppo, tmp_path / "x.onnx"),
        lambda: export_c_header(ppo, tmp_path / "x.h"),
        lambda: distill(ppo),
    ):
        with pytest.raises(ImportError, match=r"pip install .*unilab-gym\[export\]"):
            call()


@pytest.mark.parametrize(("name", "normalized"), [("PPO", True), ("SAC", False), ("TD3", True)])
def test_c_header_matches_onnxruntime(name, normalized, env, vecnormalize, tmp_path):
    model = _model(name, env)
    stats = vecnormalize if normalized else None
    header = export_c_header(model, tmp_path / "policy.h", vecnormalize=stats)
    text = header.read_text()
    assert "int unilab_policy_step(const float obs[48], float action[12])" in text
    assert "static const float unilab_w0" in text and ("unilab_obs_mean" in text) == normalized
    obs = env_observations()[:1000]
    status, actions = run_header(header, obs)
    reference = run_onnx(export_onnx(model, tmp_path / "policy.onnx", vecnormalize=stats), obs)
    assert (status == 0).all()
    assert np.abs(actions - reference).max() <= 1e-5


def _bad_observations() -> np.ndarray:
    """600 env observations, most with bad values: NaN, +-inf (one or many per row), huge finite ones, FLT_MAX."""
    rng = np.random.default_rng(7)
    obs = env_observations()[:600].copy()
    rows = np.arange(600)
    cols = rng.integers(0, 48, 600)
    obs[rows[:100], cols[:100]] = np.nan
    obs[rows[100:150], cols[100:150]] = np.inf
    obs[rows[150:200], cols[150:200]] = -np.inf
    obs[200, 0] = obs[201, 47] = np.nan  # the first and last column
    many = rng.random((48, 48)) < 0.2  # many bad values per row
    many[:, 5] = True
    block = obs[202:250]  # a view
    block[many] = rng.choice([np.nan, np.inf, -np.inf], many.sum())
    obs[rows[250:300], cols[250:300]] = 1e30
    obs[rows[300:350], cols[300:350]] = -1e30
    obs[rows[350:400], cols[350:400]] = rng.choice([1e20, -1e20, 3e33], 50)
    big = np.finfo(np.float32).max
    obs[rows[400:450], cols[400:450]] = rng.choice([big, -big], 50)  # finite: valid input
    return obs  # rows 450-599 are untouched env observations


@pytest.mark.parametrize(("name", "normalized"), [("PPO", True), ("SAC", False), ("TD3", True)])
def test_nan_and_inf_observations_give_an_error_code_in_c_and_nan_in_onnx(
    name, normalized, env, vecnormalize, tmp_path
):
    """One rule: a non-finite observation row gets UNILAB_ERR_NONFINITE_OBS and no action (C), NaN actions (ONNX)."""
    # PPO's unsquashed mean at 0.3 gives FLT_MAX rows (clipped to 5 standard deviations) pre-activations so large
    # that the C header's plain float sums differ from onnxruntime's by 4.2e-6; at 0.1 by far less
    model = _model(name, env, scale=0.1 if name == "PPO" else 0.3)
    stats = vecnormalize if normalized else None
    obs = _bad_observations()
    if not normalized:  # FLT_MAX through unnormalized layers may overflow in one summation order and not another
        obs = obs[np.r_[0:400, 450:600]]
    bad = ~np.isfinite(obs).all(axis=1)
    assert bad.sum() == 250
    header = export_c_header(model, tmp_path / "policy.h", vecnormalize=stats)
    text = header.read_text()
    assert "#define UNILAB_OK 0" in text and "#define UNILAB_ERR_NONFINITE_OBS 1" in text
    status, actions = run_header(header, obs)
    onnx_actions = run_onnx(export_onnx(model, tmp_path / "policy.onnx", vecnormalize=stats), obs)
    torch_actions = policy_net(model, stats).act(obs)

    np.testing.assert_array_equal(status[bad], 1)  # UNILAB_ERR_NONFINITE_OBS
    assert (actions[bad] == SENTINEL).all()  # nothing written
    assert np.isnan(onnx_actions[bad]).all() and np.isnan(torch_actions[bad]).all()
    # huge finite values are valid inputs: clipped by the normalization, or saturating tanh / the bounds
    np.testing.assert_array_equal(status[~bad], 0)
    assert np.isfinite(onnx_actions[~bad]).all()
    assert np.abs(actions[~bad] - onnx_actions[~bad]).max() <= 1e-5
    assert np.abs(torch_actions[~bad] - onnx_actions[~bad]).max() <= PARITY_TOLERANCE
    expected = _expected(model, obs[~bad], stats)  # SB3 on the valid rows (huge ones included)
    assert np.abs(onnx_actions[~bad] - expected).max() <= PARITY_TOLERANCE


def test_an_overflow_inside_the_net_is_not_hidden_by_tanh(tmp_path):
    """All-positive weights: FLT_MAX overflows float32 in any summation order; tanh(inf) = 1 would hide it."""
    layers = torch.nn.Sequential(
        torch.nn.Linear(48, 8), torch.nn.ReLU(), torch.nn.Linear(8, 12), torch.nn.Tanh()
    )  # fmt: skip
    with torch.no_grad():
        for p in layers.parameters():
            p.fill_(0.5)
    net = PolicyNet(layers, action_low=-np.ones(12), action_high=np.ones(12), squash_output=True).eval()
    big = np.finfo(np.float32).max
    obs = np.zeros((6, 48), np.float32)
    obs[0] = big  # the first layer overflows
    obs[1, 3] = big  # the second one does (8 * 0.5 * 0.5 * FLT_MAX)
    obs[2, 3] = 1e30  # no overflow: saturated, valid
    obs[3, 0] = np.nan
    obs[5, 7] = -big  # ReLU gives 0: valid
    with torch.no_grad():
        unguarded = layers(torch.as_tensor(obs)).numpy()
    assert np.isfinite(unguarded[[0, 1]]).all()  # what a plain tanh net answers: a plausible full-scale command

    header = export_c_header(net, tmp_path / "policy.h")
    assert "#define UNILAB_ERR_OVERFLOW 2" in header.read_text()
    onnx_actions = run_onnx(export_onnx(net, tmp_path / "policy.onnx"), obs)
    for flags in (STRICT, ("-std=c99", "-O3", "-ffast-math")):  # the check reads bits: fast-math keeps it
        status, actions = run_binary(compile_header(header, flags), obs)
        np.testing.assert_array_equal(status, [2, 2, 0, 1, 0, 0])
        assert (actions[[0, 1, 3]] == SENTINEL).all()
        np.testing.assert_allclose(actions[[2, 4, 5]], onnx_actions[[2, 4, 5]], rtol=0, atol=1e-5)
    assert np.isnan(onnx_actions[[0, 1, 3]]).all() and np.isfinite(onnx_actions[[2, 4, 5]]).all()
    np.testing.assert_array_equal(onnx_actions[2], 1.0)
    assert np.isnan(net.act(obs)[[0, 1, 3]]).all()


def test_distill_returns_a_student_and_metrics(ppo, vecnormalize, tmp_path):
    result = distill(
        ppo,
        hidden=(16, 16),
        vecnormalize=vecnormalize,
        num_envs=4,
        steps=8,
        dagger_rounds=1,
        epochs=2,
        eval_episodes=2,
        max_episode_steps=16,
    )
    metrics = result.metrics
    assert set(metrics) >= METRIC_KEYS
    assert all(np.isfinite(metrics[k]) for k in METRIC_KEYS)
    assert metrics["student_params"] == 48 * 16 + 16 + 16 * 16 + 16 + 16 * 12 + 12
    assert metrics["teacher_params"] == 48 * 32 + 32 + 32 * 32 + 32 + 32 * 12 + 12
    assert metrics["action_mse"] >= 0 and metrics["labels"] == 4 * 8 * 2
    assert 0 < metrics["student_latency_us"] <= metrics["student_latency_p99_us"]
    assert 0 < metrics["teacher_latency_us"] <= metrics["teacher_latency_p99_us"]
    assert metrics["return_ratio"] == pytest.approx(metrics["student_return"] / metrics["teacher_return"])

    student = result.student
    assert isinstance(student, torch.nn.Module)
    obs = env_observations()[:5]
    actions = student(torch.tensor(obs)).detach().numpy()
    assert actions.shape == (5, 12) and np.abs(actions).max() <= 1.0

    path = result.export_onnx(tmp_path / "student.onnx")
    proto = onnx.load(path)
    assert (proto.graph.input[0].name, proto.graph.output[0].name) == ("obs", "action")
    assert np.abs(run_onnx(path, obs) - actions).max() <= PARITY_TOLERANCE
    assert onnx_metadata(export_onnx(result, tmp_path / "same.onnx"))["algo"] == "PolicyNet"
    header = export_c_header(result, tmp_path / "student.h").read_text()
    assert f"#define UNILAB_POLICY_PARAMS {metrics['student_params']}" in header
    assert isinstance(result.teacher, PolicyNet)


def test_cli_export_prints_parity_sizes_and_latency(ppo, vecnormalize, tmp_path, capsys):
    from unilab_gym.cli import main

    ppo.save(tmp_path / "model.zip")
    vecnormalize.save(str(tmp_path / "stats.pkl"))
    out, header = tmp_path / "policy.onnx", tmp_path / "policy.h"
    argv = ["export", str(tmp_path / "model.zip"), "--out", str(out), "--vecnormalize", str(tmp_path / "stats.pkl")]
    assert main([*argv, "--c-header", str(header)]) == 0
    printed = capsys.readouterr().out
    assert "parity max |diff|" in printed and "latency p50" in printed and "bytes of constants" in printed
    assert out.exists() and header.exists()
    expected = _expected(ppo, env_observations(), vecnormalize)
    assert np.abs(run_onnx(out, env_observations()) - expected).max() <= PARITY_TOLERANCE
    with pytest.raises(SystemExit, match="no VecNormalize statistics"):
        main(["export", str(tmp_path / "model.zip"), "--out", str(out), "--vecnormalize", str(tmp_path / "none.pkl")])


def test_cli_export_distill_writes_the_student(ppo, tmp_path, capsys, monkeypatch):
    import functools

    import unilab_gym.cli.export as cli_export

    tiny = functools.partial(distill, num_envs=2, epochs=1, eval_episodes=2, max_episode_steps=10)
    monkeypatch.setattr(cli_export, "distill", tiny)
    ppo.save(tmp_path / "model.zip")
    out, header = tmp_path / "student.onnx", tmp_path / "student.h"
    argv = [str(tmp_path / "model.zip"), "--out", str(out), "--distill", "8,8", "--c-header", str(header)]
    assert cli_export.main([*argv, "--distill-steps", "3", "--dagger-rounds", "1"]) == out
    printed = capsys.readouterr().out
    assert "distilled: return" in printed and "teacher:" in printed and "student:" in printed
    assert "#define UNILAB_POLICY_PARAMS 572" in header.read_text()  # 48*8+8 + 8*8+8 + 8*12+12
    with pytest.raises(SystemExit):
        cli_export.main([*argv[:3], "--distill", "0,8"])


def test_deploy_example_runs_without_torch_and_matches_the_torch_returns(env, vecnormalize, tmp_path):
    # an unperturbed policy: the robot stands, so actions ~1e-7 apart do not grow into different trajectories
    # (a flailing, falling robot is chaotic: any difference in the actions changes its return)
    ppo = PPO("MlpPolicy", env, device="cpu", seed=0, policy_kwargs={"net_arch": [32, 32]})
    path = export_onnx(ppo, tmp_path / "policy.onnx", vecnormalize=vecnormalize)
    script = (
        "import runpy, sys\n"
        f"sys.argv = ['deploy_onnx.py', {str(path)!r}, '--episodes', '3', '--max-episode-steps', '40', '--json']\n"
        f"runpy.run_path({str(ROOT / 'examples' / 'deploy_onnx.py')!r}, run_name='__main__')\n"
        "assert 'torch' not in sys.modules, 'deploy_onnx.py imported torch'\n"
    )
    ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert ran.returncode == 0, ran.stderr[-3000:]
    returns = np.array(json.loads(ran.stdout.strip().splitlines()[-1]))
    torch_returns = record_gait(ppo, n_episodes=3, vecnormalize=vecnormalize, seed=0, max_episode_steps=40).returns
    np.testing.assert_allclose(returns, torch_returns, rtol=0, atol=PARITY_TOLERANCE)
