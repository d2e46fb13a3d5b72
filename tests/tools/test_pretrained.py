"""The policy shipped under examples/pretrained/ walks on the default task (issue 15)."""

from pathlib import Path

import pytest
from stable_baselines3 import PPO

from unilab_gym.evaluation import evaluate_gait

PRETRAINED = Path(__file__).resolve().parents[2] / "examples" / "pretrained"
MODEL, STATS = PRETRAINED / "ppo_quadruped.zip", PRETRAINED / "ppo_quadruped_vecnormalize.pkl"


def test_shipped_files_stay_small():
    for path in (MODEL, STATS):
        assert path.stat().st_size <= 2 * 1024**2, path


@pytest.mark.timeout(600)
def test_pretrained_policy_tracks_the_command_without_falling():
    model = PPO.load(MODEL, device="cpu")
    gait = evaluate_gait(model, n_episodes=4, vecnormalize=STATS, seed=10_000)
    assert gait["episodes"] == 4
    assert gait["tracking_error_mps"] <= 0.15, gait
    assert gait["fall_rate"] == 0.0, gait
    assert 0.229 <= gait["base_height_m"] <= 0.309, gait  # within 15% of the 0.269 m nominal standing height
