"""``AsyncRunner``: stock SB3 off-policy training with collection in separate processes.

::

    collector 0 ─┐  (spawned: EIC cluster + CPU actor)      ┌─► model.train()  (stock SB3, unchanged)
    collector 1 ─┼──► SharedReplayBuffer (shared memory) ───┘         │
       ...      ─┘         ▲                                          ▼
                 └──────── versioned actor weights (shared memory) ◄──┘

**Replay ratio.** The runner keeps SB3's ratio of gradient steps to env steps (transitions):
``replay_ratio = gradient_steps / (train_freq * n_envs)``, with ``train_freq`` in steps and
``n_envs`` the number of envs of the model's own env (``gradient_steps=-1`` means one gradient
step per transition, as in SB3). E.g. ``SAC(..., make_sb3_env(id, 64), train_freq=1,
gradient_steps=1)`` gives 1/64: one gradient step per 64 transitions, whoever collects them.
Pass ``replay_ratio=`` to set it directly. After ``learning_starts`` transitions the learner
runs ``floor((num_timesteps - learning_starts) * replay_ratio)`` gradient steps in total:

- when the learner falls behind, collectors wait (backpressure): together they may not run more
  than ``2 * num_collectors * envs_per_collector`` transitions ahead of the learner;
- when collectors fall behind, the learner waits for data instead of training more.

**Policy lag** is the learner's published weight version minus the version a collector acts
with. Collectors load every new version before their next step; the learner never publishes a
version more than ``max_policy_lag`` ahead of the slowest live collector (it keeps training and
publishes later), so the lag stays within ``max_policy_lag``. Both figures are logged.
"""

from __future__ import annotations

import io
import math
import multiprocessing as mp
import os
import time
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import Any

import numpy as np

from unilab_gym.runtime.collector import CollectorSpec, collector_main
from unilab_gym.runtime.control import BUDGET, LEARNING_STARTS, STOP, VERSION, Control
from unilab_gym.runtime.errors import CollectorError
from unilab_gym.runtime.weights import SharedWeights

#: Longest a learner waits for collectors to exit on close before terminating them, in s.
JOIN_TIMEOUT_S = 3.0
#: Target duration of one ``model.train()`` call, in s: faults are checked between calls.
TRAIN_CHUNK_S = 0.05


class AsyncRunner:
    """Drive a stock SB3 off-policy model (SAC, TD3, DDPG) with collectors in separate processes.

    Args:
        model: an SB3 ``SAC`` / ``TD3`` / ``DDPG`` whose replay buffer is a
            :class:`unilab_gym.SharedReplayBuffer` (``replay_buffer_class=SharedReplayBuffer``).
        env_id: a registered gymnasium id; each collector makes ``gym.make_vec(env_id,
            num_envs=envs_per_collector, **env_kwargs)``.
        env_fn: instead of ``env_id``: a picklable ``env_fn(num_envs) -> gymnasium.vector.VectorEnv``.
        num_collectors: collector processes.
        envs_per_collector: envs per collector (its EIC cluster size).
        env_kwargs: keyword arguments for ``gym.make_vec``.
        max_policy_lag: most weight versions a collector may act behind the learner (>= 1).
        replay_ratio: gradient steps per transition; default from the model (see module docs).
        seed: collector ``c`` seeds its env with ``seed + c * envs_per_collector`` (env ``i`` of it
            gets ``+ i``) and its torch / noise streams with ``seed + c``; default ``model.seed``,
            else random.
        start_method: multiprocessing start method for collectors (``"spawn"``, safe with torch).

    Raises:
        ValueError: an unsupported model (on-policy, gSDE, episode-based ``train_freq``), a
            replay buffer that is not a ``SharedReplayBuffer``, a buffer capacity smaller than
            ``learning_starts``, both or neither of ``env_id`` / ``env_fn``, or bad counts.

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
        max_policy_lag: int = 4,
        replay_ratio: float | None = None,
        seed: int | None = None,
        start_method: str = "spawn",
    ):
        from stable_baselines3 import SAC, TD3
        from stable_baselines3.common.buffers import ReplayBuffer
        from stable_baselines3.common.type_aliases import TrainFrequencyUnit

        from unilab_gym.integrations.sb3_replay import SharedReplayBuffer

        self._closed = True  # until fully constructed
        if (env_id is None) == (env_fn is None):
            raise ValueError("pass exactly one of env_id or env_fn")
        for name, value in (("num_collectors", num_collectors), ("envs_per_collector", envs_per_collector)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if isinstance(max_policy_lag, bool) or not isinstance(max_policy_lag, int) or max_policy_lag < 1:
            raise ValueError(f"max_policy_lag must be an int >= 1 for off-policy models, got {max_policy_lag!r}")
        if isinstance(model, SAC):
            self._algo = "sac"
        elif isinstance(model, TD3):  # DDPG is a TD3
            self._algo = "td3"
        else:
            raise ValueError(f"AsyncRunner drives SB3 SAC, TD3 or DDPG models, got {type(model).__name__}")
        if getattr(model, "use_sde", False):
            raise ValueError("AsyncRunner does not support gSDE exploration (use_sde=True)")
        if not isinstance(model.replay_buffer, SharedReplayBuffer):
            raise ValueError(
                f"the model's replay buffer is a {type(model.replay_buffer).__name__}; create the model with "
                "replay_buffer_class=unilab_gym.SharedReplayBuffer so collectors can write to it"
            )
        capacity = model.replay_buffer.storage.capacity
        if capacity < model.learning_starts:
            raise ValueError(
                f"replay buffer capacity {capacity} is smaller than learning_starts={model.learning_starts}: "
                "training would never start"
            )
        if model.train_freq.unit != TrainFrequencyUnit.STEP:
            raise ValueError("AsyncRunner needs train_freq in steps, e.g. train_freq=1 or (1, 'step')")
        if replay_ratio is None:
            per_call = model.train_freq.frequency * model.n_envs
            replay_ratio = 1.0 if model.gradient_steps < 0 else model.gradient_steps / per_call
        if not (math.isfinite(replay_ratio) and replay_ratio >= 0):
            raise ValueError(f"replay_ratio must be a finite number >= 0, got {replay_ratio!r}")

        self.model = model
        self.replay_ratio = float(replay_ratio)
        self.num_collectors = num_collectors
        self.envs_per_collector = envs_per_collector
        self.max_policy_lag = max_policy_lag
        self._env_id, self._env_fn, self._env_kwargs = env_id, env_fn, dict(env_kwargs or {})
        if seed is None:
            seed = model.seed if model.seed is not None else int(np.random.SeedSequence().generate_state(1)[0])
        self.seed = int(seed)
        self._ctx = mp.get_context(start_method)
        # a saved model must load without unilab_gym: SB3 pickles replay_buffer_class
        model.replay_buffer_class = ReplayBuffer
        model.replay_buffer_kwargs = {}

        self._actor = model.actor
        self._actor_tensors = list(self._actor.state_dict().values())
        size = sum(t.numel() for t in self._actor_tensors)
        self._flat = np.empty(size, np.float32)
        self._weights = SharedWeights(size)
        try:
            self._control = Control(num_collectors)
        except BaseException:
            self._weights.close()
            raise
        self._procs: list[Any] = []
        self._conns: list[Any] = []
        self._closed = False
        self._publish(force=True)

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

        Collectors get ``JOIN_TIMEOUT_S`` to exit, then SIGTERM, then SIGKILL. The model and its
        replay buffer stay usable.
        """
        if self._closed:
            return
        self._closed = True
        self._control.globals[STOP] = 1
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

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this AsyncRunner is closed; create a new one")

    def _start_collectors(self) -> None:
        import torch

        buffer = io.BytesIO()
        torch.save(_cpu_copy(self._actor), buffer)
        noise = getattr(self.model, "action_noise", None)
        for c in range(self.num_collectors):
            spec = CollectorSpec(
                index=c,
                num_envs=self.envs_per_collector,
                seed=self.seed + c * self.envs_per_collector,
                algo=self._algo,
                actor=buffer.getvalue(),
                env_id=self._env_id,
                env_fn=self._env_fn,
                env_kwargs=self._env_kwargs,
                action_noise=noise,
                parent_pid=os.getpid(),
            )
            reader, writer = self._ctx.Pipe(duplex=False)
            proc = self._ctx.Process(
                target=collector_main,
                args=(spec, self.model.replay_buffer.handle, self._weights.handle, self._control.handle, writer),
                name=f"unilab-collector-{c}",
                daemon=True,
            )
            proc.start()
            writer.close()
            self._procs.append(proc)
            self._conns.append(reader)

    # ------------------------------------------------------------------ weights
    def _publish(self, force: bool = False) -> bool:
        """Publish the actor's weights unless that would put a live collector over ``max_policy_lag``."""
        if not force and self._procs:
            slowest = int(self._control.rows[:, VERSION].min())
            if self._weights.version + 1 - slowest > self.max_policy_lag:
                return False
        offset = 0
        for t in self._actor_tensors:
            k = t.numel()
            self._flat[offset : offset + k] = t.detach().reshape(-1).cpu().numpy()
            offset += k
        self._weights.publish(self._flat)
        return True

    def policy_lag(self) -> int:
        """Current policy lag: published version minus the oldest version a collector acts with."""
        if not self._procs:
            return 0
        return self._weights.version - int(self._control.rows[:, VERSION].min())

    # ------------------------------------------------------------------ faults and messages
    def _poll(self, on_episodes: Callable[[list[float], list[int]], None]) -> None:
        """Drain collector messages; raise :class:`CollectorError` for a failed or dead collector."""
        ready = wait(self._conns + [p.sentinel for p in self._procs], timeout=0)
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
                    on_episodes(*payload)
            if proc.sentinel in ready or not proc.is_alive():
                proc.join(0.1)
                raise CollectorError(
                    f"collector {c} (pid {proc.pid}) died unexpectedly with exit code {proc.exitcode}"
                    + (" (killed by signal %d)" % -proc.exitcode if proc.exitcode is not None and proc.exitcode < 0 else ""),
                    collector=c, pid=proc.pid, exitcode=proc.exitcode, traceback=None,
                )

    # ------------------------------------------------------------------ training
    def learn(
        self,
        total_timesteps: int,
        callback: Any = None,
        log_interval: int = 4,
        tb_log_name: str = "AsyncRunner",
        reset_num_timesteps: bool = True,
        progress_bar: bool = False,
    ) -> Any:
        """Train ``self.model`` for ``total_timesteps`` env steps (transitions); return the model.

        Same signature and meaning as SB3's ``model.learn``: callbacks (``on_step`` is called once
        per ``model.n_envs`` transitions, as SB3 does for the model's own env), the logger
        (``log_interval`` in episodes), TensorBoard and the progress bar work unchanged.
        ``model.num_timesteps`` counts transitions written by the collectors.

        Raises:
            CollectorError: a collector raised (with its traceback) or died (e.g. SIGKILL).
                Collectors are stopped before any exception leaves ``learn``.
        """
        self._check_open()
        model = self.model
        try:
            total, callback = model._setup_learn(total_timesteps, callback, reset_num_timesteps, tb_log_name, progress_bar)
            callback.on_training_start(locals(), globals())
            self._train_loop(total, callback, log_interval)
            callback.on_training_end()
        except BaseException:
            self.close()
            raise
        return model

    def _train_loop(self, total: int, callback: Any, log_interval: int) -> None:
        model, control = self.model, self._control
        start_steps = model.num_timesteps
        base = control.total_transitions()
        target = total - start_steps  # transitions to collect in this call
        starts = max(0, model.learning_starts - start_steps)
        lead = 2 * self.num_collectors * self.envs_per_collector
        control.globals[LEARNING_STARTS] = base + starts
        t0 = time.monotonic()
        grad_steps = calls = 0
        grad_step_s = TRAIN_CHUNK_S  # running estimate of one gradient step's duration
        episodes_logged = model._episode_num
        lag_sum = lag_n = lag_max = 0

        def on_episodes(returns: list[float], lengths: list[int]) -> None:
            for r, l in zip(returns, lengths):
                model.ep_info_buffer.append({"r": r, "l": l, "t": round(time.monotonic() - t0, 6)})
            model._episode_num += len(returns)

        def set_budget() -> None:
            allowed = target if self.replay_ratio == 0 else min(target, starts + math.ceil(grad_steps / self.replay_ratio) + lead)
            control.globals[BUDGET] = base + allowed

        set_budget()
        if not self._procs:
            self._start_collectors()
        while True:
            self._poll(on_episodes)
            produced = control.total_transitions() - base
            now_steps = start_steps + min(produced, target)
            # one on_step per model.n_envs transitions, num_timesteps rising as in SB3's own loop
            while (calls + 1) * model.n_envs <= now_steps - start_steps:
                calls += 1
                model.num_timesteps = start_steps + calls * model.n_envs
                if not callback.on_step():
                    return
            model.num_timesteps = now_steps
            lag = self.policy_lag()
            lag_sum, lag_n, lag_max = lag_sum + lag, lag_n + 1, max(lag_max, lag)
            if log_interval is not None and model._episode_num // log_interval > episodes_logged // log_interval:
                episodes_logged = model._episode_num
                elapsed = max(time.monotonic() - t0, 1e-9)
                model.logger.record("unilab/policy_lag_mean", lag_sum / max(lag_n, 1))
                model.logger.record("unilab/policy_lag_max", lag_max)
                model.logger.record("unilab/grad_steps_per_s", grad_steps / elapsed)
                model.logger.record("unilab/env_steps_per_s", produced / elapsed)
                model.logger.record("unilab/replay_ratio", grad_steps / max(produced - starts, 1))
                (model.dump_logs if hasattr(model, "dump_logs") else model._dump_logs)()
                lag_sum = lag_n = lag_max = 0
            done = produced >= target
            if done:
                control.globals[BUDGET] = control.total_transitions()  # pause collectors
            counted = min(produced, target)
            due = math.floor(max(0, counted - starts) * self.replay_ratio) - grad_steps if counted > starts else 0
            if due > 0:
                # SB3 trains after every collection, the last one included; so do we
                model._update_current_progress_remaining(model.num_timesteps, total)
                # chunks of about TRAIN_CHUNK_S, so collector faults are noticed between them
                k = due if done else max(1, min(due, int(TRAIN_CHUNK_S / grad_step_s)))
                t_train = time.perf_counter()
                model.train(gradient_steps=k, batch_size=model.batch_size)
                grad_step_s = 0.8 * grad_step_s + 0.2 * (time.perf_counter() - t_train) / k
                grad_steps += k
                self._publish()
            if done:
                return
            set_budget()
            if due <= 0:
                wait(self._conns + [p.sentinel for p in self._procs], timeout=0.001)


def _cpu_copy(module: Any) -> Any:
    import copy

    return copy.deepcopy(module).to("cpu")
