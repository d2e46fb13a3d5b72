"""Stable-Baselines3 adapter: :class:`SB3VecEnv`, an SB3 ``VecEnv`` over a :class:`UniLabVectorEnv`.

SB3 does not take a Gymnasium ``VectorEnv``; it wants its own ``VecEnv`` with same-step
autoreset (the returned obs of a finished env is already the first obs of its next episode,
the last one is in ``infos[i]["terminal_observation"]``). :class:`SB3VecEnv` gives exactly
what SB3's ``DummyVecEnv`` gives over N single ``gym.make("UniLab/Quadruped-v0")`` envs
seeded the way SB3 seeds them (``seed(s)``: env ``i`` gets ``s + i`` at the next reset),
while stepping all N robots in one batched call::

    from stable_baselines3 import SAC
    from unilab_gym.sb3.vec_env import make_sb3_env
    from unilab_gym.sb3.replay_buffer import SharedReplayBuffer

    model = SAC("MlpPolicy", make_sb3_env("UniLab/Quadruped-v0", 64), replay_buffer_class=SharedReplayBuffer)

Importing this module imports SB3 (and torch).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import VecEnv, VecMonitor
from stable_baselines3.common.vec_env.base_vec_env import VecEnvIndices, VecEnvObs, VecEnvStepReturn

from unilab_gym.adapters import make_unilab_vector_env, unbatch_infos
from unilab_gym.sb3.policies import AsymmetricActorCriticPolicy, AsymmetricSACPolicy, KeyExtractor
from unilab_gym.validation import check_seed
from unilab_gym.vector_env import UniLabVectorEnv

__all__ = [
    "AsymmetricActorCriticPolicy",
    "AsymmetricSACPolicy",
    "EnvMetricsCallback",
    "KeyExtractor",
    "SB3VecEnv",
    "make_sb3_env",
]


class SB3VecEnv(VecEnv):
    """SB3 ``VecEnv`` over a :class:`~unilab_gym.vector_env.UniLabVectorEnv` (same-step autoreset).

    ``step`` returns ``obs`` (N, 48) float32 (with ``privileged_obs=True``, a dict of ``"policy"`` (N, 48) and
    ``"critic"`` (N, 68), as SB3's ``DummyVecEnv`` stacks ``Dict`` observations), ``rewards`` (N,) float32,
    ``dones`` (N,) bool
    (terminated or truncated) and ``infos``, a list of N dicts: the single env's info
    (``reward_terms``: dict of floats), ``"TimeLimit.truncated"`` (truncated and not
    terminated) and, for finished envs, ``"terminal_observation"`` ((48,) float32, the last
    obs of the episode). Finished envs are reset in the same call (continuing each env's
    random stream, as SB3's ``DummyVecEnv`` does); their reset infos go to ``reset_infos``.

    ``seed(s)`` / ``set_options(opts)`` take effect at the next ``reset()``, as in SB3.
    The N envs are one object: ``get_attr`` / ``env_method`` read or call the
    ``UniLabVectorEnv`` once and return that result for each index, ``set_attr`` sets it
    for all envs. With ``render_mode="rgb_array"``, ``render()`` gives env 0's frame
    ((240, 320, 3) uint8) and ``get_images()`` a lazy sequence of the N frames.

    Args:
        venv: a ``UniLabVectorEnv`` with ``autoreset_mode`` ``"NextStep"`` (the default) or
            ``"Disabled"``; the adapter resets finished envs itself.

    Raises:
        TypeError: ``venv`` is not a ``UniLabVectorEnv``.
        ValueError: ``venv`` is in ``"SameStep"`` mode (it would reset envs before the
            adapter can hand SB3 the terminal observation through its own reset path).
    """

    def __init__(self, venv: UniLabVectorEnv):
        """Check ``venv`` and wrap it (arguments and errors: see the class docstring)."""
        if not isinstance(venv, UniLabVectorEnv):
            raise TypeError(
                f"SB3VecEnv wraps a UniLabVectorEnv, got {type(venv).__name__}; for other envs use "
                "stable_baselines3.common.env_util.make_vec_env"
            )
        if venv.autoreset_mode == AutoresetMode.SAME_STEP:
            raise ValueError(
                "SB3VecEnv needs a UniLabVectorEnv with autoreset_mode='NextStep' (default) or 'Disabled', "
                "got 'SameStep'; create it with gym.make(id, num_envs=N) or use make_sb3_env"
            )
        self.venv = venv
        super().__init__(venv.num_envs, venv.single_observation_space, venv.single_action_space)
        self.metadata = {**self.metadata, "render_fps": venv.metadata["render_fps"]}
        self._actions: np.ndarray | None = None

    # ------------------------------------------------------------------ stepping
    def reset(self) -> VecEnvObs:
        """Reset all envs with the seeds of ``seed()`` and options of ``set_options()`` (then forget them).

        Returns:
            obs (N, 48) float32. ``reset_infos[i]`` holds env ``i``'s reset info.

        Raises:
            ValueError: an option dict contains ``"reset_mask"`` (SB3 resets every env).
        """
        seeds = None if all(s is None for s in self._seeds) else list(self._seeds)
        groups = self._option_groups()
        if len(groups) == 1:
            options, mask = groups[0]
            obs, info = self.venv.reset(seed=seeds, options=options or None)
            self._store_reset_infos(info, mask)
        else:  # envs asked for different options: reset each group of envs with its own
            for options, mask in groups:
                obs, info = self.venv.reset(seed=seeds, options={**options, "reset_mask": mask})
                self._store_reset_infos(info, mask)
        self._reset_seeds()
        self._reset_options()
        return obs

    def step_async(self, actions: np.ndarray) -> None:
        """Store the actions ((N, 12) floats in [-1, 1]) for :meth:`step_wait`."""
        self._actions = actions

    def step_wait(self) -> VecEnvStepReturn:
        """Step every env; reset the finished ones (see the class docstring).

        Raises:
            ValueError: wrong action shape or NaN/inf actions (no env is stepped).
            RuntimeError: ``step_wait`` without a preceding ``step_async``.
        """
        if self._actions is None:
            raise RuntimeError("step_wait() called without step_async(actions)")
        actions, self._actions = self._actions, None
        obs, reward, terminated, truncated, info = self.venv.step(actions)
        dones = terminated | truncated
        infos = unbatch_infos(info, self.num_envs)
        for i in range(self.num_envs):
            infos[i]["TimeLimit.truncated"] = bool(truncated[i] and not terminated[i])
        if dones.any():
            for i in np.flatnonzero(dones).tolist():
                infos[i]["terminal_observation"] = _row(obs, i)
            obs, reset_info = self.venv.reset(options={"reset_mask": dones})
            self._store_reset_infos(reset_info, dones)
        return obs, reward.astype(np.float32), dones, infos

    def close(self) -> None:
        """Close the underlying vector env (its pybullet worlds)."""
        self.venv.close()

    # ------------------------------------------------------------------ attributes and methods
    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """The vector env's attribute ``attr_name``, once per index.

        Raises:
            AttributeError: no such attribute.
        """
        value = getattr(self.venv, attr_name)
        return [value for _ in self._get_indices(indices)]

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        """Set ``attr_name`` on the vector env (shared by all envs).

        Raises:
            ValueError: ``indices`` is not every env (the envs share one object).
        """
        self._check_all(indices, f"set_attr({attr_name!r})")
        setattr(self.venv, attr_name, value)

    def env_method(
        self, method_name: str, *method_args: Any, indices: VecEnvIndices = None, **method_kwargs: Any
    ) -> list[Any]:
        """Call the vector env's method ``method_name`` once; its result is returned once per index."""
        result = getattr(self.venv, method_name)(*method_args, **method_kwargs)
        return [result for _ in self._get_indices(indices)]

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None) -> list[bool]:
        """Always ``False``: the envs are rows of one vector env, with no per-env gym wrappers."""
        return [False for _ in self._get_indices(indices)]

    # ------------------------------------------------------------------ rendering
    def get_images(self) -> Sequence[np.ndarray | None]:
        """A lazy sequence of the N frames ((240, 320, 3) uint8; env ``i`` is drawn when indexed)."""
        if self.render_mode != "rgb_array":
            warnings.warn(f"The render mode is {self.render_mode}, but get_images() needs 'rgb_array'.", stacklevel=2)
            return [None] * self.num_envs
        frames = self.venv.render()
        return [None] * self.num_envs if frames is None else frames

    def render(self, mode: str | None = None) -> np.ndarray | None:
        """Env 0's frame ((240, 320, 3) uint8) with ``render_mode="rgb_array"`` (shown in a window for ``"human"``)."""
        if self.render_mode == "rgb_array" and mode in (None, "rgb_array", "human"):
            frame = self.venv.render_env(0)
            if mode != "human":
                return frame
            import cv2  # as SB3's VecEnv.render does for "human"

            cv2.imshow("vecenv", frame[:, :, ::-1])
            cv2.waitKey(1)
            return None
        return super().render(mode)

    # ------------------------------------------------------------------ internals
    def _store_reset_infos(self, info: dict[str, Any], mask: np.ndarray) -> None:
        per_env = unbatch_infos(info, self.num_envs)
        for i in np.flatnonzero(mask):
            self.reset_infos[i] = per_env[i]

    def _option_groups(self) -> list[tuple[dict[str, Any], np.ndarray]]:
        """The distinct option dicts of ``set_options`` with the mask of envs that use each."""
        groups: list[tuple[dict[str, Any], np.ndarray]] = []
        for i, options in enumerate(self._options):
            options = options or {}
            if "reset_mask" in options:
                raise ValueError("SB3VecEnv.reset() resets every env; 'reset_mask' is not a valid option")
            for known, mask in groups:
                if _same(known, options):
                    mask[i] = True
                    break
            else:
                mask = np.zeros(self.num_envs, dtype=bool)
                mask[i] = True
                groups.append((options, mask))
        return groups

    def _check_all(self, indices: VecEnvIndices, what: str) -> None:
        if set(self._get_indices(indices)) != set(range(self.num_envs)):
            raise ValueError(
                f"{what} on a subset of envs is not supported: the {self.num_envs} envs share one UniLabVectorEnv"
            )


def _row(obs: Any, i: int) -> Any:
    """A copy of env ``i``'s observation: row ``i`` of the array, or a dict of the rows of a dict observation."""
    return {k: v[i].copy() for k, v in obs.items()} if isinstance(obs, dict) else obs[i].copy()


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except (ValueError, TypeError):  # e.g. dicts holding arrays
        return False


def make_sb3_env(
    env_id: str,
    num_envs: int,
    seed: int | None = None,
    *,
    monitor: bool = True,
    **env_kwargs: Any,
) -> VecEnv:
    """Create an SB3 ``VecEnv`` of ``num_envs`` envs of a UniLab id (the counterpart of SB3's ``make_vec_env``).

    Args:
        env_id: a registered UniLab id, e.g. ``"UniLab/Quadruped-v0"``.
        num_envs: number of envs N (>= 1).
        seed: seed of the first reset (env ``i`` gets ``seed + i``) and of the action space;
            ``None`` draws a random seed, as ``make_vec_env`` does.
        monitor: wrap in SB3's ``VecMonitor`` (episode returns and lengths in
            ``infos[i]["episode"]``, ``rollout/ep_rew_mean`` in the logs), as ``make_vec_env``
            wraps each env in a ``Monitor``.
        **env_kwargs: arguments of the vector env (``envs_per_cluster``, ``render_mode``,
            ``max_episode_steps``, task arguments ...). ``privileged_obs=True`` gives ``Dict`` observations
            (``"policy"`` and ``"critic"``) for :class:`AsymmetricSACPolicy` / :class:`AsymmetricActorCriticPolicy`.

    Returns:
        ``VecMonitor(SB3VecEnv(venv))``, or the bare :class:`SB3VecEnv` with ``monitor=False``.

    Raises:
        TypeError: ``env_id`` does not make a ``UniLabVectorEnv``.
        ValueError: invalid env arguments (raised by the env, naming the argument).
    """
    venv = make_unilab_vector_env(
        env_id, num_envs, "make_sb3_env", "stable_baselines3.common.env_util.make_vec_env", **env_kwargs
    )
    env: VecEnv = SB3VecEnv(venv)
    if seed is not None:
        try:
            seed = check_seed("seed", seed)
        except ValueError:
            venv.close()
            raise
        env.action_space.seed(seed)
    env.seed(seed)
    return VecMonitor(env) if monitor else env


class EnvMetricsCallback(BaseCallback):
    """Write the env-side pipeline metrics to SB3's logger when training without ``AsyncRunner``.

    For a model whose env is :func:`make_sb3_env` (any SB3 algorithm, ``model.learn(...,
    callback=EnvMetricsCallback())``), at the end of every rollout it records, over the time
    since the previous record:

    - ``unilab/env_steps_per_s``: env steps (transitions) per second, collection and training;
    - ``unilab/step_physics_us``, ``unilab/step_task_us``: mean wall-clock µs of one vector-env
      ``step()`` in physics (every cluster's slice, reading the states back) and task math (the
      rest), from the env's ``step_latency`` (:class:`~unilab_gym.latency.StepLatency`);
    - ``unilab/episodes_terminated``, ``unilab/episodes_truncated``: episodes finished so far.

    The keys are those ``AsyncRunner`` logs (README, "Pipeline metrics"). The episode counts are
    also recorded at the step an episode ends. Off-policy SB3 algorithms log when episodes end,
    in the middle of a rollout: their rows carry the rates and latencies of the previous rollout
    (for ``train_freq=1``, the previous env step), and when several episodes end in one step
    SB3 writes several rows, of which only the first holds the ``unilab/*`` keys.

    Raises:
        ValueError: at training start, if the model's env is not a UniLab env with step timing
            (``step_latency`` missing or ``None``).
    """

    def _init_callback(self) -> None:
        try:
            latency = self.training_env.get_attr("step_latency")[0]
        except AttributeError:
            latency = None
        if latency is None:
            raise ValueError(
                "EnvMetricsCallback needs a UniLab env with step timing "
                "(make_sb3_env(...), env.step_latency not None); "
                f"the model's env is a {type(self.training_env.unwrapped).__name__}"
            )
        self._latency = latency
        self._terminated = self._truncated = 0
        self._mark()

    def _mark(self) -> None:
        self._t, self._steps, self._data = time.monotonic(), self.num_timesteps, self._latency.data.copy()

    def _on_step(self) -> bool:
        dones = self.locals["dones"]
        for i in np.flatnonzero(dones):
            if self.locals["infos"][i].get("TimeLimit.truncated", False):
                self._truncated += 1
            else:
                self._terminated += 1
        if dones.any():  # now: off-policy SB3 logs at episode ends, before this rollout ends
            self.logger.record("unilab/episodes_terminated", self._terminated)
            self.logger.record("unilab/episodes_truncated", self._truncated)
        return True

    def _on_rollout_end(self) -> None:
        from unilab_gym.latency import StepLatency, mean_latency_us

        dt = max(time.monotonic() - self._t, 1e-9)
        delta = self._latency.data - self._data
        rec = self.logger.record
        rec("unilab/env_steps_per_s", (self.num_timesteps - self._steps) / dt)
        for key, part in (("step_physics_us", StepLatency.PHYSICS), ("step_task_us", StepLatency.TASK)):
            mean = mean_latency_us(delta[part])
            if mean is not None:
                rec(f"unilab/{key}", mean)
        rec("unilab/episodes_terminated", self._terminated)
        rec("unilab/episodes_truncated", self._truncated)
        self._mark()
