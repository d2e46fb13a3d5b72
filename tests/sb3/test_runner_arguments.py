"""AsyncRunner's argument checks: in the learner, before any collector starts, and leaving no state behind.

Issue 26 item 6 (env_id / env_fn, the env-count match, the root cause on a CollectorError's first line,
the missing main guard) and issue 29 items 9 and 14 (refusals leave no claim on the model; start_method
and control_addr name themselves).
"""

import functools
import os
import subprocess
import sys
import textwrap
import traceback

import gymnasium as gym
import pytest

pytest.importorskip("stable_baselines3")
import _runner_envs
from _paths import HELPERS
from _runner_common import ID, SMALL_ENV, assert_no_children, fast
from stable_baselines3 import PPO, SAC

from unilab_gym import AsyncRunner, CollectorError, SharedReplayBuffer
from unilab_gym.runtime.errors import root_cause
from unilab_gym.sb3.vec_env import make_sb3_env

SMALL_RUN = dict(num_collectors=2, envs_per_collector=2, env_kwargs=SMALL_ENV)


def sac(n_envs=1):
    env = make_sb3_env(ID, n_envs, seed=0, **SMALL_ENV)
    return SAC("MlpPolicy", env, replay_buffer_class=SharedReplayBuffer, **fast())


def ppo(n_envs=4):
    env = make_sb3_env(ID, n_envs, seed=0, **SMALL_ENV)
    return PPO("MlpPolicy", env, n_steps=8, batch_size=16, n_epochs=1, policy_kwargs=dict(net_arch=[16]))


def close_model(model):
    model.env.close()
    if isinstance(model, SAC):
        model.replay_buffer.close()


def assert_a_valid_runner_follows(model, **kwargs):
    """The refusal left no claim on the model: a valid runner on it is accepted (nothing starts before learn())."""
    with AsyncRunner(model, env_id=ID, **{**SMALL_RUN, **kwargs}) as runner:
        assert not runner.closed


# --------------------------------------------------------------------------- env_id, env_fn
def test_an_env_id_typo_is_refused_at_once_with_gymnasiums_suggestion_on_the_first_line():
    model = sac()
    with pytest.raises(gym.error.NameNotFound) as info:
        AsyncRunner(model, env_id="UniLab/Quadrupd-v0", **SMALL_RUN)
    first = str(info.value).splitlines()[0]
    assert "env_id='UniLab/Quadrupd-v0'" in first and "Did you mean: `Quadruped`?" in first
    assert_no_children()  # refused in the learner: no collector was started
    assert_a_valid_runner_follows(model)
    close_model(model)


def test_an_unregistered_version_and_a_bad_env_id_type_are_refused():
    model = sac()
    with pytest.raises(gym.error.VersionNotFound, match=r"env_id='UniLab/Quadruped-v9'.*provides versioned"):
        AsyncRunner(model, env_id="UniLab/Quadruped-v9", **SMALL_RUN)
    with pytest.raises(ValueError, match=r"env_id must be a registered gymnasium id \(a str\), got 3"):
        AsyncRunner(model, env_id=3, **SMALL_RUN)
    assert_a_valid_runner_follows(model)
    close_model(model)


def _local_env_fn():
    def make(num_envs):  # a local function: spawned collectors cannot unpickle it
        return _runner_envs.quadruped(num_envs)

    return make


@pytest.mark.parametrize(
    "env_fn, match",
    [
        (lambda n: _runner_envs.quadruped(n), r"env_fn=.*<lambda>.* cannot be pickled.*define it at module level"),
        (_local_env_fn(), r"env_fn=.*make.* cannot be pickled.*not a lambda or a local function"),
        ("UniLab/Quadruped-v0", r"env_fn must be a callable env_fn\(num_envs\) -> VectorEnv"),
    ],
)
def test_an_env_fn_collectors_cannot_use_is_refused_in_the_learner(env_fn, match):
    model = sac()
    with pytest.raises(ValueError, match=match):
        AsyncRunner(model, env_fn=env_fn, num_collectors=2, envs_per_collector=2)
    assert_no_children()
    with AsyncRunner(model, env_fn=functools.partial(_runner_envs.quadruped, max_episode_steps=20), num_collectors=2,
                     envs_per_collector=2):  # fmt: skip
        pass  # a module-level function (in a partial) pickles
    close_model(model)


# --------------------------------------------------------------------------- env count
def test_an_off_policy_model_env_of_another_size_is_refused_naming_the_numbers():
    model = sac(n_envs=8)
    with pytest.raises(ValueError, match=r"model's env has 8 envs .* = 2 \* 2 = 4; off-policy") as info:
        AsyncRunner(model, env_id=ID, **SMALL_RUN)
    assert "make_sb3_env(env_id, 1)" in str(info.value)  # the fix: an env of 4, or of 1 that gives the spaces
    with AsyncRunner(model, env_id=ID, num_collectors=2, envs_per_collector=4, env_kwargs=SMALL_ENV) as runner:
        assert runner.replay_ratio == pytest.approx(1 / 8)  # SB3's ratio for the model's 8 envs
    close_model(model)


def test_an_off_policy_model_env_of_one_env_only_gives_the_spaces():
    model = sac(n_envs=1)
    with AsyncRunner(model, env_id=ID, **SMALL_RUN) as runner:
        assert runner.replay_ratio == 1.0  # train_freq=1, gradient_steps=1 over 1 env
    close_model(model)


def test_the_on_policy_env_count_check_is_the_same_check():
    model = ppo(n_envs=4)
    with pytest.raises(ValueError, match=r"model's env has 4 envs .* = 2 \* 4 = 8; a rollout is n_steps x n_envs"):
        AsyncRunner(model, env_id=ID, num_collectors=2, envs_per_collector=4)
    with pytest.raises(ValueError, match=r"model's env has 4 envs .* = 4 \* 2 = 8; a rollout"):
        AsyncRunner(model, env_id=ID, num_collectors=4, envs_per_collector=2)  # on-policy, 1 env is no exception
    assert_a_valid_runner_follows(model)  # 2 x 2
    close_model(model)


# --------------------------------------------------------------------------- refusals leave no state
def test_every_refused_off_policy_construction_can_be_followed_by_a_valid_one():
    model = sac(n_envs=2)  # valid: 1 collector x 2 envs
    bad = [
        (dict(replay_ratio=-1.0), ValueError, "replay_ratio"),  # the case: it used to lock the model
        (dict(replay_ratio=float("nan")), ValueError, "replay_ratio"),
        (dict(max_policy_lag=0), ValueError, "max_policy_lag"),
        (dict(num_collectors=0), ValueError, "num_collectors"),
        (dict(num_collectors=4), ValueError, r"model's env has 2 envs .* = 4 \* 2 = 8"),
        (dict(envs_per_collector=True), ValueError, "envs_per_collector"),
        (dict(max_collector_restarts=-1), ValueError, "max_collector_restarts"),
        (dict(collector_timeout_s=0.0), ValueError, "collector_timeout_s"),
        (dict(seed=-1), ValueError, "seed"),
        (dict(env_kwargs="max_episode_steps=20"), ValueError, "env_kwargs"),
        (dict(metrics_port=70_000), ValueError, "metrics_port"),
        (dict(metrics_port=0, metrics_addr="256.1.1.1"), ValueError, "metrics_addr"),
        (dict(control_port=-1), ValueError, "control_port"),
        (dict(control_port=0, control_addr="256.1.1.1"), ValueError, "control_addr"),
        (dict(control_port=0, control_addr=""), ValueError, "control_addr"),
        (dict(snapshot_on_change="yes"), ValueError, "snapshot_on_change"),
        (dict(snapshot_dir=3), ValueError, "snapshot_dir"),
        (dict(start_method="bogus"), ValueError, "start_method"),
        (dict(backend="threads"), ValueError, "backend"),
        (dict(ray_address="auto"), ValueError, "ray_address"),
        (dict(backend="ray", ray_address=6379), ValueError, "ray_address must be a str"),  # before Ray starts
        (dict(env_id="UniLab/Quadrupd-v0"), gym.error.NameNotFound, "Did you mean"),
        (dict(env_fn=_runner_envs.quadruped), ValueError, "exactly one of env_id or env_fn"),
    ]
    stock = model.replay_buffer_class
    for kwargs, error, match in bad:
        with pytest.raises(error, match=match):
            AsyncRunner(model, **{"env_id": ID, "num_collectors": 1, "envs_per_collector": 2, **kwargs})
        assert model.replay_buffer_class is stock, kwargs  # nothing of the model was changed
        assert_a_valid_runner_follows(model, num_collectors=1)
        stock = model.replay_buffer_class  # a valid runner rewrites it so the saved model loads without unilab_gym
    assert_no_children()
    close_model(model)


def test_every_refused_on_policy_construction_can_be_followed_by_a_valid_one():
    model = ppo(n_envs=4)
    stock_buffer = model.rollout_buffer
    for kwargs, match in [
        (dict(replay_ratio=0.5), "replay_ratio is for off-policy"),
        (dict(max_policy_lag=2), "max_policy_lag must be 0"),
        (dict(env_kwargs=dict(autoreset_mode="NextStep")), "SameStep"),
        (dict(start_method="bogus"), "start_method"),
        (dict(control_port=0, control_addr="256.1.1.1"), "control_addr"),
        (dict(envs_per_collector=4), "model's env has 4 envs"),
    ]:
        with pytest.raises(ValueError, match=match):
            AsyncRunner(model, env_id=ID, **{**SMALL_RUN, **kwargs})
        assert model.rollout_buffer is stock_buffer, kwargs
        assert_a_valid_runner_follows(model)
        assert model.rollout_buffer is stock_buffer  # closing a runner gives the model its own buffer back
    close_model(model)


# --------------------------------------------------------------------------- start_method, control_addr
def test_start_method_and_control_addr_are_value_errors_naming_the_argument():
    model = sac()
    with pytest.raises(ValueError, match=r"start_method must be one of \[.*'spawn'.*\].*got 'bogus'"):
        AsyncRunner(model, env_id=ID, start_method="bogus", **SMALL_RUN)
    with pytest.raises(ValueError, match=r"control_addr must be a host name or IP address, got '256.1.1.1'"):
        AsyncRunner(model, env_id=ID, control_port=0, control_addr="256.1.1.1", **SMALL_RUN)
    with pytest.raises(ValueError, match=r"control_addr .* got 'no-such-host.invalid', which does not resolve"):
        AsyncRunner(model, env_id=ID, control_port=0, control_addr="no-such-host.invalid", **SMALL_RUN)
    assert_a_valid_runner_follows(model)
    close_model(model)


# --------------------------------------------------------------------------- the root cause of a CollectorError
def _formatted(raiser):
    try:
        raiser()
    except Exception:
        return traceback.format_exc()
    raise AssertionError("did not raise")


def _chained():
    try:
        {}["key"]
    except KeyError as error:
        raise gym.error.NameNotFound("Environment `Quadrupd` doesn't exist.\nsecond line") from error


def test_root_cause_is_the_raised_exception_without_its_module_path():
    assert root_cause(_formatted(_chained)) == "NameNotFound: Environment `Quadrupd` doesn't exist."
    assert root_cause(_formatted(lambda: 1 / 0)) == "ZeroDivisionError: division by zero"
    assert root_cause(None) is None and root_cause("") is None
    error = CollectorError("collector 0 (pid 7) raised an exception", collector=0, pid=7, exitcode=1,
                           traceback=_formatted(_chained))  # fmt: skip
    lines = str(error).splitlines()
    assert lines[0] == "collector 0 (pid 7) raised an exception: NameNotFound: Environment `Quadrupd` doesn't exist."
    assert lines[2] == "--- collector 0 traceback ---" and error.cause.startswith("NameNotFound")


@pytest.fixture
def registered_here_only():
    """An id registered in this process only, as by a script that registers it inside its main guard."""
    spec = gym.spec(ID)
    gym.register("UniLab/QuadrupedHere-v0", entry_point=spec.entry_point, vector_entry_point=spec.vector_entry_point,
                 disable_env_checker=True, order_enforce=False)  # fmt: skip
    yield "UniLab/QuadrupedHere-v0"
    del gym.registry["UniLab/QuadrupedHere-v0"]


def test_a_collector_error_names_the_root_cause_on_its_first_line(registered_here_only):
    model = sac()
    runner = AsyncRunner(model, env_id=registered_here_only, num_collectors=1, envs_per_collector=2,
                         env_kwargs=SMALL_ENV, collector_timeout_s=300)  # fmt: skip
    with pytest.raises(CollectorError) as info:
        runner.learn(100)
    first = str(info.value).splitlines()[0]
    assert first.startswith("collector 0 (pid ") and " raised NameNotFound: Environment `QuadrupedHere` " in first
    assert "Did you mean: `Quadruped`?" in first
    assert "Traceback (most recent call last)" in str(info.value).split("\n\n", 1)[1]  # the remote traceback follows
    assert runner.closed
    assert_no_children()
    close_model(model)


# --------------------------------------------------------------------------- the missing main guard
_UNGUARDED = """
import sys
sys.path.insert(0, {helpers!r})
from _runner_common import make_sac as sac
from unilab_gym import AsyncRunner
model = sac()
print(model.replay_buffer.handle.name, flush=True)
{call}
"""


def _run_script(tmp_path, call):
    """Run ``call`` at the end of a script that builds a SAC model; return the result and the model's replay segment."""
    script = tmp_path / "train.py"
    text = _UNGUARDED.format(helpers=str(HELPERS), call=textwrap.dedent(call).strip())
    script.write_text(text)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    replay = out.stdout.splitlines()[0]
    return out, text.splitlines().index(textwrap.dedent(call).strip().splitlines()[0]) + 1, replay


def test_a_script_without_the_main_guard_is_refused_at_once_and_leaks_nothing(tmp_path):
    out, line, replay = _run_script(
        tmp_path,
        """
        with AsyncRunner(model, env_id="UniLab/Quadruped-v0", num_collectors=2, envs_per_collector=2) as runner:
            runner.learn(100)
        """,
    )
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: the AsyncRunner is created at the top level of ")
    assert f'train.py (line {line}), outside `if __name__ == "__main__":`' in last
    # refused in the script's own process, before any collector was spawned: one traceback (no collector's,
    # no CollectorError), no segment left for the resource tracker to reclaim, the model's replay unlinked at exit
    assert out.stderr.count("Traceback (most recent call last)") == 1
    assert "CollectorError" not in out.stderr and "leaked" not in out.stderr and "resource_tracker" not in out.stderr
    assert replay.startswith("unilab_") and not os.path.exists(f"/dev/shm/{replay}")


def test_the_same_runner_under_the_main_guard_is_accepted(tmp_path):
    out, _, replay = _run_script(
        tmp_path,
        """
        def main():
            with AsyncRunner(model, env_id="UniLab/Quadruped-v0", num_collectors=2, envs_per_collector=2) as r:
                print("built", r.num_collectors)

        if __name__ == "__main__":
            main()
        """,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[1:] == ["built 2"] and "leaked" not in out.stderr
    assert not os.path.exists(f"/dev/shm/{replay}")
