"""evaluate_gait: keys, determinism, and figures that mean what they say on policies whose gait we know."""

from __future__ import annotations

import numpy as np
import pytest

from unilab_gym.evaluation import FEET, evaluate_gait, record_gait, urdf_mass
from unilab_gym.sim import a1

KEYS = {
    "return_mean",
    "return_std",
    "tracking_error_mps",
    "fall_rate",
    "duty_factor",
    "cost_of_transport",
    "base_height_m",
    "tilt_rad",
    "episodes",
}


class Constant:
    """An SB3-like model that always outputs the same action (the zero action stands in the nominal pose)."""

    def __init__(self, value: float = 0.0):
        self.value = value
        self.calls = 0

    def predict(self, obs, deterministic=True):
        self.calls += 1
        return np.full((obs.shape[0], a1.NUM_JOINTS), self.value, np.float32), None


class Noisy:
    """Random actions from its own seeded stream (deterministic across runs)."""

    def __init__(self):
        self.rng = np.random.default_rng(0)

    def predict(self, obs, deterministic=True):
        return self.rng.uniform(-1, 1, (obs.shape[0], a1.NUM_JOINTS)).astype(np.float32), None


def test_standing_policy_keys_and_figures():
    out = evaluate_gait(Constant(), n_episodes=4, seed=3)
    assert set(out) == KEYS and out["episodes"] == 4
    assert out["fall_rate"] == 0.0
    assert out["duty_factor"] > 0.95  # all four feet stay on the ground
    assert 0.2 < out["base_height_m"] < 0.35 and out["tilt_rad"] < 0.05
    # commands are uniform in [0.3, 1.0] m/s: standing still misses them by about their mean
    assert 0.3 < out["tracking_error_mps"] < 1.0
    assert 0.0 < out["cost_of_transport"] < np.inf
    assert out["return_std"] >= 0.0


def test_same_seed_same_result_and_other_seed_differs():
    first = evaluate_gait(Noisy(), n_episodes=3, seed=7)
    again = evaluate_gait(Noisy(), n_episodes=3, seed=7)
    other = evaluate_gait(Noisy(), n_episodes=3, seed=8)
    assert first == again
    assert first != other


class TorchSampler:
    """Samples its actions from torch's global generator when ``deterministic=False``, as SB3 policies do."""

    def predict(self, obs, deterministic=True):
        import torch

        if deterministic:
            return np.zeros((obs.shape[0], a1.NUM_JOINTS), np.float32), None
        return (0.3 * torch.randn(obs.shape[0], a1.NUM_JOINTS)).numpy(), None


def test_sampled_actions_are_deterministic_for_a_seed_and_leave_torchs_generator_alone():
    import torch

    torch.manual_seed(123)
    state = torch.random.get_rng_state()
    first = record_gait(TorchSampler(), n_episodes=2, seed=5, deterministic=False, max_episode_steps=30)
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's generator is restored
    torch.manual_seed(999)  # whatever the global state, the same seed gives the same episodes
    again = record_gait(TorchSampler(), n_episodes=2, seed=5, deterministic=False, max_episode_steps=30)
    other = record_gait(TorchSampler(), n_episodes=2, seed=6, deterministic=False, max_episode_steps=30)
    assert first.summary() == again.summary()
    np.testing.assert_array_equal(first.returns, again.returns)
    assert first.summary() != other.summary()


def test_falling_policy_counts_falls_and_stops_counting_finished_episodes():
    record = record_gait(Constant(1.0), n_episodes=3, seed=0, max_episode_steps=200)
    summary = record.summary()
    assert record.terminated.all() and summary["fall_rate"] == 1.0  # full joint targets fold the robot over
    assert (record.lengths < 200).all()
    assert record.duty_factor.shape == (3, len(FEET))
    assert np.all((record.duty_factor >= 0) & (record.duty_factor <= 1))
    truncated = record_gait(Constant(), n_episodes=2, seed=0, max_episode_steps=30)
    assert list(truncated.lengths) == [30, 30] and not truncated.terminated.any()


def test_vecnormalize_statistics_are_applied_from_an_object_or_a_path(tmp_path):
    from stable_baselines3.common.vec_env import VecNormalize

    from unilab_gym.sb3.vec_env import make_sb3_env

    seen = []

    class Recorder(Constant):
        def predict(self, obs, deterministic=True):
            seen.append(obs.copy())
            return super().predict(obs, deterministic)

    venv = make_sb3_env("UniLab/Quadruped-v0", 2, seed=0)
    vn = VecNormalize(venv)
    vn.obs_rms.mean[:] = 1.0
    vn.obs_rms.var[:] = 4.0
    vn.save(tmp_path / "stats.pkl")
    venv.close()
    record_gait(Recorder(), n_episodes=2, seed=0, vecnormalize=vn, max_episode_steps=2)
    from_object = seen[0]
    seen.clear()
    record_gait(Recorder(), n_episodes=2, seed=0, vecnormalize=tmp_path / "stats.pkl", max_episode_steps=2)
    np.testing.assert_array_equal(seen[0], from_object)
    seen.clear()
    record_gait(Recorder(), n_episodes=2, seed=0, max_episode_steps=2)
    np.testing.assert_allclose(from_object, np.clip((seen[0] - 1.0) / np.sqrt(4.0 + 1e-8), -10, 10), atol=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n_episodes": 0}, "n_episodes"),
        ({"n_episodes": True}, "n_episodes"),
        ({"seed": -1}, "seed"),
        ({"vecnormalize": 3}, "vecnormalize"),
        ({"env_id": "CartPole-v1"}, "UniLabVectorEnv"),
    ],
)
def test_bad_arguments_raise_clear_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        evaluate_gait(Constant(), **kwargs)


def test_model_without_predict_is_refused():
    with pytest.raises(ValueError, match="predict"):
        evaluate_gait(object())


def test_urdf_mass_is_the_a1s():
    assert 11.0 < urdf_mass() < 13.5  # Unitree A1: about 12 kg
