"""The env side over every registered ``UniLab/*`` task (issue 27, item 1 and its first done-when): Gymnasium's
``check_env`` on the single env, our vector-env conformance (``SyncVectorEnv`` of single envs as the reference, in
every autoreset mode), determinism per env across ``envs_per_cluster`` and across sync / async collection
(``UniLabVectorEnv`` directly, ``AsyncRunner(backend="inline")`` and ``backend="process"``), every autoreset mode's
``final_obs`` / ``final_info`` and flags, domain randomization with a parameter trace that replays each recorded
episode exactly (``replay_env`` builds the recorded task's env from the trace header), and privileged observations.

The task ids come from Gymnasium's registry, so a new registration is tested without editing this file; the
quadruped task also runs with each of its other shipped robots (``robot=``). Everything is small: 2-5 envs,
episodes of 4-5 control steps, a dozen steps per run.
"""

from __future__ import annotations

import functools
import glob

import _task_envs
import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from gymnasium.vector import SyncVectorEnv
from test_gym_conformance import _assert_same_infos

import unilab_gym  # noqa: F401  (registers the ids)
from unilab_gym.randomization import PARAMETER_NAMES
from unilab_gym.registration import QUADRUPED_ID
from unilab_gym.robots import ROBOTS
from unilab_gym.trace import read_jsonl
from unilab_gym.trace_replay import replay_env
from unilab_gym.vector_env import FinishedEnvError, UniLabVectorEnv

#: Every registered UniLab task (a new registration is picked up here).
TASKS = sorted(env_id for env_id in gym.registry if env_id.startswith("UniLab/"))
#: (id, kwargs): every task with its defaults, and the quadruped task with each of its other shipped robots.
CASES = [(task, {}) for task in TASKS] + [(QUADRUPED_ID, {"robot": name}) for name in sorted(ROBOTS) if name != "a1"]
CASE_IDS = [task.split("/")[1] + (f"-{kw['robot']}" if kw else "") for task, kw in CASES]
#: A termination threshold that ends some episodes early (a fall), where the task has one we can set.
FALLS = {
    "UniLab/Quadruped-v0": {"termination": {"min_base_height": 0.27}},
    "UniLab/QuadrupedRough-v0": {"termination": {"min_base_height": 0.27}},
    "UniLab/Quadrotor-v0": {"termination": {"min_height": 0.99}},
}
#: Physics parameters every task takes (latency delays any action; friction and mass act on contacts and bodies).
DR = {"friction": (0.4, 1.2), "added_mass": (0.0, 0.01), "latency": (0, 2)}
MODES = ["NextStep", "SameStep", "Disabled"]
SEED = 11


def short(task, kwargs, steps=4, falls=True):
    """The case's kwargs with ``steps``-step episodes (and the task's early falls, with its default robot)."""
    extra = FALLS.get(task, {}) if falls and "robot" not in kwargs else {}
    return {**kwargs, "max_episode_steps": steps, **extra}


def env_actions(index, steps, dim):
    """(steps, dim) actions of env ``index``: its own stream, whatever the grouping."""
    return np.random.default_rng(1_000 + index).uniform(-1, 1, (steps, dim))


def test_every_registered_task_is_collected():
    assert {"UniLab/Quadruped-v0", "UniLab/QuadrupedRough-v0", "UniLab/PandaReach-v0", "UniLab/PandaPick-v0",
            "UniLab/Quadrotor-v0"} <= set(TASKS)  # fmt: skip
    assert sorted(ROBOTS) == ["a1", "aliengo", "laikago", "mini_cheetah"]


# --------------------------------------------------------------------------- Gymnasium's check_env, spaces
@pytest.mark.parametrize("privileged", [False, True], ids=["flat", "privileged"])
@pytest.mark.parametrize(("task", "kwargs"), CASES, ids=CASE_IDS)
def test_single_env_passes_check_env_and_the_vector_env_has_its_spaces(closing, task, kwargs, privileged):
    single = closing(gym.make(task, privileged_obs=privileged, **kwargs))
    check_env(single, skip_render_check=True)
    vec = closing(gym.make_vec(task, num_envs=2, privileged_obs=privileged, **kwargs))
    assert isinstance(vec, UniLabVectorEnv) and vec.num_envs == 2
    assert vec.single_observation_space == single.observation_space
    assert vec.single_action_space == single.action_space
    obs, _ = vec.reset(seed=0)
    assert vec.observation_space.contains(obs)


# --------------------------------------------------------------------------- conformance: SyncVectorEnv reference
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("task", "kwargs"), CASES, ids=CASE_IDS)
def test_vector_env_equals_sync_vector_env_of_single_envs_in_every_autoreset_mode(closing, task, kwargs, mode):
    """Obs, rewards, flags and every info key (``final_obs`` / ``final_info`` included) as Gymnasium's
    ``SyncVectorEnv`` over the single envs builds them; ``Disabled`` resets the finished envs by ``reset_mask``."""
    n, config = 3, short(task, kwargs)
    ours = closing(gym.make_vec(task, num_envs=n, autoreset_mode=mode, **config))
    ref = closing(SyncVectorEnv([lambda: gym.make(task, **config)] * n, autoreset_mode=mode))
    obs, info = ours.reset(seed=SEED)
    obs_r, info_r = ref.reset(seed=SEED)
    np.testing.assert_array_equal(obs, obs_r)
    _assert_same_infos(info, info_r, "reset")
    rng = np.random.default_rng(0)
    done, ends = np.zeros(n, bool), 0
    for t in range(10):
        if mode == "Disabled" and done.any():
            obs, info = ours.reset(options={"reset_mask": done})
            obs_r, info_r = ref.reset(options={"reset_mask": done.copy()})
            np.testing.assert_array_equal(obs, obs_r)
            _assert_same_infos(info, info_r, f"reset_mask at step {t}")
        action = rng.uniform(-1, 1, ours.action_space.shape).astype(np.float32)
        out, out_r = ours.step(action), ref.step(action)
        for name, mine, theirs in zip(("obs", "reward", "terminated", "truncated"), out[:4], out_r[:4]):
            np.testing.assert_array_equal(mine, theirs, err_msg=f"{mode} step {t}: {name}")
            assert mine.dtype == theirs.dtype, f"{mode} step {t}: dtype of {name}"
        _assert_same_infos(out[4], out_r[4], f"{mode} step {t}")
        done = out[2] | out[3]
        ends += int(done.sum())
    assert ends >= n, "the scenario should contain episode ends"


# --------------------------------------------------------------------------- autoreset modes, against each other
def _episodes(task, kwargs, mode, n=2, steps=11):
    """Each env's episodes under ``mode``: lists of (obs list, rewards, flags, final infos); the action of an
    episode's k-th step is the same in every mode (``table[env, k]``)."""
    env = gym.make_vec(task, num_envs=n, autoreset_mode=mode, **short(task, kwargs))
    try:
        table = np.random.default_rng(5).uniform(-1, 1, (n, 8, env.single_action_space.shape[0]))
        obs, _ = env.reset(seed=SEED)
        current = [{"obs": [obs[i]], "rewards": [], "flags": [], "terms": []} for i in range(n)]
        episodes = [[] for _ in range(n)]
        k = np.zeros(n, dtype=np.int64)  # step of each env's episode
        restarting = np.zeros(n, bool)  # NextStep: this step resets these envs (reward 0, flags False)
        for _ in range(steps):
            actions = table[np.arange(n), np.minimum(k, 7)]
            obs, reward, terminated, truncated, info = env.step(actions)
            done = terminated | truncated
            for i in range(n):
                if restarting[i]:
                    assert reward[i] == 0.0 and not done[i], "a NextStep reset step has no reward and no flags"
                    assert info["_episode_seed"][i] and not info.get("_reward_terms", np.zeros(n, bool))[i]
                    current[i] = {"obs": [obs[i]], "rewards": [], "flags": [], "terms": []}
                    continue
                terms = info["final_info"]["reward_terms"] if mode == "SameStep" and done[i] else info["reward_terms"]
                current[i]["terms"].append({name: terms[name][i] for name in terms if not name.startswith("_")})
                current[i]["rewards"].append(reward[i])
                current[i]["flags"].append((bool(terminated[i]), bool(truncated[i])))
                if mode == "SameStep" and done[i]:
                    assert info["_final_obs"][i] and info["_final_info"][i]
                    current[i]["obs"].append(info["final_obs"][i])
                    episodes[i].append(current[i])
                    current[i] = {"obs": [obs[i]], "rewards": [], "flags": [], "terms": []}  # the next episode's
                else:
                    current[i]["obs"].append(obs[i])
                    if done[i]:
                        episodes[i].append(current[i])
            if mode == "SameStep":
                assert info.get("_final_obs", np.zeros(n, bool)).tolist() == done.tolist()
                if not done.any():
                    assert "final_obs" not in info and "final_info" not in info
            if mode == "Disabled" and done.any():
                with pytest.raises(FinishedEnvError):  # a finished env is not stepped on ...
                    env.step(actions)
                obs, _ = env.reset(options={"reset_mask": done})  # ... until it is reset
                for i in np.flatnonzero(done):
                    current[i] = {"obs": [obs[i]], "rewards": [], "flags": [], "terms": []}
            k = np.where(done | restarting, 0, k + 1)
            restarting = done if mode == "NextStep" else np.zeros(n, bool)
        return episodes
    finally:
        env.close()


@pytest.mark.parametrize(("task", "kwargs"), CASES, ids=CASE_IDS)
def test_every_autoreset_mode_gives_the_same_episodes_and_final_obs(task, kwargs):
    """The episodes (observations, the final one included, rewards, reward terms and flags) are the same in the
    three modes: NextStep's last obs of an episode is SameStep's ``final_obs`` (with its ``final_info``) and
    Disabled's obs before ``reset_mask``; NextStep's reset step has reward 0 and no flags; Disabled refuses to
    step a finished env."""
    by_mode = {mode: _episodes(task, kwargs, mode) for mode in MODES}
    reference = by_mode["NextStep"]
    assert all(len(episodes) >= 2 for episodes in reference), "every env should finish two episodes"
    for mode in ("SameStep", "Disabled"):
        for i, episodes in enumerate(by_mode[mode]):
            count = min(len(episodes), len(reference[i]))
            assert count >= 2, f"{mode}: env {i} finished {len(episodes)} episodes"
            for e, (mine, theirs) in enumerate(zip(episodes[:count], reference[i][:count])):
                where = f"{mode} env {i} episode {e}"
                np.testing.assert_array_equal(np.stack(mine["obs"]), np.stack(theirs["obs"]), err_msg=where)
                assert mine["rewards"] == theirs["rewards"] and mine["flags"] == theirs["flags"], where
                assert mine["terms"] == theirs["terms"], where
                assert mine["flags"][-1] != (False, False) and all(f == (False, False) for f in mine["flags"][:-1])


# --------------------------------------------------------------------------- determinism across envs_per_cluster
def _rollout(task, kwargs, num_envs, envs_per_cluster, first=0, steps=12):
    """Per-step (policy obs, critic obs, reward, terminated, truncated) of envs ``first ..``, seeded and fed as in a
    vector env of envs 0.. seeded ``SEED``; privileged observations and domain randomization on."""
    env = gym.make_vec(task, num_envs=num_envs, envs_per_cluster=envs_per_cluster, privileged_obs=True,
                       domain_randomization=DR, **short(task, kwargs))  # fmt: skip
    try:
        dim = env.single_action_space.shape[0]
        actions = np.stack([env_actions(first + i, steps, dim) for i in range(num_envs)], axis=1)
        obs, _ = env.reset(seed=SEED + first)
        out = {"policy": [obs["policy"]], "critic": [obs["critic"]], "reward": [], "terminated": [], "truncated": []}
        for t in range(steps):
            obs, reward, terminated, truncated, _ = env.step(actions[t])
            for key, value in (("policy", obs["policy"]), ("critic", obs["critic"]), ("reward", reward),
                               ("terminated", terminated), ("truncated", truncated)):  # fmt: skip
                out[key].append(value)
        return {key: np.stack(value) for key, value in out.items()}
    finally:
        env.close()


@pytest.mark.determinism
@pytest.mark.parametrize(("task", "kwargs"), CASES, ids=CASE_IDS)
def test_env_i_is_deterministic_alone_and_in_any_envs_per_cluster(task, kwargs):
    """Bit for bit: 5 envs in one world, in worlds of 2 and one per world; env 3 alone (seeded SEED + 3). The other
    robots (slower to load) with 3 envs: in one world and one per world, env 2 alone."""
    n, groupings = (3, (3, 1)) if kwargs else (5, (5, 2, 1))
    grouped = [_rollout(task, kwargs, n, epc) for epc in groupings]
    assert (grouped[0]["terminated"] | grouped[0]["truncated"]).sum() >= n, "episodes should end and restart"
    for other in grouped[1:]:
        for key in grouped[0]:
            np.testing.assert_array_equal(grouped[0][key], other[key], err_msg=key)
    last = n - 2 if n > 3 else n - 1
    alone = _rollout(task, kwargs, 1, 1, first=last)
    for key in alone:
        np.testing.assert_array_equal(grouped[0][key][:, last], alone[key][:, 0], err_msg=f"{key} of env {last} alone")


# --------------------------------------------------------------------------- determinism across sync / async
def _spaces_env(task, config):
    try:
        from unilab_gym.sb3 import make_sb3_env
    except ImportError:  # before the SB3 wing (issue 28) is in place
        from unilab_gym.integrations.sb3 import make_sb3_env
    return make_sb3_env(task, 1, seed=0, **config)


def _collect(task, backend, prefix, steps=36):
    """What one collector of 3 envs (one world) stepped, recorded in the collector (actions before
    ``learning_starts`` are the collector's own uniform draws: the same in every backend)."""
    from stable_baselines3 import SAC

    from unilab_gym import AsyncRunner, SharedReplayBuffer

    config = short(task, {})
    model = SAC("MlpPolicy", _spaces_env(task, config), replay_buffer_class=SharedReplayBuffer, buffer_size=1_000,
                learning_starts=1_000, batch_size=8, policy_kwargs=dict(net_arch=[8]), seed=0)  # fmt: skip
    env_fn = functools.partial(_task_envs.recording, env_id=task, prefix=prefix, envs_per_cluster=3, **config)
    try:
        with AsyncRunner(model, env_fn=env_fn, num_collectors=1, envs_per_collector=3, seed=SEED,
                         backend=backend) as runner:  # fmt: skip
            runner.learn(steps)
        stored = {
            "obs": model.replay_buffer.observations[: model.replay_buffer.size(), 0].copy(),
            "rewards": model.replay_buffer.rewards[: model.replay_buffer.size(), 0].copy(),
        }
    finally:
        model.replay_buffer.close()
    (path,) = glob.glob(f"{prefix}.*.npz")
    with np.load(path) as f:
        return {key: f[key] for key in f.files}, stored


@pytest.mark.determinism
@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("task", TASKS)
def test_inline_and_process_collection_give_env_is_transitions_bit_for_bit(task, tmp_path):
    """The same env seed gives the same transitions collected inline, in a collector process, and stepped
    directly in a ``UniLabVectorEnv`` (one world per env there, one world of 3 in the collectors); the replay holds
    the collected observations and rewards."""
    inline, stored = _collect(task, "inline", str(tmp_path / "inline"))
    process, _ = _collect(task, "process", str(tmp_path / "process"))
    assert int(inline["seed"]) == int(process["seed"]) == SEED  # collector 0's env seed is the runner's seed
    steps = min(len(inline["actions"]), len(process["actions"]))
    assert steps >= 8
    for key in ("actions", "rewards", "terminated", "truncated"):
        np.testing.assert_array_equal(inline[key][:steps], process[key][:steps], err_msg=key)
    np.testing.assert_array_equal(inline["obs"][: steps + 1], process["obs"][: steps + 1])
    direct = gym.make_vec(task, num_envs=3, envs_per_cluster=1, **short(task, {}))
    try:
        obs, _ = direct.reset(seed=SEED)
        np.testing.assert_array_equal(obs, inline["obs"][0])
        restarting = np.zeros(3, bool)
        rows_obs, rows_rewards = [], []
        for t, action in enumerate(inline["actions"]):
            previous = obs
            obs, reward, terminated, truncated, _ = direct.step(action)
            for name, mine, theirs in (("obs", obs, inline["obs"][t + 1]), ("reward", reward, inline["rewards"][t]),
                                       ("terminated", terminated, inline["terminated"][t]),
                                       ("truncated", truncated, inline["truncated"][t])):  # fmt: skip
                np.testing.assert_array_equal(mine, theirs, err_msg=f"step {t}: {name}")
            rows_obs += [previous[i] for i in range(3) if not restarting[i]]  # NextStep: a reset step is no transition
            rows_rewards += [reward[i] for i in range(3) if not restarting[i]]
            restarting = terminated | truncated
    finally:
        direct.close()
    assert (inline["terminated"] | inline["truncated"]).any(), "the collection should cross episode ends"
    count = len(stored["obs"])
    assert 0 < count <= len(rows_obs)
    np.testing.assert_array_equal(stored["obs"], np.stack(rows_obs)[:count])
    np.testing.assert_array_equal(stored["rewards"], np.float32(rows_rewards[:count]))


# --------------------------------------------------------------------------- domain randomization, trace, replay
REPLAY_KWARGS = {"UniLab/QuadrupedRough-v0": {"init_terrain_level": 3}}  # the curriculum moves levels down


@pytest.mark.determinism
@pytest.mark.parametrize(("task", "kwargs"), CASES, ids=CASE_IDS)
def test_every_traced_episode_replays_exactly_from_the_trace_file(task, kwargs, tmp_path):
    """Domain randomization draws each episode's parameters; the streamed trace's header names the env id, and
    ``replay_env(header, record)`` builds that task's env at the episode's start: the episode's actions give its
    observations, rewards and flags bit for bit, and the replayed env records the same episode."""
    n, steps = 3, 14
    config = {**short(task, kwargs, steps=5), **REPLAY_KWARGS.get(task, {})}
    env = gym.make_vec(task, num_envs=n, autoreset_mode="SameStep", domain_randomization=DR,
                       trace_path=tmp_path / "trace.jsonl", **config)  # fmt: skip
    logs, live = {}, {}
    try:
        dim = env.single_action_space.shape[0]
        actions = np.stack([env_actions(i, steps, dim) for i in range(n)], axis=1)
        obs, _ = env.reset(seed=SEED)
        episode = np.zeros(n, dtype=np.int64)
        for i in range(n):
            logs[i, 0] = {"obs": [obs[i]], "actions": [], "rewards": [], "flags": []}
        for t in range(steps):
            obs, reward, terminated, truncated, info = env.step(actions[t])
            for i in range(n):
                log = logs[i, episode[i]]
                done = terminated[i] or truncated[i]
                log["actions"].append(actions[t, i])
                log["rewards"].append(reward[i])
                log["flags"].append((bool(terminated[i]), bool(truncated[i])))
                log["obs"].append(info["final_obs"][i] if done else obs[i])
                if done:
                    episode[i] += 1
                    logs[i, episode[i]] = {"obs": [obs[i]], "actions": [], "rewards": [], "flags": []}
        live = env.parameter_trace()
    finally:
        env.close()
    header, records = read_jsonl(tmp_path / "trace.jsonl")
    assert header["env_id"] == task and header["env"] == env.task_config and records == live
    assert len(records) >= 2 * n
    assert len({r["parameters"]["friction"] for r in records}) == len(records)  # drawn per episode
    assert set(records[0]["parameters"]) == {*PARAMETER_NAMES, *env.task.episode_parameter_names}
    for record in records:
        log = logs[record["env"], record["episode"]]
        assert len(log["actions"]) == record["length"]
        replay, obs, info = replay_env(header, record)
        try:
            assert type(replay) is type(env)
            np.testing.assert_array_equal(obs[0], log["obs"][0])
            assert {name: info["parameters"][name][0].item() for name in PARAMETER_NAMES} == {
                name: record["parameters"][name] for name in PARAMETER_NAMES
            }
            for k, action in enumerate(log["actions"]):
                obs, reward, terminated, truncated, _ = replay.step(action[None])
                where = f"env {record['env']} episode {record['episode']} step {k}"
                np.testing.assert_array_equal(obs[0], log["obs"][k + 1], err_msg=where)
                assert reward[0] == log["rewards"][k] and (terminated[0], truncated[0]) == log["flags"][k], where
            (replayed,) = replay.parameter_trace()
        finally:
            replay.close()
        for key in ("return", "length", "termination", "fall_conditions", "parameters", "command", "episode_seed"):
            assert replayed[key] == record[key], f"{key} of env {record['env']} episode {record['episode']}"


def test_replay_env_refuses_an_env_id_that_is_not_registered():
    record = {"parameters": dict.fromkeys(PARAMETER_NAMES, 0.0), "episode_seed": 1}
    with pytest.raises(ValueError, match="env_id 'os:UniLab/Nothing-v0' is not registered"):
        replay_env({"type": "header", "env_id": "os:UniLab/Nothing-v0", "env": {}}, record)
    with pytest.raises(ValueError, match="env_id None"):  # a trace of an unregistered env class
        replay_env({"type": "header", "env_id": None, "env": {}}, record)


class _MyQuadrupedEnv(UniLabVectorEnv):
    """A user's env class (the default task), registered under its own id by the test below."""


@pytest.fixture
def registered_user_env():
    gym.register("TestOnly/MyQuadruped-v0", vector_entry_point=_MyQuadrupedEnv)
    yield "TestOnly/MyQuadruped-v0"
    del gym.registry["TestOnly/MyQuadruped-v0"]


def test_a_user_env_class_registered_under_its_own_id_is_named_in_the_trace_and_replayed(
    registered_user_env, tmp_path, closing
):
    env = _MyQuadrupedEnv(1, max_episode_steps=2, trace_path=tmp_path / "trace.jsonl")
    try:
        env.reset(seed=0)
        for _ in range(2):
            env.step(np.zeros((1, 12)))
    finally:
        env.close()
    header, (record,) = read_jsonl(tmp_path / "trace.jsonl")
    assert header["env_id"] == registered_user_env
    replay, _, _ = replay_env(header, record)
    try:
        assert type(replay) is _MyQuadrupedEnv
    finally:
        replay.close()
    assert _MyQuadrupedEnv.__mro__[1] is UniLabVectorEnv  # a subclass: not UniLab/Quadruped-v0's class itself
    default = closing(UniLabVectorEnv(1))
    assert read_jsonl(default.save_parameter_trace(tmp_path / "a1.jsonl"))[0]["env_id"] == QUADRUPED_ID


# --------------------------------------------------------------------------- privileged observations
def _parameter_columns(layout):
    """The critic's columns of the physics parameters (:data:`PARAMETER_NAMES` order)."""
    if "parameters" in layout:
        return slice(*layout["parameters"])
    return slice(layout["friction"][0], layout["push_velocity"][1])


@pytest.mark.parametrize(("task", "kwargs"), CASES, ids=CASE_IDS)
def test_privileged_obs_is_a_dict_whose_policy_part_is_the_plain_observation(task, kwargs):
    """``privileged_obs=True``: a ``Dict`` space of ``"policy"`` (the task's observation, bit for bit the plain one)
    and ``"critic"`` (the policy columns, then the privileged ones: the episode's physics parameters among them)."""
    config = dict(domain_randomization=DR, **short(task, kwargs))
    plain = gym.make_vec(task, num_envs=2, **config)
    env = gym.make_vec(task, num_envs=2, privileged_obs=True, **config)
    try:
        task_math = env.task
        space = env.single_observation_space
        assert isinstance(space, gym.spaces.Dict) and set(space.spaces) == {"policy", "critic"}
        assert space["policy"] == plain.single_observation_space
        assert space["policy"].shape == (task_math.obs_dim,) and space["critic"].shape == (task_math.critic_obs_dim,)
        assert space["critic"].dtype == np.float32
        layout = task_math.critic_obs_layout
        assert {name: layout[name] for name in task_math.obs_layout} == task_math.obs_layout
        assert max(stop for _, stop in layout.values()) == task_math.critic_obs_dim
        obs, _ = env.reset(seed=SEED)
        obs_plain, _ = plain.reset(seed=SEED)
        actions = np.random.default_rng(2).uniform(-1, 1, (8, *env.action_space.shape))
        for t in range(9):
            assert env.observation_space.contains(obs)
            np.testing.assert_array_equal(obs["policy"], obs_plain, err_msg=f"step {t}")
            np.testing.assert_array_equal(obs["critic"][:, : task_math.obs_dim], obs["policy"])
            np.testing.assert_array_equal(obs["critic"][:, _parameter_columns(layout)], np.float32(env.parameters))
            if t < 8:
                obs, reward, *_ = env.step(actions[t])
                obs_plain, reward_plain, *_ = plain.step(actions[t])
                np.testing.assert_array_equal(reward, reward_plain)
        assert len(np.unique(env.parameters[:, 0])) == 2  # the envs' frictions differ: the columns are per env
    finally:
        env.close()
        plain.close()
