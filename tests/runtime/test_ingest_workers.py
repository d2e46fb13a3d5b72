"""AsyncRunner(backend="ray", ingest_workers=2): two learner-side threads fetch the collectors' answers and write
them into the replay / rollout storage; the loops' guarantees keep their meaning (issue 30, item 2).

Each test checks one guarantee with K = 2: the replay ratio, ``learning_starts``, policy lag, backpressure, the
bit-for-bit lag-0 PPO run, and the ingest metric (its CPU now spent on the workers too). One module-scoped local
Ray instance serves them all (the pool uses an initialised Ray and leaves it running).
"""

import math
import threading

import numpy as np
import pytest
import torch
from _runner_common import ID, SMALL_ENV
from _runner_common import make_sac as shared_make_sac
from stable_baselines3 import PPO, TD3
from stable_baselines3.common.callbacks import BaseCallback

from unilab_gym import AsyncRunner, CollectorError, SharedReplayBuffer

ray = pytest.importorskip("ray")

K = 2
WORKERS = {f"unilab-ingest-{w}" for w in range(K)}


#: every test runs on the session's shared local Ray (tests/conftest.py, ``local_ray``)
pytestmark = pytest.mark.usefixtures("local_ray")


def ingest_threads():
    return {t.name for t in threading.enumerate() if t.name.startswith("unilab-ingest-")}


def make_sac(**kwargs):
    """The shared quick SAC (tests/helpers/_runner_common.py), learning from the 10th transition by default."""
    return shared_make_sac(**{"learning_starts": 10, **kwargs})


def runner_for(model, **kwargs):
    settings = dict(env_id=ID, num_collectors=2, envs_per_collector=4, env_kwargs=SMALL_ENV, replay_ratio=0.1)
    return AsyncRunner(model, backend="ray", ingest_workers=K, **{**settings, **kwargs})


class Record(BaseCallback):
    """At each on_step: (num_timesteps, gradient steps so far, policy lag, ingest threads alive)."""

    def __init__(self):
        super().__init__()
        self.rows = []
        self.runner = None

    def _on_step(self):
        self.rows.append((self.num_timesteps, self.model._n_updates, self.runner.policy_lag(), ingest_threads()))
        return True


def test_replay_ratio_and_learning_starts_hold_and_the_workers_ingest():
    model = make_sac(learning_starts=200)
    rec = Record()
    with runner_for(model, replay_ratio=0.25) as runner:
        rec.runner = runner
        pool = runner._pool
        runner.learn(1200, callback=rec)
        counted = pool.counters.total_transitions()
        committed = model.replay_buffer.storage.committed
        assert pool.ingest_workers == K
        # the counters count what poll() counted; as with collector processes, the storage may already hold
        # answers a worker stored after the last poll()
        assert pool.ingested == counted <= committed
        assert pool.ingest_stats.worker_cpu_seconds > 0  # the workers fetched and copied
    assert model.num_timesteps == 1200
    assert model._n_updates == math.floor((1200 - 200) * 0.25)
    for steps, updates, _, _ in rec.rows:  # never ahead of the counted data, nothing before learning_starts
        assert updates <= max(0, math.floor((steps - 200) * 0.25))
    assert all(threads == WORKERS for *_, threads in rec.rows)  # K threads ran while learn() did
    assert not ingest_threads()  # and close() ended them
    model.replay_buffer.close()


def test_backpressure_bounds_the_collectors():
    from stable_baselines3.common.noise import NormalActionNoise

    from unilab_gym.sb3.vec_env import make_sb3_env

    env = make_sb3_env(ID, 1, seed=0, **SMALL_ENV)
    model = TD3(
        "MlpPolicy",
        env,
        replay_buffer_class=SharedReplayBuffer,
        learning_starts=100,
        seed=1,
        batch_size=32,
        policy_kwargs=dict(net_arch=[32, 32]),
        buffer_size=5_000,
        action_noise=NormalActionNoise(np.zeros(12), 0.1 * np.ones(12)),
    )
    with runner_for(model, replay_ratio=1.0) as runner:
        runner.learn(600)
        produced = runner._pool.counters.total_transitions()
    assert model._n_updates == 600 - 100
    assert 600 <= produced <= 600 + 2 * 4  # collectors never ran past the target by more than one step each
    model.replay_buffer.close()


def test_policy_lag_stays_bounded():
    model = make_sac(learning_starts=50)
    rec = Record()
    with runner_for(model, max_policy_lag=1, replay_ratio=0.5) as runner:
        rec.runner = runner
        runner.learn(500, callback=rec)
        versions = [s["weight_version"] for s in runner.collector_status()]
    lags = [lag for _, _, lag, _ in rec.rows]
    assert max(lags) <= 1 and model._n_updates > 0
    assert max(versions) >= 1  # the collectors acted with published weights
    model.replay_buffer.close()


def test_ppo_one_collector_lag0_equals_stock_sb3_bit_for_bit():
    from unilab_gym.sb3.vec_env import make_sb3_env

    env_kwargs = dict(max_episode_steps=10, envs_per_cluster=4)  # truncations (bootstrap) in every rollout

    def make():
        env = make_sb3_env(ID, 8, seed=3, **env_kwargs)
        return PPO("MlpPolicy", env, n_steps=16, batch_size=64, n_epochs=2, seed=3, policy_kwargs=dict(net_arch=[32]))

    stock = make()
    torch.manual_seed(3)  # the collector seeds torch with seed + 0 before its first action
    stock.learn(2 * 128)
    model = make()
    with runner_for(model, num_collectors=1, envs_per_collector=8, env_kwargs=env_kwargs, replay_ratio=None) as runner:
        runner.learn(2 * 128)
        assert runner._pool.ingest_stats.worker_cpu_seconds > 0  # the rollouts went through a worker
    assert model._n_updates == stock._n_updates == 2 * 2
    for (name, ours), theirs in zip(model.policy.state_dict().items(), stock.policy.state_dict().values()):
        assert torch.equal(ours, theirs), name


def test_ingest_metric_counts_the_workers_cpu():
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from unilab_gym.runtime.metrics import INGEST_PHASES

    model = make_sac()
    with runner_for(model, metrics_port=0) as runner:
        runner.learn(400)
        pool = runner._pool
        with urllib.request.urlopen(runner.metrics_url, timeout=10) as page:
            families = {f.name: f for f in text_string_to_metric_families(page.read().decode())}
        answers = sum(pool._next_ingest)  # answers counted, in request order, per collector (no restarts)
        committed = model.replay_buffer.storage.committed
        stats = pool.ingest_stats
    cpu = {s.labels["phase"]: s.value for s in families["unilab_ingest_cpu_seconds"].samples}
    # every phase but wait (the training thread may never have had to wait for data) has CPU in it
    assert set(cpu) == set(INGEST_PHASES) and all(v > 0 for p, v in cpu.items() if p != "wait"), cpu
    # once the workers have stopped (close() joins them) no span is open: the phases add up to the total
    assert sum(stats.cpu_seconds.values()) == pytest.approx(stats.total_cpu_seconds, rel=1e-6)
    assert sum(stats.cpu_seconds.values()) >= sum(cpu.values())  # (the scrape was earlier)
    # the workers' part (fetch, copy, requests) is in the total, beside the training thread's (poll, count, wait)
    assert 0 < stats.worker_cpu_seconds < stats.total_cpu_seconds
    hist = {(s.name, s.labels.get("le")): s.value for s in families["unilab_ingest_answer_transitions"].samples}
    assert answers > 0 and hist[("unilab_ingest_answer_transitions_count", None)] == answers
    assert hist[("unilab_ingest_answer_transitions_sum", None)] == pool.ingested >= 400
    assert pool.ingested <= committed  # (a worker may have stored answers after the last poll())
    model.replay_buffer.close()


def test_a_remote_exception_still_raises_a_collector_error():
    model = make_sac()
    runner = runner_for(model, env_kwargs={**SMALL_ENV, "no_such_option": 1})
    with pytest.raises(CollectorError) as info:
        runner.learn(200)
    assert info.value.traceback is not None and "no_such_option" in info.value.traceback
    assert runner.closed and not ingest_threads()
    model.replay_buffer.close()
