"""Tianshou 2.x vector env: :class:`TianshouVectorEnv` over one batched ``UniLabVectorEnv``.

Tianshou's ``Collector`` drives a ``BaseVectorEnv`` (``step(action, id)``, ``reset(env_id=...)``,
infos as object arrays of dicts) and resets finished envs itself, after storing the
transition, so ``obs_next`` of the last transition of an episode is the true terminal
observation. :class:`TianshouVectorEnv` gives that API over one batched
:class:`~unilab_gym.vector_env.UniLabVectorEnv`, and behaves like Tianshou's
``DummyVectorEnv`` over N single ``gym.make("UniLab/Quadruped-v0")`` envs::

    from tianshou.data import Collector
    from unilab_gym.tianshou import SharedVectorReplayBuffer, make_tianshou_env

    envs = make_tianshou_env("UniLab/Quadruped-v0", 64, seed=0)
    buffer = SharedVectorReplayBuffer(1_000_000, len(envs))
    collector = Collector(policy, envs, buffer, exploration_noise=True)

Importing this module imports Tianshou (and torch).
"""

from __future__ import annotations

import copy
import numbers
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode
from tianshou.env import BaseVectorEnv

from unilab_gym.adapters import make_unilab_vector_env, unbatch_infos
from unilab_gym.validation import check_seed
from unilab_gym.vector_env import UniLabVectorEnv

__all__ = ["TianshouVectorEnv", "make_tianshou_env"]


def _object_array(items: Sequence[Any]) -> np.ndarray:
    """1-D object array of ``items`` (dicts stay dicts)."""
    out = np.empty(len(items), dtype=object)
    for k, item in enumerate(items):
        out[k] = item
    return out


def _rows(obs: Any, ids: np.ndarray) -> np.ndarray:
    """Rows ``ids`` of the observation.

    For a dict observation (``privileged_obs=True``), an (R,) object array of one dict per env, as ``DummyVectorEnv``
    stacks single envs' dict observations (Tianshou's ``Batch`` stacks it).
    """
    if isinstance(obs, dict):
        return _object_array([{k: v[j] for k, v in obs.items()} for j in ids.tolist()])
    return obs[ids]


class TianshouVectorEnv(BaseVectorEnv):
    """Tianshou ``BaseVectorEnv`` over a :class:`~unilab_gym.vector_env.UniLabVectorEnv`.

    Same results as Tianshou's ``DummyVectorEnv`` over N single envs (seeded alike):

    - ``reset(env_id=None, seed=None, options=None)`` -> ``obs`` (R, 48) float32 (with ``privileged_obs=True``
      an (R,) object array of ``{"policy": (48,), "critic": (68,)}`` dicts, as ``DummyVectorEnv`` gives) and
      ``infos``, an (R,) object array of the single env's reset-info dicts.
    - ``step(action, id=None)`` -> ``obs`` (R, 48) float32, ``rew`` (R,) float64,
      ``terminated`` (R,) bool, ``truncated`` (R,) bool, ``infos`` (R,) object array of dicts
      (``reward_terms``: dict of floats; ``env_id``: int). Finished envs are **not** reset:
      the Collector resets them with ``reset(env_id=...)``, so ``obs`` holds the true final
      observation.
    - ``seed(s)``: env ``i`` and its action space get ``s + i`` (a list gives one seed per env);
      like ``DummyVectorEnv`` this resets the envs.
    - ``action_space`` / ``observation_space``: lists of N per-env spaces (each action space
      has its own RNG, used by ``Collector.collect(random=True)``).

    The N envs are rows of one batched simulation, so they always advance together: stepping
    a subset ``id`` (the Collector does so in ``n_episode`` mode) advances the other envs with
    zero actions and marks them stale; a stale env must be reset before it is stepped again
    (the Collector resets every env at the end of an ``n_episode`` collect).

    Args:
        venv: a ``UniLabVectorEnv`` with ``autoreset_mode`` ``"Disabled"`` or ``"NextStep"``.

    Raises:
        TypeError: ``venv`` is not a ``UniLabVectorEnv``.
        ValueError: ``venv`` is in ``"SameStep"`` mode (it would replace the final
            observation with the next episode's first one).
    """

    def __init__(self, venv: UniLabVectorEnv):
        """Check ``venv`` and wrap it (arguments and errors: see the class docstring)."""
        if not isinstance(venv, UniLabVectorEnv):
            raise TypeError(f"TianshouVectorEnv wraps a UniLabVectorEnv, got {type(venv).__name__}")
        if venv.autoreset_mode == AutoresetMode.SAME_STEP:
            raise ValueError(
                "TianshouVectorEnv needs a UniLabVectorEnv with autoreset_mode='Disabled' or 'NextStep', "
                "got 'SameStep'; use make_tianshou_env"
            )
        # BaseVectorEnv.__init__ builds one worker per env; here the N envs are rows of one
        # batched env, so the base-class state is set directly (synchronous, never async).
        self.venv = venv
        self._env_fns: list = []
        self.workers: list = []
        self.env_num = venv.num_envs
        self.wait_num = venv.num_envs
        self.timeout = None
        self.is_async = False
        self.waiting_conn: list = []
        self.waiting_id: list[int] = []
        self.ready_id = list(range(venv.num_envs))
        self.is_closed = False
        self._action_spaces = [copy.deepcopy(venv.single_action_space) for _ in range(venv.num_envs)]
        self._action_shape = cast(spaces.Box, venv.single_action_space).shape
        self._stale = np.zeros(venv.num_envs, dtype=bool)

    # ------------------------------------------------------------------ attributes
    def get_env_attr(self, key: str, id: int | list[int] | np.ndarray | None = None) -> list[Any]:
        """Attribute ``key`` for each env of ``id`` (the vector env's attribute, shared by all envs).

        ``action_space`` and ``observation_space`` are the per-env (single) spaces.

        Raises:
            AttributeError: no such attribute.
        """
        self._assert_is_not_closed()
        ids = self._ids(id)
        if key == "action_space":
            return [self._action_spaces[j] for j in ids]
        if key == "observation_space":
            return [self.venv.single_observation_space for _ in ids]
        value = getattr(self.venv, key)
        return [value for _ in ids]

    def set_env_attr(self, key: str, value: Any, id: int | list[int] | np.ndarray | None = None) -> None:
        """Set ``key`` on the vector env (shared by all envs).

        Raises:
            ValueError: ``id`` is not every env.
        """
        self._assert_is_not_closed()
        if set(self._ids(id).tolist()) != set(range(self.env_num)):
            raise ValueError(
                f"set_env_attr({key!r}) on a subset of envs is not supported: the {self.env_num} envs "
                "share one UniLabVectorEnv"
            )
        setattr(self.venv, key, value)

    # ------------------------------------------------------------------ reset / step
    def reset(
        self,
        env_id: int | list[int] | np.ndarray | None = None,
        **kwargs: Any,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Reset the envs ``env_id`` (default: all).

        Args:
            env_id: an env index or a sequence of them.
            **kwargs: ``seed`` and ``options``, below.

        Keyword Args:
            seed (int | Sequence[int] | None): like Tianshou (which passes the same kwargs to every
                env's ``reset``), an int seeds every selected env (and its action space) with that
                same int; a sequence gives one seed per selected env. ``None`` continues each env's
                random stream.
            options (dict | None): passed to the env's reset (``"reset_mask"`` is not allowed).

        Returns:
            ``(obs, infos)``: (R, 48) float32 and an (R,) object array of dicts.

        Raises:
            TypeError: an unknown keyword argument.
            ValueError: bad ``env_id``, a seed that is not a non-negative int (``bool`` is refused), a seed
                list of the wrong length, or ``reset_mask`` in options.
        """
        self._assert_is_not_closed()
        seed = kwargs.pop("seed", None)
        options = dict(kwargs.pop("options", None) or {})
        if kwargs:
            raise TypeError(f"TianshouVectorEnv.reset() got unexpected keyword arguments {sorted(kwargs)}")
        if "reset_mask" in options:
            raise ValueError("use env_id to choose the envs to reset, not options['reset_mask']")
        ids = self._ids(env_id)
        mask = np.zeros(self.env_num, dtype=bool)
        mask[ids] = True
        seeds: list[int | None] | None = None
        if seed is not None:
            per_env = [check_seed("seed", seed)] * len(ids) if isinstance(seed, numbers.Number) else _seed_list(seed)
            if len(per_env) != len(ids):
                raise ValueError(f"got {len(per_env)} seeds for {len(ids)} envs")
            seeds = [None] * self.env_num
            for j, s in zip(ids.tolist(), per_env):
                seeds[j] = s
        obs, info = self.venv.reset(seed=seeds, options={**options, "reset_mask": mask})
        if seeds is not None:
            for j in ids.tolist():
                self._action_spaces[j].seed(seeds[j])
        self._stale[mask] = False
        infos = unbatch_infos(info, self.env_num)
        return _rows(obs, ids), _object_array([infos[j] for j in ids.tolist()])

    def step(
        self,
        action: np.ndarray | Any,
        id: int | list[int] | np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Step the envs ``id`` (default: all) with ``action`` ((R, 12), row ``k`` for env ``id[k]``).

        Returns:
            ``(obs, rew, terminated, truncated, infos)`` for the R envs (see the class docstring).

        Raises:
            ValueError: ``action`` is ``None`` or has the wrong length / shape, NaN/inf actions
                (nothing is stepped), or bad ``id``.
            RuntimeError: a stale env (advanced while not in ``id``) is stepped before its reset.
            unilab_gym.vector_env.FinishedEnvError: with autoreset ``"Disabled"``, an env of ``id`` finished
                and was not reset (nothing is stepped).
        """
        self._assert_is_not_closed()
        ids = self._ids(id)
        if action is None:
            raise ValueError("action must not be None: TianshouVectorEnv is synchronous")
        action = np.asarray(action)
        if len(action) != len(ids):
            raise ValueError(f"got {len(action)} actions for {len(ids)} envs")
        if self._stale[ids].any():
            stale = ids[self._stale[ids]].tolist()
            raise RuntimeError(
                f"envs {stale} advanced (with zero actions) while other envs were stepped alone; "
                "reset them (reset(env_id=...)) before stepping them again"
            )
        full = np.zeros((self.env_num, *self._action_shape))
        try:
            full[ids] = action
        except (TypeError, ValueError):
            raise ValueError(f"actions must have shape {(len(ids), *self._action_shape)}, got {action.shape}") from None
        active = np.zeros(self.env_num, dtype=bool)
        active[ids] = True
        # a partial step: the other envs idle (their robots are simulated with a zero action, so they are stale)
        obs, rew, terminated, truncated, info = self.venv.step(full, active=active)
        self._stale |= ~active
        infos = unbatch_infos(info, self.env_num)
        for j in ids.tolist():
            infos[j]["env_id"] = j
        return (
            _rows(obs, ids),
            rew[ids],
            terminated[ids],
            truncated[ids],
            _object_array([infos[j] for j in ids.tolist()]),
        )

    def seed(self, seed: int | list[int] | None = None) -> list[list[int] | None]:
        """Seed env ``i`` and its action space with ``seed + i`` (or ``seed[i]``) and reset all envs.

        Returns:
            ``[[seed_0], [seed_1], ...]`` as Tianshou's ``DummyVectorEnv`` returns.

        Raises:
            ValueError: a seed that is not a non-negative int (``bool`` is refused), or a list of the wrong length.
        """
        self._assert_is_not_closed()
        if seed is None:
            seeds: list[int | None] = [None] * self.env_num
        elif isinstance(seed, numbers.Number):
            first = check_seed("seed", seed)
            seeds = [first + i for i in range(self.env_num)]
        else:
            seeds = _seed_list(seed)
        self.venv.reset(seed=seeds)  # validates the list
        for space, s in zip(self._action_spaces, seeds):
            space.seed(s)
        self._stale[:] = False
        # Tianshou annotates list[int] | None, but its DummyVectorEnv returns [None] for an unseeded env too
        return [[s] for s in seeds]  # type: ignore[list-item]

    # Tianshou annotates list[Any]; a lazy Sequence keeps Collector(render=...), which discards the result,
    # from drawing all N frames on every step.
    def render(self, **kwargs: Any) -> Sequence[np.ndarray | None]:  # type: ignore[override]
        """The N frames ((240, 320, 3) uint8, env ``i`` drawn when indexed), or N ``None`` without a render mode."""
        self._assert_is_not_closed()
        frames = self.venv.render()
        return [None] * self.env_num if frames is None else frames

    def close(self) -> None:
        """Close the vector env (its pybullet worlds)."""
        self._assert_is_not_closed()
        self.venv.close()
        self.is_closed = True

    def _ids(self, id: int | list[int] | np.ndarray | None) -> np.ndarray:
        ids = np.asarray(self._wrap_id(id))
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
            raise ValueError(f"env ids must be an int or a sequence of ints, got {id!r}")
        ids = ids.astype(np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.env_num):
            raise ValueError(f"env ids must be in [0, {self.env_num}), got {ids.tolist()}")
        if np.unique(ids).size != ids.size:
            raise ValueError(f"env ids must be distinct, got {ids.tolist()}")
        return ids


def make_tianshou_env(env_id: str, num_envs: int, seed: int | None = None, **env_kwargs: Any) -> TianshouVectorEnv:
    """Create a :class:`TianshouVectorEnv` of ``num_envs`` envs of a UniLab id.

    Args:
        env_id: a registered UniLab id, e.g. ``"UniLab/Quadruped-v0"``.
        num_envs: number of envs N (>= 1).
        seed: if given, ``envs.seed(seed)``: env ``i`` and its action space get ``seed + i``.
        **env_kwargs: arguments of the vector env (``envs_per_cluster``, ``render_mode``,
            ``max_episode_steps``, task arguments ...).

    Raises:
        TypeError: ``env_id`` does not make a ``UniLabVectorEnv``.
        ValueError: invalid env arguments (raised by the env, naming the argument).
    """
    venv = make_unilab_vector_env(
        env_id, num_envs, "make_tianshou_env", "tianshou.env.DummyVectorEnv / SubprocVectorEnv", **env_kwargs
    )
    envs = TianshouVectorEnv(venv)
    if seed is not None:
        envs.seed(seed)
    return envs


def _seed_list(seed: Any) -> list[int | None]:
    """A per-env seed list (its entries are checked by the env), or ``ValueError`` if ``seed`` is no sequence."""
    if not isinstance(seed, (list, tuple, np.ndarray)):
        raise ValueError(f"seed must be an int, a list of ints/None, or None; got {seed!r}")
    return list(seed)
