"""Determinism contract: env i's trajectory depends only on its seed and its actions.

Compared bit for bit (obs, reward, terminated, truncated): env i alone vs inside vector envs of
7 and 64, in clusters of several sizes, with neighbours reset mid-episode, and across runs.
"""

import hashlib
import subprocess
import sys

import numpy as np
import pytest

from unilab_gym import QuadrupedEnv, UniLabVectorEnv

SEED = 100
# a low "fall" height makes terminations frequent and irregular, so autoresets happen mid-run
TASK = dict(max_episode_steps=25, termination={"min_base_height": 0.27})


def env_actions(env_index: int, steps: int) -> np.ndarray:
    """(steps, 12) actions of env ``env_index``: its own stream, whatever the grouping."""
    return np.random.default_rng(10_000 + env_index).uniform(-1, 1, (steps, 12))


def rollout(
    num_envs, envs_per_cluster, steps, autoreset_mode="NextStep", neighbour_reset_every=None, keep=None, seed=SEED, **kw
):
    """Run a vector env; return per-env lists of (obs, reward, terminated, truncated) arrays."""
    env = UniLabVectorEnv(num_envs, envs_per_cluster=envs_per_cluster, autoreset_mode=autoreset_mode, **{**TASK, **kw})
    noise = np.random.default_rng(7)
    acts = np.stack([env_actions(i, steps) for i in range(num_envs)], axis=1)
    obs, _ = env.reset(seed=seed)
    out = {"obs": [obs], "rew": [], "term": [], "trunc": []}
    for t in range(steps):
        a = acts[t].copy()
        if keep is not None:  # neighbours of `keep` get actions nobody else sees
            others = np.arange(num_envs) != keep
            a[others] = noise.uniform(-1, 1, (others.sum(), 12))
        obs, rew, term, trunc, _ = env.step(a)
        for key, value in zip(("obs", "rew", "term", "trunc"), (obs, rew, term, trunc)):
            out[key].append(value)
        mask = (term | trunc) if autoreset_mode == "Disabled" else np.zeros(num_envs, bool)  # finished envs
        if neighbour_reset_every and (t + 1) % neighbour_reset_every == 0:
            mask |= np.arange(num_envs) != keep
        if mask.any():
            env.reset(options={"reset_mask": mask})
    env.close()
    return {k: np.stack(v) for k, v in out.items()}


def alone(index, steps, **kw):
    """Env ``index`` run alone: a 1-env vector env seeded SEED + index, fed env ``index``'s actions."""
    env = UniLabVectorEnv(1, autoreset_mode=kw.pop("autoreset_mode", "NextStep"), **{**TASK, **kw})
    acts = env_actions(index, steps)
    obs, _ = env.reset(seed=SEED + index)
    out = {"obs": [obs[0]], "rew": [], "term": [], "trunc": []}
    for t in range(steps):
        obs, rew, term, trunc, _ = env.step(acts[t][None])
        for key, value in zip(("obs", "rew", "term", "trunc"), (obs[0], rew[0], term[0], trunc[0])):
            out[key].append(value)
        if env.autoreset_mode.value == "Disabled" and (term[0] or trunc[0]):  # "Disabled": reset finished envs
            env.reset(options={"reset_mask": np.array([True])})
    env.close()
    return {k: np.stack(v) for k, v in out.items()}


def assert_same(group, index, solo):
    for key in ("obs", "rew", "term", "trunc"):
        np.testing.assert_array_equal(group[key][:, index], solo[key], err_msg=f"{key} of env {index} differs")


def test_every_index_of_a_7_env_vector_matches_alone_in_clusters_of_3():
    steps = 60
    group = rollout(7, 3, steps)
    assert group["term"].sum() >= 3, "the scenario should contain falls and autoresets"
    for i in range(7):
        assert_same(group, i, alone(i, steps))


@pytest.fixture(scope="module")
def solo_runs_of_64():
    """Envs 0, 17 and 63 run alone for 30 steps: computed once for the module, the same reference for every
    cluster size (``alone`` is a pure function of its arguments; each test only reads the arrays)."""
    steps = 30
    return steps, {i: alone(i, steps) for i in (0, 17, 63)}


@pytest.mark.parametrize("envs_per_cluster", [1, 16, 64])
def test_64_envs_any_cluster_size_match_alone(envs_per_cluster, solo_runs_of_64):
    steps, solo = solo_runs_of_64
    group = rollout(64, envs_per_cluster, steps)
    for i in (0, 17, 63):
        assert_same(group, i, solo[i])


def test_cluster_size_does_not_change_any_trajectory():
    steps = 30
    a = rollout(7, 7, steps)
    b = rollout(7, 2, steps)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])


@pytest.mark.parametrize("keep", [0, 3, 6])
def test_neighbour_resets_and_actions_do_not_leak(keep):
    steps = 40
    group = rollout(7, 7, steps, autoreset_mode="Disabled", neighbour_reset_every=6, keep=keep, max_episode_steps=1000)
    solo = alone(keep, steps, autoreset_mode="Disabled", max_episode_steps=1000)
    assert_same(group, keep, solo)


def test_same_step_mode_also_matches_alone():
    steps = 50
    group = rollout(5, 2, steps, autoreset_mode="SameStep")
    for i in (0, 4):
        assert_same(group, i, alone(i, steps, autoreset_mode="SameStep"))


def test_single_env_matches_vector_env_index():
    steps = 20
    group = rollout(4, 2, steps, max_episode_steps=1000, termination={})
    env = QuadrupedEnv()
    obs, _ = env.reset(seed=SEED + 2)
    np.testing.assert_array_equal(obs, group["obs"][0, 2])
    for t, action in enumerate(env_actions(2, steps)):
        obs, rew, term, trunc, _ = env.step(action)
        np.testing.assert_array_equal(obs, group["obs"][t + 1, 2])
        assert rew == group["rew"][t, 2] and term == group["term"][t, 2] and trunc == group["trunc"][t, 2]
        if term:  # the vector env autoresets from here on; the single env waits for reset()
            break
    env.close()


def contact_rollout(num_envs, envs_per_cluster, steps, first_env=0):
    """(steps, num_envs, 13) bool: foot contacts (FR, FL, RR, RL), trunk contact and thigh/calf contacts
    (8) of envs ``first_env``.., seeded and fed as in a vector env of envs 0.. seeded SEED."""
    env = UniLabVectorEnv(num_envs, envs_per_cluster=envs_per_cluster, **TASK)
    acts = np.stack([env_actions(first_env + i, steps) for i in range(num_envs)], axis=1)
    env.reset(seed=SEED + first_env)
    out = []
    for t in range(steps):
        env.step(acts[t])
        state = env.robot_state
        out.append(np.concatenate([state.foot_contact, state.trunk_contact[:, None], state.leg_contact], axis=1))
    env.close()
    return np.stack(out)


def test_contact_flags_do_not_depend_on_the_neighbours():
    group = contact_rollout(7, 3, 60)
    assert group[..., :4].any() and not group[..., :4].all()  # feet touch and leave the ground
    for i in (0, 4, 6):
        np.testing.assert_array_equal(group[:, i], contact_rollout(1, 1, 60, first_env=i)[:, 0])


_DIGEST = """
import hashlib, numpy as np, sys
sys.path.insert(0, {path!r})
from test_determinism import rollout
r = rollout(5, 2, 40)
print(hashlib.sha256(b"".join(np.ascontiguousarray(v).tobytes() for v in r.values())).hexdigest())
"""


def test_repeated_runs_in_fresh_processes_are_identical():
    import os

    code = _DIGEST.format(path=os.path.dirname(__file__))
    digests = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
        for _ in range(2)
    }
    local = rollout(5, 2, 40)
    digests.add(hashlib.sha256(b"".join(np.ascontiguousarray(v).tobytes() for v in local.values())).hexdigest())
    assert len(digests) == 1


GAIT_WEIGHTS = {"feet_air_time": 1.0, "base_height": -100.0, "orientation": -5.0, "collision": -1.0}


def test_gait_terms_and_air_time_match_alone():
    """Every gait term weighted (feet air time is state kept per env across steps): env i still matches alone."""
    steps = 60
    group = rollout(7, 3, steps, reward_weights=GAIT_WEIGHTS)
    for i in (0, 3, 6):
        assert_same(group, i, alone(i, steps, reward_weights=GAIT_WEIGHTS))


def test_privileged_obs_dict_matches_alone_and_the_plain_observation():
    """``privileged_obs=True``: env i's "policy" and "critic" observations are its own, alone or in a vector, and
    "policy" is the observation of ``privileged_obs=False`` bit for bit."""
    steps, dr = 40, {"friction": (0.4, 1.2), "added_mass": (-1.0, 2.0), "latency": (0, 2)}

    def run(num_envs, envs_per_cluster, first):
        env = UniLabVectorEnv(num_envs, envs_per_cluster=envs_per_cluster, privileged_obs=True, **TASK,
                              domain_randomization=dr)  # fmt: skip
        acts = np.stack([env_actions(first + i, steps) for i in range(num_envs)], axis=1)
        obs, _ = env.reset(seed=SEED + first)
        seen = [obs]
        for t in range(steps):
            obs, *_ = env.step(acts[t])
            seen.append(obs)
        env.close()
        return {key: np.stack([o[key] for o in seen]) for key in ("policy", "critic")}

    group = run(5, 2, 0)
    np.testing.assert_array_equal(group["policy"], rollout(5, 2, steps, domain_randomization=dr)["obs"])
    for i in (0, 3):
        solo = run(1, 1, i)
        for key in ("policy", "critic"):
            np.testing.assert_array_equal(group[key][:, i], solo[key][:, 0], err_msg=f"{key} of env {i} differs")
