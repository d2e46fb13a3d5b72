"""Child-process bodies for the replay tests (top-level functions, so spawn can import them).

They import only numpy and unilab_gym.replay, to keep process start-up short.
"""

from __future__ import annotations

import numpy as np

from unilab_gym.replay import ReplayStorage


def uniform_rows(layout, values):
    """Transitions whose every column equals its value: a torn row would mix two values."""
    v = np.asarray(values, dtype=np.float32)
    col = v[:, None]
    return dict(
        obs=np.repeat(col, layout.obs_dim, 1),
        next_obs=np.repeat(col, layout.obs_dim, 1),
        action=np.repeat(col, layout.act_dim, 1),
        reward=v,
        terminated=v,
        truncated=v,
        extra=np.repeat(col, layout.extra_dim, 1) if layout.extras else None,
    )


def seeded_batch(layout, n, seed):
    """A reproducible batch of transitions (the parent regenerates it to compare)."""
    rng = np.random.default_rng(seed)
    return dict(
        obs=rng.standard_normal((n, layout.obs_dim), dtype=np.float32),
        next_obs=rng.standard_normal((n, layout.obs_dim), dtype=np.float32),
        action=rng.uniform(-1, 1, (n, layout.act_dim)).astype(np.float32),
        reward=rng.standard_normal(n, dtype=np.float32),
        terminated=rng.random(n) < 0.1,
        truncated=rng.random(n) < 0.1,
    )


def add_seeded(handle_queue, reply_queue, n, seed):
    """Receive a handle through a Queue, attach, add a seeded batch, report the first seq."""
    handle = handle_queue.get()
    storage = ReplayStorage.attach(handle)
    try:
        first = storage.add(**seeded_batch(handle.layout, n, seed))
        reply_queue.put(("ok", first))
    finally:
        storage.close()


def write_uniform(handle, writer_id, batches, batch_rows, start_event, reply_queue):
    """Add ``batches`` batches of uniform rows valued ``writer_id * 1e6 + k``."""
    storage = ReplayStorage.attach(handle)
    try:
        start_event.wait()
        k = 0
        for _ in range(batches):
            values = writer_id * 1_000_000 + np.arange(k, k + batch_rows)
            storage.add(**uniform_rows(handle.layout, values))
            k += batch_rows
        reply_queue.put(("done", writer_id))
    finally:
        storage.close()


def reserve_and_hang(handle, n, reply_queue, never):
    """Attach, reserve ``n`` rows, scribble on them, report, then block until killed."""
    storage = ReplayStorage.attach(handle)
    res = storage.reserve(n)
    for r0, r1, _, _ in res.pieces:
        storage.block[r0:r1] = -7.0
    reply_queue.put(("reserved", res.start))
    never.wait()  # never set: the parent SIGKILLs this process


def attach_and_hang(handle, reply_queue, never):
    """Attach (as a collector would), report, then block until killed."""
    storage = ReplayStorage.attach(handle)
    reply_queue.put(("attached", storage.reserved))
    never.wait()


def own_and_hang(layout, capacity, prefix, reply_queue, never):
    """Create (own) a replay, send its handle, then block until killed."""
    storage = ReplayStorage(layout, capacity, prefix=prefix)
    reply_queue.put(storage.handle)
    never.wait()  # never set: the parent SIGKILLs this process
