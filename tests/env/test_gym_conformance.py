"""Issue 20, env side: Gymnasium's conventions, with ``SyncVectorEnv`` over single envs as the reference.

Items: (1) infos exactly as ``SyncVectorEnv`` builds them in every autoreset mode; (2) autoreset ``Disabled``
refuses to step a finished env, the single env warns as Gymnasium's envs do; (4) wrong types raise
``TypeError``, wrong values / shapes ``ValueError``, with nothing changed; (5) configuration and seeds
validated where they enter; (6) ``gym.make(ID, num_envs=N, max_episode_steps=k)`` never returns a
``TimeLimit`` around the vector env; (3) copying or pickling a live env raises a ``TypeError`` saying what to do;
(9) the single env reconnects at ``reset()`` after ``close()`` (SB3's ``check_env`` with its render check).
"""

import copy
import pickle
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.error import ClosedEnvironmentError, ResetNeeded
from gymnasium.vector import SyncVectorEnv
from gymnasium.wrappers import TimeLimit

import unilab_gym  # noqa: F401  (registers the id)
from unilab_gym import QuadrupedEnv, UniLabVectorEnv
from unilab_gym.vector_env import FinishedEnvError

ID = "UniLab/Quadruped-v0"
# episodes of at most 3 steps that often end earlier by a "fall" (a high fall height): autoresets every few steps
SHORT = dict(max_episode_steps=3, termination={"min_base_height": 0.27})
MODES = ["NextStep", "SameStep", "Disabled"]


def _reference(n, mode, **kwargs):
    return SyncVectorEnv([lambda: gym.make(ID, **kwargs)] * n, autoreset_mode=mode)


def _flat(info, prefix=""):
    """Nested vector infos as ``{"a.b": array}``."""
    out = {}
    for key, value in info.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def _assert_same_infos(mine, theirs, where):
    a, b = _flat(mine), _flat(theirs)
    assert a.keys() == b.keys(), f"{where}: keys differ {sorted(set(a) ^ set(b))}"
    for key in b:
        if key == "final_obs":  # object arrays of (48,) arrays or None
            assert [x is None for x in a[key]] == [y is None for y in b[key]], where
            for x, y in zip(a[key], b[key]):
                if y is not None:
                    np.testing.assert_array_equal(x, y, err_msg=f"{where}: {key}")
            continue
        np.testing.assert_array_equal(a[key], b[key], err_msg=f"{where}: {key}")
        assert np.asarray(a[key]).dtype == np.asarray(b[key]).dtype, f"{where}: dtype of {key}"


# --------------------------------------------------------------------------- item 1: infos
@pytest.mark.parametrize("mode", MODES)
def test_infos_key_for_key_like_sync_vector_env(closing, mode):
    n = 3
    ours = closing(UniLabVectorEnv(n, autoreset_mode=mode, **SHORT))
    ref = closing(_reference(n, mode, **SHORT))
    obs, info = ours.reset(seed=1)
    obs_r, info_r = ref.reset(seed=1)
    np.testing.assert_array_equal(obs, obs_r)
    _assert_same_infos(info, info_r, "reset")
    rng = np.random.default_rng(0)
    ends = 0
    done = np.zeros(n, bool)
    for t in range(10):
        if mode == "Disabled" and done.any():
            obs, info = ours.reset(options={"reset_mask": done})
            obs_r, info_r = ref.reset(options={"reset_mask": done.copy()})
            np.testing.assert_array_equal(obs, obs_r)
            _assert_same_infos(info, info_r, f"reset_mask at step {t}")
        action = rng.uniform(-1, 1, (n, 12)).astype(np.float32)
        out, out_r = ours.step(action), ref.step(action)
        for mine, theirs in zip(out[:4], out_r[:4]):
            np.testing.assert_array_equal(mine, theirs)
        _assert_same_infos(out[4], out_r[4], f"{mode} step {t}")
        done = out[2] | out[3]
        ends += int(done.sum())
    assert ends >= 6, "the scenario should contain several episode ends"


def test_next_step_restarting_envs_hold_only_their_reset_info(closing):
    env = closing(UniLabVectorEnv(2, max_episode_steps=2))
    env.reset(seed=0)
    env.reset(options={"reset_mask": np.array([False, True])})
    env.step(np.zeros((2, 12)))
    env.reset(options={"reset_mask": np.array([False, True])})  # env 1 is one step behind env 0
    _, _, _, trunc, _ = env.step(np.zeros((2, 12)))
    assert trunc.tolist() == [True, False]
    _, _, _, _, info = env.step(np.zeros((2, 12)))  # env 0 restarts, env 1 steps (and truncates)
    assert info["_reward_terms"].tolist() == [False, True]
    masks = [v.tolist() for k, v in info["reward_terms"].items() if k.startswith("_")]
    assert len(masks) == 11 and all(mask == [False, True] for mask in masks)
    assert info["_command"].tolist() == [True, False] and info["_episode_seed"].tolist() == [True, False]
    _, _, _, _, info = env.step(np.zeros((2, 12)))  # env 1 restarts alone
    assert info["_reward_terms"].tolist() == [True, False]
    env.reset(seed=0)
    for _ in range(2):
        env.step(np.zeros((2, 12)))
    _, _, _, _, info = env.step(np.zeros((2, 12)))  # every env restarts: no env has reward terms
    assert "reward_terms" not in info and "_reward_terms" not in info and info["_command"].all()


def test_same_step_per_term_episode_sums_the_gymnasium_way_equal_the_returns(closing):
    """Per-term sums built as Gymnasium users build them (top-level values of the envs that have them, plus
    ``final_info`` at the last step) add up to each episode's return: nothing is counted twice."""
    n = 3
    env = closing(UniLabVectorEnv(n, autoreset_mode="SameStep", **SHORT))
    env.reset(seed=4)
    sums = np.zeros(n)
    finished = []
    rng = np.random.default_rng(1)
    for _ in range(12):
        _, _, term, trunc, info = env.step(rng.uniform(-1, 1, (n, 12)))
        done = term | trunc
        if "reward_terms" in info:
            assert info["_reward_terms"].tolist() == (~done).tolist()
            for name, value in info["reward_terms"].items():
                if not name.startswith("_"):
                    sums += np.where(info["reward_terms"][f"_{name}"], value, 0.0)
        if done.any():
            final = info["final_info"]["reward_terms"]
            assert info["final_info"]["_reward_terms"].tolist() == done.tolist()
            for name, value in final.items():
                if not name.startswith("_"):
                    sums += np.where(final[f"_{name}"], value, 0.0)
            finished += [sums[i] for i in np.flatnonzero(done)]
            sums[done] = 0.0
    returns = [record["return"] for record in env.parameter_trace()]
    assert len(returns) == len(finished) >= 6
    np.testing.assert_allclose(finished, returns, rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------- item 2: finished envs
def test_disabled_refuses_to_step_a_finished_env_like_sync_vector_env(closing):
    env = closing(UniLabVectorEnv(3, autoreset_mode="Disabled", max_episode_steps=2))
    ref = closing(_reference(3, "Disabled", max_episode_steps=2))
    for e in (env, ref):
        e.reset(seed=0)
        e.step(np.zeros((3, 12)))
        e.reset(options={"reset_mask": np.array([False, True, False])})  # env 1 one step behind
        _, _, _, trunc, _ = e.step(np.zeros((3, 12)))
        assert trunc.tolist() == [True, False, True]
    with pytest.raises(AssertionError):  # what Gymnasium's SyncVectorEnv raises
        ref.step(np.zeros((3, 12)))
    obs_before, steps_before = env._obs.copy(), env.episode_step.copy()
    with pytest.raises(FinishedEnvError, match=r"envs \[0, 2\].*reset_mask") as raised:
        env.step(np.zeros((3, 12)))
    assert isinstance(raised.value, AssertionError) and isinstance(raised.value, ResetNeeded)
    np.testing.assert_array_equal(env._obs, obs_before)  # nothing was stepped
    np.testing.assert_array_equal(env.episode_step, steps_before)
    assert len(env.parameter_trace()) == 2
    env.reset(options={"reset_mask": np.array([True, False, False])})
    with pytest.raises(FinishedEnvError, match=r"envs \[2\]"):
        env.step(np.zeros((3, 12)))
    env.reset(options={"reset_mask": np.array([False, False, True])})
    _, _, _, trunc, _ = env.step(np.zeros((3, 12)))  # env 1 truncates now
    assert trunc.tolist() == [False, True, False]
    env.reset()  # a full reset clears every env
    env.step(np.zeros((3, 12)))


def test_disabled_refuses_after_a_fall_too(closing):
    env = closing(UniLabVectorEnv(2, autoreset_mode="Disabled", termination={"min_base_height": 0.5}))
    env.reset(seed=0)
    _, _, term, _, _ = env.step(np.zeros((2, 12)))
    assert term.all()
    with pytest.raises(FinishedEnvError, match=r"envs \[0, 1\]"):
        env.step(np.zeros((2, 12)))


def test_other_modes_never_refuse(closing):
    for mode in ("NextStep", "SameStep"):
        env = closing(UniLabVectorEnv(2, autoreset_mode=mode, max_episode_steps=1))
        env.reset(seed=0)
        for _ in range(3):
            env.step(np.zeros((2, 12)))


def test_single_env_warns_once_per_episode_like_gymnasium_envs_and_steps_on(closing):
    env = closing(QuadrupedEnv(max_episode_steps=2, termination={"min_base_height": 0.0}))
    env.reset(seed=0)
    for _ in range(2):
        _, _, _, truncated, _ = env.step(np.zeros(12))
    assert truncated
    with pytest.warns(UserWarning, match=r"even though this environment has already returned.*reset\(\)"):
        env.step(np.zeros(12))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        env.step(np.zeros(12))  # once per episode, as CartPole
        env.reset()
        env.step(np.zeros(12))
    assert not [w for w in caught if "even though" in str(w.message)]
    assert [r["length"] for r in env.parameter_trace()] == [2]  # the episode stepped on is recorded once


# --------------------------------------------------------------------------- item 4: types and values
@pytest.mark.parametrize(
    "bad",
    [
        0.5,
        np.float32(0.5),
        "0.5",
        [["0.5"] * 12] * 2,
        np.full((2, 12), "0.1"),
        np.zeros((2, 12), dtype=complex),
        [[1 + 0j] * 12] * 2,
        np.full((2, 12), None, dtype=object),
        None,
    ],
    ids=["float", "np.float32", "str", "numeric-str-list", "str-array", "complex", "complex-list", "object", "None"],
)
def test_actions_of_the_wrong_type_raise_type_error_and_change_nothing(closing, bad):
    env = closing(UniLabVectorEnv(2))
    ref = closing(UniLabVectorEnv(2))
    env.reset(seed=0)
    ref.reset(seed=0)
    with pytest.raises(TypeError, match="actions"):
        env.step(bad)
    action = np.full((2, 12), 0.3)
    for got, want in zip(env.step(action)[:4], ref.step(action)[:4]):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("bad", [np.zeros((2, 11)), np.zeros(12), np.zeros((1, 2, 12)), [[0.0] * 12, [0.0] * 11]])
def test_actions_of_the_wrong_shape_raise_value_error(closing, bad):
    env = closing(UniLabVectorEnv(2))
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"\(2, 12\)"):
        env.step(bad)


@pytest.mark.parametrize("bad", [0.5, "0.5", np.full(12, "0.1"), np.zeros(12, dtype=complex), [1j] * 12])
def test_single_env_actions_of_the_wrong_type_raise_type_error(closing, bad):
    env = closing(QuadrupedEnv())
    env.reset(seed=0)
    with pytest.raises(TypeError, match="action"):
        env.step(bad)
    with pytest.raises(ValueError, match=r"\(12,\)"):
        env.step(np.zeros(13))
    env.step(np.zeros(12))


@pytest.mark.parametrize(
    "mask, error",
    [
        (np.array([1, 0, 1]), TypeError),  # wrong dtype
        (np.array([1.0, 0.0, 1.0]), TypeError),
        ([True, False, True], TypeError),  # not a numpy array
        (np.array([True, False]), ValueError),  # wrong shape
        (np.zeros(3, bool), ValueError),  # selects no env
    ],
)
def test_bad_reset_mask_raises_the_error_sync_vector_env_raises(closing, mask, error):
    env = closing(UniLabVectorEnv(3))
    ref = closing(_reference(3, "NextStep"))
    env.reset(seed=0)
    ref.reset(seed=0)
    with pytest.raises(error):
        ref.reset(options={"reset_mask": mask})
    seeds = env.episode_seed.copy()
    with pytest.raises(error, match="reset_mask"):
        env.reset(options={"reset_mask": mask})
    np.testing.assert_array_equal(env.episode_seed, seeds)  # no env was reset


@pytest.mark.parametrize("make_env", [lambda: UniLabVectorEnv(2), QuadrupedEnv], ids=["vector", "single"])
def test_unknown_reset_option_is_named_and_resets_nothing(closing, make_env):
    env = closing(make_env())
    env.reset(seed=0)
    vec = env.vector_env if isinstance(env, QuadrupedEnv) else env
    seeds = vec.episode_seed.copy()
    with pytest.raises(ValueError, match="reset_masks"):
        env.reset(options={"reset_masks": np.array([True, False])[: vec.num_envs]})
    np.testing.assert_array_equal(vec.episode_seed, seeds)
    for bad in (["reset_mask"], "reset_mask", 3, (("episode_seed", 1),)):
        with pytest.raises(TypeError, match="options must be a dict"):
            env.reset(options=bad)
    np.testing.assert_array_equal(vec.episode_seed, seeds)
    env.reset(options={})
    env.reset(options={"episode_seed": 7})
    assert vec.episode_seed.tolist() == [7] * vec.num_envs


def test_single_env_refuses_the_vector_option_reset_mask(closing):
    env = closing(QuadrupedEnv())
    with pytest.raises(ValueError, match="reset_mask"):
        env.reset(options={"reset_mask": np.array([True])})


# --------------------------------------------------------------------------- item 5: configuration, seeds
@pytest.mark.parametrize("weight", [float("nan"), float("inf"), -float("inf"), "1.0", None])
@pytest.mark.parametrize("make_env", [lambda **kw: UniLabVectorEnv(2, **kw), lambda **kw: gym.make(ID, **kw)])
def test_reward_weights_must_be_finite_numbers(make_env, weight):
    with pytest.raises(ValueError, match=r"reward_weights\['alive'\]"):
        make_env(reward_weights={"alive": weight})


@pytest.mark.parametrize(
    "termination, name",
    [
        ({"min_base_height": "low"}, "min_base_height"),
        ({"min_base_height": float("nan")}, "min_base_height"),
        ({"min_base_height": -float("inf")}, "min_base_height"),
        ({"max_tilt": float("nan")}, "max_tilt"),
        ({"max_tilt": float("inf")}, "max_tilt"),
        ({"max_tilt": None}, "max_tilt"),
        ({"trunk_contact": "yes"}, "trunk_contact"),
    ],
)
@pytest.mark.parametrize("make_env", [lambda **kw: UniLabVectorEnv(2, **kw), lambda **kw: gym.make(ID, **kw)])
def test_termination_thresholds_are_checked_at_construction(make_env, termination, name):
    with pytest.raises(ValueError, match=rf"termination\['{name}'\]"):
        make_env(termination=termination)


@pytest.mark.parametrize("seed", [-1, np.int64(-5), -(2**40)])
def test_negative_seed_raises_value_error_naming_it_everywhere(closing, seed):
    vec = closing(UniLabVectorEnv(2))
    single = closing(gym.make(ID))
    made = closing(gym.make_vec(ID, num_envs=2))
    for reset in (vec.reset, single.reset, made.reset):
        with pytest.raises(ValueError, match=rf"seed.*{int(seed)}"):
            reset(seed=seed)
    with pytest.raises(ValueError, match=rf"seed\[1\].*{int(seed)}"):
        vec.reset(seed=[0, seed])
    with pytest.raises(ValueError, match="seed"):
        single.reset(seed=1.5)
    single.reset(seed=3)  # a good seed after the bad ones: nothing was left half-done
    np.testing.assert_array_equal(single.reset(seed=3)[0], closing(QuadrupedEnv()).reset(seed=3)[0])


# --------------------------------------------------------------------------- item 6: gym.make with a time limit
def test_make_with_num_envs_and_max_episode_steps_points_to_make_vec():
    with pytest.raises(ValueError, match=r"make_vec\('UniLab/Quadruped-v0', num_envs=2, max_episode_steps=3\)"):
        gym.make(ID, num_envs=2, max_episode_steps=3)


def test_make_vec_truncates_each_env_at_max_episode_steps(closing):
    env = closing(gym.make_vec(ID, num_envs=2, max_episode_steps=3, termination={"min_base_height": 0.0}))
    assert type(env) is UniLabVectorEnv
    env.reset(seed=0)
    env.step(np.zeros((2, 12)))
    env.reset(options={"reset_mask": np.array([False, True])})
    truncs = [env.step(np.zeros((2, 12)))[3].tolist() for _ in range(3)]
    assert truncs == [[False, False], [True, False], [False, True]]  # env 0 restarts (NextStep) as env 1 ends


def test_make_keeps_its_usual_meaning_elsewhere(closing):
    vec = closing(gym.make(ID, num_envs=2, max_episode_steps=-1))  # -1: no TimeLimit, as gym.make documents
    assert type(vec) is UniLabVectorEnv and vec.max_episode_steps == 1000
    single = closing(gym.make(ID, max_episode_steps=2, termination={"min_base_height": 0.0}))
    assert isinstance(single, TimeLimit) and isinstance(single.unwrapped, QuadrupedEnv)
    single.reset(seed=0)
    assert [single.step(np.zeros(12))[3] for _ in range(2)] == [False, True]


def test_tianshou_adapter_still_advances_idle_finished_envs_with_autoreset_disabled(closing):
    tianshou = pytest.importorskip("unilab_gym.tianshou")
    envs = tianshou.TianshouVectorEnv(closing(UniLabVectorEnv(2, autoreset_mode="Disabled", max_episode_steps=1)))
    envs.reset()
    assert envs.step(np.zeros((2, 12)))[3].all()  # both truncated
    envs.reset(env_id=[0])
    envs.step(np.zeros((1, 12)), id=[0])  # env 1 (finished, idle) advances with zero actions, as before
    with pytest.raises(FinishedEnvError, match=r"envs \[0\]"):  # a finished env in `id` is refused
        envs.step(np.zeros((1, 12)), id=[0])


# --------------------------------------------------------------------------- item 3: copies
COPIES = [copy.copy, copy.deepcopy, pickle.dumps]


@pytest.mark.parametrize("make_copy", COPIES, ids=["copy", "deepcopy", "pickle"])
@pytest.mark.parametrize("make_env", [lambda: UniLabVectorEnv(2), lambda: gym.make(ID)], ids=["vector", "single"])
def test_copying_a_live_env_raises_type_error_saying_what_to_do(closing, make_copy, make_env):
    # Gymnasium's test_pickle_env does not apply: a copy would share the pybullet worlds (docs/conformance.md)
    env = closing(make_env())
    obs, _ = env.reset(seed=0)
    with pytest.raises(TypeError, match=r"cannot be copied or pickled.*task_config.*env_fn"):
        make_copy(env)
    np.testing.assert_array_equal(env.reset(seed=0)[0], obs)  # the env is untouched and still works
    world = (env if isinstance(env, UniLabVectorEnv) else env.vector_env)._clusters[0][1]
    with pytest.raises(TypeError, match="ClusterWorld cannot be copied or pickled"):
        make_copy(world)


def test_an_independent_env_from_the_configuration_follows_the_same_trajectory(closing):
    env = closing(UniLabVectorEnv(2, **SHORT))
    twin = closing(UniLabVectorEnv(2, **env.task_config))
    single = closing(gym.make(ID, **SHORT))
    single_twin = closing(gym.make(ID, **single.unwrapped.task_config))
    for a, b in ((env, twin), (single, single_twin)):
        np.testing.assert_array_equal(a.reset(seed=3)[0], b.reset(seed=3)[0])
        action = np.full(a.action_space.shape, 0.3, dtype=np.float32)
        np.testing.assert_array_equal(a.step(action)[0], b.step(action)[0])


# --------------------------------------------------------------------------- item 9: the single env after close()
def test_single_env_reconnects_at_reset_after_close_and_continues_its_stream(closing):
    kept, closed = closing(gym.make(ID)), closing(gym.make(ID))
    for env in (kept, closed):
        env.reset(seed=11)
        env.step(np.zeros(12))
    closed.close()
    with pytest.raises(ClosedEnvironmentError, match="reset"):
        closed.step(np.zeros(12))
    old_world = closed.unwrapped.vector_env
    obs, info = closed.reset()  # reconnects: a new world, the same configuration and random stream
    assert closed.unwrapped.vector_env is not old_world and old_world.closed
    obs_k, info_k = kept.reset()
    np.testing.assert_array_equal(obs, obs_k)
    assert info["episode_seed"] == info_k["episode_seed"]
    np.testing.assert_array_equal(closed.step(np.zeros(12))[0], kept.step(np.zeros(12))[0])


def test_single_env_with_a_trace_file_does_not_reconnect(closing, tmp_path):
    env = closing(gym.make(ID, trace_path=tmp_path / "trace.jsonl"))
    env.reset(seed=0)
    env.close()
    with pytest.raises(ClosedEnvironmentError, match="trace_path"):
        env.reset()
    assert (tmp_path / "trace.jsonl").read_text()  # the file close() finished is left as it was
