"""The collector process: one vector env (an EIC cluster), a CPU copy of the actor, writes to shared replay.

Started by :class:`~unilab_gym.runtime.runner.AsyncRunner` with the ``spawn`` start method.
Everything it needs arrives as picklable handles; it reports to the learner through its own
one-way pipe (``("episodes", returns, lengths)`` messages, or ``("error", traceback)`` before
it exits with code 1). It ignores SIGINT (the learner decides when to stop) and exits when
the learner sets ``stop`` or disappears.
"""

from __future__ import annotations

import io
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from unilab_gym.runtime.control import BUDGET, EPISODES, LEARNING_STARTS, STEP_CALLS, TRANSITIONS, VERSION, Control, ControlHandle
from unilab_gym.runtime.weights import SharedWeights, WeightsHandle

#: How long a collector waits between checks while it has no budget (backpressure), in s.
IDLE_WAIT_S = 0.0005


@dataclass
class CollectorSpec:
    """What one collector needs (picklable).

    ``env_id`` / ``env_kwargs`` or ``env_fn`` (``env_fn(num_envs) -> gymnasium VectorEnv``) make its
    env; ``seed`` seeds the env (env ``i`` gets ``seed + i``), torch and the exploration noise.
    ``algo`` is ``"sac"`` (sample the stochastic actor) or ``"td3"`` (deterministic actor plus
    ``action_noise``). ``actor`` is the actor module saved with ``torch.save`` (bytes).
    """

    index: int
    num_envs: int
    seed: int
    algo: str
    actor: bytes
    env_id: str | None = None
    env_fn: Callable[[int], Any] | None = None
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    action_noise: Any = None
    parent_pid: int = 0


def make_vector_env(spec: CollectorSpec):
    """The collector's gymnasium ``VectorEnv``."""
    if spec.env_fn is not None:
        return spec.env_fn(spec.num_envs)
    import gymnasium as gym

    import unilab_gym  # noqa: F401  (registers UniLab ids)

    return gym.make_vec(spec.env_id, num_envs=spec.num_envs, **spec.env_kwargs)


def collector_main(spec: CollectorSpec, replay_handle: Any, weights_handle: WeightsHandle, control_handle: ControlHandle, conn: Connection) -> None:
    """Process entry point: run :func:`_collect`, report any exception through ``conn``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    code = 0
    try:
        _collect(spec, replay_handle, weights_handle, control_handle, conn)
    except BaseException:
        code = 1
        try:
            conn.send(("error", traceback.format_exc()))
        except OSError:
            pass
    finally:
        # skip interpreter teardown (torch's takes ~1 s): every resource was released above
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _collect(spec: CollectorSpec, replay_handle: Any, weights_handle: WeightsHandle, control_handle: ControlHandle, conn: Connection) -> None:
    import torch
    from stable_baselines3.common.noise import VectorizedActionNoise

    from unilab_gym.replay import ReplayStorage

    torch.set_num_threads(1)
    torch.manual_seed(spec.seed)
    actor = torch.load(io.BytesIO(spec.actor), weights_only=False)
    actor.eval()
    params = [t for t in actor.state_dict().values()]
    flat = np.empty(sum(t.numel() for t in params), np.float32)

    env = make_vector_env(spec)
    storage = ReplayStorage.attach(replay_handle)
    weights = SharedWeights.attach(weights_handle)
    control = Control.attach(control_handle)
    row = control.rows[spec.index]
    n = env.num_envs
    space = env.single_action_space
    low, high = space.low.astype(np.float64), space.high.astype(np.float64)
    rng = np.random.default_rng(spec.seed)
    noise = spec.action_noise
    if noise is not None and not isinstance(noise, VectorizedActionNoise):
        noise = VectorizedActionNoise(noise, n)
    same_step = str(env.metadata.get("autoreset_mode", "")).endswith(("SAME_STEP", "SameStep"))
    try:
        obs, _ = env.reset(seed=spec.seed)
        restarting = np.zeros(n, bool)  # NEXT_STEP: envs whose next step is a reset step
        ep_return = np.zeros(n)
        ep_length = np.zeros(n, np.int64)
        version = 0
        while not control.stopped and os.getppid() == spec.parent_pid:
            if weights.version > version:
                version = weights.read(flat)
                _load(params, flat)
                row[VERSION] = version
            total = control.total_transitions()
            if total >= control.globals[BUDGET] or version == 0:
                time.sleep(IDLE_WAIT_S)
                continue
            if total < control.globals[LEARNING_STARTS]:
                scaled = rng.uniform(-1.0, 1.0, (n, low.size))
            else:
                with torch.no_grad():
                    obs_t = torch.as_tensor(np.asarray(obs, np.float32))
                    if spec.algo == "sac":
                        scaled = actor(obs_t, deterministic=False).numpy().astype(np.float64)
                    else:
                        scaled = actor(obs_t).numpy().astype(np.float64)
                if noise is not None:
                    scaled = np.clip(scaled + noise(), -1.0, 1.0)
            env_action = (low + 0.5 * (scaled + 1.0) * (high - low)).astype(space.dtype)
            next_obs, reward, terminated, truncated, info = env.step(env_action)
            keep = ~restarting
            stored_next = np.array(next_obs, np.float32, copy=True)
            if same_step and "final_obs" in info:
                for i in np.flatnonzero(info["_final_obs"]):
                    stored_next[i] = info["final_obs"][i]
            if keep.any():
                storage.add(obs[keep], stored_next[keep], scaled[keep], reward[keep], terminated[keep], truncated[keep])
            row[TRANSITIONS] += int(keep.sum())
            row[STEP_CALLS] += 1
            ep_return[keep] += reward[keep]
            ep_length[keep] += 1
            done = (terminated | truncated) & keep
            if done.any():
                idx = np.flatnonzero(done)
                conn.send(("episodes", ep_return[idx].tolist(), ep_length[idx].tolist()))
                row[EPISODES] += idx.size
                ep_return[idx] = 0.0
                ep_length[idx] = 0
                if noise is not None:
                    noise.reset(indices=idx.tolist())
            restarting = done if not same_step else np.zeros(n, bool)
            obs = next_obs
    finally:
        env.close()
        storage.close()
        weights.close()
        control.close()


def _load(params: list, flat: np.ndarray) -> None:
    """Copy the flat float32 vector into the actor's state tensors, in state_dict order."""
    import torch

    offset = 0
    with torch.no_grad():
        for t in params:
            k = t.numel()
            t.copy_(torch.from_numpy(flat[offset : offset + k]).view_as(t))
            offset += k
