"""Env factories for AsyncRunner tests (module level, so spawned collectors can unpickle them)."""

import os
import time

import gymnasium as gym

from unilab_gym import UniLabVectorEnv

SMALL = dict(max_episode_steps=20, envs_per_cluster=4)


def quadruped(num_envs, **kwargs):
    return UniLabVectorEnv(num_envs, **{**SMALL, **kwargs})


class _FailingEnv(gym.vector.VectorWrapper):
    def __init__(self, env, fail_at, stamp_path, trigger_path=None):
        super().__init__(env)
        self.fail_at, self.stamp_path, self.trigger_path, self.steps = fail_at, stamp_path, trigger_path, 0

    def step(self, actions):
        self.steps += 1
        if self.steps == self.fail_at or (self.trigger_path is not None and os.path.exists(self.trigger_path)):
            with open(f"{self.stamp_path}.{os.getpid()}", "w") as f:
                f.write(repr(time.time()))
            raise RuntimeError("boom: simulated physics failure in a collector")
        return self.env.step(actions)


def failing_quadruped(num_envs, fail_at, stamp_path, trigger_path=None, **kwargs):
    """A quadruped vector env that raises on its ``fail_at``-th step (or on the first step once the file
    ``trigger_path`` exists), after writing the time to ``stamp_path.<pid>``."""
    return _FailingEnv(quadruped(num_envs, **kwargs), fail_at, stamp_path, trigger_path)


class _RecordingEnv(gym.vector.VectorWrapper):
    """Saves every observation it returns (reset and step) to ``<prefix>.<pid>.npy`` when closed."""

    def __init__(self, env, prefix):
        super().__init__(env)
        self.prefix, self.seen = prefix, []

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self.seen.append(obs.copy())
        return obs, info

    def step(self, actions):
        out = self.env.step(actions)
        self.seen.append(out[0].copy())
        return out

    def close(self, **kwargs):
        import numpy as np

        np.save(f"{self.prefix}.{os.getpid()}.npy", np.stack(self.seen))
        return self.env.close(**kwargs)


def recording_quadruped(num_envs, prefix, **kwargs):
    """A quadruped vector env that records the observations it returns (see ``_RecordingEnv``)."""
    return _RecordingEnv(quadruped(num_envs, **kwargs), prefix)
