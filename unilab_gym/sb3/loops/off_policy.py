"""Off-policy family (SAC, TD3, DDPG): collectors write transitions into the shared replay, the learner trains.

**Replay ratio.** The runner keeps SB3's ratio of gradient steps to env steps (transitions):
``replay_ratio = gradient_steps / (train_freq * n_envs)``, with ``train_freq`` in steps and
``n_envs`` the number of envs of the model's own env (``gradient_steps=-1`` means one gradient
step per transition, as in SB3). E.g. ``SAC(..., make_sb3_env(id, 64), train_freq=1,
gradient_steps=1)`` gives 1/64: one gradient step per 64 transitions, whoever collects them.
Pass ``replay_ratio=`` to set it directly. After ``learning_starts`` transitions the learner
runs ``floor((num_timesteps - learning_starts) * replay_ratio)`` gradient steps in total:

- when the learner falls behind, collectors wait (backpressure): together they may not run more
  than ``2 * num_collectors * envs_per_collector`` transitions ahead of what the learner's next
  gradient step needs (``1 / replay_ratio`` transitions a step);
- when collectors fall behind, the learner waits for data instead of training more.

**Policy lag** is the learner's published weight version minus the version a collector acts
with. Collectors load every new version before their next step; the learner never publishes a
version more than ``max_policy_lag`` ahead of the slowest live collector (it keeps training and
publishes later), so the lag of the data stays within ``max_policy_lag`` (default 4). The lag
metric counts each training call held back that way as one more version: it is the lag the
slowest collector really has behind the learner's weights, so a stalled collector shows a
growing lag (until ``collector_timeout_s`` declares it hung), not a healthy ``max_policy_lag``.
Both figures are logged with the other pipeline metrics (:mod:`unilab_gym.runtime.metrics`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from unilab_gym.runtime.collector import Collector, Sink, autoreset_mode_of, obs_copy, obs_rows, obs_tensor
from unilab_gym.runtime.control import STEP_CALLS, TRANSITIONS
from unilab_gym.runtime.metrics import ReplayInfo
from unilab_gym.runtime.normalization import NormalizationSpec
from unilab_gym.runtime.rollout import put_obs
from unilab_gym.sb3 import _sb3_private
from unilab_gym.sb3.loops.base import LearnerLoop
from unilab_gym.validation import check_int, check_real

if TYPE_CHECKING:
    from unilab_gym.replay import ReplayHandle
    from unilab_gym.runtime.metrics import RunnerMetrics
    from unilab_gym.runtime.pool import CollectorPool

#: Target duration of one ``model.train()`` call, in s: faults are checked between calls.
TRAIN_CHUNK_S = 0.05
DEFAULT_MAX_POLICY_LAG = 4


@dataclass
class ReplayWriter:
    """Collector side: act with the actor (or uniformly before ``learning_starts``), write transitions.

    ``algo`` is ``"sac"`` (sample the stochastic actor) or ``"td3"`` (deterministic actor plus
    ``action_noise``). Any autoreset mode works: NEXT_STEP reset steps are not stored, and
    SAME_STEP stores ``final_obs`` as the next obs of a finished episode.
    """

    #: where this writer writes (:attr:`~unilab_gym.runtime.collector.Writer.sink`).
    sink: ClassVar[Sink] = "replay"
    replay: ReplayHandle
    algo: str
    action_noise: Any = None
    autoreset_mode: str | None = None
    normalization: NormalizationSpec | None = None

    def run(self, c: Collector) -> None:
        """Step ``c``'s env with the actor and add every transition to the shared replay, until ``c`` stops."""
        import torch
        from stable_baselines3.common.noise import VectorizedActionNoise

        from unilab_gym.replay import ReplayStorage

        env, actor, row, norm = c.env, c.policy, c.row, c.normalizer
        n = env.num_envs
        space = env.single_action_space
        low, high = space.low.astype(np.float64), space.high.astype(np.float64)
        rng = np.random.default_rng(c.spec.seed)
        noise = self.action_noise
        if noise is not None and not isinstance(noise, VectorizedActionNoise):
            noise = VectorizedActionNoise(noise, n)
        same_step = autoreset_mode_of(env) == "SameStep"
        storage = ReplayStorage.attach(self.replay)
        try:
            obs, _ = env.reset(seed=c.spec.env_seed)
            if norm is not None:  # VecNormalize counts reset observations too
                norm.observe(obs)
            restarting = np.zeros(n, bool)  # NEXT_STEP: envs whose next step is a reset step
            while c.running:
                version = c.refresh()
                total = c.total_transitions()
                if total >= c.budget() or version == 0:
                    c.send_moments()  # before pausing: the learner's statistics cover every step taken
                    c.idle()
                    continue
                if total < c.learning_starts():
                    scaled = rng.uniform(-1.0, 1.0, (n, low.size))
                else:
                    with torch.no_grad():
                        obs_t = obs_tensor(obs if norm is None else norm.normalize_obs(obs))
                        if self.algo == "sac":
                            scaled = actor(obs_t, deterministic=False).numpy().astype(np.float64)
                        else:
                            scaled = actor(obs_t).numpy().astype(np.float64)
                    if noise is not None:
                        scaled = np.clip(scaled + noise(), -1.0, 1.0)
                env_action = (low + 0.5 * (scaled + 1.0) * (high - low)).astype(space.dtype)
                next_obs, reward, terminated, truncated, info = env.step(env_action)
                keep = ~restarting
                stored_next = obs_copy(next_obs)
                if same_step and "final_obs" in info:
                    for i in np.flatnonzero(info["_final_obs"]):
                        put_obs(stored_next, i, info["final_obs"][i])
                if keep.any():
                    # memory-optimized replays link each env's rows: tell it which envs these are
                    streams = np.flatnonzero(keep) if storage.layout.final_obs else None
                    storage.add(
                        obs_rows(obs, keep),
                        obs_rows(stored_next, keep),
                        scaled[keep],
                        reward[keep],
                        terminated[keep],
                        truncated[keep],
                        streams=streams,
                    )
                if norm is not None:  # the replay keeps raw data; SB3 normalizes it when it samples
                    norm.observe(next_obs)
                    norm.normalize_reward(np.asarray(reward, np.float64), terminated | truncated)
                    # before the step counts: a learner that sees the count has the moments in its inbox
                    c.send_moments()
                row[TRANSITIONS] += int(keep.sum())
                row[STEP_CALLS] += 1
                done = (terminated | truncated) & keep
                idx = c.track_episodes(reward, terminated, truncated, counted=keep)
                if noise is not None and idx.size:
                    noise.reset(indices=idx.tolist())
                restarting = done if not same_step else np.zeros(n, bool)
                obs = next_obs
        finally:
            storage.close()


class OffPolicyLoop(LearnerLoop):
    """Learner side for SB3 ``SAC`` / ``TD3`` / ``DDPG`` (see the module docstring).

    Args:
        model: the SB3 model; its replay buffer must be a ``SharedReplayBuffer``.
        num_collectors: collectors writing into the replay.
        envs_per_collector: envs of each collector.
        max_policy_lag: most weight versions a collector may act behind the learner, an int >= 1;
            ``None``: :data:`DEFAULT_MAX_POLICY_LAG`.
        replay_ratio: gradient steps per transition collected, >= 0; ``None``: the model's
            ``gradient_steps / (train_freq * n_envs)`` (1.0 with ``gradient_steps=-1``).

    Raises:
        ValueError: gSDE, a replay buffer that is not a ``SharedReplayBuffer``, a capacity
            smaller than ``learning_starts``, an episode-based ``train_freq``, a bad
            ``max_policy_lag`` (int >= 1) or ``replay_ratio`` (finite, >= 0).
    """

    default_log_interval = 4  # episodes, as SB3's off-policy learn()

    def __init__(
        self,
        model: Any,
        num_collectors: int,
        envs_per_collector: int,
        max_policy_lag: int | None,
        replay_ratio: float | None,
    ):
        """Check the model and the arguments (see the class docstring)."""
        from stable_baselines3 import SAC, TD3
        from stable_baselines3.common.buffers import ReplayBuffer
        from stable_baselines3.common.type_aliases import TrainFrequencyUnit

        from unilab_gym.sb3.replay_buffer import SharedReplayBuffer

        if max_policy_lag is None:
            max_policy_lag = DEFAULT_MAX_POLICY_LAG
        try:
            max_policy_lag = check_int("max_policy_lag", max_policy_lag, minimum=1)
        except ValueError:
            raise ValueError(
                f"max_policy_lag must be an int >= 1 for off-policy models, got {max_policy_lag!r}"
            ) from None
        if isinstance(model, SAC):
            self.algo = "sac"
        elif isinstance(model, TD3):  # DDPG is a TD3
            self.algo = "td3"
        else:
            raise ValueError(f"AsyncRunner drives SB3 SAC, TD3, DDPG, PPO or A2C models, got {type(model).__name__}")
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
        super().__init__(model, model.actor)
        #: gradient steps per transition collected.
        self.replay_ratio = check_real("replay_ratio", replay_ratio, minimum=0.0)
        self.max_policy_lag = max_policy_lag
        self.num_collectors, self.envs_per_collector = num_collectors, envs_per_collector
        self._held = 0  # training calls since the last publish, held back by a lagging collector
        self._rebase = False  # the replay ratio changed: count gradient steps due from here
        # a saved model must load without unilab_gym: SB3 pickles replay_buffer_class
        model.replay_buffer_class = ReplayBuffer
        model.replay_buffer_kwargs = {}

    def set_replay_ratio(self, replay_ratio: float) -> None:
        """Change the replay ratio (on the learner's thread): steps already run stand, the new ratio counts from now."""
        self.replay_ratio = check_real("replay_ratio", replay_ratio, minimum=0.0)
        self._rebase = True

    def writer(self, index: int) -> ReplayWriter:
        """A :class:`ReplayWriter` into the model's shared replay (the same for every collector ``index``)."""
        return ReplayWriter(
            self.model.replay_buffer.handle,
            self.algo,
            getattr(self.model, "action_noise", None),
            normalization=self.normalization,
        )

    def replay_info(self) -> ReplayInfo:
        """The model's replay (it belongs to the model: the loop frees nothing)."""
        return ReplayInfo(self.model.replay_buffer.storage, int(self.model.batch_size))

    def _run(self, pool: CollectorPool, metrics: RunnerMetrics, total: int, callback: Any, log_interval: int) -> None:
        """Collect and train until ``total`` transitions (``model.num_timesteps``); stop early if a callback says so."""
        model = self.model
        start_steps = model.num_timesteps
        base = pool.counters.total_transitions()
        target = total - start_steps  # transitions to collect in this call
        starts = max(0, model.learning_starts - start_steps)
        lead = 2 * self.num_collectors * self.envs_per_collector
        pool.set_learning_starts(base + starts)
        grad_steps = calls = 0
        grad_step_s = TRAIN_CHUNK_S  # running estimate of one gradient step's duration
        episodes_logged = _sb3_private.episode_count(model)
        # the replay ratio holds from origin_counted transitions and origin_steps gradient steps on
        # (a live change of the ratio moves the origin: steps already run stand)
        origin_counted, origin_steps = starts, 0
        self._rebase = False

        def set_budget() -> None:
            # the transitions the next gradient step needs, plus the lead: with less, a replay ratio
            # below 1 / lead would leave the learner waiting for data and the collectors for budget
            allowed = (
                target
                if self.replay_ratio == 0
                else min(target, origin_counted + math.ceil((grad_steps - origin_steps + 1) / self.replay_ratio) + lead)
            )
            pool.set_budget(base + allowed)

        set_budget()
        pool.start()
        while True:
            self.at_boundary()
            self.poll(pool, metrics)
            produced = pool.counters.total_transitions() - base
            now_steps = start_steps + min(produced, target)
            # one on_step per model.n_envs transitions, num_timesteps rising as in SB3's own loop
            while (calls + 1) * model.n_envs <= now_steps - start_steps:
                calls += 1
                model.num_timesteps = start_steps + calls * model.n_envs
                if not callback.on_step():
                    return
            model.num_timesteps = now_steps
            metrics.observe_policy_lag(pool.policy_lag() + self._held)
            if _sb3_private.episode_count(model) // log_interval > episodes_logged // log_interval:
                episodes_logged = _sb3_private.episode_count(model)
                metrics.record(model.logger)
                _sb3_private.dump_logs(model)
            done = produced >= target
            if done:
                pool.set_budget(pool.counters.total_transitions())  # pause collectors
            counted = min(produced, target)
            if self._rebase:
                origin_counted, origin_steps, self._rebase = max(counted, starts), grad_steps, False
            due = (
                origin_steps + math.floor(max(0, counted - origin_counted) * self.replay_ratio) - grad_steps
                if counted > starts
                else 0
            )
            if due > 0:
                # SB3 trains after every collection, the last one included; so do we
                _sb3_private.update_progress_remaining(model, model.num_timesteps, total)
                # chunks of about TRAIN_CHUNK_S, so collector faults are noticed between them
                # (inline collectors run only between calls: all that is due, so no timing enters the run)
                k = due if done or not pool.runs_concurrently else max(1, min(due, int(TRAIN_CHUNK_S / grad_step_s)))
                t_train = time.perf_counter()
                with metrics.learner_phase("train"):
                    model.train(gradient_steps=k, batch_size=model.batch_size)
                grad_step_s = 0.8 * grad_step_s + 0.2 * (time.perf_counter() - t_train) / k
                grad_steps += k
                metrics.gradient_steps += k
                # never publish a version more than max_policy_lag ahead of a live collector
                if pool.policy_lag() + 1 <= self.max_policy_lag:
                    self.publish(pool, metrics)
                    self._held = 0
                else:
                    self._held += 1
            if done:
                # the moments of every step counted so far were sent before it counted: merge them
                # (a step in flight when the collectors were paused is merged by the next learn())
                self.poll(pool, metrics)
                return
            set_budget()
            if due <= 0:
                self.wait(pool, metrics, 0.001)
