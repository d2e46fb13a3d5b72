"""Bounded memory (issue 19, item 7): the parameter trace keeps the last ``trace_max_records`` records and streams
every one to ``trace_path``; configurations that cannot fit the available memory are refused before anything is
built."""

import json

import gymnasium as gym
import numpy as np
import psutil
import pytest

import unilab_gym.memory
import unilab_gym.vector_env
from unilab_gym import QuadrupedEnv, UniLabVectorEnv
from unilab_gym.memory import estimate_env_bytes
from unilab_gym.trace import DEFAULT_TRACE_MAX_RECORDS, ParameterTrace, read_jsonl

ID = "UniLab/Quadruped-v0"


@pytest.fixture
def make():
    envs = []

    def _make(num_envs=3, **kwargs):
        env = gym.make_vec(ID, num_envs=num_envs, max_episode_steps=2, **kwargs)
        envs.append(env)
        return env

    yield _make
    for env in envs:
        env.close()


@pytest.fixture
def no_worlds(monkeypatch):
    """Building a pybullet world fails the test: checks must come before anything is built."""

    def world(*args, **kwargs):
        raise AssertionError("a pybullet world was built")

    monkeypatch.setattr(unilab_gym.vector_env, "ClusterWorld", world)


def _run(env, steps):
    """Step ``env`` with random actions (seed 0); returns the number of finished episodes."""
    rng = np.random.default_rng(0)
    env.reset(seed=0)
    finished = 0
    for _ in range(steps):
        _, _, terminated, truncated, _ = env.step(rng.uniform(-1, 1, (env.num_envs, 12)))
        finished += int((terminated | truncated).sum())
    return finished


def test_trace_keeps_the_last_k_records_over_many_episodes(make):
    bounded, full = make(trace_max_records=4), make()
    finished = _run(bounded, 60)
    assert finished == _run(full, 60) >= 50  # 2-step episodes: one finishes every 3 steps in NextStep mode
    records = bounded.parameter_trace()
    assert len(records) == 4
    assert records == full.parameter_trace()[-4:]  # the last 4, oldest first
    assert len(full.parameter_trace()) == finished <= DEFAULT_TRACE_MAX_RECORDS


def test_trace_memory_stays_flat_over_a_million_episodes():
    """RSS growth over the second half of 10**6 records stays far below what keeping them would cost (156 MB)."""
    k, batch = 1000, 100
    trace = ParameterTrace(max_records=k)
    args = dict(
        env=np.arange(batch),
        episode=np.zeros(batch, dtype=np.int64),
        episode_seed=np.arange(batch),
        command=np.zeros((batch, 3)),
        parameters=np.ones((batch, 11)),
        returns=np.ones(batch),
        lengths=np.full(batch, 2),
        terminated=np.zeros(batch, dtype=bool),
        conditions=np.zeros((batch, 3), dtype=bool),
    )
    process = psutil.Process()
    rss = [process.memory_info().rss]
    for _window in range(2):
        for _ in range(5_000):
            trace.append(**args)
        rss.append(process.memory_info().rss)
    assert len(trace) == len(trace.records()) == k
    assert rss[2] - rss[1] < 8e6, f"RSS grew {(rss[2] - rss[1]) / 1e6:.1f} MB over 500,000 episodes"


def test_trace_path_holds_every_record(make, tmp_path):
    path = tmp_path / "runs" / "trace.jsonl"
    env, full = make(trace_max_records=2, trace_path=path), make()
    finished = _run(env, 30)
    _run(full, 30)
    header, streamed = read_jsonl(path)  # flushed as episodes finish: readable while the env runs
    assert header["env"] == env.task_config and header["packages"]["pybullet"]
    assert len(streamed) == finished and streamed == json.loads(json.dumps(full.parameter_trace()))
    assert env.parameter_trace() == streamed[-2:]
    env.close()
    assert read_jsonl(path)[1] == streamed and len(env.parameter_trace()) == 2


def test_one_trace_path_per_env(make, tmp_path):
    path = tmp_path / "trace.jsonl"
    make(trace_path=path)
    with pytest.raises(ValueError, match=r"trace_path .* is being written by another env"):
        make(trace_path=path)


@pytest.mark.parametrize("value", [-1, 2.5, True, "10", None])
def test_invalid_trace_max_records_is_refused(value, no_worlds):
    with pytest.raises(ValueError, match=f"trace_max_records must be an int >= 0, got {value!r}"):
        UniLabVectorEnv(2, trace_max_records=value)


def test_invalid_trace_path_is_refused(no_worlds, tmp_path):
    for value in (123, "", b"trace.jsonl", tmp_path):
        with pytest.raises(ValueError, match="trace_path"):
            UniLabVectorEnv(2, trace_path=value)
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match=r"trace_path .* cannot be opened"):
        UniLabVectorEnv(2, trace_path=tmp_path / "file" / "trace.jsonl")  # a file as parent folder
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_single_env_takes_the_trace_arguments(tmp_path):
    env = QuadrupedEnv(trace_max_records=1, trace_path=tmp_path / "t.jsonl", max_episode_steps=1)
    for seed in range(3):
        env.reset(seed=seed)
        env.step(np.zeros(12))
    env.close()
    assert len(env.parameter_trace()) == 1 and len(read_jsonl(tmp_path / "t.jsonl")[1]) == 3


def test_a_million_envs_raise_memory_error_naming_the_estimate(no_worlds):
    estimate = estimate_env_bytes(10**6, 32, 0, DEFAULT_TRACE_MAX_RECORDS)
    with pytest.raises(MemoryError, match=rf"needs an estimated {estimate / 2**30:.2f} GiB \({estimate} bytes"):
        gym.make_vec(ID, num_envs=10**6)


def test_memory_error_follows_the_available_memory(monkeypatch, no_worlds):
    need = estimate_env_bytes(64, 32, 0, DEFAULT_TRACE_MAX_RECORDS)
    monkeypatch.setattr(unilab_gym.memory, "available_bytes", lambda: need - 1)
    with pytest.raises(MemoryError, match="available"):
        UniLabVectorEnv(64)
    monkeypatch.setattr(unilab_gym.memory, "available_bytes", lambda: need)
    with pytest.raises(AssertionError, match="a pybullet world was built"):  # passes the check, then builds
        UniLabVectorEnv(64)


def test_estimate_bounds_the_measured_memory():
    """Building 64 envs (2 worlds) adds less resident memory than the estimate."""
    process = psutil.Process()
    before = process.memory_info().rss
    env = UniLabVectorEnv(64, max_episode_steps=5)
    env.reset(seed=0)
    for _ in range(10):
        env.step(np.zeros((64, 12)))
    grown = process.memory_info().rss - before
    env.close()
    assert 0 < grown < estimate_env_bytes(64, 32, 0, DEFAULT_TRACE_MAX_RECORDS)
