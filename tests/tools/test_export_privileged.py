"""Export of an asymmetric policy (privileged_obs=True) trained under a VecNormalize over the Dict observation.

``export_onnx``, ``policy_net``, ``export_c_header``, ``distill`` and ``unilab-gym export`` fold in the
``"policy"`` key's statistics alone, and match ``model.predict(vecnormalize.normalize_obs(obs))`` on
10,000 observations of which a fifth of the values lie beyond ``clip_obs``. The models are untrained,
with their weights perturbed so that the actions reach the bounds: parity is about the math.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

import torch
from _c_policy import run_header
from _export_setup import random_action_statistics
from stable_baselines3 import PPO, SAC
from stable_baselines3.common.vec_env import VecNormalize

from unilab_gym.export import (
    PARITY_TOLERANCE,
    distill,
    env_observations,
    export_c_header,
    export_onnx,
    policy_net,
    run_onnx,
)
from unilab_gym.sb3.vec_env import AsymmetricActorCriticPolicy, AsymmetricSACPolicy, make_sb3_env

ID = "UniLab/Quadruped-v0"
CLIP_OBS = 3.0


@pytest.fixture(scope="module")
def dict_vecnormalize():
    """A VecNormalize over the Dict of privileged_obs=True, with statistics of 60 random-action steps.

    The critic's first 48 columns are the policy observation, so their statistics would be nearly the
    policy's: they are shifted, so that a net folding in the wrong key's statistics gives other actions.
    """
    venv = random_action_statistics(
        VecNormalize(make_sb3_env(ID, 4, seed=1, privileged_obs=True), clip_obs=CLIP_OBS), 60
    )
    venv.obs_rms["critic"].mean = venv.obs_rms["critic"].mean + 1.0
    venv.obs_rms["critic"].var = venv.obs_rms["critic"].var * 4.0
    yield venv
    venv.close()


@pytest.fixture(scope="module")
def parity_obs(dict_vecnormalize):
    """10,000 env observations; 20% of the values moved to 1.03-4x ``clip_obs`` standard deviations, 1% to +-1e30."""
    rng = np.random.default_rng(3)
    rms = dict_vecnormalize.obs_rms["policy"]
    std = np.sqrt(rms.var + dict_vecnormalize.epsilon)
    obs = env_observations().astype(np.float64)  # a copy
    beyond = rng.random(obs.shape) < 0.2
    z = rng.choice([-1.0, 1.0], obs.shape) * rng.uniform(1.03 * CLIP_OBS, 4 * CLIP_OBS, obs.shape)
    obs[beyond] = (rms.mean + z * std)[beyond]
    huge = rng.random(obs.shape) < 0.01
    obs[huge] = rng.choice([-1e30, 1e30], huge.sum())
    return obs.astype(np.float32)


def _model(name, env):
    """An untrained asymmetric SAC or PPO (actor and critic [32, 32]) with perturbed weights."""
    kwargs = {"net_arch": [32, 32]}
    if name == "SAC":
        model = SAC(AsymmetricSACPolicy, env, buffer_size=1_000, device="cpu", seed=0, policy_kwargs=kwargs)
    else:
        kwargs["activation_fn"] = torch.nn.ELU
        model = PPO(
            AsymmetricActorCriticPolicy, env, n_steps=16, batch_size=32, device="cpu", seed=0, policy_kwargs=kwargs
        )
    # spread the actions over (and past) [-1, 1]. PPO's unsquashed mean needs less: with 0.3, 86% of its actions
    # sit at the bounds and the rest come from pre-activations so large that float32 rounding reaches 6e-6 (C
    # vs SB3); with 0.1, 32% and 1.1e-6. SAC at 0.3: 32% within 0.01 of the bounds, 2.7e-6.
    scale = 0.3 if name == "SAC" else 0.1
    with torch.no_grad():
        generator = torch.Generator().manual_seed(0)
        for p in model.policy.parameters():
            p.add_(scale * torch.randn(p.shape, generator=generator))
    return model


@pytest.fixture(scope="module", params=["SAC", "PPO"])
def model(request, dict_vecnormalize):
    return _model(request.param, dict_vecnormalize)


def _sb3_actions(model, vecnormalize, obs):
    """``model.predict`` on the Dict, normalized by SB3's VecNormalize (the critic's values: zeros, unread)."""
    full = {"policy": obs, "critic": np.zeros((len(obs), 68), np.float32)}
    return model.predict(vecnormalize.normalize_obs(full), deterministic=True)[0]


@pytest.mark.parametrize("source", ["object", "pkl"])
def test_export_folds_in_the_policy_statistics_only(model, dict_vecnormalize, parity_obs, source, tmp_path):
    stats = dict_vecnormalize
    if source == "pkl":
        stats = tmp_path / "stats.pkl"
        dict_vecnormalize.save(str(stats))
    rms = dict_vecnormalize.obs_rms["policy"]
    z = (parity_obs - rms.mean) / np.sqrt(rms.var + dict_vecnormalize.epsilon)
    assert np.mean(z > CLIP_OBS) > 0.09 and np.mean(z < -CLIP_OBS) > 0.09  # VecNormalize clips a fifth of the values
    expected = _sb3_actions(model, dict_vecnormalize, parity_obs)
    assert (np.abs(expected) > 0.99).mean() > 0.01  # the bounds are reached

    net = policy_net(model, stats)
    np.testing.assert_array_equal(net.obs_mean.numpy(), rms.mean)
    np.testing.assert_array_equal(net.obs_std.numpy(), np.sqrt(rms.var + dict_vecnormalize.epsilon))
    assert net.clip_obs == CLIP_OBS
    assert np.abs(net.act(parity_obs) - expected).max() <= PARITY_TOLERANCE

    onnx_actions = run_onnx(export_onnx(model, tmp_path / "policy.onnx", vecnormalize=stats), parity_obs)
    assert np.abs(onnx_actions - expected).max() <= PARITY_TOLERANCE

    status, c_actions = run_header(export_c_header(model, tmp_path / "policy.h", vecnormalize=stats), parity_obs)
    np.testing.assert_array_equal(status, 0)
    assert np.abs(c_actions - expected).max() <= PARITY_TOLERANCE

    unnormalized = policy_net(model).act(parity_obs)
    assert np.abs(unnormalized - expected).max() > 0.1  # the statistics are in the exported forms


def test_cli_exports_an_asymmetric_model_with_dict_statistics(model, dict_vecnormalize, parity_obs, tmp_path, capsys):
    from unilab_gym.cli import main

    model.save(tmp_path / "model.zip")
    dict_vecnormalize.save(str(tmp_path / "model_vecnormalize.pkl"))
    out, header = tmp_path / "policy.onnx", tmp_path / "policy.h"
    argv = ["export", str(tmp_path / "model.zip"), "--out", str(out), "--sibling-vecnormalize"]
    assert main([*argv, "--c-header", str(header)]) == 0
    assert "parity max |diff|" in capsys.readouterr().out
    expected = _sb3_actions(model, dict_vecnormalize, parity_obs)
    assert np.abs(run_onnx(out, parity_obs) - expected).max() <= PARITY_TOLERANCE
    status, c_actions = run_header(header, parity_obs)
    np.testing.assert_array_equal(status, 0)
    assert np.abs(c_actions - expected).max() <= PARITY_TOLERANCE


def test_statistics_of_the_other_observation_are_refused(dict_vecnormalize, tmp_path):
    flat_env = make_sb3_env(ID, 2, seed=0)
    flat_stats = random_action_statistics(VecNormalize(make_sb3_env(ID, 2, seed=1)), 5)
    try:
        flat = PPO("MlpPolicy", flat_env, n_steps=16, batch_size=32, device="cpu", seed=0)
        asymmetric = _model("PPO", dict_vecnormalize)
        with pytest.raises(
            ValueError, match=r"vecnormalize normalizes a Dict observation \(keys \['critic', 'policy'\]"
        ):
            export_onnx(flat, tmp_path / "x.onnx", vecnormalize=dict_vecnormalize)
        with pytest.raises(ValueError, match="vecnormalize normalizes a flat observation"):
            export_c_header(asymmetric, tmp_path / "x.h", vecnormalize=flat_stats)
        assert not (tmp_path / "x.onnx").exists() and not (tmp_path / "x.h").exists()

        from unilab_gym.cli import main

        flat.save(tmp_path / "flat.zip")
        dict_vecnormalize.save(str(tmp_path / "dict.pkl"))
        argv = ["export", str(tmp_path / "flat.zip"), "--out", str(tmp_path / "x.onnx")]
        with pytest.raises(SystemExit, match="Dict observation"):
            main([*argv, "--vecnormalize", str(tmp_path / "dict.pkl")])
    finally:
        flat_env.close()
        flat_stats.close()


def test_a_policy_key_left_unnormalized_is_left_unnormalized(tmp_path):
    """``norm_obs_keys=["critic"]``: SB3 passes ``"policy"`` through, so the export folds in no statistics."""
    venv = random_action_statistics(
        VecNormalize(make_sb3_env(ID, 2, seed=1, privileged_obs=True), norm_obs_keys=["critic"]), 60
    )
    try:
        model = _model("SAC", venv)
        obs = env_observations()[:2000]
        assert not policy_net(model, venv).normalizes
        expected = _sb3_actions(model, venv, obs)
        actions = run_onnx(export_onnx(model, tmp_path / "policy.onnx", vecnormalize=venv), obs)
        assert np.abs(actions - expected).max() <= PARITY_TOLERANCE
    finally:
        venv.close()


def test_distill_takes_the_policy_statistics(dict_vecnormalize):
    teacher = _model("PPO", dict_vecnormalize)
    result = distill(
        teacher,
        hidden=(8,),
        vecnormalize=dict_vecnormalize,
        num_envs=2,
        steps=4,
        dagger_rounds=0,
        epochs=1,
        eval_episodes=2,
        max_episode_steps=10,
    )
    rms = dict_vecnormalize.obs_rms["policy"]
    np.testing.assert_allclose(result.student.obs_mean.numpy(), rms.mean, rtol=0, atol=0)
    np.testing.assert_allclose(result.teacher.obs_mean.numpy(), rms.mean, rtol=0, atol=0)
    assert np.isfinite(result.metrics["teacher_return"]) and np.isfinite(result.metrics["student_return"])
