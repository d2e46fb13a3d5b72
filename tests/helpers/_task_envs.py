"""Env factories for ``test_every_task_env.py``'s AsyncRunner collectors (module level: spawned collectors unpickle
them)."""

import gymnasium as gym
import numpy as np


class _Recording(gym.vector.VectorWrapper):
    """Records the seed of its first reset, every action it was given and everything it returned; writes them to
    ``<prefix>.<seed>.npz`` when closed (one file per collector, named by its env seed)."""

    def __init__(self, env, prefix):
        super().__init__(env)
        self.prefix, self.seed = prefix, None
        self.obs, self.actions, self.rewards, self.terminated, self.truncated = [], [], [], [], []

    def reset(self, *, seed=None, options=None):
        obs, info = self.env.reset(seed=seed, options=options)
        if self.seed is None:
            self.seed = seed
        self.obs.append(obs.copy())
        return obs, info

    def step(self, actions):
        obs, reward, terminated, truncated, info = self.env.step(actions)
        self.actions.append(np.array(actions, copy=True))
        for log, value in zip(
            (self.obs, self.rewards, self.terminated, self.truncated), (obs, reward, terminated, truncated)
        ):
            log.append(np.array(value, copy=True))
        return obs, reward, terminated, truncated, info

    def close(self, **kwargs):
        if self.seed is not None:
            np.savez(
                f"{self.prefix}.{self.seed}.npz",
                seed=self.seed,
                obs=np.stack(self.obs),
                actions=np.stack(self.actions),
                rewards=np.stack(self.rewards),
                terminated=np.stack(self.terminated),
                truncated=np.stack(self.truncated),
            )
        return self.env.close(**kwargs)


def recording(num_envs, env_id, prefix, **kwargs):
    """``gym.make_vec(env_id, num_envs=num_envs, **kwargs)`` that records its transitions (see ``_Recording``)."""
    return _Recording(gym.make_vec(env_id, num_envs=num_envs, **kwargs), prefix)
