"""Live hyperparameters take effect where SB3 reads them; snapshots restore bit for bit (issue 16, items 1, 2, 5)."""

import json
import zipfile

import numpy as np
import pytest
import torch

pytest.importorskip("stable_baselines3")

from stable_baselines3 import PPO, SAC

from unilab_gym.sb3.control import ControlCallback, Controller

torch.set_num_threads(1)


def ppo(**kwargs):
    return PPO(
        "MlpPolicy",
        "Pendulum-v1",
        seed=0,
        policy_kwargs=dict(net_arch=[16]),
        **{"n_steps": 64, "batch_size": 32, "n_epochs": 1, **kwargs},
    )


def sac(**kwargs):
    return SAC(
        "MlpPolicy",
        "Pendulum-v1",
        policy_kwargs=dict(net_arch=[16]),
        **{"seed": 0, "learning_starts": 16, "batch_size": 16, **kwargs},
    )


class Recorded:
    """Spy on ``model.logger.record``: every value recorded under a key, in order."""

    def __init__(self, model):
        self.values = {}
        record = model.logger.record

        def spy(key, value, exclude=None):
            self.values.setdefault(key, []).append(value)
            return record(key, value, exclude)

        model.logger.record = spy


def learn(model, steps, control):
    model.learn(steps, callback=ControlCallback(port=None, snapshot_dir=control), reset_num_timesteps=False)


def test_learning_rate_is_not_undone_by_sb3_schedule(tmp_path):
    model = sac()
    control = Controller(model, snapshot_dir=tmp_path)
    model.learning_rate = 0.05  # what SB3 users try: _update_learning_rate re-applies lr_schedule (SB3 #735)
    model.learn(32)
    assert model.actor.optimizer.param_groups[0]["lr"] == pytest.approx(3e-4)
    control.set_hyperparameters({"learning_rate": 0.05})
    model.learn(32, reset_num_timesteps=False)
    optimizers = [model.actor.optimizer, model.critic.optimizer, model.ent_coef_optimizer]
    assert [o.param_groups[0]["lr"] for o in optimizers] == [0.05] * 3
    assert control.hyperparameters()["learning_rate"] == 0.05


def test_gamma_reaches_the_gae(tmp_path):
    model = ppo()
    Controller(model, snapshot_dir=tmp_path).set_hyperparameters({"gamma": 0.5})
    seen = {}
    compute = model.rollout_buffer.compute_returns_and_advantage

    def spy(last_values, dones):
        seen["last"], seen["dones"] = last_values.clone().numpy().ravel(), np.asarray(dones, np.float32)
        return compute(last_values, dones)

    model.rollout_buffer.compute_returns_and_advantage = spy
    model.learn(64)
    buf = model.rollout_buffer
    # GAE (Schulman et al. 2016, eq. 16) with the new gamma, from the rollout as stored
    adv, last = np.zeros_like(buf.rewards), np.zeros(buf.n_envs, np.float32)
    for t in reversed(range(buf.buffer_size)):
        if t == buf.buffer_size - 1:
            not_done, next_v = 1.0 - seen["dones"], seen["last"]
        else:
            not_done, next_v = 1.0 - buf.episode_starts[t + 1], buf.values[t + 1]
        delta = buf.rewards[t] + 0.5 * next_v * not_done - buf.values[t]
        last = delta + 0.5 * buf.gae_lambda * not_done * last
        adv[t] = last
    np.testing.assert_allclose(buf.advantages, adv, rtol=1e-5, atol=1e-6)
    assert model.gamma == 0.5


@pytest.mark.parametrize("built, new, used", [(0.1, 0.3, 0.3), ("auto_0.1", "auto_0.05", 0.05)])
def test_sac_entropy_coefficient_used_in_the_loss(tmp_path, built, new, used):
    model = sac(ent_coef=built, gradient_steps=1)
    model.learn(20)
    control = Controller(model, snapshot_dir=tmp_path)
    control.set_hyperparameters({"ent_coef": new})
    spy = Recorded(model)
    model.train(gradient_steps=1, batch_size=16)
    assert spy.values["train/ent_coef"] == [pytest.approx(used, rel=1e-6)]
    # the mode the model was built with stays: the other kind of value is refused, nothing changes
    other = "auto" if isinstance(built, float) else 0.2
    with pytest.raises(ValueError, match="ent_coef"):
        control.set_hyperparameters({"ent_coef": other})
    assert control.hyperparameters()["ent_coef"] == new


def test_clip_range_n_epochs_and_batch_size_reach_ppo_train(tmp_path):
    model = ppo(n_epochs=1)
    model.learn(64)
    Controller(model, snapshot_dir=tmp_path).set_hyperparameters({"clip_range": 0.05, "n_epochs": 3, "batch_size": 16})
    spy = Recorded(model)
    ratios = []
    evaluate = model.policy.evaluate_actions

    def spy_evaluate(obs, actions):
        ratios.append(len(obs))  # one call per minibatch
        return evaluate(obs, actions)

    model.policy.evaluate_actions = spy_evaluate
    model.train()  # on the rollout learn() collected
    assert spy.values["train/clip_range"] == [0.05]  # the value train() clamps the ratio with
    assert model._n_updates == 1 + 3  # n_epochs: 1 before, 3 after
    assert ratios == [16] * (3 * 64 // 16)


def test_bad_values_and_unknown_names_change_nothing(tmp_path):
    model = ppo()
    control = Controller(model, snapshot_dir=tmp_path)
    before = control.hyperparameters()
    lr = model.policy.optimizer.param_groups[0]["lr"]
    bad = [
        ({"learning_rate": 1e-3, "n_epochs": 0}, r"n_epochs must be an int in \[1, 100\], got 0"),
        ({"n_epochs": 10**6}, r"n_epochs must be an int in \[1, 100\]"),  # would stall the run in train()
        ({"learning_rate": 1e9}, r"learning_rate must be a finite number > 0\.0 and <= 1\.0"),  # NaN weights, no error
        ({"gamma": 1.5}, "gamma must be a finite number >= 0.0 and <= 1.0"),
        ({"learning_rate": float("nan")}, "learning_rate"),
        ({"batch_size": True}, "batch_size must be an int"),
        ({"batch_size": 65}, r"batch_size must be an int in \[2, 64\]"),
        ({"clip_range": "0.1"}, "clip_range"),
        ({"learning_rate": 1e-3, "bogus": 1}, "'bogus' is not a live hyperparameter"),
        ({"tau": 0.5}, "'tau' is not live for this model"),
        ({"max_policy_lag": 1}, "max_policy_lag"),
        ({}, "at least one"),
    ]
    for values, match in bad:
        with pytest.raises(ValueError, match=match):
            control.set_hyperparameters(values)
    assert control.hyperparameters() == before
    assert model.policy.optimizer.param_groups[0]["lr"] == lr
    assert control.hyperparameter_history() == []


def test_history_logger_and_snapshot_on_change(tmp_path):
    model = sac(gradient_steps=1, train_freq=1)
    model.learn(20)
    control = Controller(model, snapshot_dir=tmp_path, snapshot_on_change=True)
    control.set_hyperparameters({"tau": 0.01, "replay_ratio": 2})
    assert model.tau == 0.01 and model.gradient_steps == 2
    with pytest.raises(ValueError, match="multiple of 1 / \\(train_freq \\* n_envs\\)"):
        control.set_hyperparameters({"replay_ratio": 0.3})
    with pytest.raises(ValueError, match=r"replay_ratio must be a finite number >= 0\.0 and <= 64\.0"):
        control.set_hyperparameters({"replay_ratio": 1e6})
    with pytest.raises(ValueError, match=r"gradient_steps must be an int in \[-1, 64\]"):  # 10**9 stalls train()
        control.set_hyperparameters({"gradient_steps": 10**9})
    history = control.hyperparameter_history()
    assert [(h["name"], h["old"], h["new"], h["source"]) for h in history] == [
        ("tau", 0.005, 0.01, "python"),
        ("replay_ratio", 1.0, 2.0, "python"),
    ]
    assert set(history[0]) == {"time", "num_timesteps", "name", "old", "new", "source"}
    assert history[0]["num_timesteps"] == 20
    assert model.logger.name_to_value["unilab/hparams/tau"] == 0.01
    (snap,) = control.snapshots()  # taken before the change, with the values then in force
    assert snap["hyperparameters"]["tau"] == 0.005 and snap["bytes"] > 0
    assert set(snap) >= {"id", "time", "num_timesteps", "hyperparameters", "bytes"}


def test_restore_is_bit_identical_with_optimizers_and_replay(tmp_path):
    model = sac(ent_coef="auto_0.1")
    model.learn(40)
    control = Controller(model, snapshot_dir=tmp_path)
    sid = control.snapshot(include_replay=True)
    state = {k: v.clone() for k, v in model.policy.state_dict().items()}
    adam = model.actor.optimizer.state_dict()["state"][0]["exp_avg"].clone()
    log_ent = model.log_ent_coef.detach().clone()
    size = model.replay_buffer.size()
    control.set_hyperparameters({"learning_rate": 1e-2, "gamma": 0.9})
    model.learn(40, reset_num_timesteps=False)
    assert not torch.equal(model.log_ent_coef.detach(), log_ent)
    assert control.restore(sid)["learning_rate"] == 3e-4
    assert all(torch.equal(v, state[k]) for k, v in model.policy.state_dict().items())
    assert torch.equal(model.actor.optimizer.state_dict()["state"][0]["exp_avg"], adam)
    assert torch.equal(model.log_ent_coef.detach(), log_ent)
    assert model.gamma == 0.99 and model.actor.optimizer.param_groups[0]["lr"] == 3e-4
    assert model.replay_buffer.size() == size
    assert model.num_timesteps == 80  # counters keep counting
    with pytest.raises(KeyError, match="no snapshot 'nope'"):
        control.restore("nope")
    loaded = SAC.load(tmp_path / f"{sid}.zip")  # an ordinary SB3 file
    assert all(torch.equal(v, state[k]) for k, v in loaded.policy.state_dict().items())


def test_batch_size_is_bounded_by_the_replay(tmp_path):
    model = sac(buffer_size=500)
    control = Controller(model, snapshot_dir=tmp_path)
    with pytest.raises(ValueError, match=r"batch_size must be an int in \[1, 500\].*replay's capacity") as info:
        control.set_hyperparameters({"batch_size": 1_000_000_000})
    assert info.value.field == "batch_size" and model.batch_size == 16
    assert control.set_hyperparameters({"batch_size": 500})["batch_size"] == 500


def test_a_change_that_fails_the_next_gradient_step_is_rolled_back_and_training_goes_on(tmp_path):
    model = sac()
    model.learn(20)
    control = Controller(model, snapshot_dir=tmp_path)
    sample = model.replay_buffer.sample

    def allocate(batch_size, env=None):  # a batch this large does not fit in memory
        if batch_size > 32:
            raise MemoryError(f"cannot allocate a batch of {batch_size}")
        return sample(batch_size, env)

    model.replay_buffer.sample = allocate
    control.set_hyperparameters({"batch_size": 64, "tau": 0.01})
    model.save(tmp_path / "during.zip")  # the change on trial is not part of a saved model
    with zipfile.ZipFile(tmp_path / "during.zip") as archive:
        assert "train" not in json.loads(archive.read("data"))
    updates = model._n_updates
    with pytest.warns(UserWarning, match=r"batch_size=64, tau=0.01 made the next gradient step fail \(MemoryError"):
        model.learn(10, reset_num_timesteps=False)
    assert model.batch_size == 16 and model.tau == 0.005 and model._n_updates == updates + 10
    assert [(h["name"], h["old"], h["new"], h["source"]) for h in control.hyperparameter_history()] == [
        ("batch_size", 16, 64, "python"),
        ("tau", 0.005, 0.01, "python"),
        ("batch_size", 64, 16, "rollback"),
        ("tau", 0.01, 0.005, "rollback"),
    ]
    assert "train" not in vars(model)  # SB3's own train() again
    control.set_hyperparameters({"batch_size": 32})  # a change that works stays
    model.learn(5, reset_num_timesteps=False)
    assert model.batch_size == 32 and model._n_updates == updates + 15


def test_changes_since_the_last_gradient_step_are_rolled_back_together(tmp_path):
    model = sac()
    model.learn(20)
    control = Controller(model, snapshot_dir=tmp_path)
    sample = model.replay_buffer.sample
    model.replay_buffer.sample = lambda batch_size, env=None: (
        sample(batch_size, env) if batch_size <= 32 else np.empty(10**20)  # numpy's MemoryError
    )
    control.set_hyperparameters({"batch_size": 24})
    control.set_hyperparameters({"batch_size": 64, "gamma": 0.9})
    with pytest.warns(UserWarning, match="rolled back to batch_size=16, gamma=0.99"):
        model.learn(4, reset_num_timesteps=False)
    assert (model.batch_size, model.gamma) == (16, 0.99)
