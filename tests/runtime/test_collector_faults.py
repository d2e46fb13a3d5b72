"""Collector faults the runner must see (issue 19): hung collectors (SIGSTOP), the true policy lag of a stalled
collector, one model under two runners, and a Ctrl-C that reaches a collector still starting."""

import contextlib
import os
import signal
import socket
import time

import psutil
import pytest

pytest.importorskip("stable_baselines3")
from _runner_common import FAMILIES, ID, SMALL_ENV, assert_no_children, make_model, make_sac, release
from stable_baselines3.common.callbacks import BaseCallback

from unilab_gym import AsyncRunner, CollectorError

#: collector_timeout_s of these tests, in s: long enough that no healthy collector on a loaded 2-core CI machine
#: (one step seen to take over 2 s there) counts as hung, as short as that allows (each test waits it out once).
HUNG_AFTER_S = 10


def resume_and_kill(pids):
    """SIGCONT then SIGKILL every pid still there (a test that failed must not leave a stopped process)."""
    for pid in pids:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)


class StopCollector(BaseCallback):
    """SIGSTOPs collector ``index`` of ``runner`` after ``after`` timesteps; gives up (returns False) at ``cap``."""

    def __init__(self, runner, index, after, cap=10**6):
        super().__init__()
        self.runner, self.index, self.after, self.cap = runner, index, after, cap
        self.stopped = []  # (pid, time.monotonic() of the SIGSTOP)

    def _on_step(self):
        # only once it acts with published weights: a collector still at version 0 does not count in the lag
        loaded = self.runner.collector_status()[self.index]["weight_version"] >= 1
        if self.num_timesteps >= self.after and loaded and not self.stopped:
            pid = self.runner.collector_pids[self.index]
            os.kill(pid, signal.SIGSTOP)
            self.stopped.append((pid, time.monotonic()))
        return self.num_timesteps < self.cap


def test_a_sigstopped_collector_is_a_collector_error_naming_it():
    """PPO's learn() used to wait for the stopped collector's rollout for ever (SAC: see the next test)."""
    model = make_model("ppo", 4)
    # 10 s, not less: a collector's heartbeat moves once per env step, and on a loaded 2-core CI machine one
    # step (with the first forward pass of the policy) has taken over 2 s, which flagged a healthy collector
    # as hung before the callback could stop it (at 2 s); 10 s leaves that stall a 5x margin
    timeout = HUNG_AFTER_S
    runner = AsyncRunner(
        model, env_id=ID, num_collectors=2, envs_per_collector=2, env_kwargs=SMALL_ENV, collector_timeout_s=timeout
    )
    stop = StopCollector(runner, 1, after=64)
    try:
        with pytest.raises(CollectorError, match=r"collector 1 \(pid \d+\) made no progress for \d+\.\d s") as info:
            runner.learn(10**6, callback=stop)
        detected = time.monotonic()
    finally:
        resume_and_kill([pid for pid, _ in stop.stopped])
    (pid, stopped_at), error = stop.stopped[0], info.value
    assert error.collector == 1 and error.pid == pid and str(pid) in str(error)
    # counted from the collector's last heartbeat, which moves once per step: at most one step before the SIGSTOP
    # (a step has taken over 2 s on a loaded 2-core CI machine; was 0.1 s of slack), far below timeout (10 s)
    assert timeout <= error.seconds_since_progress <= detected - stopped_at + 3.0
    assert runner.closed and not psutil.pid_exists(pid)  # killed and reaped, not left stopped
    assert_no_children()
    release(model)


def test_a_stalled_collector_shows_its_true_lag_then_is_restarted():
    """Before: the learner stopped publishing at max_policy_lag, the lag metric stayed there looking healthy,
    and training went on without the frozen collector for ever."""
    model = make_sac(learning_starts=10)
    seen = {"lag": 0}
    with AsyncRunner(
        model,
        env_id=ID,
        num_collectors=2,
        envs_per_collector=2,
        env_kwargs=SMALL_ENV,
        replay_ratio=0.25,
        max_policy_lag=1,
        collector_timeout_s=HUNG_AFTER_S,
        max_collector_restarts=1,
    ) as runner:
        stop = StopCollector(runner, 1, after=64)

        class Watch(BaseCallback):  # training goes on with collector 0 until the stopped one is replaced
            def _on_step(self):
                if stop.stopped and not runner.metrics.collector_restarts:
                    seen["lag"] = max(seen["lag"], runner.metrics.last_policy_lag)
                    seen["ages"] = dict(
                        next(
                            s
                            for m, s in runner.metrics.samples()
                            if m.name == "unilab_collector_seconds_since_progress"
                        )
                    )
                return not runner.metrics.collector_restarts

        try:
            with pytest.warns(RuntimeWarning, match=r"collector 1 \(pid \d+\) made no progress.*restarting it \(1 of"):
                runner.learn(10**6, callback=[stop, Watch()])
            replacement = runner.collector_pids[1]
        finally:
            resume_and_kill([pid for pid, _ in stop.stopped])
        assert runner.metrics.collector_restarts == 1 and runner.metrics.collector_errors == 1
        assert replacement != stop.stopped[0][0] and not psutil.pid_exists(stop.stopped[0][0])
    assert seen["lag"] > runner.max_policy_lag + 2  # the held-back training calls count
    ages, host = seen["ages"], socket.gethostname()  # labels: collector, node (the host, for processes)
    assert set(ages) == {("0", host), ("1", host)} and ages[("1", host)] > ages[("0", host)] >= 0
    assert_no_children()
    release(model)


@pytest.mark.parametrize("family", FAMILIES)
def test_one_model_under_two_open_runners_is_refused(family):
    model = make_model(family, 2)
    kwargs = dict(env_id=ID, num_collectors=1, envs_per_collector=2, env_kwargs=SMALL_ENV)
    first = AsyncRunner(model, **kwargs)
    with pytest.raises(ValueError, match="driven by another AsyncRunner that is still open"):
        AsyncRunner(model, **kwargs)
    first.close()
    AsyncRunner(model, **kwargs).close()  # free again once the first is closed
    release(model)


def _sigint_mask(pid, *keys):
    """Whether SIGINT is in any of the signal masks ``keys`` (``SigBlk``, ``SigIgn``, ``SigCgt``) of process ``pid``."""
    with open(f"/proc/{pid}/status") as f:
        masks = {key: int(value, 16) for key, _, value in (line.partition(":") for line in f) if key in keys}
    return any(mask & (1 << (signal.SIGINT - 1)) for mask in masks.values())


def _sigint_catchable(pid):
    """Python installed its SIGINT handler (a SIGINT raises KeyboardInterrupt), or SIGINT is blocked."""
    return _sigint_mask(pid, "SigBlk", "SigCgt")


def _sigint_ignored(pid):
    return _sigint_mask(pid, "SigIgn")


def test_ctrl_c_during_collector_start_up_prints_no_traceback(capfd):
    model = make_sac()
    runner = AsyncRunner(model, env_id=ID, num_collectors=2, envs_per_collector=2, env_kwargs=SMALL_ENV)
    try:
        runner._pool.start()  # what learn() does first; the collectors are now importing (READY = 0)
        for pid in runner.collector_pids:
            while not _sigint_catchable(pid):  # Python is up: before, a SIGINT now raised KeyboardInterrupt
                pass
            os.kill(pid, signal.SIGINT)  # as a Ctrl-C does: the whole foreground process group gets it
        pool = runner._pool
        # until each collector died of it (before: printing a traceback) or reached collector_main, which ignores it
        while not all(not p.is_alive() or _sigint_ignored(p.pid) for p in pool._procs):
            pool.wait(0.01)
        survived = all(p.is_alive() for p in pool._procs)
    finally:
        runner.close()
    assert_no_children()
    assert "KeyboardInterrupt" not in capfd.readouterr().err
    assert survived
    release(model)


def test_each_collector_streams_its_parameter_trace_to_its_own_file(tmp_path):
    from unilab_gym.runtime.pool import CollectorSetup

    setup = CollectorSetup(
        num_collectors=2, envs_per_collector=4, seed=0, policy=None, weights_size=1, writers=(),
        env_id=ID, env_kwargs={"trace_path": str(tmp_path / "trace.jsonl"), "max_episode_steps": 20},
    )  # fmt: skip
    paths = {setup.collector_env_kwargs(c, r)["trace_path"] for c in (0, 1) for r in (0, 1)}
    assert paths == {
        tmp_path / "trace.collector0.jsonl",
        tmp_path / "trace.collector1.jsonl",
        tmp_path / "trace.collector0.restart1.jsonl",
        tmp_path / "trace.collector1.restart1.jsonl",
    }
    assert setup.collector_env_kwargs(1, 0)["max_episode_steps"] == 20
    assert setup.env_kwargs["trace_path"] == str(tmp_path / "trace.jsonl")  # the setup itself is untouched
    assert "trace_path" not in CollectorSetup(1, 1, 0, None, 1, (), env_id=ID).collector_env_kwargs(0, 0)
