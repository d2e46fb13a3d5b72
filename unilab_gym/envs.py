"""``QuadrupedEnv``: the single-robot ``gymnasium.Env`` face of ``UniLab/Quadruped-v0``.

It is a :class:`~unilab_gym.vector_env.UniLabVectorEnv` of one env with autoreset disabled,
so a single env and env ``i`` of a vector env seeded ``s - i`` follow the same trajectory,
bit for bit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import logger

from unilab_gym.tasks.config import check_task_kwargs
from unilab_gym.validation import check_action_array, check_seed
from unilab_gym.vector_env import UniLabVectorEnv, check_reset_options

#: The keys ``QuadrupedEnv.reset(options=...)`` accepts (``reset_mask`` is a vector-env option).
SINGLE_RESET_OPTIONS = ("episode_seed",)


class QuadrupedEnv(gym.Env):
    """One Unitree A1 following a velocity command (see :class:`UniLabVectorEnv` for the task).

    ``observation_space``: Box(-inf, inf, (48,), float32); ``action_space``: Box(-1, 1, (12,), float32).
    ``reward`` is a float, ``info["reward_terms"]`` a dict of the weighted terms (floats).

    Args:
        render_mode: ``None`` or ``"rgb_array"`` ((240, 320, 3) uint8 frames).
        **kwargs: the task configuration, the fields of :class:`~unilab_gym.tasks.config.QuadrupedConfig`
            (``dt``, ``substeps``, ``kp``, ...), and the parameter trace's ``trace_max_records`` and
            ``trace_path`` (see :class:`UniLabVectorEnv`).

    Raises:
        ValueError: an invalid task argument, naming it.
        TypeError: a vector-env argument (``num_envs``, ``autoreset_mode``, ``envs_per_cluster``) or an
            unknown one.
    """

    def __init__(self, render_mode: str | None = None, **kwargs: Any):
        for key in ("num_envs", "autoreset_mode", "envs_per_cluster"):
            if key in kwargs:
                raise TypeError(f"QuadrupedEnv got vector-env argument {key!r}; use UniLabVectorEnv for several envs")
        check_task_kwargs("QuadrupedEnv", kwargs, ("render_mode", "trace_max_records", "trace_path"))
        self._vec = UniLabVectorEnv(1, render_mode=render_mode, autoreset_mode="Disabled", **kwargs)
        self.render_mode = render_mode
        self.metadata = {"render_modes": ["rgb_array"], "render_fps": self._vec.metadata["render_fps"]}
        self.observation_space = self._vec.single_observation_space
        self.action_space = self._vec.single_action_space
        self._episode_over = False  # terminated or truncated since the last reset
        self._warned = False  # the step-after-episode-end warning of this episode was given

    @property
    def vector_env(self) -> UniLabVectorEnv:
        """The one-env :class:`UniLabVectorEnv` underneath."""
        return self._vec

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Start an episode; ``options={"episode_seed": s}`` starts it from episode seed ``s`` (a replay).

        Returns:
            obs (48,) float32 and info: ``command`` (3,) float64, ``episode_seed`` (int) and
            ``parameters`` (dict of the episode's physics parameters, see :mod:`unilab_gym.randomization`).

        Raises:
            TypeError: ``options`` is not a dict.
            ValueError: a bad seed (e.g. negative: named with its value), an unknown option key (named), a bad
                ``episode_seed``. Nothing is reset then.
        """
        if seed is not None:
            seed = check_seed("seed", seed)
        options = check_reset_options(options, SINGLE_RESET_OPTIONS)
        obs, info = self._vec.reset(seed=seed, options=options)
        super().reset(seed=seed)
        self._episode_over = self._warned = False
        parameters = {k: v[0].item() for k, v in info["parameters"].items() if not k.startswith("_")}
        return obs[0], {
            "command": info["command"][0].copy(),
            "episode_seed": int(info["episode_seed"][0]),
            "parameters": parameters,
        }

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """One control step of the robot.

        Stepping on after ``terminated`` or ``truncated`` without ``reset()`` is undefined behaviour: as
        Gymnasium's own envs (CartPole), the env warns once per episode (``gymnasium.logger.warn``) and steps on.

        Args:
            action: (12,) array-like of floats; values outside [-1, 1] are clipped.

        Returns:
            obs (48,) float32, reward, terminated, truncated and info: ``reward_terms`` (the weighted terms).

        Raises:
            TypeError: an action of the wrong type: a scalar, strings, complex numbers, objects.
            ValueError: a wrong shape or NaN/inf (the env is not stepped).
            gymnasium.error.ResetNeeded: before ``reset()`` (an episode is not restarted by itself).
        """
        shape = self.action_space.shape
        assert shape is not None
        batched = check_action_array("action", action, shape)[None]
        obs, reward, terminated, truncated, info = self._vec._step(batched, allow_finished=True)
        if self._episode_over and not self._warned:
            logger.warn(
                "You are calling 'step()' even though this environment has already returned terminated = True or "
                "truncated = True. You should always call 'reset()' once you receive 'terminated = True' or "
                "'truncated = True' -- any further steps are undefined behavior."
            )
            self._warned = True
        self._episode_over = self._episode_over or bool(terminated[0] or truncated[0])
        terms = {k: float(v[0]) for k, v in info["reward_terms"].items() if not k.startswith("_")}
        return obs[0], float(reward[0]), bool(terminated[0]), bool(truncated[0]), {"reward_terms": terms}

    def parameter_trace(self) -> list[dict[str, Any]]:
        """One record per finished episode (see :meth:`UniLabVectorEnv.parameter_trace`)."""
        return self._vec.parameter_trace()

    def save_parameter_trace(self, path: str | Path) -> Path:
        """Write the trace as JSON Lines (see :meth:`UniLabVectorEnv.save_parameter_trace`)."""
        return self._vec.save_parameter_trace(path)

    def render(self) -> np.ndarray | None:
        return self._vec.render_env(0) if self.render_mode == "rgb_array" else None

    def close(self) -> None:
        self._vec.close()
