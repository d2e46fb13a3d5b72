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
