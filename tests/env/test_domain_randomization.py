"""Domain randomization: parameters drawn in range and reproducibly, applied to the physics of
one robot only, bad configs rejected; the parameter trace and its bit-exact replay."""

import json

import gymnasium as gym
import numpy as np
import pybullet as p
import pytest
from test_determinism import alone, assert_same, rollout

from unilab_gym import UniLabVectorEnv
from unilab_gym.randomization import NOMINAL, PARAMETER_NAMES, DomainRandomization
from unilab_gym.sim import a1
from unilab_gym.trace import read_jsonl
from unilab_gym.trace_replay import replay_env

FULL_DR = {
    "friction": (0.3, 1.2),
    "added_mass": (-1.0, 3.0),
    "com_x": (-0.05, 0.05),
    "com_y": (-0.03, 0.03),
    "com_z": (-0.02, 0.02),
    "motor_strength": (0.7, 1.1),
    "kp_factor": (0.8, 1.3),
    "kd_factor": (0.5, 1.5),
    "latency": (0, 3),
    "push_interval": (0.1, 0.3),  # frequent, so short tests see pushes
    "push_velocity": (0.2, 0.8),
}
OBS_NO_LAST_ACTION = slice(0, 36)


@pytest.fixture
def make():
    envs = []

    def _make(num_envs=1, **kwargs):
        env = UniLabVectorEnv(num_envs, **kwargs)
        envs.append(env)
        return env

    yield _make
    for env in envs:
        env.close()


def _params(info):
    return {name: info["parameters"][name] for name in PARAMETER_NAMES}


def _robot(env, index):
    rows, world = env._cluster_of(index)
    return world, world._robots[index - rows.start]


# --------------------------------------------------------------------------- drawing parameters
def test_off_by_default_everything_nominal(make):
    env = make(2)
    _, info = env.reset(seed=0)
    assert env.domain_randomization.ranges == {}
    for k, name in enumerate(PARAMETER_NAMES):
        np.testing.assert_array_equal(info["parameters"][name], NOMINAL[k])
    world, robot = _robot(env, 1)
    c = world._client
    assert p.getDynamicsInfo(robot, -1, physicsClientId=c)[0] == a1.TRUNK_MASS == world.nominal_trunk_mass
    assert world.nominal_friction == a1.LINK_FRICTION
    assert all(p.getDynamicsInfo(robot, link, physicsClientId=c)[1] == a1.LINK_FRICTION for link in world._links)
    np.testing.assert_array_equal(env.kp, 20.0)
    np.testing.assert_array_equal(env.torque_limits, [[20.0, 55.0, 55.0] * 4] * 2)


def test_parameters_drawn_in_range_integer_latency_and_reproducible(make):
    env = make(16, domain_randomization=FULL_DR, max_episode_steps=5)
    draws = []
    _, info = env.reset(seed=7)
    draws.append(_params(info))
    for _ in range(3):
        _, info = env.reset()
        draws.append(_params(info))
    for name, (lo, hi) in FULL_DR.items():
        values = np.concatenate([d[name] for d in draws])
        assert ((values >= lo) & (values <= hi)).all(), name
        if name != "latency":
            assert np.unique(values).size == values.size, f"{name} should vary across envs and episodes"
    latency = np.concatenate([d["latency"] for d in draws])
    assert latency.dtype == np.int64 and set(latency.tolist()) == {0, 1, 2, 3}
    # reproducible: same seed, same draws; and env i's draws do not depend on the grouping
    again = make(16, domain_randomization=FULL_DR, envs_per_cluster=3, max_episode_steps=5)
    _, info = again.reset(seed=7)
    for name in PARAMETER_NAMES:
        np.testing.assert_array_equal(info["parameters"][name], draws[0][name])
    solo = make(1, domain_randomization=FULL_DR)
    _, info = solo.reset(seed=7 + 11)
    assert {n: info["parameters"][n][0] for n in PARAMETER_NAMES} == {n: draws[0][n][11] for n in PARAMETER_NAMES}


def test_fixed_values_are_exact_and_config_does_not_shift_other_draws(make):
    ranged = make(3, domain_randomization={"friction": (0.2, 0.9), "latency": (1, 4)})
    fixed = make(3, domain_randomization={"friction": 0.6125, "latency": 2})
    plain = make(3)
    obs_r, info_r = ranged.reset(seed=3)
    obs_f, info_f = fixed.reset(seed=3)
    obs_p, info_p = plain.reset(seed=3)
    np.testing.assert_array_equal(info_f["parameters"]["friction"], 0.6125)
    np.testing.assert_array_equal(info_f["parameters"]["latency"], 2)
    # the same episode seeds give the same command, pose and lane whatever the config
    for info in (info_r, info_f):
        np.testing.assert_array_equal(info["episode_seed"], info_p["episode_seed"])
        np.testing.assert_array_equal(info["command"], info_p["command"])
    np.testing.assert_array_equal(obs_r, obs_p)
    np.testing.assert_array_equal(obs_f, obs_p)


@pytest.mark.parametrize(
    "config, name",
    [
        ({"gravity": (0, 1)}, "gravity"),
        ({"friction": (1.2, 0.3)}, "friction"),
        ({"friction": (-0.1, 0.5)}, "friction"),
        ({"friction": (0.5, float("nan"))}, "friction"),
        ({"friction": "high"}, "friction"),
        ({"friction": (0.1, 0.2, 0.3)}, "friction"),
        ({"added_mass": (-4.713, 1.0)}, "added_mass"),
        ({"com_x": (-0.5, 0.0)}, "com_x"),
        ({"motor_strength": (-1.0, 1.0)}, "motor_strength"),
        ({"latency": (0, 1.5)}, "latency"),
        ({"latency": (0, 51)}, "latency"),
        ({"push_interval": (0.0, 1.0)}, "push_interval"),
        ({"push_velocity": True}, "push_velocity"),
        ([("friction", (0.3, 1.2))], "domain_randomization"),
    ],
)
def test_bad_configs_raise_naming_the_key(config, name):
    with pytest.raises(ValueError, match=name):
        UniLabVectorEnv(1, domain_randomization=config)


def test_unknown_key_error_lists_valid_keys():
    with pytest.raises(ValueError, match=r"valid keys.*friction.*push_velocity"):
        DomainRandomization({"mass": (0, 1)})


def test_bad_episode_seed_option_raises(make):
    env = make(2)
    env.reset(seed=0)
    for bad in (-1, 2**63, 1.5, [1, 2, 3], "7"):
        with pytest.raises(ValueError, match="episode_seed"):
            env.reset(options={"episode_seed": bad})


# --------------------------------------------------------------------------- physics of each parameter
def test_friction_mass_and_gains_applied_to_that_robot_only(make):
    env = make(
        3,
        domain_randomization={
            "friction": (0.3, 1.2),
            "added_mass": (-1.0, 3.0),
            "kp_factor": (0.5, 2.0),
            "kd_factor": (0.5, 2.0),
            "motor_strength": (0.5, 1.0),
        },
    )
    _, info = env.reset(seed=1)
    prm = info["parameters"]
    nominal = make(1)
    world0, robot0 = _robot(nominal, 0)
    nominal_inertia = np.array(p.getDynamicsInfo(robot0, -1, physicsClientId=world0._client)[2])
    for i in range(3):
        world, robot = _robot(env, i)
        c = world._client
        frictions = {p.getDynamicsInfo(robot, link, physicsClientId=c)[1] for link in world._links}
        assert frictions == {prm["friction"][i]}
        mass, _, inertia = p.getDynamicsInfo(robot, -1, physicsClientId=c)[:3]
        assert mass == pytest.approx(a1.TRUNK_MASS + prm["added_mass"][i])
        np.testing.assert_allclose(inertia, nominal_inertia * mass / a1.TRUNK_MASS)
        np.testing.assert_allclose(env.kp[i], 20.0 * prm["kp_factor"][i])
        np.testing.assert_allclose(env.kd[i], 0.5 * prm["kd_factor"][i])
        np.testing.assert_allclose(env.torque_limits[i], np.array([20.0, 55.0, 55.0] * 4) * prm["motor_strength"][i])
    ground = env._clusters[0][1]
    assert p.getDynamicsInfo(ground._plane, -1, physicsClientId=ground._client)[1] == 1.0  # shared ground untouched


def test_latency_applies_the_action_of_k_steps_ago(make):
    delayed = make(1, domain_randomization={"latency": 2})
    direct = make(1)
    delayed.reset(seed=4)
    direct.reset(seed=4)
    acts = np.random.default_rng(0).uniform(-1, 1, (8, 1, 12))
    shifted = np.concatenate([np.zeros((2, 1, 12)), acts[:-2]])
    for t in range(8):
        obs_d, *_ = delayed.step(acts[t])
        obs_n, *_ = direct.step(shifted[t])
        np.testing.assert_array_equal(obs_d[:, OBS_NO_LAST_ACTION], obs_n[:, OBS_NO_LAST_ACTION])
        np.testing.assert_array_equal(obs_d[:, 36:], acts[t].astype(np.float32))  # obs keeps the policy's action


def test_pushes_change_the_base_velocity_at_each_interval(make):
    pushed = make(1, domain_randomization={"push_velocity": 0.8, "push_interval": 0.1})  # every 5 control steps
    calm = make(1, domain_randomization={"push_velocity": 0.0, "push_interval": 0.1})
    pushed.reset(seed=2)
    calm.reset(seed=2)
    for t in range(1, 11):
        obs_p, *_ = pushed.step(np.zeros((1, 12)))
        obs_c, *_ = calm.step(np.zeros((1, 12)))
        if t < 6:  # the first push comes before step 6 (after 5 steps)
            np.testing.assert_array_equal(obs_p, obs_c)
        if t == 6:
            dv = pushed.robot_state.lin_vel[0, :2] - calm.robot_state.lin_vel[0, :2]
            assert 0.5 < np.linalg.norm(dv) < 0.85, dv  # 0.8 m/s, minus 0.02 s of ground friction
            assert abs(pushed.robot_state.lin_vel[0, 2] - calm.robot_state.lin_vel[0, 2]) < 0.1  # horizontal


def test_com_offset_shifts_the_weight_between_front_and_rear_legs(make):
    def load_shift(com_x):
        env = make(1, domain_randomization={"com_x": com_x})
        env.reset(seed=0)
        for _ in range(100):
            env.step(np.zeros((1, 12)))
        world, robot = _robot(env, 0)
        front = rear = 0.0
        for contact in p.getContactPoints(robot, world._plane, physicsClientId=world._client):
            name = p.getJointInfo(robot, contact[3], physicsClientId=world._client)[12].decode()
            front += contact[9] if name.startswith("F") else 0.0
            rear += 0.0 if name.startswith("F") else contact[9]
        return front - rear

    # statics: moving the trunk's weight (4.713 kg) 5 cm forward moves ~M g dx / L onto the front legs,
    # L = 0.366 m between hips: 6.3 N each way (the body pitches a little, so allow 40 %)
    # (front - rear changes by twice that)
    expected = a1.TRUNK_MASS * 9.81 * 0.05 / 0.366
    nominal = load_shift(0.0)
    assert (load_shift(0.05) - nominal) / 2 == pytest.approx(expected, rel=0.4)
    assert (nominal - load_shift(-0.05)) / 2 == pytest.approx(expected, rel=0.4)


# --------------------------------------------------------------------------- determinism with randomization
def test_every_index_matches_alone_with_randomization_on():
    steps = 50
    kw = dict(domain_randomization=FULL_DR)
    group = rollout(7, 3, steps, **kw)
    assert group["term"].sum() >= 3, "the scenario should contain falls and autoresets"
    for i in (0, 4, 6):
        assert_same(group, i, alone(i, steps, **kw))


def test_neighbour_randomized_resets_do_not_leak():
    steps = 40
    kw = dict(domain_randomization=FULL_DR, max_episode_steps=1000)
    group = rollout(5, 5, steps, autoreset_mode="Disabled", neighbour_reset_every=4, keep=2, **kw)
    assert_same(group, 2, alone(2, steps, autoreset_mode="Disabled", **kw))


# --------------------------------------------------------------------------- parameter trace
def _run_recording(env, steps, rng):
    """Step ``env`` (NextStep autoreset) with random actions.

    Returns {(env, episode): (actions, obs, rewards, flags)}."""
    n = env.num_envs
    obs, _ = env.reset(seed=3)
    episode = np.zeros(n, dtype=int)
    log = {(i, 0): ([], [obs[i].copy()], [], []) for i in range(n)}
    restarting = np.zeros(n, dtype=bool)
    for _ in range(steps):
        action = rng.uniform(-1, 1, (n, 12))
        obs, reward, term, trunc, _ = env.step(action)
        for i in range(n):
            if restarting[i]:  # the restart step: its action is ignored, its obs starts the next episode
                log[(i, episode[i])] = ([], [obs[i].copy()], [], [])
            else:
                acts, obs_i, rews, flags = log[(i, episode[i])]
                acts.append(action[i].copy()), obs_i.append(obs[i].copy()), rews.append(reward[i])
                flags.append((term[i], trunc[i]))
        restarting = term | trunc
        episode += restarting
    return log


def test_trace_records_every_finished_episode(make):
    env = make(6, domain_randomization=FULL_DR, max_episode_steps=30, termination={"min_base_height": 0.24})
    log = _run_recording(env, 100, np.random.default_rng(0))
    records = env.parameter_trace()
    finished = {key: value for key, value in log.items() if value[3] and any(value[3][-1])}
    assert len(records) == len(finished) > 6
    causes = {r["termination"] for r in records}
    assert causes == {"fall", "time_limit"}, "the scenario should contain both"
    for r in records:
        acts, _, rews, flags = log[(r["env"], r["episode"])]
        assert r["length"] == len(acts)
        assert r["return"] == pytest.approx(sum(rews), rel=1e-12)
        terminated, _ = flags[-1]
        assert r["termination"] == ("fall" if terminated else "time_limit")
        if r["termination"] == "fall":
            assert r["fall_conditions"] and set(r["fall_conditions"]) <= {"height", "tilt", "trunk_contact"}
        else:
            assert r["fall_conditions"] == [] and r["length"] == 30
        assert set(r["parameters"]) == set(PARAMETER_NAMES)
    # an episode interrupted by reset() is not a finished episode; a done env stepped on is recorded once
    env2 = make(2, autoreset_mode="Disabled", max_episode_steps=3)
    env2.reset(seed=0)
    for _ in range(3):
        env2.step(np.zeros((2, 12)))
    for _ in range(2):  # "Disabled" refuses to step a finished env; a partial step leaves it out (it idles)
        env2.step(np.zeros((2, 12)), active=np.zeros(2, dtype=bool))
    env2.reset(options={"reset_mask": np.array([True, False])})
    env2.step(np.zeros((2, 12)), active=np.array([True, False]))
    env2.reset()
    assert [(r["env"], r["episode"], r["length"]) for r in env2.parameter_trace()] == [(0, 0, 3), (1, 0, 3)]


def test_third_episode_of_env_5_of_16_replays_bit_for_bit_alone(make, tmp_path):
    env = make(
        16,
        envs_per_cluster=8,
        domain_randomization=FULL_DR,
        max_episode_steps=25,
        termination={"min_base_height": 0.24},
    )
    log = _run_recording(env, 90, np.random.default_rng(1))
    path = env.save_parameter_trace(tmp_path / "trace.jsonl")
    header, records = read_jsonl(path)
    assert header["packages"]["pybullet"] == "3.2.7" and header["packages"]["unilab-gym"]
    assert records == json.loads(json.dumps(env.parameter_trace()))
    env5 = [r for r in records if r["env"] == 5]
    assert len(env5) >= 3 and len({json.dumps(r["parameters"]) for r in env5}) == len(env5)
    assert env5[2]["episode"] == 2
    # the 3rd episode of env 5 first, then every other episode of envs 5 and 10 (falls and time
    # limits): each after other physics ran in its slot
    others = [r for r in records if r["env"] in (5, 10) and r is not env5[2]]
    assert {r["termination"] for r in others} == {"fall", "time_limit"}
    for record in [env5[2], *others]:
        acts, obs_log, rews, flags = log[(record["env"], record["episode"])]
        replay, obs, info = replay_env(header["env"], record)
        np.testing.assert_array_equal(obs[0], obs_log[0])
        assert {n: info["parameters"][n][0].item() for n in PARAMETER_NAMES} == record["parameters"]
        total = 0.0
        for t, action in enumerate(acts):
            obs, reward, term, trunc, _ = replay.step(action[None])
            np.testing.assert_array_equal(obs[0], obs_log[t + 1], err_msg=f"step {t + 1}")
            assert reward[0] == rews[t] and (term[0], trunc[0]) == flags[t]
            total += reward[0]
        replayed = replay.parameter_trace()[0]
        assert replayed["return"] == record["return"] and replayed["length"] == record["length"]
        assert replayed["termination"] == record["termination"]
        assert replayed["fall_conditions"] == record["fall_conditions"]
        replay.close()


def test_read_jsonl_rejects_other_files(tmp_path):
    path = tmp_path / "other.jsonl"
    path.write_text('{"type": "episode"}\n')
    with pytest.raises(ValueError, match="not a unilab-gym parameter trace"):
        read_jsonl(path)


def test_reset_info_and_single_env():
    env = gym.make(
        "UniLab/Quadruped-v0", domain_randomization={"friction": (0.3, 0.4)}, termination={"min_base_height": 0.5}
    )  # spawn height 0.32 < 0.5: falls at once
    _, info = env.reset(seed=0)
    assert 0.3 <= info["parameters"]["friction"] <= 0.4 and isinstance(info["episode_seed"], int)
    _, _, terminated, _, _ = env.step(np.zeros(12))
    (record,) = env.parameter_trace()
    assert terminated and record["termination"] == "fall" and "height" in record["fall_conditions"]
    assert record["episode_seed"] == info["episode_seed"] and record["parameters"] == info["parameters"]
    # replaying from the episode seed reproduces the first obs, and leaves the env's stream as it was
    first, _ = env.reset(seed=0)
    second, _ = env.reset()
    env.reset(seed=0)
    replayed, _ = env.reset(options={"episode_seed": info["episode_seed"]})
    np.testing.assert_array_equal(replayed, first)
    np.testing.assert_array_equal(env.reset()[0], second)
    env.close()
