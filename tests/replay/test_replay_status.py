"""Status-aware sampling (issue 18, item 3): status frequencies follow weights x counts."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces
from scipy.stats import chisquare

from unilab_gym.replay.status import NORMAL, TERMINATED, TRUNCATED, check_status_weights, status_of
from unilab_gym.sb3.replay_buffer import SharedReplayBuffer

OBS = spaces.Box(-1, 1, (4,), np.float32)
ACT = spaces.Box(-1, 1, (1,), np.float32)
COUNTS = {NORMAL: 600, TERMINATED: 300, TRUNCATED: 100}


def filled(optimize=False, **kw):
    """1000 transitions: 600 normal, 300 terminated, 100 truncated; the action holds the status."""
    buf = SharedReplayBuffer(1000, OBS, ACT, n_envs=1, seed=0, optimize_memory_usage=optimize, **kw)
    status = np.repeat([NORMAL, TERMINATED, TRUNCATED], [COUNTS[NORMAL], COUNTS[TERMINATED], COUNTS[TRUNCATED]])
    status = np.random.default_rng(0).permutation(status)
    obs = np.zeros((1000, 4), np.float32)
    buf.storage.add(obs, obs, status[:, None].astype(np.float32), np.zeros(1000), status == TERMINATED,
                    status == TRUNCATED)  # fmt: skip
    return buf


def frequencies(buf, batches=200, batch_size=64):
    drawn = np.concatenate([buf.sample(batch_size).actions.numpy()[:, 0] for _ in range(batches)]).astype(int)
    return np.bincount(drawn, minlength=3)


@pytest.mark.parametrize(
    "weights",
    [None, {"normal": 1.0, "terminated": 2.0, "truncated": 5.0}, {"normal": 0.2, "terminated": 0.0, "truncated": 1.0}],
)
def test_status_frequencies_follow_weights_times_counts(weights):
    buf = filled(status_weights=weights)
    observed = frequencies(buf)
    w = np.ones(3) if weights is None else np.array([weights[s] for s in ("normal", "terminated", "truncated")])
    target = w * np.array([COUNTS[NORMAL], COUNTS[TERMINATED], COUNTS[TRUNCATED]])
    present = target > 0
    assert (observed[~present] == 0).all()
    expected = observed.sum() * target[present] / target[present].sum()
    assert chisquare(observed[present], expected).pvalue > 1e-3, (observed, expected)
    buf.close()


def test_weights_work_with_the_optimized_layout():
    buf = SharedReplayBuffer(200, OBS, ACT, n_envs=2, seed=0, optimize_memory_usage=True,
                             status_weights={"terminated": 10.0})  # fmt: skip
    rng = np.random.default_rng(1)
    obs = rng.standard_normal((2, 4)).astype(np.float32)
    for t in range(100):
        nxt = rng.standard_normal((2, 4)).astype(np.float32)
        done = np.array([t % 10 == 9, False])
        buf.add(obs, nxt, np.zeros((2, 1), np.float32), np.zeros(2), done, [{}, {}])
        obs = nxt
    dones = np.concatenate([buf.sample(64).dones.numpy()[:, 0] for _ in range(50)])
    # 10 of ~199 complete transitions are terminated: 10 * 10 / (10 * 10 + 189) ~ 0.35 of the draws
    assert 0.25 < dones.mean() < 0.45
    buf.close()


def test_status_codes_and_weight_validation():
    assert status_of(np.array([0, 1, 0, 1]), np.array([0, 0, 1, 1])).tolist() == [0, 1, 2, 2]
    assert check_status_weights(None) is None and check_status_weights({"normal": 2.0}) is not None
    assert check_status_weights({"normal": 1, "terminated": 1, "truncated": 1}) is None  # uniform
    cases = [
        ({"falls": 1.0}, "unknown"),
        ({"normal": -1.0}, "normal"),
        ({"truncated": float("nan")}, "nan"),
        ({"normal": 0, "terminated": 0, "truncated": 0}, "all zero"),
        ([1, 2, 3], "mapping"),
    ]
    for bad, match in cases:
        with pytest.raises(ValueError, match=match):
            SharedReplayBuffer(10, OBS, ACT, status_weights=bad)
