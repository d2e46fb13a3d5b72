"""``AsyncRunner(..., backend="inline")``: collectors stepped in the learner's process, deterministic, debuggable.

The loop semantics (replay ratio, lag, rollouts, VecNormalize, callbacks) run over this backend in
``test_async_runner.py`` and ``test_async_vecnormalize.py``; here is what is the inline pool's own.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading

import _runner_envs
import gymnasium as gym
import numpy as np
import psutil
import pytest
import torch
from _runner_common import ID, SMALL_ENV, make_ppo, make_sac
from stable_baselines3.common.callbacks import BaseCallback

from unilab_gym import AsyncRunner, CollectorError

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny networks on busy cores

#: What the envs of the tests below saw, appended from inside their ``step`` (one process: a list works).
SEEN: list[tuple[int, str]] = []


def inline_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("unilab-inline-collector")]


def child_processes() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if "resource_tracker" not in " ".join(p.cmdline())]


class _BreakingEnv(gym.vector.VectorWrapper):
    """Calls ``breakpoint()`` in every ``step``, then records the pid and thread it stepped in."""

    def step(self, actions):
        breakpoint()  # the test's sys.breakpointhook: what a debugger would stop at
        SEEN.append((os.getpid(), threading.current_thread().name))
        return self.env.step(actions)


def breaking_quadruped(num_envs, **kwargs):
    return _BreakingEnv(_runner_envs.quadruped(num_envs, **kwargs))


class _GlobalRandomEnv(gym.vector.VectorWrapper):
    """Draws ``draws`` numbers from numpy's global stream at every step (a user env that uses ``np.random``)."""

    def __init__(self, env, draws):
        super().__init__(env)
        self.draws = draws

    def step(self, actions):
        np.random.random(self.draws)
        return self.env.step(actions)


def global_random_quadruped(num_envs, draws, **kwargs):
    return _GlobalRandomEnv(_runner_envs.quadruped(num_envs, **kwargs), draws)


class _InterruptingEnv(gym.vector.VectorWrapper):
    """At its ``at``-th step, sends SIGINT to the main thread (a Ctrl-C while a collector steps), then steps on."""

    def __init__(self, env, at):
        super().__init__(env)
        self.at, self.steps = at, 0

    def step(self, actions):
        self.steps += 1
        if self.steps == self.at:
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        return self.env.step(actions)

    def close(self, **kwargs):
        SEEN.append((os.getpid(), "closed"))
        return self.env.close(**kwargs)


def interrupting_quadruped(num_envs, at, **kwargs):
    return _InterruptingEnv(_runner_envs.quadruped(num_envs, **kwargs), at)


# --------------------------------------------------------------------------- in the learner's process
def test_a_breakpoint_in_the_env_stops_in_the_learners_process_and_no_process_starts(monkeypatch):
    SEEN.clear()
    hits = []
    monkeypatch.setattr(sys, "breakpointhook", lambda: hits.append((os.getpid(), sys._getframe(1).f_code.co_name)))
    children = []

    class Watch(BaseCallback):
        def _on_step(self):
            children.extend(child_processes())
            return True

    model = make_ppo(4, n_steps=8)
    env_fn = functools.partial(breaking_quadruped, autoreset_mode="SameStep")
    with AsyncRunner(model, env_fn=env_fn, num_collectors=2, envs_per_collector=2, backend="inline") as runner:
        runner.learn(2 * 8 * 4, callback=Watch())
        status = runner.collector_status()
    assert hits and all(hit == (os.getpid(), "step") for hit in hits)  # the hook ran in the env's step, here
    assert len(SEEN) == len(hits) == 2 * 8 * 2  # 2 rollouts x 8 steps x 2 collectors
    assert {pid for pid, _ in SEEN} == {os.getpid()}
    assert {name for _, name in SEEN} == {"unilab-inline-collector-0", "unilab-inline-collector-1"}
    assert not children
    assert [s["pid"] for s in status] == [os.getpid()] * 2
    assert sum(s["env_steps"] for s in status) == model.num_timesteps == 64
    assert all(s["weight_version"] == 2 for s in status)  # acted with the weights trained on rollout 0
    assert not inline_threads()


def test_an_env_fn_that_cannot_be_pickled_is_accepted_inline():
    model = make_ppo(4)
    with AsyncRunner(
        model, env_fn=lambda n: _runner_envs.quadruped(n, autoreset_mode="SameStep"), num_collectors=1,
        envs_per_collector=4, backend="inline",
    ) as runner:  # fmt: skip
        runner.learn(16 * 4)
    assert model.num_timesteps == 64 and model._n_updates == model.n_epochs
    with pytest.raises(ValueError, match="cannot be pickled"):
        AsyncRunner(model, env_fn=lambda n: _runner_envs.quadruped(n), num_collectors=1, envs_per_collector=4)


# --------------------------------------------------------------------------- determinism
def _sac_run():
    model = make_sac(learning_starts=40)
    with AsyncRunner(
        model, env_id=ID, num_collectors=2, envs_per_collector=2, env_kwargs=SMALL_ENV, replay_ratio=0.5,
        max_policy_lag=1, backend="inline",
    ) as runner:  # fmt: skip
        runner.learn(300)
        rows = runner._pool.counters.rows.copy()
        version = runner._pool.weight_version
    storage = model.replay_buffer.storage
    replay = storage.gather(np.arange(storage.committed))
    out = dict(
        replay=replay,
        params=[p.detach().clone() for p in model.policy.parameters()],
        rows=rows,
        version=version,
        updates=model._n_updates,
        returns=[e["r"] for e in model.ep_info_buffer],
    )
    model.replay_buffer.close()
    return out


def _ppo_run():
    model = make_ppo(8)
    with AsyncRunner(
        model, env_id=ID, num_collectors=2, envs_per_collector=4, env_kwargs=SMALL_ENV, max_policy_lag=1,
        backend="inline",
    ) as runner:  # fmt: skip
        runner.learn(4 * 16 * 8)
        rows = runner._pool.counters.rows.copy()
        version = runner._pool.weight_version
    buffer = model.rollout_buffer
    return dict(
        replay=np.concatenate([buffer.observations.ravel(), buffer.actions.ravel(), buffer.advantages.ravel()]),
        params=[p.detach().clone() for p in model.policy.parameters()],
        rows=rows,
        version=version,
        updates=model._n_updates,
        returns=[e["r"] for e in model.ep_info_buffer],
    )


@pytest.mark.parametrize("run", [_sac_run, _ppo_run], ids=["sac", "ppo_lag1"])
def test_two_inline_runs_are_identical(run):
    first, second = run(), run()
    assert first["replay"].size > 0 and first["updates"] > 0
    np.testing.assert_array_equal(first["replay"], second["replay"])
    for a, b in zip(first["params"], second["params"], strict=True):
        assert torch.equal(a, b)
    np.testing.assert_array_equal(first["rows"][:, :7], second["rows"][:, :7])  # counters (not the heartbeat)
    assert first["version"] == second["version"] and first["updates"] == second["updates"]
    assert first["returns"] == second["returns"]
    assert (first["rows"][:, 0] > 0).all()  # both collectors collected


def test_the_learners_random_streams_are_not_the_collectors():
    """A user env drawing from numpy's global stream draws from its collector's: the learner's PPO minibatches
    (numpy's global stream) and so the trained weights do not depend on how much the env draws."""

    def train(draws):
        model = make_ppo(4)
        env_fn = functools.partial(global_random_quadruped, draws=draws, autoreset_mode="SameStep")
        with AsyncRunner(model, env_fn=env_fn, num_collectors=1, envs_per_collector=4, backend="inline") as runner:
            runner.learn(3 * 16 * 4)
        return [p.detach().clone() for p in model.policy.parameters()]

    quiet, drawing = train(0), train(5)
    for a, b in zip(quiet, drawing, strict=True):
        assert torch.equal(a, b)


# --------------------------------------------------------------------------- faults and lifecycle
@pytest.mark.parametrize("family", ["sac", "ppo"])
def test_an_exception_in_the_env_raises_collector_error_with_the_root_cause_first(tmp_path, family):
    model = make_sac(learning_starts=10) if family == "sac" else make_ppo(4)
    kwargs = {} if family == "sac" else {"autoreset_mode": "SameStep"}
    env_fn = functools.partial(_runner_envs.failing_quadruped, fail_at=7, stamp_path=str(tmp_path / "raised"), **kwargs)
    runner = AsyncRunner(model, env_fn=env_fn, num_collectors=2, envs_per_collector=2, backend="inline")
    with pytest.raises(CollectorError) as info:
        runner.learn(100_000)
    first_line = str(info.value).splitlines()[0]
    c = info.value.collector
    assert first_line == (
        f"collector {c} (inline, pid {os.getpid()}) raised RuntimeError: boom: simulated physics failure in a collector"
    )
    assert isinstance(info.value.__cause__, RuntimeError)  # the original: post-mortem debugging reaches the env
    tb = info.value.__cause__.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    assert tb.tb_frame.f_code.co_name == "step" and tb.tb_frame.f_code.co_filename.endswith("_runner_envs.py")
    assert "Traceback" in info.value.traceback and "_runner_envs.py" in info.value.traceback
    assert runner.closed and runner._pool.faults == 1
    assert not inline_threads()
    if family == "sac":
        model.replay_buffer.close()


def test_ctrl_c_while_a_collector_steps_stops_and_closes_every_collector():
    SEEN.clear()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        model = make_ppo(4)
        env_fn = functools.partial(interrupting_quadruped, at=5, autoreset_mode="SameStep")
        runner = AsyncRunner(model, env_fn=env_fn, num_collectors=2, envs_per_collector=2, backend="inline")
        with pytest.raises(KeyboardInterrupt):
            runner.learn(100_000)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert runner.closed
    assert not inline_threads()
    assert SEEN.count((os.getpid(), "closed")) == len(SEEN) == 2  # both envs closed by their collectors


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(backend="inline", max_collector_restarts=1), r'backend="inline" does not restart.*got 1'),
        (dict(backend="inline", ray_address="auto"), 'need backend="ray"'),
        (dict(backend="threads"), r'backend must be "process", "ray" or "inline", got \'threads\''),
    ],
)
def test_inline_arguments_are_checked(kwargs, match):
    model = make_sac()
    with pytest.raises(ValueError, match=match):
        AsyncRunner(model, env_id=ID, **kwargs)
    with AsyncRunner(model, env_id=ID, backend="inline"):  # the refusal left no claim on the model
        pass
    model.replay_buffer.close()


def test_a_closed_inline_runner_before_learn_started_nothing():
    model = make_ppo(4)
    runner = AsyncRunner(model, env_id=ID, num_collectors=1, envs_per_collector=4, backend="inline")
    assert runner.collector_status()[0]["pid"] is None  # no collector started before learn()
    runner.close()
    runner.close()
    assert runner.collector_status() == [] and not inline_threads()
