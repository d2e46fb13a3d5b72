"""``QuadrupedEnv``: the single-robot ``gymnasium.Env`` face of ``UniLab/Quadruped-v0``.

It is a :class:`~unilab_gym.vector_env.UniLabVectorEnv` of one env with autoreset disabled,
so a single env and env ``i`` of a vector env seeded ``s - i`` follow the same trajectory,
bit for bit.

``close()`` releases the pybullet world; the next ``reset()`` reconnects (a new world of the same
configuration, continuing the env's random stream; the in-memory parameter trace starts empty), as
Gymnasium's own envs can be reset after ``close()`` and as SB3's ``check_env(env, skip_render_check=False)``
expects (it closes the env after its render check and then steps it on). With ``trace_path`` it cannot
reconnect (``close()`` finished that file): ``reset()`` raises ``ClosedEnvironmentError``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import logger
from gymnasium.error import ClosedEnvironmentError

from unilab_gym.tasks.config import check_task_kwargs
from unilab_gym.validation import check_action_array, check_seed
from unilab_gym.vector_env import UniLabVectorEnv, check_reset_options

#: The keys ``QuadrupedEnv.reset(options=...)`` accepts (``reset_mask`` is a vector-env option).
SINGLE_RESET_OPTIONS = ("episode_seed",)


class QuadrupedEnv(gym.Env):
    """One quadruped following a velocity command (see :class:`UniLabVectorEnv` for the task).

    A Unitree A1 by default; ``robot=`` picks another (see :mod:`unilab_gym.robots`).

    ``observation_space``: Box(-inf, inf, (48,), float32); ``action_space``: Box(-1, 1, (12,), float32).
    ``reward`` is a float, ``info["reward_terms"]`` a dict of the weighted terms (floats).

    Args:
        render_mode: ``None`` or ``"rgb_array"`` ((240, 320, 3) uint8 frames).
        **kwargs: the task configuration, the fields of :class:`~unilab_gym.tasks.config.QuadrupedConfig`
            (``robot``, ``dt``, ``substeps``, ``kp``, ...), and the parameter trace's ``trace_max_records`` and
            ``trace_path`` (see :class:`UniLabVectorEnv`), and ``privileged_obs`` (``True``: the observation is a
            ``Dict`` of the (48,) ``"policy"`` and the (68,) ``"critic"`` observations, see :class:`UniLabVectorEnv`).

    Raises:
        ValueError: an invalid task argument, naming it.
        TypeError: a vector-env argument (``num_envs``, ``autoreset_mode``, ``envs_per_cluster``) or an
            unknown one; ``copy.copy``, ``copy.deepcopy`` or ``pickle`` of the env (a copy would share its
            pybullet world: make a new env with ``gym.make("UniLab/Quadruped-v0", **env.task_config)``).
    """

    #: The vector env underneath (a subclass for another task, e.g. :class:`~unilab_gym.envs_quadrotor.QuadrotorEnv`).
    vector_env_type: type[UniLabVectorEnv] = UniLabVectorEnv

    def __init__(self, render_mode: str | None = None, **kwargs: Any):
        """Check the arguments and make a one-env vector env (arguments and errors: see the class docstring)."""
        owner = type(self).__name__
        for key in ("num_envs", "autoreset_mode", "envs_per_cluster"):
            if key in kwargs:
                raise TypeError(f"{owner} got vector-env argument {key!r}; use UniLabVectorEnv for several envs")
        check_task_kwargs(
            owner,
            kwargs,
            ("render_mode", "trace_max_records", "trace_path", "privileged_obs"),
            self.vector_env_type.task_type.config_type(),
        )
        self._kwargs = dict(kwargs)  # to reconnect after close()
        self._vec = self.vector_env_type(1, render_mode=render_mode, autoreset_mode="Disabled", **kwargs)
        self.render_mode = render_mode
        self.metadata = {"render_modes": ["rgb_array"], "render_fps": self._vec.metadata["render_fps"]}
        self.observation_space = self._vec.single_observation_space
        self.action_space = self._vec.single_action_space
        self._episode_over = False  # terminated or truncated since the last reset
        self._warned = False  # the step-after-episode-end warning of this episode was given
        # the episode's end: its terminated / truncated flags and the info returned after it (zero reward terms)
        self._end: tuple[bool, bool, dict[str, Any]] = (False, False, {})

    @property
    def vector_env(self) -> UniLabVectorEnv:
        """The one-env :class:`UniLabVectorEnv` underneath (a new one after ``close()`` and ``reset()``)."""
        return self._vec

    @property
    def task_config(self) -> dict[str, Any]:
        """The arguments that determine the trajectories (:attr:`UniLabVectorEnv.task_config`), JSON-able.

        ``QuadrupedEnv(**env.task_config)`` makes an env that follows the same ones.
        """
        return self._vec.task_config

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Refuse ``copy.copy``, ``copy.deepcopy`` and ``pickle`` (see :meth:`UniLabVectorEnv.__reduce_ex__`).

        Raises:
            TypeError: always; the message says how to make an independent env.
        """
        raise TypeError(
            "a QuadrupedEnv cannot be copied or pickled: its pybullet world lives in this process and a copy would "
            "share it. Make an independent env instead: gym.make('UniLab/Quadruped-v0', **env.task_config) or "
            "QuadrupedEnv(**env.task_config) (the same configuration; reset(seed=...) for the same trajectory); to "
            "start one in another process, send a function that builds it (an env_fn) or the env id and kwargs"
        )

    def _reconnect(self) -> None:
        """After ``close()``: a new one-env vector env of the same configuration, continuing the random stream."""
        if self._kwargs.get("trace_path") is not None:
            raise ClosedEnvironmentError(
                "this QuadrupedEnv was closed and streams its parameter trace to trace_path, which close() "
                "finished: it cannot reconnect without truncating that file; create a new env"
            )
        old = self._vec
        self._vec = self.vector_env_type(1, render_mode=self.render_mode, autoreset_mode="Disabled", **self._kwargs)
        self._vec.set_env_rng(0, old.env_rng(0))  # the env's stream goes on, as if it had not been closed

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
        if self._vec.closed:
            self._reconnect()
        obs, info = self._vec.reset(seed=seed, options=options)
        super().reset(seed=seed)
        self._episode_over = self._warned = False
        parameters = {k: v[0].item() for k, v in info["parameters"].items() if not k.startswith("_")}
        return _row(obs, 0), {
            "command": info["command"][0].copy(),
            "episode_seed": int(info["episode_seed"][0]),
            "parameters": parameters,
        }

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """One control step of the robot.

        Stepping on after ``terminated`` or ``truncated`` without ``reset()`` is undefined behaviour: as
        Gymnasium's own envs (CartPole), the env warns once per episode (``gymnasium.logger.warn``) and steps on.
        The robot then idles (``UniLabVectorEnv.step(actions, active=...)`` with the env inactive: ``action`` is
        ignored, the zero action applied) and the step returns the current observation, reward ``0.0`` (as
        CartPole after its end), the ``terminated`` / ``truncated`` flags and task entries the episode ended with,
        and reward terms of 0.0.

        Args:
            action: (12,) array-like of floats; values outside [-1, 1] are clipped.

        Returns:
            obs (48,) float32, reward, terminated, truncated and info: ``reward_terms`` (the weighted terms).

        Raises:
            TypeError: an action of the wrong type: a scalar, strings, complex numbers, objects.
            ValueError: a wrong shape or NaN/inf (the env is not stepped).
            gymnasium.error.ResetNeeded: before ``reset()`` (an episode is not restarted by itself).
            gymnasium.error.ClosedEnvironmentError: after ``close()``, before the ``reset()`` that reconnects.
        """
        if self._vec.closed:
            raise ClosedEnvironmentError("this QuadrupedEnv was closed; reset() reconnects it (a new world)")
        shape = self.action_space.shape
        assert shape is not None
        batched = check_action_array("action", action, shape)[None]
        if self._episode_over:
            if not np.isfinite(batched).all():  # the idle step ignores the action: refuse NaN here, as before the end
                raise ValueError("action contains NaN or inf; the env was not stepped")
            obs, _, _, _, _ = self._vec.step(batched, active=np.zeros(1, dtype=bool))  # the robot idles
            if not self._warned:
                logger.warn(
                    "You are calling 'step()' even though this environment has already returned terminated = True "
                    "or truncated = True. You should always call 'reset()' once you receive 'terminated = True' or "
                    "'truncated = True' -- any further steps are undefined behavior."
                )
                self._warned = True
            terminated_end, truncated_end, end_info = self._end
            return (
                _row(obs, 0),
                0.0,
                terminated_end,
                truncated_end,
                {**end_info, "reward_terms": dict(end_info["reward_terms"])},
            )
        obs, reward, terminated, truncated, info = self._vec.step(batched)
        terms = {k: float(v[0]) for k, v in info["reward_terms"].items() if not k.startswith("_")}
        out: dict[str, Any] = {"reward_terms": terms}
        for name in self._vec.task.step_info():  # the task's own entries, e.g. is_success
            out[name] = info[name][0].item()
        if terminated[0] or truncated[0]:
            self._episode_over = True
            self._end = (bool(terminated[0]), bool(truncated[0]), {**out, "reward_terms": dict.fromkeys(terms, 0.0)})
        return _row(obs, 0), float(reward[0]), bool(terminated[0]), bool(truncated[0]), out

    def parameter_trace(self) -> list[dict[str, Any]]:
        """One record per finished episode (see :meth:`UniLabVectorEnv.parameter_trace`)."""
        return self._vec.parameter_trace()

    def save_parameter_trace(self, path: str | Path) -> Path:
        """Write the trace as JSON Lines (see :meth:`UniLabVectorEnv.save_parameter_trace`)."""
        return self._vec.save_parameter_trace(path)

    def render(self) -> np.ndarray | None:
        """(240, 320, 3) uint8 frame with ``render_mode="rgb_array"``, else ``None``.

        Raises:
            gymnasium.error.ClosedEnvironmentError: after ``close()``, before the ``reset()`` that reconnects.
        """
        if self.render_mode != "rgb_array":
            return None
        if self._vec.closed:
            raise ClosedEnvironmentError("this QuadrupedEnv was closed; reset() reconnects it (a new world)")
        return self._vec.render_env(0)

    def close(self) -> None:
        """Disconnect the pybullet world (idempotent); the next ``reset()`` reconnects."""
        self._vec.close()


def _row(obs: Any, i: int) -> Any:
    """Env ``i``'s observation: row ``i`` of the array, or of each array of a dict observation."""
    return {k: v[i] for k, v in obs.items()} if isinstance(obs, dict) else obs[i]
