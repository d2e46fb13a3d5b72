"""Env factories for AsyncRunner tests (module level, so spawned collectors can unpickle them)."""

import os
import time
from typing import ClassVar

import gymnasium as gym
import numpy as np

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


class TinyVectorEnv(gym.vector.VectorEnv):
    """A tiny numpy vector env (no physics) for runner fault tests: obs (3,) float32, action (2,) in [-1, 1].

    Reward ``-|a|^2``; episodes of ``episode_steps`` steps end truncated; same-step autoreset (``final_obs`` in
    ``info``), which both runner families take. With ``claim_path``, each process's env creates
    ``<claim_path>.stepped.<pid>`` at its first step. The process whose env first creates ``claim_path``
    (``O_CREAT | O_EXCL``) is the faulty one, and writes its pid there; on its ``fault_at``-th step:

    - ``fault="nan_obs"`` / ``"inf_reward"`` / ``"nan_final_obs"``: env ``fault_env`` returns a NaN observation,
      an inf reward, or a NaN ``final_obs`` (the step ends every episode);
    - ``fault="hang"``: writes ``<claim_path>.hung`` and blocks for ever inside ``step``.
    """

    metadata: ClassVar[dict] = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}

    def __init__(self, num_envs, claim_path=None, fault=None, fault_at=5, fault_env=0, episode_steps=8):
        super().__init__()
        self.num_envs = num_envs
        self.single_observation_space = gym.spaces.Box(-10.0, 10.0, (3,), np.float32)
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self.fault, self.fault_at, self.fault_env, self.episode_steps = fault, fault_at, fault_env, episode_steps
        self.claim_path, self.faulty, self.steps = claim_path, False, 0
        if claim_path is not None and fault is not None:
            try:
                fd = os.open(claim_path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                pass
            else:
                os.write(fd, str(os.getpid()).encode())
                os.close(fd)
                self.faulty = True
        self._rng = np.random.default_rng(0)
        self._t = np.zeros(num_envs, np.int64)

    def _obs(self):
        return self._rng.uniform(-1.0, 1.0, (self.num_envs, 3)).astype(np.float32)

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._t[:] = 0
        return self._obs(), {}

    def step(self, actions):
        self.steps += 1
        if self.steps == 1 and self.claim_path is not None:  # this process is past its start-up
            open(f"{self.claim_path}.stepped.{os.getpid()}", "w").close()
        fault = self.fault if self.faulty and self.steps == self.fault_at else None
        if fault == "hang":
            with open(f"{self.claim_path}.hung", "w") as f:
                f.write(str(os.getpid()))
            while True:  # a deadlocked env: never returns
                time.sleep(60)
        actions = np.asarray(actions, np.float32).reshape(self.num_envs, 2)
        self._t += 1
        obs = self._obs()
        reward = -np.sum(actions.astype(np.float64) ** 2, axis=1)
        terminated = np.zeros(self.num_envs, bool)
        truncated = self._t >= self.episode_steps
        if fault == "nan_final_obs":
            truncated[:] = True
        info = {}
        if truncated.any():
            final = obs.copy()
            if fault == "nan_final_obs":
                final[self.fault_env, 1] = np.nan
            info["final_obs"] = np.empty(self.num_envs, object)  # as gymnasium's vector envs build it
            for i in np.flatnonzero(truncated):
                info["final_obs"][i] = final[i]
            info["_final_obs"] = truncated.copy()
            obs = np.where(truncated[:, None], self._obs(), obs)
            self._t[truncated] = 0
        if fault == "nan_obs":
            obs[self.fault_env, 2] = np.nan
        if fault == "inf_reward":
            reward[self.fault_env] = np.inf
        return obs, reward, terminated, truncated, info


def tiny(num_envs, **kwargs):
    """A :class:`TinyVectorEnv` (an ``env_fn`` for ``AsyncRunner``; bind the fault with ``functools.partial``)."""
    return TinyVectorEnv(num_envs, **kwargs)


class TinyEnv(gym.Env):
    """One env of :class:`TinyVectorEnv`'s spaces, for building the SB3 model a runner drives."""

    observation_space = gym.spaces.Box(-10.0, 10.0, (3,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(3, np.float32), {}

    def step(self, action):
        return np.zeros(3, np.float32), 0.0, False, False, {}
