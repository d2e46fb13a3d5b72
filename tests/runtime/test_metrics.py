"""Pipeline metrics: env step latency, the Prometheus endpoint, the SB3 logger's unilab/* keys, collector restarts."""

import csv
import errno
import math
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request

import numpy as np
import psutil
import pytest

pytest.importorskip("stable_baselines3")
pytest.importorskip("prometheus_client")
from _paths import HELPERS
from _ports import port_is_free
from _runner_common import ID, SMALL_ENV, assert_no_children, fast, make_model, make_sac, release, runner_segments
from prometheus_client.parser import text_string_to_metric_families
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import configure

from unilab_gym import AsyncRunner, CollectorError, UniLabVectorEnv
from unilab_gym.latency import LATENCY_BUCKETS_US, LatencyHistogram, StepLatency
from unilab_gym.runtime.metrics import LEARNER_PHASES, METRICS


# --------------------------------------------------------------------------- histograms and the env
def test_latency_histogram_uses_prometheus_le_bounds():
    h = LatencyHistogram()
    for us in (LATENCY_BUCKETS_US[0], LATENCY_BUCKETS_US[0] + 0.5, 3 * LATENCY_BUCKETS_US[-1]):
        h.observe(us)
    buckets = dict(h.cumulative())
    assert buckets[LATENCY_BUCKETS_US[0]] == 1  # le is inclusive
    assert buckets[LATENCY_BUCKETS_US[1]] == 2
    assert buckets[LATENCY_BUCKETS_US[-1]] == 2 and buckets[math.inf] == 3 == h.count
    assert h.sum == pytest.approx(LATENCY_BUCKETS_US[0] * 2 + 0.5 + 3 * LATENCY_BUCKETS_US[-1])
    with pytest.raises(ValueError, match="float64 array of shape"):
        LatencyHistogram(np.zeros(3))


def test_rebinding_to_memory_keeps_counting_from_its_contents():
    memory = np.zeros(StepLatency.SIZE)
    StepLatency(memory).physics.observe(100.0)
    again = StepLatency(memory)  # e.g. a replacement collector binding the same shared row
    again.physics.observe(100.0)
    assert again.physics.count == 2 and again.task.count == 0


def test_env_times_every_step_physics_vs_task_and_can_stop():
    env = UniLabVectorEnv(8, envs_per_cluster=4)
    env.reset(seed=0)
    assert env.step_latency.physics.count == 0
    for _ in range(3):  # first steps pay one-off costs (lazy imports, caches)
        env.step(np.zeros((8, 12), np.float32))
    assert env.step_latency.physics.count == 3
    env.step_latency = lat = StepLatency()
    t0 = time.perf_counter()
    for _ in range(12):
        env.step(np.zeros((8, 12), np.float32))
    wall_us = (time.perf_counter() - t0) * 1e6
    assert lat.physics.count == 12 and lat.task.count == 12
    # the two phases split the steps' time between them (the loop adds a little outside step())
    assert lat.physics.sum > 0 and lat.task.sum > 0
    assert 0.8 * wall_us < lat.physics.sum + lat.task.sum <= wall_us
    env.step_latency = None
    env.step(np.zeros((8, 12), np.float32))  # untimed, still steps
    assert lat.physics.count == 12
    env.close()


# --------------------------------------------------------------------------- Prometheus
def scrape(url):
    # 30 s: only a hung server should time out, not one whose thread waits for a CPU (or the GIL) on loaded CI
    with urllib.request.urlopen(url, timeout=30) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def values(family, sample_suffix=""):
    """{labels tuple: value} of the samples named ``family.name + sample_suffix``."""
    return {tuple(sorted(s.labels.items())): s.value for s in family.samples if s.name == family.name + sample_suffix}


def test_prometheus_endpoint_serves_every_metric_during_a_run_and_releases_the_port():
    model = make_sac(learning_starts=64, train_freq=1, gradient_steps=1)
    scraped = {}
    # The rates are computed over windows of at least RATE_WINDOW_S (1 s). The first window opens when the runner
    # is made and spans the collectors' start-up (nothing committed yet), and on an idle machine the next 1,500
    # transitions can come within one window: scrape once a window that saw commits has been computed, in a run
    # long enough to hold several windows.
    total, scrape_at = 6000, 1500

    class Scrape(BaseCallback):
        def _on_step(self):
            if self.num_timesteps >= scrape_at and runner.metrics.replay_write_per_second > 0 and not scraped:
                scraped.update(scrape(runner.metrics_url))
            return True

    with AsyncRunner(
        model,
        env_id=ID,
        num_collectors=2,
        envs_per_collector=4,
        env_kwargs=SMALL_ENV,
        replay_ratio=0.25,
        metrics_port=0,
    ) as runner:
        url = runner.metrics_url
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        assert url.startswith("http://127.0.0.1:") and not port_is_free(port)
        listening = [c for c in psutil.Process().net_connections("tcp") if c.status == psutil.CONN_LISTEN]
        assert [c.laddr.ip for c in listening if c.laddr.port == port] == ["127.0.0.1"]  # loopback only
        runner.learn(total, callback=Scrape())
        after = scrape(url)
    assert runner.metrics_url is None and port_is_free(port)
    assert scraped, f"no rate window with commits was computed in {total} transitions"

    kinds = {m.name.removesuffix("_total"): m.kind for m in METRICS}
    assert {name: f.type for name, f in scraped.items() if name.startswith("unilab_")} == kinds
    for family in scraped.values():
        assert family.documentation
    steps = values(scraped["unilab_env_steps"], "_total")
    host = socket.gethostname()  # the process backend's node label: the host name
    assert set(steps) == {(("collector", "0"), ("node", host)), (("collector", "1"), ("node", host))}
    assert all(v > 0 for v in steps.values())
    assert scrape_at <= sum(steps.values()) <= total + 2 * 8
    assert sum(values(after["unilab_env_steps"], "_total").values()) >= total
    # histograms: cumulative buckets, +Inf == count, plausible means
    step = scraped["unilab_step_latency_microseconds"]
    counts = values(step, "_count")
    assert {dict(k)["phase"] for k in counts} == {"physics", "task"} and len(counts) == 4
    sums = values(step, "_sum")
    for key, count in counts.items():
        labels = dict(key)
        buckets = [
            s for s in step.samples if s.name.endswith("_bucket") and all(s.labels[k] == v for k, v in labels.items())
        ]
        cum = [b.value for b in buckets]
        assert cum == sorted(cum) and buckets[-1].labels["le"] == "+Inf" and cum[-1] == count > 0
        assert 1 < sums[key] / count < 1e6  # between 1 µs and 1 s per step
    sync = values(scraped["unilab_weight_sync_latency_microseconds"], "_count")
    sync_sum = values(scraped["unilab_weight_sync_latency_microseconds"], "_sum")
    assert all(v >= 1 for v in sync.values())
    assert sum(sync_sum.values()) / sum(sync.values()) < 2e6  # publish to loaded: not collector start-up
    assert 0 <= values(scraped["unilab_policy_lag_versions"])[()] <= runner.max_policy_lag
    assert values(scraped["unilab_policy_version"])[()] >= 1
    committed = values(scraped["unilab_replay_committed_transitions"], "_total")[()]
    assert scrape_at <= committed <= sum(steps.values())
    assert values(scraped["unilab_replay_size_transitions"])[()] == min(committed, model.replay_buffer.storage.capacity)
    assert values(scraped["unilab_replay_write_transitions_per_second"])[()] > 0
    grad = values(after["unilab_gradient_steps"], "_total")[()]
    assert grad == np.floor((total - 64) * 0.25)  # the learner's exact count
    phases = values(after["unilab_learner_seconds"], "_total")
    assert {dict(k)["phase"] for k in phases} == set(LEARNER_PHASES) and phases[(("phase", "train"),)] > 0
    episodes = values(after["unilab_episodes"], "_total")
    truncated = sum(v for k, v in episodes.items() if dict(k)["outcome"] == "truncated")
    assert truncated > 0  # 20-step episodes
    assert values(after["unilab_collector_errors"], "_total")[()] == 0
    release(model)


def test_ipv6_loopback_url_has_brackets():
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback")
    model = make_sac()
    with AsyncRunner(
        model, env_id=ID, num_collectors=1, envs_per_collector=2, metrics_port=0, metrics_addr="::1"
    ) as runner:
        assert runner.metrics_url.startswith("http://[::1]:")
        assert "unilab_policy_version" in urllib.request.urlopen(runner.metrics_url, timeout=30).read().decode()
    release(model)


def test_metrics_are_off_unless_asked():
    model = make_sac()
    with AsyncRunner(model, env_id=ID, num_collectors=1, envs_per_collector=2, env_kwargs=SMALL_ENV) as runner:
        assert runner.metrics_url is None
        assert not [c for c in psutil.Process().net_connections("tcp") if c.status == psutil.CONN_LISTEN]
    release(model)


def test_a_port_in_use_is_a_clear_error_and_leaks_nothing():
    model = make_sac()
    before = set(os.listdir("/dev/shm"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"metrics_port {port} on 127.0.0.1 is already in use") as info:
            AsyncRunner(model, env_id=ID, num_collectors=1, envs_per_collector=2, metrics_port=port)
        assert info.value.errno == errno.EADDRINUSE
    assert set(os.listdir("/dev/shm")) - before == set()
    release(model)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(metrics_port=-1), "metrics_port"),
        (dict(metrics_port=70_000), "metrics_port"),
        (dict(metrics_port="9100"), "metrics_port"),
        (dict(max_collector_restarts=-1), "max_collector_restarts"),
        (dict(max_collector_restarts=1.5), "max_collector_restarts"),
        (dict(metrics_addr=None), "metrics_addr"),
        (dict(metrics_addr=""), "metrics_addr"),
    ],
)
def test_bad_metrics_and_restart_arguments(kwargs, match):
    model = make_sac()
    with pytest.raises(ValueError, match=match):
        AsyncRunner(model, env_id=ID, **kwargs)
    release(model)


# --------------------------------------------------------------------------- SB3 logger
LOGGER_KEYS = [
    "unilab/env_steps",
    "unilab/env_steps_per_s",
    "unilab/env_steps_per_s/c0",
    "unilab/env_steps_per_s/c1",
    "unilab/step_physics_us",
    "unilab/step_task_us",
    "unilab/weight_sync_us",
    "unilab/policy_version",
    "unilab/policy_lag_mean",
    "unilab/policy_lag_max",
    "unilab/grad_steps",
    "unilab/grad_steps_per_s",
    "unilab/learner_wait_for_data_frac",
    "unilab/learner_train_frac",
    "unilab/learner_publish_weights_frac",
    "unilab/collector_restarts",
    "unilab/collector_errors",
    "unilab/episodes_terminated",
    "unilab/episodes_truncated",
]
REPLAY_KEYS = [
    "unilab/replay_size",
    "unilab/replay_committed",
    "unilab/replay_write_per_s",
    "unilab/replay_sample_per_s",
    "unilab/replay_ratio",
]


# the keys come from the loops and the counter table, the same over every pool: SAC on processes, PPO on the
# inline pool (no processes: 0.6 CPU s instead of 3.7; SAC's cost is its training, the same on both)
@pytest.mark.parametrize("family, backend", [("sac", "process"), ("ppo", "inline")])
def test_unilab_keys_reach_the_sb3_logger_output(tmp_path, family, backend):
    model = make_model(family, 8)
    model.set_logger(configure(str(tmp_path), ["csv", "stdout"]))
    with AsyncRunner(
        model, env_id=ID, num_collectors=2, envs_per_collector=4, env_kwargs=SMALL_ENV, backend=backend
    ) as runner:
        runner.learn(1024, log_interval=1)
    rows = list(csv.DictReader((tmp_path / "progress.csv").read_text().splitlines()))
    expected = LOGGER_KEYS + (REPLAY_KEYS if family == "sac" else [])
    assert [k for k in expected if k not in rows[0]] == []
    if family == "ppo":
        assert not [k for k in rows[0] if k in REPLAY_KEYS]
    last = {k: float(v) for k, v in rows[-1].items() if k.startswith("unilab/") and v != ""}
    env_steps = [float(r["unilab/env_steps"]) for r in rows]
    assert env_steps == sorted(env_steps) and 0 < env_steps[-1] <= 1024 + 8  # logged as it went
    assert last["unilab/env_steps_per_s"] > 0
    per_collector = last["unilab/env_steps_per_s/c0"] + last["unilab/env_steps_per_s/c1"]
    assert per_collector == pytest.approx(last["unilab/env_steps_per_s"], rel=1e-6)  # same interval
    assert last["unilab/step_physics_us"] > 0 and last["unilab/step_task_us"] > 0
    assert last["unilab/policy_lag_max"] <= runner.max_policy_lag
    assert last["unilab/episodes_truncated"] > 0 and last["unilab/collector_errors"] == 0
    for phase in LEARNER_PHASES:
        assert 0 <= last[f"unilab/learner_{phase}_frac"] <= 1.05
    assert last["unilab/grad_steps"] > 0
    release(model)


# --------------------------------------------------------------------------- collector restarts
@pytest.mark.parametrize("family", ["sac", "ppo"])
def test_a_sigkilled_collector_is_restarted_and_counted(tmp_path, family):
    model = make_model(family, 8)
    model.set_logger(configure(str(tmp_path), ["csv"]))
    killed = []

    class Killer(BaseCallback):
        def _on_step(self):
            if self.num_timesteps >= 200 and not killed:
                killed.append(runner.collector_pids[1])
                os.kill(killed[0], signal.SIGKILL)
            return True

    with AsyncRunner(
        model,
        env_id=ID,
        num_collectors=2,
        envs_per_collector=4,
        env_kwargs=SMALL_ENV,
        max_collector_restarts=1,
        metrics_port=0,
    ) as runner:
        with pytest.warns(
            RuntimeWarning, match=r"collector 1 .*signal 9.*restarting it \(1 of max_collector_restarts=1\)"
        ):
            runner.learn(1024, callback=Killer(), log_interval=1)
        assert model.num_timesteps >= 1024
        assert runner.collector_pids[1] != killed[0] and psutil.pid_exists(runner.collector_pids[1])
        assert runner.metrics.collector_restarts == 1 and runner.metrics.collector_errors == 1
        text = urllib.request.urlopen(runner.metrics_url, timeout=30).read().decode()
        assert "unilab_collector_restarts_total 1.0" in text and "unilab_collector_errors_total 1.0" in text
        lag = next(
            float(line.split()[-1]) for line in text.splitlines() if line.startswith("unilab_policy_lag_versions ")
        )
        assert lag <= runner.max_policy_lag
        # the next fault is one too many: it raises
        segments = runner_segments(runner)
        os.kill(runner.collector_pids[0], signal.SIGKILL)
        with pytest.raises(CollectorError, match=r"collector 0 .*signal 9"):
            runner.learn(1024, reset_num_timesteps=False)
    assert runner.closed and runner.metrics.collector_errors == 2
    assert_no_children()
    assert not any(os.path.exists(s) for s in segments)
    rows = list(csv.DictReader((tmp_path / "progress.csv").read_text().splitlines()))
    assert float(rows[-1]["unilab/collector_restarts"]) == 1
    release(model)


def test_a_script_without_main_guard_fails_fast_with_the_fix(tmp_path):
    """Spawned collectors would re-import the script: without the guard the learner refuses at once, with the fix
    (issue 26: before any collector starts; tests/sb3/test_runner_arguments.py checks that nothing leaks)."""
    script = tmp_path / "no_guard.py"
    script.write_text(
        textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(HELPERS)!r})
        from _runner_common import make_sac, ID, SMALL_ENV
        from unilab_gym import AsyncRunner
        model = make_sac()
        AsyncRunner(model, env_id=ID, num_collectors=1, envs_per_collector=2, env_kwargs=SMALL_ENV).learn(10_000)
    """)
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: the AsyncRunner is created at the top level of"), last
    assert 'if __name__ == "__main__":' in last and "CollectorError" not in out.stderr


# --------------------------------------------------------------------------- without AsyncRunner
def test_env_metrics_callback_logs_the_env_side_figures_with_plain_sb3(tmp_path):
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv

    from unilab_gym.sb3.vec_env import EnvMetricsCallback, make_sb3_env

    env = make_sb3_env(ID, 4, seed=0, max_episode_steps=10)
    model = PPO("MlpPolicy", env, n_steps=16, batch_size=32, n_epochs=1, seed=0, policy_kwargs=dict(net_arch=[16]))
    model.set_logger(configure(str(tmp_path), ["csv"]))
    model.learn(3 * 16 * 4, callback=EnvMetricsCallback())
    rows = list(csv.DictReader((tmp_path / "progress.csv").read_text().splitlines()))
    assert len(rows) == 3
    for key in ("unilab/env_steps_per_s", "unilab/step_physics_us", "unilab/step_task_us"):
        assert all(float(r[key]) > 0 for r in rows), key
    # 10-step episodes: every env truncates, or falls first (terminated), 4 envs x 48 steps in all
    ended = [float(r["unilab/episodes_terminated"]) + float(r["unilab/episodes_truncated"]) for r in rows]
    assert ended == sorted(ended) and ended[-1] >= 4 * (48 // 10)
    assert float(rows[-1]["unilab/episodes_truncated"]) > 0
    env.close()

    other = PPO(
        "MlpPolicy", DummyVecEnv([lambda: __import__("gymnasium").make("Pendulum-v1")]), n_steps=16, batch_size=16
    )
    with pytest.raises(ValueError, match="EnvMetricsCallback needs a UniLab env"):
        other.learn(16, callback=EnvMetricsCallback())


def test_env_metrics_callback_counts_are_current_when_off_policy_sb3_logs(tmp_path):
    from stable_baselines3 import SAC

    from unilab_gym.sb3.vec_env import EnvMetricsCallback, make_sb3_env

    env = make_sb3_env(ID, 4, seed=0, max_episode_steps=10)
    model = SAC("MlpPolicy", env, learning_starts=1000, seed=0, **{**fast(), "buffer_size": 1000})
    model.set_logger(configure(str(tmp_path), ["csv"]))
    model.learn(200, callback=EnvMetricsCallback(), log_interval=1)
    rows = [
        r
        for r in csv.DictReader((tmp_path / "progress.csv").read_text().splitlines())
        if r.get("unilab/episodes_truncated")
    ]
    assert rows
    for r in rows:  # SB3 dumps at each episode end; ours counts every episode of that step
        ours = float(r["unilab/episodes_terminated"]) + float(r["unilab/episodes_truncated"])
        assert float(r["time/episodes"]) <= ours <= float(r["time/episodes"]) + 3
    env.close()


def test_collectors_that_have_not_loaded_weights_do_not_count_in_the_lag():
    from unilab_gym.runtime.control import VERSION
    from unilab_gym.runtime.pool import CollectorSetup
    from unilab_gym.runtime.process_pool import ProcessCollectorPool

    setup = CollectorSetup(
        num_collectors=3, envs_per_collector=1, seed=0, policy=None, weights_size=4, writers=(), env_id=ID
    )
    pool = ProcessCollectorPool(setup)  # never started: only its counters and weights are used
    try:
        assert pool.policy_lag() == 0  # nothing published, nobody acting
        for _ in range(7):
            pool.publish_weights(np.zeros(4, np.float32))
        pool.counters.rows[:, VERSION] = [0, 5, 6]  # collector 0 is starting (or restarted)
        assert pool.policy_lag() == 2
        pool.counters.rows[:, VERSION] = 0
        assert pool.policy_lag() == 0
    finally:
        pool.close()
