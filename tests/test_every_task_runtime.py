"""The framework over every registered ``UniLab/*`` task (issue 27, item 1): ``AsyncRunner`` (inline, process and
Ray backends; SAC and PPO; flat and privileged ``Dict`` observations), ``SharedReplayBuffer`` (default and optimized
layouts), the pipeline metrics, ONNX / C-header export, ``evaluate_*`` and the memory estimate.

The task ids come from Gymnasium's registry, so a new registration is tested without editing this file. Everything
is tiny (8-step episodes, 2-4 envs, 16-unit networks): the learner-loop assertions run on ``backend="inline"``
(no processes), and one short ``backend="process"`` and one ``backend="ray"`` run per task check that the data
crossed the process boundary with the task's shapes and dtypes. One local Ray instance serves the whole module.
"""

from __future__ import annotations

import math
import os
import sys
import urllib.request

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("stable_baselines3")
import torch
from stable_baselines3 import PPO, SAC

from unilab_gym import AsyncRunner, SharedReplayBuffer

try:
    from unilab_gym.sb3 import AsymmetricActorCriticPolicy, AsymmetricSACPolicy, make_sb3_env
except ImportError:  # before the SB3 wing (issue 28) is in place
    from unilab_gym.integrations.sb3 import AsymmetricActorCriticPolicy, AsymmetricSACPolicy, make_sb3_env

sys.path.insert(0, os.path.dirname(__file__))

#: Every registered UniLab task (a new registration is picked up here).
TASKS = sorted(env_id for env_id in gym.registry if env_id.startswith("UniLab/"))
#: Short episodes, so that every run crosses episode ends.
EPISODE_STEPS = 8
SMALL = dict(max_episode_steps=EPISODE_STEPS, envs_per_cluster=2)

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py: tiny networks on busy cores


def env_kwargs(privileged: bool) -> dict:
    return {**SMALL, "privileged_obs": True} if privileged else dict(SMALL)


def test_every_task_is_collected():
    assert "UniLab/Quadruped-v0" in TASKS and len(TASKS) >= 5, TASKS


@pytest.fixture(scope="module")
def spaces_of():
    """``spaces_of(task, privileged) -> (observation space, action space)`` of one env (cached)."""
    cache: dict = {}

    def get(task: str, privileged: bool):
        if (task, privileged) not in cache:
            env = gym.make_vec(task, num_envs=1, **env_kwargs(privileged))
            cache[task, privileged] = (env.single_observation_space, env.single_action_space)
            env.close()
        return cache[task, privileged]

    return get


@pytest.fixture(scope="module")
def reset_obs():
    """``reset_obs(task, n, privileged)``: the reset observations of ``n`` envs seeded ``0 .. n-1`` (cached)."""
    cache: dict = {}

    def get(task: str, n: int, privileged: bool):
        if (task, n, privileged) not in cache:
            env = gym.make_vec(task, num_envs=n, **env_kwargs(privileged))
            cache[task, n, privileged] = env.reset(seed=0)[0]
            env.close()
        return cache[task, n, privileged]

    return get


def flat(x):
    """A ``Dict`` observation as ``{key: array}``, a flat one as ``{"": array}``."""
    return dict(x) if isinstance(x, dict) else {"": x}


def rows_of(arrays, width_of):
    """``{key: (rows, width)}`` from SB3 storage arrays ``(pos, n_envs, width)`` (or a dict of them)."""
    return {k: np.asarray(v).reshape(-1, width_of[k]) for k, v in flat(arrays).items()}


def obs_widths(space):
    return {k: s.shape[0] for k, s in flat(getattr(space, "spaces", space)).items()}


def assert_every_reset_obs_is_stored(stored, reset):
    """Each env's reset observation (env ``j`` seeded ``j``) is a row of the stored observations, for every key."""
    for key, rows in stored.items():
        want = flat(reset)[key]
        for j in range(len(want)):
            assert (rows == want[j]).all(axis=1).any(), f"env {j}'s reset observation [{key!r}] is not stored"


def assert_samples_match_spaces(samples, obs_space, act_space, batch):
    for key, space in flat(getattr(obs_space, "spaces", obs_space)).items():
        for tensor in (flat(samples.observations)[key], flat(samples.next_observations)[key]):
            assert tensor.shape == (batch, *space.shape) and tensor.dtype == torch.float32, key
            assert torch.isfinite(tensor).all()
    assert samples.actions.shape == (batch, *act_space.shape) and samples.actions.dtype == torch.float32
    assert ((samples.actions >= -1) & (samples.actions <= 1)).all()
    assert samples.rewards.shape == (batch, 1) and torch.isfinite(samples.rewards).all()


def make_sac(task, privileged, learning_starts=16, **kwargs):
    env = make_sb3_env(task, 1, seed=0, **env_kwargs(privileged))
    policy = AsymmetricSACPolicy if privileged else "MlpPolicy"
    settings = dict(batch_size=16, buffer_size=2_000, learning_starts=learning_starts, seed=0)
    settings["policy_kwargs"] = dict(net_arch=[16])  # a fresh dict each time: SB3 writes into it
    return SAC(policy, env, replay_buffer_class=SharedReplayBuffer, **{**settings, **kwargs})


def make_ppo(task, privileged, n_envs, n_steps=EPISODE_STEPS):
    env = make_sb3_env(task, n_envs, seed=0, **env_kwargs(privileged))
    policy = AsymmetricActorCriticPolicy if privileged else "MlpPolicy"
    return PPO(policy, env, n_steps=n_steps, batch_size=16, n_epochs=1, policy_kwargs=dict(net_arch=[16]), seed=0)


def unflatten(rollout, array):
    """A rollout buffer's array as ``(n_steps, n_envs, ...)`` (SB3's ``get()`` flattens it env-major for training)."""
    array = np.asarray(array)
    if rollout.generator_ready:
        return array.reshape(rollout.n_envs, rollout.buffer_size, *array.shape[1:]).swapaxes(0, 1)
    return array


def rollout_obs(rollout):
    """``{key: (n_steps, n_envs, width)}`` observations of a rollout buffer (``{"": ...}`` for flat ones)."""
    return {k: unflatten(rollout, v) for k, v in flat(rollout.observations).items()}


def scrape(url):
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def sample_sum(family, suffix=""):
    return sum(s.value for s in family.samples if s.name == family.name + suffix)


# --------------------------------------------------------------------------- AsyncRunner, inline: the learner loops
@pytest.mark.parametrize("privileged", [False, True], ids=["flat", "privileged"])
@pytest.mark.parametrize("task", TASKS)
def test_inline_sac_keeps_the_replay_ratio_and_stores_the_tasks_transitions(task, privileged, spaces_of, reset_obs):
    obs_space, act_space = spaces_of(task, privileged)
    model = make_sac(task, privileged)
    total, starts, ratio = 96, 16, 0.25
    with AsyncRunner(
        model,
        env_id=task,
        num_collectors=2,
        envs_per_collector=2,
        env_kwargs=env_kwargs(privileged),
        replay_ratio=ratio,
        seed=0,
        backend="inline",
        metrics_port=None if privileged else 0,
    ) as runner:
        runner.learn(total)
        status = runner.collector_status()
        scraped = scrape(runner.metrics_url) if not privileged else None
    try:
        replay = model.replay_buffer
        assert model.num_timesteps == total
        assert model._n_updates == math.floor((total - starts) * ratio)
        steps = [s["env_steps"] for s in status]
        assert all(n > 0 for n in steps) and sum(steps) == replay.size() >= total
        assert len(model.ep_info_buffer) > 0 and all(0 < e["l"] <= EPISODE_STEPS for e in model.ep_info_buffer)
        stored = rows_of(replay.observations, obs_widths(obs_space))
        assert_every_reset_obs_is_stored(stored, reset_obs(task, 4, privileged))
        assert_samples_match_spaces(replay.sample(32), obs_space, act_space, 32)
        if scraped is not None:  # the Prometheus counters count this task's steps and episodes
            per_collector = {
                s.labels["collector"]: s.value
                for s in scraped["unilab_env_steps"].samples
                if s.name == "unilab_env_steps_total"
            }
            assert per_collector == {str(i): float(n) for i, n in enumerate(steps)}
            assert sample_sum(scraped["unilab_gradient_steps"], "_total") == model._n_updates
            assert sample_sum(scraped["unilab_replay_committed_transitions"], "_total") == replay.size()
            # every episode lasts at most EPISODE_STEPS steps: each env ended at least steps // EPISODE_STEPS
            ended = sample_sum(scraped["unilab_episodes"], "_total")
            assert ended >= sum(2 * ((n // 2) // EPISODE_STEPS) for n in steps) > 0
    finally:
        model.replay_buffer.close()


@pytest.mark.parametrize("privileged", [False, True], ids=["flat", "privileged"])
@pytest.mark.parametrize("task", TASKS)
def test_inline_ppo_rollout_holds_the_tasks_observations(task, privileged, spaces_of, reset_obs):
    obs_space, act_space = spaces_of(task, privileged)
    model = make_ppo(task, privileged, n_envs=4)
    with AsyncRunner(
        model, env_id=task, num_collectors=2, envs_per_collector=2, env_kwargs=env_kwargs(privileged), seed=0,
        backend="inline",
    ) as runner:  # fmt: skip
        runner.learn(EPISODE_STEPS * 4)  # one rollout
        status = runner.collector_status()
        rollout = model.rollout_buffer  # the runner's buffer, holding the rollout, until it closes
    assert model.num_timesteps == EPISODE_STEPS * 4 == sum(s["env_steps"] for s in status)
    assert model._n_updates == 1  # n_epochs=1: one train() over the rollout
    observations = rollout_obs(rollout)
    for key, want in flat(reset_obs(task, 4, privileged)).items():  # step 0 of the rollout: the resets
        np.testing.assert_array_equal(observations[key][0], want, err_msg=key)
    for key, width in obs_widths(obs_space).items():
        assert observations[key].shape == (EPISODE_STEPS, 4, width) and observations[key].dtype == np.float32
    assert unflatten(rollout, rollout.actions).shape == (EPISODE_STEPS, 4, *act_space.shape)
    assert np.isfinite(rollout.returns).all() and np.isfinite(rollout.advantages).all()


# --------------------------------------------------------------------------- AsyncRunner across processes / Ray
@pytest.mark.parametrize("task", TASKS)
def test_process_collectors_write_the_tasks_dict_observations_into_the_shared_replay(task, spaces_of, reset_obs):
    obs_space, act_space = spaces_of(task, True)
    model = make_sac(task, True, learning_starts=32)
    try:
        with AsyncRunner(
            model, env_id=task, num_collectors=1, envs_per_collector=2, env_kwargs=env_kwargs(True), seed=0,
            replay_ratio=0.1, backend="process",
        ) as runner:  # fmt: skip
            runner.learn(48)
            pids = runner.collector_pids
        assert pids and os.getpid() not in pids
        replay = model.replay_buffer
        assert replay.size() >= 48 and model._n_updates == math.floor((48 - 32) * 0.1)
        stored = rows_of(replay.observations, obs_widths(obs_space))
        assert_every_reset_obs_is_stored(stored, reset_obs(task, 2, True))
        assert_samples_match_spaces(replay.sample(16), obs_space, act_space, 16)
    finally:
        model.replay_buffer.close()


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray instance for the module's Ray runs (the runners use it and leave it running)."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        yield ray
        return
    ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=80 << 20, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.mark.parametrize("task", TASKS)
def test_ray_collectors_ship_the_tasks_rollouts_to_the_learner(task, local_ray, spaces_of, reset_obs):
    obs_space, act_space = spaces_of(task, False)
    model = make_ppo(task, False, n_envs=2)
    with AsyncRunner(
        model, env_id=task, num_collectors=1, envs_per_collector=2, env_kwargs=SMALL, seed=0, backend="ray"
    ) as runner:
        runner.learn(EPISODE_STEPS * 2)
        status = runner.collector_status()
        rollout = model.rollout_buffer  # the runner's buffer, holding the rollout, until it closes
    assert [s["pid"] for s in status] != [os.getpid()]
    assert model.num_timesteps == EPISODE_STEPS * 2
    observations = rollout_obs(rollout)[""]
    assert observations.shape == (EPISODE_STEPS, 2, *obs_space.shape) and observations.dtype == np.float32
    np.testing.assert_array_equal(observations[0], reset_obs(task, 2, False))
    assert unflatten(rollout, rollout.actions).shape == (EPISODE_STEPS, 2, *act_space.shape)
    assert np.isfinite(rollout.rewards).all() and np.isfinite(rollout.returns).all()
