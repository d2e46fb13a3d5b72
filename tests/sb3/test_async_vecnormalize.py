"""VecNormalize under AsyncRunner: collectors normalize with the learner's statistics, the learner merges theirs.

Over ``backend="inline"`` (no processes) and ``backend="process"``: at least one process case for each behaviour."""

from __future__ import annotations

import functools
import itertools
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _runner_envs import SMALL, recording_quadruped
from stable_baselines3 import PPO, SAC
from stable_baselines3.common.running_mean_std import RunningMeanStd
from stable_baselines3.common.vec_env import VecNormalize

from unilab_gym import AsyncRunner, SharedReplayBuffer
from unilab_gym.evaluation import evaluate_gait
from unilab_gym.sb3.vec_env import make_sb3_env

ID = "UniLab/Quadruped-v0"

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny networks on busy cores

_ENVS = itertools.count()


def recording(num_envs: int, prefix: str, **kwargs):
    """``recording_quadruped`` with one file per env, also when the collectors share a process (inline)."""
    return recording_quadruped(num_envs, prefix=f"{prefix}.{next(_ENVS)}", **kwargs)


def _ppo(n_envs: int) -> PPO:
    env = VecNormalize(make_sb3_env(ID, n_envs, seed=0, **SMALL), gamma=0.99)
    return PPO("MlpPolicy", env, n_steps=16, batch_size=32, n_epochs=2, policy_kwargs=dict(net_arch=[32, 32]), seed=0)


def _recorded(prefix: Path) -> list[np.ndarray]:
    """Every observation batch the collectors' envs returned, one array (steps, envs, 48) per collector."""
    files = sorted(prefix.parent.glob(prefix.name + ".*.npy"))
    assert files, "the collectors wrote no recording"
    return [np.load(f) for f in files]


@pytest.mark.parametrize("lag, backend", [(0, "inline"), (0, "process"), (1, "inline")])
def test_ppo_statistics_merge_to_the_single_stream_of_what_collectors_stepped(tmp_path, lag, backend):
    model = _ppo(8)
    vn = model.get_vec_normalize_env()
    obs_before, ret_before = vn.obs_rms.count, vn.ret_rms.count
    prefix = tmp_path / "obs"
    env_fn = functools.partial(recording, prefix=str(prefix), autoreset_mode="SameStep")
    with AsyncRunner(
        model, env_fn=env_fn, num_collectors=2, envs_per_collector=4, max_policy_lag=lag, backend=backend
    ) as runner:
        runner.learn(3 * 16 * 8)
        steps = model.num_timesteps
    assert steps == 3 * 16 * 8
    recorded = _recorded(prefix)
    assert len(recorded) == 2  # one recording per collector
    stepped = sum(r.shape[0] * r.shape[1] for r in recorded)
    # every observation stepped is counted once: the reset observations plus one per env step
    # (at lag 1 the collectors may have gathered one rollout more than the learner took; its moments come
    # after the rollout is finished, so they are merged exactly when the learner saw that rollout)
    merged = vn.obs_rms.count - obs_before
    if lag == 0:
        assert merged == pytest.approx(stepped, abs=1e-6)
        assert merged == pytest.approx(steps + 8, abs=1e-6)  # + the reset observations of the 8 envs
        assert vn.ret_rms.count - ret_before == pytest.approx(steps, abs=1e-6)
    else:
        assert steps + 8 <= merged + 1e-6 <= stepped + 1e-6
    # the merged statistics equal one stream over the same data (in the order the collectors stepped it)
    if lag == 0:
        reference = RunningMeanStd(shape=(48,))
        reference.update(np.concatenate([r.reshape(-1, 48) for r in recorded]).astype(np.float64))
        np.testing.assert_allclose(vn.obs_rms.mean, reference.mean, rtol=0, atol=1e-6)
        np.testing.assert_allclose(vn.obs_rms.var, reference.var, rtol=0, atol=1e-6)
    assert np.all(vn.obs_rms.var > 0)
    model.env.close()


@pytest.mark.parametrize("backend", ["inline", "process"])
def test_collectors_act_with_the_statistics_of_their_weight_version(tmp_path, backend):
    """A rollout's stored observations are the raw ones normalized with the statistics published before it."""
    model = _ppo(4)
    vn = model.get_vec_normalize_env()
    rng = np.random.default_rng(0)
    vn.obs_rms.update(rng.normal(0.5, 2.0, (100, 48)))  # statistics far from the defaults, published as version 1
    mean, var = vn.obs_rms.mean.copy(), vn.obs_rms.var.copy()
    prefix = tmp_path / "obs"
    env_fn = functools.partial(recording_quadruped, prefix=str(prefix), autoreset_mode="SameStep")
    with AsyncRunner(
        model, env_fn=env_fn, num_collectors=1, envs_per_collector=4, max_policy_lag=0, backend=backend
    ) as runner:
        runner.learn(16 * 4)  # one rollout, collected with version 1
        stored = model.rollout_buffer.observations.copy()  # after train(): SB3's swap_and_flatten, env-major
    raw = _recorded(prefix)[0][:16]  # reset obs + the first 15 step observations: the rollout's inputs
    expected = np.clip((raw - mean) / np.sqrt(var + vn.epsilon), -vn.clip_obs, vn.clip_obs).astype(np.float32)
    np.testing.assert_allclose(stored.reshape(-1, 48), expected.swapaxes(0, 1).reshape(-1, 48), rtol=0, atol=1e-6)
    model.env.close()


def test_saved_statistics_load_into_play_and_evaluate_gait(tmp_path):
    model = _ppo(4)
    with AsyncRunner(
        model, env_id=ID, num_collectors=1, envs_per_collector=4, env_kwargs=SMALL, backend="inline"
    ) as runner:  # what is saved is the loop's business, whatever the pool
        runner.learn(2 * 16 * 4)
    path = tmp_path / "model"
    model.save(path)
    model.get_vec_normalize_env().save(str(tmp_path / "model_vecnormalize.pkl"))
    play = Path(__file__).resolve().parents[2] / "examples" / "play.py"  # the script the training examples name
    proc = subprocess.run(
        [sys.executable, str(play), str(path.with_suffix(".zip")), "--sibling-vecnormalize", "--steps", "5",
         "--out", str(tmp_path / "walk.gif")],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"loading VecNormalize statistics {tmp_path / 'model_vecnormalize.pkl'}" in proc.stderr
    assert "return" in proc.stdout and (tmp_path / "walk.gif").stat().st_size > 0
    loaded = VecNormalize.load(str(tmp_path / "model_vecnormalize.pkl"), make_sb3_env(ID, 1))
    np.testing.assert_array_equal(loaded.obs_rms.mean, model.get_vec_normalize_env().obs_rms.mean)
    stats = evaluate_gait(PPO.load(path), n_episodes=2, vecnormalize=tmp_path / "model_vecnormalize.pkl")
    assert stats["episodes"] == 2
    loaded.close()
    model.env.close()


@pytest.mark.parametrize("backend", ["inline", "process"])
def test_sac_replay_keeps_raw_observations_and_statistics_grow(tmp_path, backend):
    env = VecNormalize(make_sb3_env(ID, 1, seed=0, **SMALL), gamma=0.98)
    model = SAC(
        "MlpPolicy", env, replay_buffer_class=SharedReplayBuffer, buffer_size=4_000, learning_starts=64,
        batch_size=32, policy_kwargs=dict(net_arch=[32, 32]), seed=0,
    )  # fmt: skip
    vn = model.get_vec_normalize_env()
    before = vn.obs_rms.count
    prefix = tmp_path / "obs"
    env_fn = functools.partial(recording, prefix=str(prefix), autoreset_mode="SameStep")
    with AsyncRunner(model, env_fn=env_fn, num_collectors=2, envs_per_collector=4, backend=backend) as runner:
        runner.learn(800)
        transitions = model.num_timesteps
        grown = vn.obs_rms.count - before
    stepped = sum(r.shape[0] * r.shape[1] for r in _recorded(prefix))  # reset observations + one per env step
    # a step's moments are sent before it counts, so all are merged when learn() returns, but for the one
    # vector step (4 envs) each collector may have had in flight when it was paused
    assert transitions + 2 * 4 <= grown <= stepped
    assert stepped - 2 * 4 <= grown
    storage = model.replay_buffer.storage
    rows = storage.gather(np.arange(8))
    raw_obs = rows[:, storage.layout.obs]
    assert np.abs(raw_obs).max() > vn.clip_obs or not np.allclose(
        raw_obs, vn.normalize_obs(raw_obs)
    )  # raw, not normalized
    sample = model.replay_buffer.sample(16, env=vn)
    assert sample.observations.abs().max() <= vn.clip_obs + 1e-6
    model.replay_buffer.close()
    env.close()
