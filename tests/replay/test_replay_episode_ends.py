"""No silently dropped episode ends in the memory-optimized layout (issue 29, item 6).

Short episodes (lengths 1-15) are streamed through the plain and the optimized layout. Every
terminal transition the optimized ring can still sample is sampled at the plain layout's rate;
a side table too small for the episode-end rate retires the oldest rows with their ends (and
warns, naming ``final_obs_capacity``) instead of silently dropping the ends.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from gymnasium import spaces
from scipy import stats

from unilab_gym import SharedReplayBuffer
from unilab_gym.replay import ReplayStorage, final_obs_capacity_for

OBS = spaces.Box(-1e6, 1e6, (3,), np.float32)  # (env, episode, step): every transition is unique
ACT = spaces.Box(-1.0, 1.0, (1,), np.float32)
N_ENVS = 4
CAPACITY = 2000
SAMPLES = 200  # batches of 256: 51,200 draws


def stream(buffers, steps, lengths=(1, 15), seed=0):
    """Add ``steps`` vector steps of short episodes (lengths uniform in ``lengths``, ends
    terminated or truncated at random) to every buffer's storage; the same rows to each."""
    rng = np.random.default_rng(seed)
    episode = np.arange(N_ENVS, dtype=np.float32) * 1000
    t = np.zeros(N_ENVS, np.float32)
    length = rng.integers(lengths[0], lengths[1] + 1, N_ENVS)
    env = np.arange(N_ENVS, dtype=np.float32)
    for _ in range(steps):
        obs = np.stack([env, episode, t], axis=1)
        nxt = np.stack([env, episode, t + 1], axis=1)  # at an end: the episode's final observation
        done = t + 1 >= length
        timeout = done & (rng.random(N_ENVS) < 0.5)
        row = dict(obs=obs, next_obs=nxt, action=np.zeros((N_ENVS, 1), np.float32), reward=t)
        for buf in buffers:
            buf.storage.add(**row, terminated=done & ~timeout, truncated=timeout)
        t = np.where(done, 0, t + 1).astype(np.float32)
        episode = np.where(done, episode + 1, episode).astype(np.float32)
        length = np.where(done, rng.integers(lengths[0], lengths[1] + 1, N_ENVS), length)


def ring(storage):
    """The transitions the storage may sample now: ``(seq, fields)`` of every complete row of
    ``[oldest, head)`` (an optimized ring's newest row per env waits for its successor)."""
    seq = np.arange(storage.oldest, storage.reserved, dtype=np.int64)
    fields, ok = storage.gather_fields(seq)
    return seq[ok], {name: value[ok] for name, value in fields.items()}, ok


def status(fields):
    """0 normal, 1 terminated, 2 truncated."""
    return np.where(fields["truncated"] != 0, 2, np.where(fields["terminated"] != 0, 1, 0))


def draws(storage, seed=1):
    rng = np.random.default_rng(seed)
    seqs, statuses = [], []
    for _ in range(SAMPLES):
        seq, fields = storage.sample_fields(256, rng)
        seqs.append(seq)
        statuses.append(status(fields))
        np.testing.assert_array_equal(fields["next_obs"][:, :2], fields["obs"][:, :2])  # same episode
        np.testing.assert_array_equal(fields["next_obs"][:, 2], fields["obs"][:, 2] + 1)
    return np.concatenate(seqs), np.concatenate(statuses)


def assert_ends_sampled_at_the_plain_rate(storage):
    """Every terminal transition the ring holds is drawable, and each is drawn as often as any
    row of the ring (chi-square goodness of fit of the status shares and of the counts per end)."""
    seq, fields, ok = ring(storage)
    assert (~ok).sum() <= N_ENVS  # every row of [oldest, head) but each env's newest can be drawn
    end = status(fields) != 0
    assert end.sum() > 50
    drawn, drawn_status = draws(storage)
    assert np.isin(drawn, seq).all()
    expected = np.bincount(status(fields), minlength=3) / seq.shape[0] * drawn.shape[0]
    observed = np.bincount(drawn_status, minlength=3)
    assert stats.chisquare(observed, expected).pvalue > 1e-3, (observed, expected)
    per_end = np.searchsorted(seq[end], drawn[np.isin(drawn, seq[end])])
    counts = np.bincount(per_end, minlength=int(end.sum()))
    assert (counts > 0).all()  # every episode end of the ring was drawn
    assert stats.chisquare(counts).pvalue > 1e-3


def test_short_episodes_with_the_default_side_table_drop_no_episode_end():
    plain = SharedReplayBuffer(CAPACITY, OBS, ACT, n_envs=N_ENVS, seed=0)
    small = SharedReplayBuffer(CAPACITY, OBS, ACT, n_envs=N_ENVS, seed=0, optimize_memory_usage=True)
    try:
        assert small.layout.final_obs == CAPACITY // 25  # the default: sized for ~25-step episodes
        with pytest.warns(RuntimeWarning, match="final_obs_capacity"):
            stream([plain, small], 3 * CAPACITY // N_ENVS)  # wraps the ring three times
        storage = small.storage
        assert storage.final_obs_evictions > 0
        assert storage.oldest > storage.reserved - CAPACITY  # the oldest rows were retired with their ends
        assert len(storage) == storage.reserved - storage.oldest
        assert_ends_sampled_at_the_plain_rate(storage)
        assert_ends_sampled_at_the_plain_rate(plain.storage)
        # the terminal share of the samples matches the plain layout's (old code: about 3x fewer)
        _, s_small = draws(storage)
        _, s_plain = draws(plain.storage)
        table = np.stack([np.bincount(s_small, minlength=3), np.bincount(s_plain, minlength=3)])
        share = table[:, 1:].sum(axis=1) / table.sum(axis=1)
        assert abs(share[0] / share[1] - 1) < 0.25, share
    finally:
        small.close()
        plain.close()


@pytest.mark.parametrize("shortest", [1, 5])
def test_a_side_table_sized_from_the_shortest_episode_keeps_every_end_of_the_ring(shortest):
    capacity = final_obs_capacity_for(CAPACITY, shortest, N_ENVS)
    plain = SharedReplayBuffer(CAPACITY, OBS, ACT, n_envs=N_ENVS, seed=0)
    small = SharedReplayBuffer(
        CAPACITY, OBS, ACT, n_envs=N_ENVS, seed=0, optimize_memory_usage=True, final_obs_capacity=capacity
    )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            stream([plain, small], 3 * CAPACITY // N_ENVS, lengths=(shortest, 15))
            assert small.storage.final_obs_evictions == 0
            assert small.storage.oldest == plain.storage.oldest == small.storage.reserved - CAPACITY
            seq_p, fields_p, _ = ring(plain.storage)
            seq_s, fields_s, ok = ring(small.storage)
            assert (~ok).sum() <= N_ENVS  # only each env's newest row may wait for its successor
            # every terminal transition of the plain ring is in the optimized one, with its final obs
            ends = seq_p[status(fields_p) != 0]
            assert np.isin(ends, seq_s).all()
            for name in ("obs", "next_obs", "terminated", "truncated"):
                np.testing.assert_array_equal(fields_s[name], fields_p[name][np.isin(seq_p, seq_s)])
            assert_ends_sampled_at_the_plain_rate(small.storage)
            # same population: the status counts of the two layouts' draws agree (two-sample test)
            _, s_small = draws(small.storage, seed=2)
            _, s_plain = draws(plain.storage, seed=3)
            table = np.stack([np.bincount(s_small, minlength=3), np.bincount(s_plain, minlength=3)])
            assert stats.chi2_contingency(table).pvalue > 1e-3, table
    finally:
        small.close()
        plain.close()


def test_every_row_an_episode_end_is_the_worst_case():
    capacity = final_obs_capacity_for(CAPACITY, 1, N_ENVS)
    assert capacity == CAPACITY + 2 * N_ENVS
    small = SharedReplayBuffer(
        CAPACITY, OBS, ACT, n_envs=N_ENVS, seed=0, optimize_memory_usage=True, final_obs_capacity=capacity
    )
    try:
        stream([small], 3 * CAPACITY // N_ENVS, lengths=(1, 1))
        assert small.storage.final_obs_evictions == 0
        seq, fields, ok = ring(small.storage)
        assert ok.all() and seq.shape[0] == CAPACITY and (status(fields) != 0).all()
    finally:
        small.close()


def test_a_reader_warns_and_the_retired_rows_survive_a_copy():
    small = SharedReplayBuffer(400, OBS, ACT, n_envs=N_ENVS, seed=0, optimize_memory_usage=True)
    try:
        with pytest.warns(RuntimeWarning, match="final_obs_capacity=16"):
            stream([small], 300)
        reader = ReplayStorage.attach(small.handle, read_only=True)
        try:
            assert reader.final_obs_evictions == small.storage.final_obs_evictions > 0
            with pytest.warns(RuntimeWarning, match="final_obs_capacity"):  # the learner side hears it too
                reader.sample_fields(64, np.random.default_rng(0))
        finally:
            reader.close()
        copy = ReplayStorage.from_state(small.storage.to_state())
        try:
            assert copy.oldest == small.storage.oldest > copy.reserved - 400
            assert len(copy) == len(small.storage)
        finally:
            copy.close()
        small.storage.reset()
        assert small.storage.final_obs_evictions == 0 and small.storage.oldest == 0
    finally:
        small.close()


def test_final_obs_capacity_for_names_a_bad_argument():
    with pytest.raises(ValueError, match="min_episode_length"):
        final_obs_capacity_for(100, 0, 1)
    with pytest.raises(ValueError, match="streams"):
        final_obs_capacity_for(100, 1, 0)
    assert final_obs_capacity_for(100, 3, 2) == 34 + 4
