"""Collectors die with the learner, even inside a hung step or while stopped (issue 29, item 7).

A learner script runs in a subprocess with two collectors: one hangs for ever inside its env's ``step``, the
test SIGSTOPs the other, then SIGKILLs the learner. Before, both collectors lived on with PPID 1 (they checked
``getppid()`` only between iterations), and since they held the write end of the learner's resource-tracker
pipe, the tracker never saw EOF and the learner's ``/dev/shm`` segments stayed, for ever."""

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest

pytest.importorskip("stable_baselines3")

import _runner_envs
from _paths import HELPERS

from unilab_gym import AsyncRunner

#: The issue's bound: no collector of a SIGKILLed learner is left after this, in s (met on an idle machine).
ORPHAN_BOUND_S = 2.0
#: How long the test waits for it: the bound plus slack for a loaded 2-core CI machine, where the fork server
#: (which must see EOF and exit before the kernel kills its children) waits for a CPU; still far from "never"
#: (an orphaned collector would run on for ever).
ORPHAN_DEADLINE_S = ORPHAN_BOUND_S + 18.0
#: Longest the learner script may take to start its collectors and reach the hung step, in s (busy 2-core machine).
START_DEADLINE_S = 120.0

LEARNER = """
import functools, sys
sys.path.insert(0, {helpers!r})
import torch
from stable_baselines3 import SAC
from stable_baselines3.common.vec_env import DummyVecEnv

import _runner_envs
from unilab_gym import AsyncRunner, SharedReplayBuffer

if __name__ == "__main__":
    torch.set_num_threads(1)
    env_fn = functools.partial(_runner_envs.tiny, claim_path={claim!r}, fault="hang", fault_at=12)
    model = SAC("MlpPolicy", DummyVecEnv([_runner_envs.TinyEnv]), replay_buffer_class=SharedReplayBuffer,
                learning_starts=10, batch_size=16, buffer_size=2000, policy_kwargs=dict(net_arch=[16, 16]), seed=0)
    runner = AsyncRunner(model, env_fn=env_fn, num_collectors=2, envs_per_collector=2, start_method={start_method!r})
    runner.learn(10**9)
"""


def alive(pid):
    """Whether ``pid`` still runs (a zombie has exited: nothing of it is left but its exit status)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_for(predicate, deadline_s, what):
    """Poll ``predicate`` until it is true; fail with ``what`` (a str, or a callable giving it) after ``deadline_s``."""
    deadline = time.monotonic() + deadline_s
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"{what() if callable(what) else what} (after {deadline_s} s)")
        time.sleep(0.01)


def shm_segments(pid):
    """``/dev/shm`` files that process ``pid`` has mapped (its own segments and those it attached)."""
    with open(f"/proc/{pid}/maps") as f:
        paths = {line.split(None, 5)[5].strip() for line in f if "/dev/shm/" in line}
    return sorted(p.removesuffix(" (deleted)") for p in paths)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_a_sigkilled_learner_takes_its_hung_and_its_stopped_collector_and_its_segments_with_it(tmp_path, start_method):
    """With ``forkserver`` the collectors' parent is the fork server, which exits with the learner."""
    claim = tmp_path / "claim"
    script = tmp_path / "learner.py"
    text = LEARNER.format(helpers=str(HELPERS), claim=str(claim), start_method=start_method)
    script.write_text(textwrap.dedent(text))
    log = tmp_path / "learner.log"
    with open(log, "w") as out:  # the child keeps its own copy of the descriptor
        learner = subprocess.Popen([sys.executable, str(script)], stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
    hung_file = tmp_path / "claim.hung"
    family_pids, segments = [], []
    try:
        # both collectors past their start-up (a collector still importing has no death signal yet), one hung
        wait_for(
            lambda: (
                (hung_file.exists() and len(list(tmp_path.glob("claim.stepped.*"))) == 2) or learner.poll() is not None
            ),
            START_DEADLINE_S,
            "the collectors did not start, or none hung",
        )
        assert learner.poll() is None, log.read_text()
        hung = int(hung_file.read_text())
        collectors = sorted(int(p.name.rsplit(".", 1)[1]) for p in tmp_path.glob("claim.stepped.*"))
        family_pids = [p.pid for p in psutil.Process(learner.pid).children(recursive=True)]
        # the rest: the resource tracker, and with forkserver the fork server (the collectors' parent)
        helpers = [p for p in family_pids if p not in collectors]
        tracker = [p for p in helpers if "resource_tracker" in " ".join(psutil.Process(p).cmdline())]
        assert hung in collectors and set(collectors) <= set(family_pids) and len(tracker) == 1, family_pids
        (stopped,) = (p for p in collectors if p != hung)
        os.kill(stopped, signal.SIGSTOP)
        wait_for(lambda: psutil.Process(stopped).status() == psutil.STATUS_STOPPED, 10, "SIGSTOP did not stop it")
        segments = shm_segments(learner.pid)
        # the replay, the weights, the counters and the policy module at least
        assert len(segments) >= 4 and all(os.path.exists(s) for s in segments), segments

        learner.kill()
        learner.wait()
        wait_for(
            lambda: not any(alive(p) for p in collectors),
            ORPHAN_DEADLINE_S,
            lambda: (
                "collectors left after the learner's SIGKILL (pid, status, ppid): "
                f"{[(p, psutil.Process(p).status(), psutil.Process(p).ppid()) for p in collectors if alive(p)]}"
            ),
        )
        # the tracker sees EOF once no collector holds its pipe: it unlinks the learner's segments and exits
        wait_for(
            lambda: not any(alive(p) for p in helpers),
            30,  # generous: the tracker must be scheduled to see EOF, unlink and exit
            lambda: f"left: {[psutil.Process(p).cmdline() for p in helpers if alive(p)]}",
        )
        left = [s for s in segments if os.path.exists(s)]
        assert not left, f"segments of the SIGKILLed learner left in /dev/shm: {left}"
    finally:
        for pid in family_pids:  # a failed test must leave no stopped or hung process
            for sig in (signal.SIGCONT, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
        if learner.poll() is None:
            learner.kill()
            learner.wait()
        for path in segments:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def test_collectors_started_from_a_thread_that_ended_live_on(one_torch_thread):
    """PR_SET_PDEATHSIG fires when the *thread* that started a process exits: the pool starts every collector
    from its own thread, so learn() in a short-lived thread does not take the collectors with it."""
    from stable_baselines3 import SAC
    from stable_baselines3.common.vec_env import DummyVecEnv

    from unilab_gym import SharedReplayBuffer

    model = SAC(
        "MlpPolicy",
        DummyVecEnv([_runner_envs.TinyEnv]),
        replay_buffer_class=SharedReplayBuffer,
        learning_starts=10,
        batch_size=16,
        buffer_size=2_000,
        policy_kwargs=dict(net_arch=[16, 16]),
        seed=0,
    )
    try:
        with AsyncRunner(model, env_fn=_runner_envs.tiny, num_collectors=1, envs_per_collector=2) as runner:
            errors = []

            def learn():
                try:
                    runner.learn(100)
                except BaseException as e:  # reported below
                    errors.append(e)

            worker = threading.Thread(target=learn)
            worker.start()
            worker.join()
            assert not errors, errors
            pids = runner.collector_pids
            assert len(pids) == 1 and alive(pids[0])
            runner.learn(100, reset_num_timesteps=False)  # the same collector, in the main thread now
            assert runner.collector_pids == pids and model.num_timesteps == 200
        assert not alive(pids[0])
    finally:
        model.replay_buffer.close()
