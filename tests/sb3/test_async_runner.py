"""AsyncRunner: off-policy (replay ratio, backpressure, lag) and on-policy (rollouts, GAE, lag) training,
weight sync, callbacks, and the lifecycle / fault guarantees of both families (the same tests for each).

The learner-loop tests run over ``backend="inline"`` (no processes: seconds) and keep at least one
``backend="process"`` case for each behaviour; the tests of processes (kills, Ctrl-C, leaks, segments)
run on processes only."""

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
from pathlib import Path

import numpy as np
import psutil
import pytest

pytest.importorskip("stable_baselines3")
import _runner_envs
import torch
from _paths import HELPERS
from _runner_common import (
    BACKENDS,
    FAMILIES,
    ID,
    SMALL_ENV,
    assert_no_children,
    env_fn_kwargs,
    fast,
    make_model,
    make_ppo,
    make_sac,
    release,
    runner_segments,
)
from stable_baselines3 import A2C, PPO, SAC, TD3
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.callbacks import (
    BaseCallback,
    CheckpointCallback,
    EvalCallback,
    StopTrainingOnRewardThreshold,
)

from unilab_gym import AsyncRunner, CollectorError, SharedReplayBuffer
from unilab_gym.runtime.rollout import RolloutStorage
from unilab_gym.runtime.weights import SharedWeights

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny networks on busy cores

#: Slack added to the documented fault latencies (a collector's fault reaches learn() within 1 s, collectors stop
#: within 5 s: docs/async-runner.md), which an idle machine meets: on a loaded 2-core CI machine the learner and the
#: collectors wait seconds for a CPU (one collector step there took over 2 s). The bounds still tell the fault paths
#: from the slow one that would otherwise end such a run (collector_timeout_s, 60 s by default); that a fault is
#: noticed in the middle of a train() is asserted by the number of updates, not by time.
LOAD_SLACK_S = 9.0


class Recorder(BaseCallback):
    """Records (num_timesteps, n_updates, replay buffer size) at every on_step."""

    def __init__(self):
        super().__init__()
        self.rows = []

    def _on_step(self):
        self.rows.append((self.model.num_timesteps, self.model._n_updates, self.model.replay_buffer.size()))
        return True


# --------------------------------------------------------------------------- training and accounting
@pytest.mark.parametrize("backend", BACKENDS)
def test_sac_learns_with_exact_replay_ratio_and_stats(tmp_path, backend):
    model = make_sac(learning_starts=200, train_freq=1, gradient_steps=1)
    rec = Recorder()
    with AsyncRunner(
        model,
        env_id=ID,
        num_collectors=2,
        envs_per_collector=4,
        env_kwargs=SMALL_ENV,
        replay_ratio=0.25,
        backend=backend,
    ) as runner:
        assert runner.replay_ratio == 0.25
        runner.learn(1200, callback=rec, log_interval=1)
        pids = runner.collector_pids
        status = runner.collector_status()
        segments = runner_segments(runner) if backend == "process" else []
        if backend == "process":
            assert len(pids) == 2 and all(psutil.pid_exists(p) for p in pids) and os.getpid() not in pids
            assert all(os.path.exists(s) for s in segments)
        else:
            assert pids == [os.getpid()] * 2  # the learner's own process
    assert all(s["env_steps"] > 0 for s in status)  # both collectors collected
    if backend == "inline":  # nothing steps after learn() returns: the counters are the replay's rows
        assert sum(s["env_steps"] for s in status) == model.replay_buffer.size()
    assert model.num_timesteps == 1200
    assert model._n_updates == math.floor((1200 - 200) * 0.25)
    # the learner never trained ahead of the data, nor before learning_starts
    for steps, updates, _ in rec.rows:
        assert updates <= max(0, math.floor((steps - 200) * 0.25))
    assert len(rec.rows) == 1200  # on_step once per model.n_envs (=1) env steps, as SB3 calls it
    assert len(model.ep_info_buffer) > 0 and all(e["l"] == 20 for e in model.ep_info_buffer)
    assert model.replay_buffer.size() >= 1200
    if backend == "process":
        assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)
        assert not any(os.path.exists(s) for s in segments)  # the model's replay stays, for the model
    replay = f"/dev/shm/{model.replay_buffer.handle.name}"
    model.replay_buffer.close()
    assert not os.path.exists(replay)


def test_default_replay_ratio_maps_sb3_train_freq_and_gradient_steps():
    from unilab_gym.sb3.vec_env import make_sb3_env

    env = make_sb3_env(ID, 4, seed=0, **SMALL_ENV)
    model = SAC("MlpPolicy", env, replay_buffer_class=SharedReplayBuffer, train_freq=2, gradient_steps=3, **fast())
    counts = dict(num_collectors=2, envs_per_collector=2)  # the model's 4 envs
    with AsyncRunner(model, env_id=ID, **counts) as runner:
        assert runner.replay_ratio == pytest.approx(3 / (2 * 4))
    model.gradient_steps = -1
    with AsyncRunner(model, env_id=ID, **counts) as runner:
        assert runner.replay_ratio == 1.0
    model.replay_buffer.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_td3_trains_and_backpressure_bounds_collectors(backend):
    from stable_baselines3.common.noise import NormalActionNoise

    from unilab_gym.sb3.vec_env import make_sb3_env

    env = make_sb3_env(ID, 1, seed=0, **SMALL_ENV)
    model = TD3(
        "MlpPolicy",
        env,
        replay_buffer_class=SharedReplayBuffer,
        learning_starts=100,
        seed=1,
        action_noise=NormalActionNoise(np.zeros(12), 0.1 * np.ones(12)),
        **fast(),
    )
    with AsyncRunner(
        model, env_fn=_runner_envs.quadruped, num_collectors=2, envs_per_collector=4, replay_ratio=1.0, backend=backend
    ) as runner:
        runner.learn(600)
        produced = runner._pool.counters.total_transitions()
    assert model._n_updates == 600 - 100
    # collectors never ran past the target by more than one step each
    assert 600 <= produced <= 600 + 2 * 4
    model.replay_buffer.close()


def test_a_replay_ratio_below_one_over_the_lead_still_trains():
    # lead = 2 collectors x 2 envs x 2 = 8 transitions; 0.05 x 8 < 1 gradient step: the budget must
    # still let collectors reach the next gradient step (it once deadlocked: learner and collectors waiting)
    model = make_sac(learning_starts=40, train_freq=1, gradient_steps=1)
    with AsyncRunner(
        model,
        env_id=ID,
        num_collectors=2,
        envs_per_collector=2,
        env_kwargs=SMALL_ENV,
        replay_ratio=0.05,
        backend="inline",  # the budget's arithmetic: the loop's, whatever the pool
    ) as runner:
        runner.learn(200)
    assert model._n_updates == math.floor((200 - 40) * 0.05)
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
        (dict(seed=-1), "seed"),
        (dict(seed=1.5), "seed"),
    ],
)
def test_bad_arguments(kwargs, match):
    model = make_sac()
    with pytest.raises(ValueError, match=match):
        AsyncRunner(model, **{"env_id": ID, **kwargs})
    model.replay_buffer.close()


def test_counts_accept_numpy_integers_and_refuse_bool():
    model = make_sac()
    with AsyncRunner(model, env_id=ID, num_collectors=np.int64(2), envs_per_collector=np.int32(3)) as runner:
        assert runner.num_collectors == 2 and type(runner.num_collectors) is int
        assert runner.envs_per_collector == 3 and type(runner.envs_per_collector) is int
    for kwargs in (dict(num_collectors=True), dict(envs_per_collector=True), dict(max_collector_restarts=False)):
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            AsyncRunner(model, env_id=ID, **kwargs)
    model.replay_buffer.close()


def test_plain_replay_buffer_is_refused_with_the_fix():
    from unilab_gym.sb3.vec_env import make_sb3_env

    model = SAC("MlpPolicy", make_sb3_env(ID, 1, **SMALL_ENV), **fast())
    with pytest.raises(ValueError, match=r"replay_buffer_class=unilab_gym.SharedReplayBuffer"):
        AsyncRunner(model, env_id=ID)


# --------------------------------------------------------------------------- weight sync
def _publisher(handle, versions, ready):
    weights = SharedWeights.attach(handle)
    # an attacher may not publish in real use; here a child plays the learner to race the reader
    ready.wait()
    for v in range(2, versions + 1):
        weights._header[0]
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


@pytest.mark.parametrize("backend", BACKENDS)
def test_policy_lag_is_bounded_and_logged(tmp_path, backend):
    from stable_baselines3.common.logger import configure

    model = make_sac(learning_starts=50)
    model.set_logger(configure(str(tmp_path), ["csv"]))
    lags = []

    class Lag(BaseCallback):
        def _on_step(self):
            lags.append(runner.policy_lag())
            return True

    with AsyncRunner(
        model,
        env_id=ID,
        num_collectors=2,
        envs_per_collector=4,
        env_kwargs=SMALL_ENV,
        max_policy_lag=1,
        replay_ratio=0.5,
        backend=backend,
    ) as runner:
        runner.learn(500, callback=Lag(), log_interval=1)
    assert max(lags) <= 1
    header = (tmp_path / "progress.csv").read_text().splitlines()[0]
    for key in ("unilab/policy_lag_mean", "unilab/policy_lag_max", "rollout/ep_rew_mean", "rollout/ep_len_mean"):
        assert key in header
    model.replay_buffer.close()


# --------------------------------------------------------------------------- on-policy: rollouts, GAE, lag
ROLLOUT_FIELDS = [
    "observations",
    "actions",
    "rewards",
    "episode_starts",
    "values",
    "log_probs",
    "advantages",
    "returns",
]


class RolloutRecorder(BaseCallback):
    """Records callback events, and at each rollout end the rollout buffer and the policy's weights."""

    def __init__(self):
        super().__init__()
        self.events, self.rollouts, self.policies = [], [], []

    def _on_rollout_start(self):
        self.events.append(("start", self.model.num_timesteps))

    def _on_step(self):
        self.events.append(("step", self.model.num_timesteps))
        return True

    def _on_rollout_end(self):
        self.events.append(("end", self.model.num_timesteps))
        buffer = self.model.rollout_buffer
        self.rollouts.append({k: getattr(buffer, k).copy() for k in ROLLOUT_FIELDS})
        self.policies.append({k: v.clone() for k, v in self.model.policy.state_dict().items()})


def test_returns_and_advantages_equal_sb3_for_the_same_rollout_data():
    from gymnasium import spaces

    n_steps, n_envs = 9, 5
    rng = np.random.default_rng(0)
    storage = RolloutStorage.create(n_steps, n_envs, (3,), 2, num_collectors=1)
    slot = 1
    data = {
        "observations": rng.normal(size=(n_steps, n_envs, 3)),
        "actions": rng.normal(size=(n_steps, n_envs, 2)),
        "rewards": rng.normal(size=(n_steps, n_envs)),
        "episode_starts": rng.random((n_steps, n_envs)) < 0.3,
        "values": rng.normal(size=(n_steps, n_envs)),
        "log_probs": rng.normal(size=(n_steps, n_envs)),
    }
    data["episode_starts"][0] = True
    for name, value in data.items():
        getattr(storage, name)[slot] = value
    storage.last_values[slot] = last_values = rng.normal(size=n_envs).astype(np.float32)
    storage.last_dones[slot] = last_dones = rng.random(n_envs) < 0.5
    obs_space, act_space = spaces.Box(-10, 10, (3,), np.float32), spaces.Box(-1, 1, (2,), np.float32)

    ours = RolloutBuffer(n_steps, obs_space, act_space, gamma=0.9, gae_lambda=0.8, n_envs=n_envs)
    storage.fill(ours, slot)
    theirs = RolloutBuffer(n_steps, obs_space, act_space, gamma=0.9, gae_lambda=0.8, n_envs=n_envs)
    f32 = {k: np.asarray(v, np.float32) for k, v in data.items()}
    for t in range(n_steps):  # what SB3's collect_rollouts does
        theirs.add(
            f32["observations"][t],
            f32["actions"][t],
            f32["rewards"][t],
            f32["episode_starts"][t],
            torch.as_tensor(f32["values"][t]),
            torch.as_tensor(f32["log_probs"][t]),
        )
    theirs.compute_returns_and_advantage(last_values=torch.as_tensor(last_values), dones=last_dones)
    for name in ROLLOUT_FIELDS:
        np.testing.assert_array_equal(getattr(ours, name), getattr(theirs, name), err_msg=name)
    assert ours.full and ours.pos == n_steps
    # and the advantages are not trivially equal: an episode start cuts the bootstrap
    assert np.abs(ours.advantages).sum() > 0
    path = f"/dev/shm/{storage.handle.name}"
    storage.close()
    assert not os.path.exists(path)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ppo_one_collector_lag0_equals_stock_sb3_bit_for_bit_and_reruns_identically(backend):
    """Same seed, same data: one collector of 8 envs trains exactly what stock SB3 PPO trains on 8 envs."""
    from unilab_gym.sb3.vec_env import make_sb3_env

    env_kwargs = dict(max_episode_steps=10, envs_per_cluster=4)  # truncations (bootstrap) in every rollout

    def make():
        env = make_sb3_env(ID, 8, seed=3, **env_kwargs)
        return PPO(
            "MlpPolicy", env, n_steps=32, batch_size=64, n_epochs=2, seed=3, policy_kwargs=dict(net_arch=[32, 32])
        )

    stock, stock_rec = make(), RolloutRecorder()
    torch.manual_seed(3)  # the collector seeds torch with seed + 0 before its first action
    stock.learn(3 * 256, callback=stock_rec)
    assert all(r["episode_starts"][1:].any() for r in stock_rec.rollouts)  # episodes ended inside each rollout
    runs = []
    for _ in range(2):
        model, rec = make(), RolloutRecorder()
        with AsyncRunner(
            model, env_id=ID, num_collectors=1, envs_per_collector=8, env_kwargs=env_kwargs, backend=backend
        ) as runner:
            assert runner.seed == 3 and runner.max_policy_lag == 0
            runner.learn(3 * 256, callback=rec)
        runs.append(model)
        assert rec.events == stock_rec.events
        for k, (ours, theirs) in enumerate(zip(rec.rollouts, stock_rec.rollouts, strict=True)):
            for name in ROLLOUT_FIELDS:
                np.testing.assert_array_equal(ours[name], theirs[name], err_msg=f"rollout {k} {name}")
    for model in runs:
        assert model._n_updates == stock._n_updates == 3 * 2
        for (name, ours), theirs in zip(model.policy.state_dict().items(), stock.policy.state_dict().values()):
            assert torch.equal(ours, theirs), name


@pytest.mark.parametrize("algo, lag, backend", [(PPO, 1, "inline"), (PPO, 1, "process"), (A2C, 0, "inline")])
def test_on_policy_two_collectors_callbacks_logs_and_behaviour_policy(tmp_path, algo, lag, backend):
    from stable_baselines3.common.logger import configure

    model = make_ppo(8, algo=algo)
    model.set_logger(configure(str(tmp_path), ["csv"]))
    rec = RolloutRecorder()
    rollouts = 5
    with AsyncRunner(
        model,
        env_id=ID,
        num_collectors=2,
        envs_per_collector=4,
        env_kwargs=SMALL_ENV,
        max_policy_lag=lag,
        backend=backend,
    ) as runner:
        runner.learn(rollouts * 16 * 8 - 3, callback=rec)  # SB3 rounds up to whole rollouts
    assert model.num_timesteps == rollouts * 16 * 8
    # SB3's order: on_rollout_start, on_step once per vector step (num_timesteps += n_envs), on_rollout_end
    expected = []
    for k in range(rollouts):
        expected += (
            [("start", k * 128)] + [("step", k * 128 + 8 * (t + 1)) for t in range(16)] + [("end", (k + 1) * 128)]
        )
    assert rec.events == expected
    assert model._n_updates == rollouts * (model.n_epochs if algo is PPO else 1)
    assert len(model.ep_info_buffer) > 0 and all(e["l"] == 20 for e in model.ep_info_buffer)

    import csv

    rows = list(csv.DictReader((tmp_path / "progress.csv").read_text().splitlines()))
    for key in ("unilab/policy_lag_max", "rollout/ep_rew_mean", "rollout/ep_len_mean", "time/fps", "train/value_loss"):
        assert key in rows[0], key
    lags = [int(float(r["unilab/policy_lag_max"])) for r in rows]  # one rollout per log: its lag
    assert len(lags) == rollouts and lags[0] == 0
    assert set(lags) <= {0, lag} and (max(lags) == lag)
    # values and log-probs are the current (proximal) policy's, the learner's weights when the rollout is taken in;
    # a rollout collected lag_k updates ago (behaviour policy: those weights) has its advantages weighted by
    # pi_current / pi_behaviour (decoupled PPO); SB3's returns stay advantage + value, unweighted
    for k, (rollout, lag_k) in enumerate(zip(rec.rollouts, lags)):
        obs = torch.as_tensor(rollout["observations"].reshape(-1, 48))
        actions = torch.as_tensor(rollout["actions"].reshape(-1, 12))

        def evaluate(weights, obs=obs, actions=actions):
            model.policy.load_state_dict(weights)
            with torch.no_grad():
                values, log_probs, _ = model.policy.evaluate_actions(obs, actions)
            return values.numpy().ravel(), log_probs.numpy()

        values, log_probs = evaluate(rec.policies[k])
        np.testing.assert_allclose(values, rollout["values"].ravel(), atol=1e-5)
        np.testing.assert_allclose(log_probs, rollout["log_probs"].ravel(), atol=1e-4)
        unweighted = (rollout["returns"] - rollout["values"]).ravel()
        weights = np.exp(log_probs - evaluate(rec.policies[k - lag_k])[1])
        np.testing.assert_allclose(rollout["advantages"].ravel(), unweighted * weights, rtol=1e-4, atol=1e-5)
        if lag_k:  # the behaviour policy really differs: the weights are not all 1
            assert not np.allclose(weights, 1.0, atol=1e-4)


def test_collector_failure_during_a_long_train_is_reported_within_1s(tmp_path):
    """Lag 1: collectors run while the learner trains, so faults are checked between minibatches."""
    model = make_ppo(4, batch_size=8, n_epochs=300)  # one train() takes seconds
    stamp, training = str(tmp_path / "raised"), tmp_path / "training"

    class AnnounceTraining(BaseCallback):
        def _on_rollout_end(self):  # the learner calls train() right after this
            training.touch()

        def _on_step(self):
            return True

    # collectors fail on their first step once the learner is training on rollout 0: the slowest
    # collector is then collecting rollout 1 (lag 1), so at least one fails during that train()
    env_fn = functools.partial(
        _runner_envs.failing_quadruped,
        fail_at=-1,
        stamp_path=stamp,
        trigger_path=str(training),
        autoreset_mode="SameStep",
    )
    runner = AsyncRunner(model, env_fn=env_fn, num_collectors=2, envs_per_collector=2, max_policy_lag=1)
    with pytest.raises(CollectorError, match=r"raised RuntimeError: boom: simulated physics failure"):
        runner.learn(100_000, callback=AnnounceTraining())
    caught = time.time()
    raised = min(float(Path(f).read_text()) for f in glob.glob(stamp + ".*"))
    assert caught - raised < 1.0 + LOAD_SLACK_S
    assert model._n_updates < 300  # noticed in the middle of the first train() (300 epochs: seconds), not after it
    assert_no_children()


@pytest.mark.parametrize("backend", BACKENDS)
def test_on_policy_env_without_same_step_autoreset_is_reported(backend):
    model = make_ppo(4)
    runner = AsyncRunner(model, env_fn=_runner_envs.quadruped, num_collectors=1, envs_per_collector=4, backend=backend)
    with pytest.raises(CollectorError, match="autoreset_mode='SameStep'"):
        runner.learn(1_000)
    assert runner.closed


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(max_policy_lag=2), "max_policy_lag must be 0"),
        (dict(max_policy_lag=-1), "max_policy_lag must be 0"),
        (dict(replay_ratio=0.5), "replay_ratio is for off-policy"),
        (dict(num_collectors=3), r"make_sb3_env\(env_id, 12\)"),
        (dict(env_kwargs=dict(autoreset_mode="NextStep")), "SameStep"),
    ],
)
def test_on_policy_bad_arguments_are_refused_and_leak_nothing(monkeypatch, kwargs, match):
    created = []
    create = RolloutStorage.create
    monkeypatch.setattr(RolloutStorage, "create", lambda *a, **k: created.append(create(*a, **k)) or created[-1])
    model = make_ppo(8)
    stock_buffer = model.rollout_buffer
    with pytest.raises(ValueError, match=match):
        AsyncRunner(model, env_id=ID, **{"num_collectors": 2, "envs_per_collector": 4, **kwargs})
    assert all(s._segment.closed for s in created)
    assert model.rollout_buffer is stock_buffer


def test_an_on_policy_model_takes_one_open_runner_at_a_time():
    model = make_ppo(8)
    with (
        AsyncRunner(model, env_id=ID, num_collectors=2, envs_per_collector=4),
        pytest.raises(ValueError, match="another AsyncRunner"),
    ):
        AsyncRunner(model, env_id=ID, num_collectors=2, envs_per_collector=4)
    with AsyncRunner(model, env_id=ID, num_collectors=2, envs_per_collector=4):  # closed: free again
        pass


# --------------------------------------------------------------------------- callbacks, saving (both families)
@pytest.mark.parametrize("family, backend", [("sac", "inline"), ("ppo", "inline"), ("ppo", "process")])
def test_sb3_callbacks_checkpoint_eval_and_stop(tmp_path, family, backend):
    import gymnasium as gym

    model = make_sac(learning_starts=50) if family == "sac" else make_ppo(4)
    eval_env = gym.make(ID, max_episode_steps=10)
    stop = StopTrainingOnRewardThreshold(reward_threshold=-1e9, verbose=0)
    callbacks = [
        CheckpointCallback(save_freq=100, save_path=str(tmp_path / "ckpt")),
        EvalCallback(eval_env, eval_freq=200, n_eval_episodes=1, callback_on_new_best=stop, verbose=0),
    ]
    with AsyncRunner(
        model, env_id=ID, num_collectors=1, envs_per_collector=4, env_kwargs=SMALL_ENV, backend=backend
    ) as runner:
        runner.learn(10_000, callback=callbacks, progress_bar=True)
        # on_step is called once per model.n_envs env steps: the first evaluation (200 calls) stopped training
        assert model.num_timesteps == 200 * model.n_envs
        assert len(list((tmp_path / "ckpt").glob("*.zip"))) == 2
        # training resumes after a stop (PPO: the stopped rollout is dropped, as in SB3; one new rollout of 16 x 4)
        steps, updates = model.num_timesteps, model._n_updates
        runner.learn(64, reset_num_timesteps=False)  # SB3: 64 more env steps
        assert model.num_timesteps == steps + 64
        if family == "ppo":
            assert model._n_updates == updates + model.n_epochs
    release(model)


@pytest.mark.parametrize("family", FAMILIES)
def test_saved_model_loads_without_unilab_gym(tmp_path, family):
    model = make_sac(learning_starts=50) if family == "sac" else make_ppo(4)
    with AsyncRunner(
        model, env_id=ID, num_collectors=1, envs_per_collector=4, env_kwargs=SMALL_ENV, backend="inline"
    ) as runner:  # what is saved is the loop's business, whatever the pool
        runner.learn(200)
    model.save(tmp_path / "model")
    obs = np.zeros((1, 48), np.float32)
    expected = model.predict(obs, deterministic=True)[0]
    release(model)
    code = textwrap.dedent(f"""
        import sys, numpy as np
        sys.modules["unilab_gym"] = None  # importing it now fails
        from stable_baselines3 import {type(model).__name__} as Algo
        m = Algo.load({str(tmp_path / "model.zip")!r}, device="cpu")
        print(repr(m.predict(np.zeros((1, 48), np.float32), deterministic=True)[0].tolist()))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    np.testing.assert_allclose(eval(out.stdout.strip()), expected, rtol=1e-6)


# --------------------------------------------------------------------------- faults and cleanup (both families)
@pytest.mark.parametrize("family", FAMILIES)
def test_collector_exception_surfaces_within_1s_with_traceback(tmp_path, family):
    model = make_model(family, 4)
    stamp = str(tmp_path / "raised")
    env_fn = functools.partial(_runner_envs.failing_quadruped, fail_at=30, stamp_path=stamp, **env_fn_kwargs(family))
    runner = AsyncRunner(model, env_fn=env_fn, num_collectors=2, envs_per_collector=2)
    segments = runner_segments(runner)
    with pytest.raises(CollectorError) as info:
        runner.learn(100_000)
    caught = time.time()
    raised = min(float(Path(f).read_text()) for f in glob.glob(stamp + ".*"))
    assert caught - raised < 1.0 + LOAD_SLACK_S
    assert "boom: simulated physics failure" in str(info.value) and "Traceback" in info.value.traceback
    assert runner.closed
    assert_no_children()
    assert not any(os.path.exists(s) for s in segments)
    release(model)


@pytest.mark.parametrize("family", FAMILIES)
def test_sigkilled_collector_is_detected_within_1s(family):
    model = make_model(family, 8)
    killed = {}

    class Killer(BaseCallback):
        def _on_step(self):
            if self.num_timesteps >= 40 and not killed:
                os.kill(runner.collector_pids[1], signal.SIGKILL)
                killed["t"] = time.monotonic()
            return True

    runner = AsyncRunner(model, env_id=ID, num_collectors=2, envs_per_collector=4, env_kwargs=SMALL_ENV)
    segments = runner_segments(runner)
    with pytest.raises(CollectorError, match=r"collector 1 .*signal 9") as info:
        runner.learn(100_000, callback=Killer())
    assert time.monotonic() - killed["t"] < 1.0 + LOAD_SLACK_S
    assert info.value.exitcode == -signal.SIGKILL
    assert_no_children()
    assert not any(os.path.exists(s) for s in segments)
    release(model)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("exc", [KeyboardInterrupt, ValueError])
def test_learner_or_callback_exception_stops_collectors_within_5s(exc, family):
    model = make_model(family, 8)
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
    assert time.monotonic() - raised["t"] < 5.0 + LOAD_SLACK_S
    assert runner.closed
    assert_no_children()
    assert not any(os.path.exists(s) for s in segments)
    runner.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        runner.learn(10)
    release(model)


_SIGINT_SCRIPT = """
import sys
sys.path.insert(0, {helpers!r})
from _runner_common import make_model, runner_segments, ID, SMALL_ENV
from unilab_gym import AsyncRunner
from stable_baselines3.common.callbacks import BaseCallback

class Announce(BaseCallback):
    def _on_step(self):
        if self.num_timesteps >= 20 and not getattr(self, "done", False):
            self.done = True
            print("PIDS", *runner.collector_pids, flush=True)
            own = ["/dev/shm/" + self.model.replay_buffer.handle.name] if {family!r} == "sac" else []
            print("SEGMENTS", *own, *runner_segments(runner), flush=True)
        return True

if __name__ == "__main__":
    model = make_model({family!r}, 8)
    runner = AsyncRunner(model, env_id=ID, num_collectors=2, envs_per_collector=4, env_kwargs=SMALL_ENV)
    runner.learn(10_000_000, callback=Announce())
"""


@pytest.mark.parametrize("family", FAMILIES)
def test_real_ctrl_c_in_the_learner_process_leaves_nothing_behind(tmp_path, family):
    script = tmp_path / "learner.py"
    script.write_text(_SIGINT_SCRIPT.format(helpers=str(HELPERS), family=family))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()[1:]]
        segments = proc.stdout.readline().split()[1:]
        assert len(pids) == 2 and len(segments) == 4 and all(os.path.exists(s) for s in segments)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:  # never leave the learner running (it would train for hours)
            proc.kill()
            proc.wait()
    assert time.monotonic() - sent < 5.0 + 2.0 + LOAD_SLACK_S  # collectors joined within 5 s, plus interpreter exit
    assert "KeyboardInterrupt" in proc.stderr.read()
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not [s for s in segments if os.path.exists(s)]


@pytest.mark.parametrize("family", FAMILIES)
def test_close_is_idempotent_and_context_manager_closes(family):
    model = make_model(family, 8)
    counts = {} if family == "sac" else dict(num_collectors=2, envs_per_collector=4)  # sac: the defaults
    with AsyncRunner(model, env_id=ID, **counts) as runner:
        segments = runner_segments(runner)
        assert all(os.path.exists(s) for s in segments)
    assert runner.closed
    assert not any(os.path.exists(s) for s in segments)
    runner.close()
    if family == "ppo":
        assert type(model.rollout_buffer) is RolloutBuffer  # the model got its own buffer back
    release(model)


def test_ppo_lag1_trains_each_rollout_from_the_current_policy_with_importance_weights():
    """Decoupled PPO at lag 1: when train() starts, the buffer's log-probs and values are the current policy's
    (PPO's ratio starts at 1), and advantages carry pi_current / pi_behaviour; at lag 0 nothing is recomputed."""
    import torch

    for lag in (0, 1):
        model = make_ppo(8)
        starts = []
        stock_train = model.train

        def train(model=model, starts=starts, stock_train=stock_train):
            buf = model.rollout_buffer
            obs = torch.as_tensor(buf.observations.reshape(-1, *buf.obs_shape))
            actions = torch.as_tensor(buf.actions.reshape(-1, buf.action_dim))
            with torch.no_grad():
                values, log_prob, _ = model.policy.evaluate_actions(obs, actions)
            starts.append(
                (
                    np.abs(log_prob.numpy() - buf.log_probs.reshape(-1)).max(),
                    np.abs(values.numpy().ravel() - buf.values.reshape(-1)).max(),
                )
            )
            stock_train()

        model.train = train
        with AsyncRunner(model, env_id=ID, num_collectors=2, envs_per_collector=4, max_policy_lag=lag,
                         env_kwargs=SMALL_ENV, backend="inline") as runner:  # fmt: skip
            runner.learn(4 * 16 * 8)
        assert len(starts) == 4
        gaps = np.array(starts)
        # the first rollout is always collected with the current weights; at lag 1 the later ones are not,
        # and their log-probs and values were recomputed with the current policy
        assert gaps.max() < 1e-5, (lag, gaps)
