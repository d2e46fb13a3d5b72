"""Pickled Tianshou SharedVectorReplayBuffers carry a checksum and are checked on load (issue 19, item 5)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

pytest.importorskip("tianshou")
from tianshou.data import Batch

from unilab_gym.tianshou import SharedVectorReplayBuffer


def no_new_block(monkeypatch):
    """Make allocating a shared block fail loudly: a refused load must refuse before it."""

    def refuse(*args, **kwargs):
        raise AssertionError("a shared block was allocated for a refused state")

    monkeypatch.setattr(SharedVectorReplayBuffer, "_allocate", refuse)


# ---- the Tianshou buffer's pickles carry the same checks ------------------------------------------------------
def tianshou_buffer():
    buf = SharedVectorReplayBuffer(20, 2, obs_shape=(3,), act_dim=2)
    for k in range(3):
        n = 2
        buf.add(
            Batch(
                obs=np.full((n, 3), k, np.float32),
                act=np.zeros((n, 2), np.float32),
                rew=np.full(n, 1000.0 + k),
                terminated=np.zeros(n, bool),
                truncated=np.zeros(n, bool),
                obs_next=np.full((n, 3), k + 1, np.float32),
                info=Batch(env_id=np.arange(n)),
            )
        )
    return buf


def test_a_corrupted_tianshou_pickle_is_refused(monkeypatch):
    buf = tianshou_buffer()
    data = pickle.dumps(buf)
    rew = np.asarray(buf.rew).tobytes()
    at = data.index(rew)
    bad = bytearray(data)
    bad[at : at + 8] = bytes(b ^ 0xFF for b in bad[at : at + 8])
    with monkeypatch.context() as m:
        no_new_block(m)
        with pytest.raises(ValueError, match="SharedVectorReplayBuffer state is corrupted"):
            pickle.loads(bytes(bad))
    copy = pickle.loads(data)
    np.testing.assert_array_equal(copy.rew, buf.rew)
    copy.close()
    buf.close()


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda st: st.__setitem__("_lengths", np.array([11, 0])), r"sub-buffer lengths \[11, 0\]"),
        (lambda st: st["_meta"].__setitem__("rew", np.zeros(19, np.float32)), r"rew has shape \(19,\)"),
        (lambda st: st.pop("_checksum"), "no sha256 checksum"),
        (lambda st: st.pop("_offset"), r"missing.*_offset"),
    ],
)
def test_an_inconsistent_tianshou_state_is_refused(edit, match, monkeypatch):
    buf = tianshou_buffer()
    state = buf.__getstate__()
    state["_meta"] = pickle.loads(pickle.dumps(state["_meta"]))  # a copy: the edit must not touch buf
    edit(state)
    fresh = type(buf).__new__(type(buf))
    no_new_block(monkeypatch)
    with pytest.raises(ValueError, match=match):
        fresh.__setstate__(state)
    buf.close()
