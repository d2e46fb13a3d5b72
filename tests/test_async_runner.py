"""AsyncRunner (off-policy): training, replay ratio, backpressure, weight sync, callbacks, faults, cleanup."""

import functools
import glob
import math
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import psutil
import pytest

pytest.importorskip("stable_baselines3")
from stable_baselines3 import SAC, TD3  # noqa: E402
from stable_baselines3.common.callbacks import BaseCallback, CheckpointCallback, EvalCallback, StopTrainingOnRewardThreshold  # noqa: E402

import unilab_gym  # noqa: E402
from unilab_gym import AsyncRunner, CollectorError, SharedReplayBuffer  # noqa: E402
from unilab_gym.runtime.weights import SharedWeights  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
import _runner_envs  # noqa: E402

ID = "UniLab/Quadruped-v0"
SMALL_ENV = dict(max_episode_steps=20, envs_per_cluster=4)
FAST = dict(batch_size=32, policy_kwargs=dict(net_arch=[32, 32]), buffer_size=5_000)


def runner_segments(runner):
    """/dev/shm paths of the runner's own segments (weights and control)."""
    return [f"/dev/shm/{runner._weights.handle.name}", f"/dev/shm/{runner._control.handle.name}"]


def make_sac(**kwargs):
    from unilab_gym.integrations.sb3 import make_sb3_env

    env = make_sb3_env(ID, 1, seed=0, **SMALL_ENV)
    return SAC("MlpPolicy", env, replay_buffer_class=SharedReplayBuffer, seed=0, **{**FAST, **kwargs})


def assert_no_children():
    kids = [p for p in psutil.Process().children(recursive=True) if "resource_tracker" not in " ".join(p.cmdline())]
    assert not kids, f"child processes left: {[(p.pid, p.cmdline()) for p in kids]}"


class Recorder(BaseCallback):
    """Records (num_timesteps, n_updates, replay buffer size) at every on_step."""

    def __init__(self):
        super().__init__()
        self.rows = []

    def _on_step(self):
        self.rows.append((self.model.num_timesteps, self.model._n_updates, self.model.replay_buffer.size()))
        return True


# --------------------------------------------------------------------------- training and accounting
def test_sac_learns_with_exact_replay_ratio_and_stats(tmp_path):
    model = make_sac(learning_starts=200, train_freq=1, gradient_steps=1)
    rec = Recorder()
    with AsyncRunner(model, env_id=ID, num_collectors=2, envs_per_collector=4, env_kwargs=SMALL_ENV, replay_ratio=0.25) as runner:
        assert runner.replay_ratio == 0.25
        runner.learn(1200, callback=rec, log_interval=1)
        pids = runner.collector_pids
        assert len(pids) == 2 and all(psutil.pid_exists(p) for p in pids)
        segments = runner_segments(runner)
        assert all(os.path.exists(s) for s in segments)
    assert model.num_timesteps == 1200
    assert model._n_updates == math.floor((1200 - 200) * 0.25)
    # the learner never trained ahead of the data, nor before learning_starts
    for steps, updates, _ in rec.rows:
        assert updates <= max(0, math.floor((steps - 200) * 0.25))
    assert len(rec.rows) == 1200  # on_step once per model.n_envs (=1) env steps, as SB3 calls it
    assert len(model.ep_info_buffer) > 0 and all(e["l"] == 20 for e in model.ep_info_buffer)
    assert model.replay_buffer.size() >= 1200
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)
    assert not any(os.path.exists(s) for s in segments)  # the model's replay stays, for the model
    replay = f"/dev/shm/{model.replay_buffer.handle.name}"
    model.replay_buffer.close()
    assert not os.path.exists(replay)


def test_default_replay_ratio_maps_sb3_train_freq_and_gradient_steps():
    from unilab_gym.integrations.sb3 import make_sb3_env

    env = make_sb3_env(ID, 4, seed=0, **SMALL_ENV)
    model = SAC("MlpPolicy", env, replay_buffer_class=SharedReplayBuffer, train_freq=2, gradient_steps=3, **FAST)
    with AsyncRunner(model, env_id=ID) as runner:
        assert runner.replay_ratio == pytest.approx(3 / (2 * 4))
    model.gradient_steps = -1
    with AsyncRunner(model, env_id=ID) as runner:
        assert runner.replay_ratio == 1.0
    model.replay_buffer.close()


def test_td3_trains_and_backpressure_bounds_collectors():
    from stable_baselines3.common.noise import NormalActionNoise

    from unilab_gym.integrations.sb3 import make_sb3_env

    env = make_sb3_env(ID, 1, seed=0, **SMALL_ENV)
    model = TD3("MlpPolicy", env, replay_buffer_class=SharedReplayBuffer, learning_starts=100, seed=1,
                action_noise=NormalActionNoise(np.zeros(12), 0.1 * np.ones(12)), **FAST)
    with AsyncRunner(model, env_fn=_runner_envs.quadruped, num_collectors=2, envs_per_collector=4, replay_ratio=1.0) as runner:
        runner.learn(600)
        produced = runner._control.total_transitions()
    assert model._n_updates == 600 - 100
    # collectors never ran past the target by more than one step each
    assert 600 <= produced <= 600 + 2 * 4
    model.replay_buffer.close()


def test_learning_starts_larger_than_capacity_is_refused():
    model = make_sac(learning_starts=6_000)
    with pytest.raises(ValueError, match="learning_starts"):
        AsyncRunner(model, env_id=ID)
    model.replay_buffer.close()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(num_collectors=0), "num_collectors"),
        (dict(envs_per_collector=-1), "envs_per_collector"),
        (dict(max_policy_lag=0), "max_policy_lag"),
        (dict(replay_ratio=-1.0), "replay_ratio"),
        (dict(env_fn=_runner_envs.quadruped), "exactly one"),
    ],
)
def test_bad_arguments(kwargs, match):
    model = make_sac()
    with pytest.raises(ValueError, match=match):
        AsyncRunner(model, **{"env_id": ID, **kwargs})
    model.replay_buffer.close()


def test_plain_replay_buffer_is_refused_with_the_fix():
    from unilab_gym.integrations.sb3 import make_sb3_env

    model = SAC("MlpPolicy", make_sb3_env(ID, 1, **SMALL_ENV), **FAST)
    with pytest.raises(ValueError, match="replay_buffer_class=unilab_gym.SharedReplayBuffer"):
        AsyncRunner(model, env_id=ID)


# --------------------------------------------------------------------------- weight sync
def _publisher(handle, versions, ready):
    weights = SharedWeights.attach(handle)
    # an attacher may not publish in real use; here a child plays the learner to race the reader
    ready.wait()
    for v in range(2, versions + 1):
        weights._header[0]  # noqa: B018
        k = v % 2
        weights._header[2 + k] += 1
        weights._buffers[k][:] = v
        weights._header[2 + k] += 1
        weights._header[0] = v
    weights.close()


def test_weight_reads_are_never_torn():
    weights = SharedWeights(200_000)
    weights.publish(np.full(200_000, 1, np.float32))
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    proc = ctx.Process(target=_publisher, args=(weights.handle, 400, ready))
    proc.start()
    out = np.empty(200_000, np.float32)
    seen = []
    ready.set()
    while proc.is_alive() or weights.version < 400:
        version = weights.read(out)
        assert out.min() == out.max(), "torn read: mixed versions in one copy"
        assert out[0] >= version  # never older than the version reported
        seen.append(version)
    proc.join()
    assert seen == sorted(seen) and seen[-1] == 400
    weights.close()


def test_policy_lag_is_bounded_and_logged(tmp_path):
    from stable_baselines3.common.logger import configure

    model = make_sac(learning_starts=50)
    model.set_logger(configure(str(tmp_path), ["csv"]))
    lags = []

    class Lag(BaseCallback):
        def _on_step(self):
            lags.append(runner.policy_lag())
            return True

    with AsyncRunner(model, env_id=ID, num_collectors=2, envs_per_collector=4, env_kwargs=SMALL_ENV, max_policy_lag=1, replay_ratio=0.5) as runner:
        runner.learn(500, callback=Lag(), log_interval=1)
    assert max(lags) <= 1
    header = open(tmp_path / "progress.csv").readline()
    for key in ("unilab/policy_lag_mean", "unilab/policy_lag_max", "rollout/ep_rew_mean", "rollout/ep_len_mean"):
        assert key in header
    model.replay_buffer.close()


# --------------------------------------------------------------------------- callbacks, saving
def test_sb3_callbacks_checkpoint_eval_and_stop(tmp_path):
    import gymnasium as gym

    model = make_sac(learning_starts=50)
    eval_env = gym.make(ID, max_episode_steps=10)
    stop = StopTrainingOnRewardThreshold(reward_threshold=-1e9, verbose=0)
    callbacks = [
        CheckpointCallback(save_freq=100, save_path=str(tmp_path / "ckpt")),
        EvalCallback(eval_env, eval_freq=200, n_eval_episodes=1, callback_on_new_best=stop, verbose=0),
    ]
    with AsyncRunner(model, env_id=ID, num_collectors=1, envs_per_collector=4, env_kwargs=SMALL_ENV) as runner:
        runner.learn(10_000, callback=callbacks, progress_bar=True)
    assert 200 <= model.num_timesteps < 10_000  # stopped by the threshold at the first evaluation
    assert len(list((tmp_path / "ckpt").glob("*.zip"))) >= 2
    model.replay_buffer.close()


def test_saved_model_loads_without_unilab_gym(tmp_path):
    model = make_sac(learning_starts=50)
    with AsyncRunner(model, env_id=ID, num_collectors=1, envs_per_collector=4, env_kwargs=SMALL_ENV) as runner:
        runner.learn(200)
    model.save(tmp_path / "sac")
    obs = np.zeros((1, 48), np.float32)
    expected = model.predict(obs, deterministic=True)[0]
    model.replay_buffer.close()
    code = textwrap.dedent(f"""
        import sys, numpy as np
        sys.modules["unilab_gym"] = None  # importing it now fails
        from stable_baselines3 import SAC
        m = SAC.load({str(tmp_path / 'sac.zip')!r}, device="cpu")
        print(repr(m.predict(np.zeros((1, 48), np.float32), deterministic=True)[0].tolist()))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    np.testing.assert_allclose(eval(out.stdout.strip()), expected, rtol=1e-6)


# --------------------------------------------------------------------------- faults and cleanup
def test_collector_exception_surfaces_within_1s_with_traceback(tmp_path):
    model = make_sac(learning_starts=10)
    stamp = str(tmp_path / "raised")
    env_fn = functools.partial(_runner_envs.failing_quadruped, fail_at=30, stamp_path=stamp)
    runner = AsyncRunner(model, env_fn=env_fn, num_collectors=2, envs_per_collector=2)
    segments = runner_segments(runner)
    with pytest.raises(CollectorError) as info:
        runner.learn(100_000)
    caught = time.time()
    raised = min(float(open(f).read()) for f in glob.glob(stamp + ".*"))
    assert caught - raised < 1.0
    assert "boom: simulated physics failure" in str(info.value) and "Traceback" in info.value.traceback
    assert runner.closed
    assert_no_children()
    assert not any(os.path.exists(s) for s in segments)
    model.replay_buffer.close()


def test_sigkilled_collector_is_detected_within_1s():
    model = make_sac(learning_starts=10)
    killed = {}

    class Killer(BaseCallback):
        def _on_step(self):
            if self.num_timesteps >= 40 and not killed:
                os.kill(runner.collector_pids[1], signal.SIGKILL)
                killed["t"] = time.monotonic()
            return True

    runner = AsyncRunner(model, env_id=ID, num_collectors=2, envs_per_collector=4, env_kwargs=SMALL_ENV)
    with pytest.raises(CollectorError, match=r"collector 1 .*signal 9") as info:
        runner.learn(100_000, callback=Killer())
    assert time.monotonic() - killed["t"] < 1.0
    assert info.value.exitcode == -signal.SIGKILL
    assert_no_children()
    model.replay_buffer.close()


@pytest.mark.parametrize("exc", [KeyboardInterrupt, ValueError])
def test_learner_or_callback_exception_stops_collectors_within_5s(exc):
    model = make_sac(learning_starts=10)
    raised = {}

    class Raiser(BaseCallback):
        def _on_step(self):
            if self.num_timesteps >= 50:
                raised["t"] = time.monotonic()
                raise exc("stop now")
            return True

    runner = AsyncRunner(model, env_id=ID, num_collectors=2, envs_per_collector=4, env_kwargs=SMALL_ENV)
    segments = runner_segments(runner)
    with pytest.raises(exc):
        runner.learn(100_000, callback=Raiser())
    assert time.monotonic() - raised["t"] < 5.0
    assert runner.closed
    assert_no_children()
    assert not any(os.path.exists(s) for s in segments)
    runner.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        runner.learn(10)
    model.replay_buffer.close()


_SIGINT_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from test_async_runner import make_sac, runner_segments, ID, SMALL_ENV
from unilab_gym import AsyncRunner
from stable_baselines3.common.callbacks import BaseCallback

class Announce(BaseCallback):
    def _on_step(self):
        if self.num_timesteps >= 20 and not getattr(self, "done", False):
            self.done = True
            print("PIDS", *runner.collector_pids, flush=True)
            replay = "/dev/shm/" + self.model.replay_buffer.handle.name
            print("SEGMENTS", replay, *runner_segments(runner), flush=True)
        return True

model = make_sac(learning_starts=10)
runner = AsyncRunner(model, env_id=ID, num_collectors=2, envs_per_collector=4, env_kwargs=SMALL_ENV)
runner.learn(10_000_000, callback=Announce())
"""


def test_real_ctrl_c_in_the_learner_process_leaves_nothing_behind():
    code = _SIGINT_SCRIPT.format(tests=os.path.dirname(__file__))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()[1:]]
        segments = proc.stdout.readline().split()[1:]
    except BaseException:
        proc.kill()
        raise
    assert len(pids) == 2 and len(segments) == 3 and all(os.path.exists(s) for s in segments)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=30)
    assert time.monotonic() - sent < 5.0 + 2.0  # collectors joined within 5 s, plus interpreter exit
    assert "KeyboardInterrupt" in proc.stderr.read()
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not [s for s in segments if os.path.exists(s)]


def test_close_is_idempotent_and_context_manager_closes():
    model = make_sac()
    with AsyncRunner(model, env_id=ID) as runner:
        pass
    assert runner.closed
    runner.close()
    model.replay_buffer.close()
