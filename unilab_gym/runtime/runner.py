"""``AsyncRunner``: stock SB3 training with env collection in separate processes.

::

    collector 0 ─┐  (spawned: EIC cluster + CPU policy)      ┌─► model.train()  (stock SB3, unchanged)
    collector 1 ─┼──► shared memory: replay | rollouts ──────┘         │
       ...      ─┘         ▲                                           ▼
                 └──────── versioned policy weights (shared memory) ◄──┘

One runtime for both families of SB3 algorithms. This module owns what they share: the
collector processes, the weights they act with (:class:`SharedWeights`), the shared counters
(:class:`Control`), fault detection, ``close()`` and the ``learn()`` plumbing (callbacks,
logger, progress bar). What differs is a *loop* (learner side) and the *writer* it gives each
collector (collector side):

- off-policy (SAC, TD3, DDPG): :mod:`unilab_gym.runtime.off_policy` — collectors write
  transitions into the model's ``SharedReplayBuffer``, the learner keeps SB3's replay ratio;
- on-policy (PPO, A2C): :mod:`unilab_gym.runtime.on_policy` — collectors write whole
  rollouts into :class:`~unilab_gym.runtime.rollout.RolloutStorage`, the learner fills
  ``model.rollout_buffer`` and runs the stock ``train()``.
"""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import time
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import Any

import numpy as np

from unilab_gym.runtime.collector import CollectorSpec, collector_main
from unilab_gym.runtime.control import READY, STOP, VERSION, Control
from unilab_gym.runtime.errors import CollectorError
from unilab_gym.runtime.weights import SharedWeights

#: Longest a learner waits for collectors to exit on close before terminating them, in s.
JOIN_TIMEOUT_S = 3.0


class AsyncRunner:
    """Drive a stock SB3 model with collectors in separate processes.

    Off-policy (``SAC``, ``TD3``, ``DDPG``): the model's replay buffer must be a
    :class:`unilab_gym.SharedReplayBuffer` (``replay_buffer_class=SharedReplayBuffer``); see
    :mod:`unilab_gym.runtime.off_policy` for the replay ratio and policy lag.
    On-policy (``PPO``, ``A2C``): the model's env must have ``num_collectors *
    envs_per_collector`` envs (``n_steps`` is per env, as in SB3); see
    :mod:`unilab_gym.runtime.on_policy` for the rollout, GAE and lag semantics.

    Args:
        model: an SB3 ``SAC`` / ``TD3`` / ``DDPG`` / ``PPO`` / ``A2C``.
        env_id: a registered gymnasium id; each collector makes ``gym.make_vec(env_id,
            num_envs=envs_per_collector, **env_kwargs)`` (on-policy: with same-step autoreset).
        env_fn: instead of ``env_id``: a picklable ``env_fn(num_envs) -> gymnasium.vector.VectorEnv``
            (on-policy: with ``autoreset_mode="SameStep"``).
        num_collectors: collector processes.
        envs_per_collector: envs per collector (its EIC cluster size).
        env_kwargs: keyword arguments for ``gym.make_vec``.
        max_policy_lag: most weight versions a collector may act behind the learner. ``None``:
            the family's default, 4 off-policy (valid: >= 1), 0 on-policy (valid: 0 or 1).
        replay_ratio: off-policy only: gradient steps per transition; default from the model.
        seed: collector ``c`` seeds its env with ``seed + c * envs_per_collector`` (env ``i`` of it
            gets ``+ i``, so env ``j`` of all collectors gets ``seed + j``, as ``make_sb3_env``
            seeds them) and torch / numpy with ``seed + c``; default ``model.seed``, else random.
        start_method: multiprocessing start method for collectors (``"spawn"``, safe with torch).

    Raises:
        ValueError: an unsupported model or model setting (named in the message), both or
            neither of ``env_id`` / ``env_fn``, bad counts, a bad ``max_policy_lag`` or
            ``replay_ratio``, or a model whose env is wrapped in ``VecNormalize`` (collectors
            would not normalize).

    Use as a context manager, or call :meth:`close`; it stops and joins every collector.
    """

    def __init__(
        self,
        model: Any,
        env_id: str | None = None,
        env_fn: Callable[[int], Any] | None = None,
        num_collectors: int = 2,
        envs_per_collector: int = 32,
        *,
        env_kwargs: dict[str, Any] | None = None,
        max_policy_lag: int | None = None,
        replay_ratio: float | None = None,
        seed: int | None = None,
        start_method: str = "spawn",
    ):
        from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
        from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm

        from unilab_gym.runtime.off_policy import OffPolicyLoop
        from unilab_gym.runtime.on_policy import OnPolicyLoop

        self._closed = True  # until fully constructed
        if (env_id is None) == (env_fn is None):
            raise ValueError("pass exactly one of env_id or env_fn")
        for name, value in (("num_collectors", num_collectors), ("envs_per_collector", envs_per_collector)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if isinstance(model, OnPolicyAlgorithm):
            family = OnPolicyLoop
        elif isinstance(model, OffPolicyAlgorithm):
            family = OffPolicyLoop
        else:
            raise ValueError(f"AsyncRunner drives SB3 SAC, TD3, DDPG, PPO or A2C models, got {type(model).__name__}")
        if model.get_vec_normalize_env() is not None:
            raise ValueError(
                "the model's env is wrapped in VecNormalize, which collectors do not apply: their observations and "
                "rewards would not be normalized; train without VecNormalize (or normalize inside the env)"
            )
        self._loop = family(model, num_collectors, envs_per_collector, max_policy_lag, replay_ratio)
        try:
            self._env_kwargs = self._loop.env_kwargs(dict(env_kwargs or {}))
        except BaseException:
            self._loop.close()
            raise
        self.model = model
        self.num_collectors = num_collectors
        self.envs_per_collector = envs_per_collector
        self.max_policy_lag: int = self._loop.max_policy_lag
        #: off-policy: gradient steps per transition; ``None`` on-policy.
        self.replay_ratio: float | None = self._loop.replay_ratio
        self._env_id, self._env_fn = env_id, env_fn
        if seed is None:
            seed = model.seed if model.seed is not None else int(np.random.SeedSequence().generate_state(1)[0])
        self.seed = int(seed)
        self._ctx = mp.get_context(start_method)

        self._policy = self._loop.policy
        self._tensors = list(self._policy.state_dict().values())
        size = sum(t.numel() for t in self._tensors)
        self._flat = np.empty(size, np.float32)
        self._published = np.full(size, np.nan, np.float32)
        self._weights: SharedWeights | None = None
        try:
            self._weights = SharedWeights(size)
            self._control = Control(num_collectors)
        except BaseException:
            if self._weights is not None:
                self._weights.close()
            self._loop.close()
            raise
        self._procs: list[Any] = []
        self._conns: list[Any] = []
        self._t0 = time.monotonic()
        self._closed = False
        self._publish()

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> "AsyncRunner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def collector_pids(self) -> list[int]:
        """Process ids of the running collectors (empty before the first :meth:`learn`)."""
        return [p.pid for p in self._procs]

    def close(self) -> None:
        """Stop and join every collector, then free the runner's shared memory. Idempotent.

        Collectors in their loop get ``JOIN_TIMEOUT_S`` to exit, then SIGTERM, then SIGKILL;
        collectors still starting (imports, env construction) get SIGTERM at once. The model (and
        its replay buffer) stays usable; an on-policy model gets its own rollout buffer back.
        """
        if self._closed:
            return
        self._closed = True
        self._control.globals[STOP] = 1
        for proc, ready in zip(self._procs, self._control.rows[:, READY]):
            if not ready:  # still importing or building its env: nothing to finish, do not wait for it
                proc.terminate()
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        for proc in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in self._procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(1.0)
            if proc.is_alive():
                proc.kill()
                proc.join(1.0)
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []
        self._control.close()
        self._weights.close()
        self._loop.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this AsyncRunner is closed; create a new one")

    def _start_collectors(self) -> None:
        """Spawn the collectors (once; later calls do nothing)."""
        if self._procs:
            return
        import copy

        import torch

        buffer = io.BytesIO()
        torch.save(copy.deepcopy(self._policy).to("cpu"), buffer)
        for c in range(self.num_collectors):
            spec = CollectorSpec(
                index=c,
                num_envs=self.envs_per_collector,
                env_seed=self.seed + c * self.envs_per_collector,
                seed=self.seed + c,
                policy=buffer.getvalue(),
                writer=self._loop.writer(c),
                env_id=self._env_id,
                env_fn=self._env_fn,
                env_kwargs=self._env_kwargs,
                parent_pid=os.getpid(),
            )
            reader, writer = self._ctx.Pipe(duplex=False)
            proc = self._ctx.Process(
                target=collector_main,
                args=(spec, self._weights.handle, self._control.handle, writer),
                name=f"unilab-collector-{c}",
                daemon=True,
            )
            proc.start()
            writer.close()
            self._procs.append(proc)
            self._conns.append(reader)

    # ------------------------------------------------------------------ weights
    def _publish(self, only_if_changed: bool = False) -> int:
        """Publish the policy's weights as a new version (unless unchanged and ``only_if_changed``); return the version."""
        offset = 0
        for t in self._tensors:
            k = t.numel()
            self._flat[offset : offset + k] = t.detach().reshape(-1).cpu().numpy()
            offset += k
        if only_if_changed and np.array_equal(self._flat, self._published):
            return self._weights.version
        self._published[:] = self._flat
        return self._weights.publish(self._flat)

    def policy_lag(self) -> int:
        """Current policy lag: published version minus the oldest version a collector acts with."""
        if not self._procs:
            return 0
        return self._weights.version - int(self._control.rows[:, VERSION].min())

    # ------------------------------------------------------------------ faults and messages
    def _wait(self, timeout: float) -> None:
        """Sleep until a collector sends a message or exits, at most ``timeout`` s."""
        wait(self._conns + [p.sentinel for p in self._procs], timeout=timeout)

    def _poll(self) -> None:
        """Drain collector messages (episode stats go to ``model.ep_info_buffer``); raise for a failed or dead collector.

        Raises:
            CollectorError: a collector sent its traceback, or exited.
        """
        ready = wait(self._conns + [p.sentinel for p in self._procs], timeout=0)
        if not ready:
            return
        for c, (conn, proc) in enumerate(zip(self._conns, self._procs)):
            if conn in ready:
                while conn.poll():
                    try:
                        kind, *payload = conn.recv()
                    except (EOFError, OSError):
                        break
                    if kind == "error":
                        raise CollectorError(
                            f"collector {c} (pid {proc.pid}) raised an exception",
                            collector=c, pid=proc.pid, exitcode=proc.exitcode, traceback=payload[0],
                        )
                    self._on_episodes(*payload)
            if proc.sentinel in ready or not proc.is_alive():
                proc.join(0.1)
                raise CollectorError(
                    f"collector {c} (pid {proc.pid}) died unexpectedly with exit code {proc.exitcode}"
                    + (" (killed by signal %d)" % -proc.exitcode if proc.exitcode is not None and proc.exitcode < 0 else ""),
                    collector=c, pid=proc.pid, exitcode=proc.exitcode, traceback=None,
                )

    def _on_episodes(self, returns: list[float], lengths: list[int]) -> None:
        model = self.model
        for r, l in zip(returns, lengths):
            model.ep_info_buffer.append({"r": r, "l": l, "t": round(time.monotonic() - self._t0, 6)})
        model._episode_num += len(returns)

    # ------------------------------------------------------------------ training
    def learn(
        self,
        total_timesteps: int,
        callback: Any = None,
        log_interval: int | None = None,
        tb_log_name: str = "AsyncRunner",
        reset_num_timesteps: bool = True,
        progress_bar: bool = False,
    ) -> Any:
        """Train ``self.model`` for ``total_timesteps`` env steps (transitions); return the model.

        Same signature and meaning as SB3's ``model.learn``: callbacks, the logger, TensorBoard
        and the progress bar work unchanged. ``on_step`` is called once per ``model.n_envs``
        transitions written by the collectors, with ``model.num_timesteps`` rising by
        ``model.n_envs``; on-policy, ``on_rollout_start`` / ``on_rollout_end`` frame each
        rollout. ``log_interval`` is in episodes off-policy (default 4) and in rollouts
        on-policy (default 1), as in SB3. The callbacks' ``self.locals`` do not hold per-step
        ``infos`` / ``dones`` (the learner never sees single steps).

        Raises:
            CollectorError: a collector raised (with its traceback) or died (e.g. SIGKILL).
                Collectors are stopped before any exception leaves ``learn``.
            RuntimeError: the runner is closed.
        """
        self._check_open()
        model = self.model
        if log_interval is None:
            log_interval = self._loop.default_log_interval
        try:
            total, callback = model._setup_learn(total_timesteps, callback, reset_num_timesteps, tb_log_name, progress_bar)
            callback.on_training_start(locals(), globals())
            self._t0 = time.monotonic()
            self._loop.run(self, total, callback, log_interval)
            callback.on_training_end()
        except BaseException:
            self.close()
            raise
        return model
