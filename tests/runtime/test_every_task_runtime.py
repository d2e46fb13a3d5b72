"""The framework over every registered ``UniLab/*`` task (issue 27, item 1): ``AsyncRunner`` (inline, process and
Ray backends; SAC and PPO; flat and privileged ``Dict`` observations), ``SharedReplayBuffer`` (default and optimized
layouts), the pipeline metrics, ONNX / C-header export, ``evaluate_*`` and the memory estimate.

The task ids come from Gymnasium's registry, so a new registration is tested without editing this file. Everything
is tiny (8-step episodes, 2-4 envs, 16-unit networks): the learner-loop assertions run on ``backend="inline"``
(no processes), and one short ``backend="process"`` and one ``backend="ray"`` run per task check that the data
crossed the process boundary with the task's shapes and dtypes. One local Ray instance serves the whole module.
"""

from __future__ import annotations

import json
import math
import os
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


# --------------------------------------------------------------------------- SharedReplayBuffer, both layouts
def copy_obs(obs):
    return {k: v.copy() for k, v in obs.items()} if isinstance(obs, dict) else obs.copy()


def obs_row(obs, i):
    return {k: v[i] for k, v in obs.items()} if isinstance(obs, dict) else obs[i]


def set_row(obs, i, value):
    if isinstance(obs, dict):
        for k in obs:
            obs[k][i] = value[k]
    else:
        obs[i] = value


@pytest.mark.parametrize("privileged", [False, True], ids=["flat", "privileged"])
@pytest.mark.parametrize("task", TASKS)
def test_shared_replay_gives_back_what_was_added_in_both_layouts_across_episode_ends(task, privileged):
    from stable_baselines3.common.buffers import DictReplayBuffer, ReplayBuffer

    venv = make_sb3_env(task, 2, seed=0, monitor=False, **env_kwargs(privileged))
    obs_space, act_space = venv.observation_space, venv.action_space
    reference = (DictReplayBuffer if privileged else ReplayBuffer)(64, obs_space, act_space, n_envs=2)
    default = SharedReplayBuffer(64, obs_space, act_space, n_envs=2, seed=0)
    optimized = SharedReplayBuffer(64, obs_space, act_space, n_envs=2, optimize_memory_usage=True, seed=0)
    rng = np.random.default_rng(0)
    added, ends = [], []
    try:
        obs = venv.reset()
        for t in range(EPISODE_STEPS + 4):  # past every env's first episode end
            action = rng.uniform(-1, 1, (2, *act_space.shape)).astype(np.float32)
            new_obs, reward, done, infos = venv.step(action)
            next_obs = copy_obs(new_obs)  # as SB3's _store_transition: the final observation at an end
            for i in np.flatnonzero(done):
                set_row(next_obs, i, infos[i]["terminal_observation"])
                ends.append((t, i))
            for buffer in (reference, default, optimized):
                buffer.add(obs, next_obs, action, reward, done, infos)
            added.append((copy_obs(obs), next_obs, action, reward, done, copy_obs(new_obs)))
            obs = new_obs
        assert ends and all(t < len(added) - 1 for t, _ in ends[:2])  # ends before the last step
        steps = np.arange(len(added) - 1)  # the last rows' successors are unknown yet (optimized layout)
        for env_index in (0, 1):
            got = {}
            for name, buffer in (("sb3", reference), ("default", default), ("optimized", optimized)):
                np.random.seed(env_index)  # SB3 draws the env index from numpy's global RNG, as we do
                got[name] = buffer._get_samples(steps)
            np.random.seed(env_index)
            envs = np.random.randint(0, 2, size=len(steps))
            for name, samples in got.items():
                for field in ("observations", "next_observations"):
                    for key, tensor in flat(getattr(samples, field)).items():
                        column = 0 if field == "observations" else 1
                        want = np.stack([flat(added[t][column])[key][e] for t, e in zip(steps, envs)])
                        np.testing.assert_array_equal(tensor.numpy(), want, err_msg=f"{name} {field} {key}")
                want_action = np.stack([added[t][2][e] for t, e in zip(steps, envs)])
                np.testing.assert_array_equal(samples.actions.numpy(), want_action, err_msg=name)
                want_reward = np.array([added[t][3][e] for t, e in zip(steps, envs)], np.float32)
                np.testing.assert_array_equal(samples.rewards.numpy()[:, 0], want_reward, err_msg=name)
        # across an episode end the optimized layout's next observation is the final one, not the next reset
        for t, i in ends:
            if t == len(added) - 1:
                continue
            np.random.seed(0)
            envs = np.random.randint(0, 2, size=64)
            pick = int(np.flatnonzero(envs == i)[0])  # a draw that gives env i
            batch = np.full(64, t)
            np.random.seed(0)
            samples = optimized._get_samples(batch)
            for key, tensor in flat(samples.next_observations).items():
                final = flat(added[t][1])[key][i]
                np.testing.assert_array_equal(tensor[pick].numpy(), final)
                assert not np.array_equal(final, flat(added[t][5])[key][i]), "the final obs equals the reset obs"
    finally:
        venv.close()
        default.close()
        optimized.close()


# --------------------------------------------------------------------------- export
#: Parity observations of the export tests (the default 10,000 per task would cost seconds each on busy cores).
PARITY = 256


@pytest.fixture
def few_parity_observations(monkeypatch):
    from unilab_gym.export import to_onnx

    monkeypatch.setattr(to_onnx, "PARITY_OBSERVATIONS", PARITY)


def tiny_sac(task, privileged=False):
    env = make_sb3_env(task, 1, seed=0, **env_kwargs(privileged))
    policy = AsymmetricSACPolicy if privileged else "MlpPolicy"
    return SAC(policy, env, buffer_size=16, learning_starts=0, policy_kwargs=dict(net_arch=[8]), seed=0)


@pytest.mark.parametrize("task", TASKS)
def test_export_onnx_and_the_c_header_act_as_a_tiny_policy_of_the_task(
    task, tmp_path, spaces_of, few_parity_observations
):
    pytest.importorskip("onnxruntime")
    from _c_policy import run_header

    from unilab_gym.export import env_observations, export_c_header, export_onnx, onnx_metadata, run_onnx

    obs_space, act_space = spaces_of(task, False)
    model = tiny_sac(task)
    path = export_onnx(model, tmp_path / "policy.onnx")  # the task from the model's env
    meta = onnx_metadata(path)
    assert meta["env_id"] == task and meta["parity_observations"] == str(PARITY)
    assert float(meta["parity_max_abs_diff"]) <= 1e-5
    assert max(b for _, b in json.loads(meta["obs_layout"]).values()) == obs_space.shape[0]
    obs = env_observations(PARITY, env_id=task)[:128]
    assert obs.shape == (128, *obs_space.shape)
    onnx_actions = run_onnx(path, obs)
    assert onnx_actions.shape == (128, *act_space.shape)
    np.testing.assert_allclose(onnx_actions, model.predict(obs, deterministic=True)[0], rtol=0, atol=1e-5)
    status, c_actions = run_header(export_c_header(model, tmp_path / "policy.h"), obs, act_space.shape[0])
    assert (status == 0).all()
    np.testing.assert_allclose(c_actions, onnx_actions, rtol=0, atol=1e-5)


@pytest.mark.parametrize("task", TASKS)
def test_export_of_the_privileged_actor_reads_the_policy_values_alone(
    task, tmp_path, spaces_of, few_parity_observations
):
    pytest.importorskip("onnxruntime")
    from unilab_gym.export import env_observations, export_onnx, run_onnx

    model = tiny_sac(task, privileged=True)
    path = export_onnx(model, tmp_path / "actor.onnx", env_id=task)
    obs = env_observations(PARITY, env_id=task)[:100]
    assert obs.shape[1] == spaces_of(task, True)[0]["policy"].shape[0]
    np.testing.assert_allclose(run_onnx(path, obs), model.predict(obs, deterministic=True)[0], rtol=0, atol=1e-5)


def test_export_refuses_a_task_whose_widths_are_not_the_policys(tmp_path):
    pytest.importorskip("onnxruntime")
    from unilab_gym.export import export_onnx

    others = [t for t in TASKS if spaces_of_default(t) != spaces_of_default("UniLab/Quadruped-v0")]
    model = tiny_sac("UniLab/Quadruped-v0")
    with pytest.raises(ValueError, match=rf"env_id='{others[0]}'.*pass the env_id"):
        export_onnx(model, tmp_path / "p.onnx", env_id=others[0])
    assert not (tmp_path / "p.onnx").exists()


def spaces_of_default(task):
    env = gym.make_vec(task, num_envs=1)
    try:
        return env.single_observation_space.shape, env.single_action_space.shape
    finally:
        env.close()


# --------------------------------------------------------------------------- evaluate_*
class Zero:
    """A policy of zero actions for ``act_dim`` actions."""

    def __init__(self, act_dim):
        self.act_dim = act_dim

    def predict(self, obs, deterministic=True):
        return np.zeros((len(obs), self.act_dim), np.float32), None


def env_type_of(task):
    """The vector env class ``gym.make_vec(task)`` makes."""
    env = gym.make_vec(task, num_envs=1)
    env.close()
    return type(env.unwrapped)


def legged(task):
    from unilab_gym.tasks.quadruped import QuadrupedTask

    return issubclass(env_type_of(task).task_type, QuadrupedTask)


@pytest.mark.parametrize("task", TASKS)
def test_evaluate_episodes_equals_a_hand_rollout_of_the_task(task, spaces_of):
    from unilab_gym.evaluation import evaluate_episodes, record_episodes

    act_dim = spaces_of(task, False)[1].shape[0]
    record = record_episodes(Zero(act_dim), task, 3, seed=5, max_episode_steps=EPISODE_STEPS)
    env = gym.make_vec(task, num_envs=3, max_episode_steps=EPISODE_STEPS)
    env.reset(seed=5)
    returns, lengths, active, success, has_success = np.zeros(3), np.zeros(3, int), np.ones(3, bool), {}, False
    while active.any():
        _, reward, terminated, truncated, info = env.step(np.zeros((3, act_dim), np.float32))
        returns[active] += reward[active]
        lengths += active
        has_success |= "is_success" in info
        for i in np.flatnonzero(active & (terminated | truncated)):
            success[i] = bool(info["is_success"][i]) if "is_success" in info else None
        active &= ~(terminated | truncated)
    env.close()
    np.testing.assert_array_equal(record.returns, returns)
    np.testing.assert_array_equal(record.lengths, lengths)
    assert (record.lengths <= EPISODE_STEPS).all()
    summary = evaluate_episodes(Zero(act_dim), task, 3, seed=5, max_episode_steps=EPISODE_STEPS)
    assert summary["return_mean"] == pytest.approx(returns.mean()) and summary["episodes"] == 3
    if has_success:
        assert summary["success_rate"] == pytest.approx(np.mean([success[i] for i in range(3)]))
    else:
        assert summary["success_rate"] is None and record.success is None


@pytest.mark.parametrize("task", TASKS)
def test_evaluate_gait_measures_legged_tasks_and_refuses_the_others(task, spaces_of):
    from unilab_gym.evaluation import GaitRecord, evaluate_gait, record_gait

    act_dim = spaces_of(task, False)[1].shape[0]
    if not legged(task):
        with pytest.raises(ValueError, match=r"evaluate_gait measures a legged gait.*evaluate_episodes"):
            evaluate_gait(Zero(act_dim), task, 2)
        with pytest.raises(ValueError, match=task):
            record_gait(Zero(act_dim), task, 2, max_episode_steps=4)
        return
    record = record_gait(Zero(act_dim), task, 2, seed=0, max_episode_steps=20)
    assert isinstance(record, GaitRecord) and (record.lengths == 20).all()  # standing: no falls in 20 steps
    summary = record.summary()
    assert 0.2 < summary["base_height_m"] < 0.4  # the A1 stands at ~0.27 m above the ground (the terrain too)
    assert summary["fall_rate"] == 0.0 and 0.5 < summary["duty_factor"] <= 1.0  # feet on the ground


def test_evaluate_gait_uses_the_mass_of_the_envs_robot():
    from unilab_gym.evaluation import record_gait, urdf_mass
    from unilab_gym.robots import get_robot, resolve_urdf

    record = record_gait(Zero(12), "UniLab/Quadruped-v0", 2, max_episode_steps=2, robot="aliengo")
    env = gym.make_vec("UniLab/Quadruped-v0", num_envs=2, max_episode_steps=2, robot="aliengo")
    added = env.reset(seed=0)[1]["parameters"]["added_mass"]
    env.close()
    aliengo = urdf_mass(resolve_urdf(get_robot("aliengo").urdf))
    assert abs(aliengo - urdf_mass()) > 1.0  # not the A1's
    np.testing.assert_array_equal(record.mass, aliengo + added)


# --------------------------------------------------------------------------- memory estimate
@pytest.mark.parametrize("task", TASKS)
def test_the_memory_check_uses_the_tasks_cost(task, monkeypatch):
    import unilab_gym.memory
    from unilab_gym.memory import estimate_env_bytes, task_bytes
    from unilab_gym.trace import DEFAULT_TRACE_MAX_RECORDS

    env_type = env_type_of(task)
    need = estimate_env_bytes(2, 2, 0, DEFAULT_TRACE_MAX_RECORDS, task_type=env_type.task_type)
    per_world, per_env = task_bytes(env_type.task_type)
    assert need == per_world + 2 * per_env + DEFAULT_TRACE_MAX_RECORDS * unilab_gym.memory.RECORD_BYTES
    monkeypatch.setattr(unilab_gym.memory, "available_bytes", lambda: need - 1)
    with pytest.raises(MemoryError, match=rf"{env_type.__name__}\(num_envs=2.*{env_type.task_type.__name__}"):
        gym.make_vec(task, num_envs=2, envs_per_cluster=2)
    monkeypatch.setattr(unilab_gym.memory, "available_bytes", lambda: need)
    gym.make_vec(task, num_envs=2, envs_per_cluster=2).close()  # exactly enough: built


def test_task_memory_costs_differ_and_a_task_may_declare_its_own():
    from unilab_gym.memory import BYTES_PER_ROBOT, task_bytes

    rough = task_bytes(env_type_of("UniLab/QuadrupedRough-v0").task_type)
    assert rough[1] > 10 * BYTES_PER_ROBOT  # a heightfield tile per robot (measured ~14-20 MB)
    assert task_bytes(env_type_of("UniLab/Quadrotor-v0").task_type)[1] < BYTES_PER_ROBOT

    class Mine(env_type_of("UniLab/Quadruped-v0").task_type):
        memory_bytes = (1_000, 2_000)

    class Bad(Mine):
        memory_bytes = (1_000, -1)

    assert task_bytes(Mine) == (1_000, 2_000)
    with pytest.raises(ValueError, match=r"Bad.memory_bytes"):
        task_bytes(Bad)
