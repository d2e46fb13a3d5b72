"""Child-process bodies for the replay tests (top-level functions, so spawn can import them).

They import only numpy and unilab_gym.replay, to keep process start-up short.
"""

from __future__ import annotations

import os

import numpy as np

from unilab_gym.replay import ReplayStorage


def uniform_rows(layout, values):
    """Transitions whose every column equals its value: a torn row would mix two values."""
    v = np.asarray(values, dtype=np.float32)
    col = v[:, None]
    if layout.is_dict:  # one array per key
        obs = {key: np.repeat(col, int(np.prod(shape)), 1) for key, shape, _ in layout.obs_spec}
    else:
        obs = np.repeat(col, layout.obs_dim, 1)
    return dict(
        obs=obs,
        next_obs=obs,
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


# ---- a decodable transition stream (memory-optimized layout tests) --------------------------------------
STREAM_OBS_DIM = 6


def _stream_obs(writer, envs, t, kind, dict_obs):
    """Observation ``[writer, env, t, kind, 0, 0]`` (kind 1: an episode's final observation)."""
    n = len(envs)
    policy = np.zeros((n, STREAM_OBS_DIM), np.float32)
    policy[:, 0], policy[:, 1], policy[:, 2], policy[:, 3] = writer, envs, t, kind
    if not dict_obs:
        return policy
    return {"policy": policy, "critic": np.stack([t + 0.5 * kind + 0 * envs, envs, envs * 0 + writer], 1)}


def stream_done(writer, envs, t):
    """``(terminated, truncated)`` of step ``t``: env e ends an episode every ``5 + e % 4`` steps,
    alternately terminated and truncated."""
    envs = np.asarray(envs)
    period = 5 + envs % 4
    done = (t + 3 * envs + writer) % period == period - 1
    term = done & ((t + 3 * envs + writer) // period % 2 == 0)
    return term, done & ~term


def stream_step(writer, n_envs, t, dict_obs=False):
    """The ``storage.add`` keywords of writer ``writer``'s step ``t`` (envs ``0..n_envs-1``)."""
    envs = np.arange(n_envs)
    term, trunc = stream_done(writer, envs, t)
    obs = _stream_obs(writer, envs, t, 0, dict_obs)
    normal, final = _stream_obs(writer, envs, t + 1, 0, dict_obs), _stream_obs(writer, envs, t + 1, 1, dict_obs)
    done = term | trunc
    if dict_obs:
        next_obs = {k: np.where(done[:, None], final[k], normal[k]) for k in normal}
    else:
        next_obs = np.where(done[:, None], final, normal)
    action = np.stack([np.full(n_envs, writer), envs, np.full(n_envs, t)], 1).astype(np.float32)
    reward = (writer * 1000 + envs * 100 + t).astype(np.float32)
    return dict(obs=obs, next_obs=next_obs, action=action, reward=reward, terminated=term, truncated=trunc)


def expected_transition(action, dict_obs=False):
    """What the stream holds for the transitions whose actions are ``action`` (``(B, 3)``)."""
    writer, env, t = (np.asarray(action)[:, i].astype(np.int64) for i in range(3))
    out = {k: [] for k in ("obs", "next_obs", "reward", "terminated", "truncated")}
    for w, e, s in zip(writer, env, t):
        step = stream_step(int(w), int(e) + 1, int(s), dict_obs)
        for k in out:
            value = step[k]
            out[k].append({key: v[e] for key, v in value.items()} if isinstance(value, dict) else value[e])
    stack = {}
    for k, rows in out.items():
        stack[k] = (
            {key: np.stack([r[key] for r in rows]) for key in rows[0]} if isinstance(rows[0], dict) else np.stack(rows)
        )
    return stack


def write_stream(handles, writer, steps, n_envs, start_event, reply_queue):
    """Add writer ``writer``'s steps ``0..steps-1`` to every storage of ``handles``, in turn."""
    storages = [ReplayStorage.attach(h) for h in handles]
    try:
        start_event.wait()
        for t in range(steps):
            for storage in storages:
                storage.add(**stream_step(writer, n_envs, t))
        reply_queue.put(("done", writer))
    finally:
        for storage in storages:
            storage.close()


# ---- read-only readers (several learners on one replay) ---------------------------------------------------
def read_uniform(handle, batches, start_event, reply_queue):
    """Attach read-only, sample ``batches`` batches while writers run, check no row is torn."""
    storage = ReplayStorage.attach(handle, read_only=True)
    try:
        start_event.wait()
        rng, torn = np.random.default_rng(os.getpid()), 0
        for _ in range(batches):
            _, fields = storage.sample_fields(16, rng)
            value = fields["reward"]
            for arr in fields.values():
                flat = arr.reshape(arr.shape[0], -1)
                torn += int((flat != value[:, None]).any(axis=1).sum())
        reply_queue.put(("read", batches, torn))
    finally:
        storage.close()


def sb3_reader_and_hang(handle, reply_queue, never):
    """Open the replay as a read-only SharedReplayBuffer, sample once, report, block until killed."""
    from unilab_gym.sb3.replay_buffer import SharedReplayBuffer

    reader = SharedReplayBuffer.attach(handle, read_only=True, seed=1)
    batch = reader.sample(8)
    reply_queue.put(("sampled", int(batch.observations.shape[0])))
    never.wait()  # never set: the parent SIGKILLs this process
