"""On-policy family (PPO, A2C): collectors write whole rollouts into shared memory, the learner runs stock ``train()``.

One iteration, as in SB3's ``OnPolicyAlgorithm.learn``::

    collectors (in parallel)                         learner
    ─────────────────────────────────────────        ───────────────────────────────────────────
    wait until rollout k is granted                  on_rollout_start; on_step as steps arrive
    load the newest weights (version v_k)            wait until every collector finished rollout k
    n_steps x: act, step, write slot k % 2           copy slot k % 2 into model.rollout_buffer,
    V(last obs) -> last_values; rollouts = k + 1     compute_returns_and_advantage (SB3's own GAE)
                                                     on_rollout_end; dump_logs; model.train()
                                                     publish the weights; grant the next rollout

**Rollout size.** ``n_steps`` is per env, as in SB3: a rollout holds ``n_steps *
num_collectors * envs_per_collector`` transitions, and the model's env must have exactly
``num_collectors * envs_per_collector`` envs (``model.n_envs``), so that ``n_steps``,
``batch_size`` and the callbacks' step counts mean what they mean in SB3.

**What a collector computes** is what ``collect_rollouts`` computes: actions sampled from the
policy (stored unclipped, clipped to the action space for the env), ``V(obs)`` and the log-prob
of the action; on a time-limit truncation (``truncated and not terminated``) the reward gets
``+ gamma * V(terminal obs)``; ``episode_starts[t]`` is 1 where ``obs[t]`` begins an episode;
the rollout ends with ``V(last obs)`` and the last dones. Envs reset in the same step
(Gymnasium's ``SameStep`` autoreset; the terminal obs is ``info["final_obs"]``).

**Policy lag.** ``max_policy_lag=0`` (default): rollout ``k`` is granted only after the
learner published the weights trained on rollouts ``0..k-1``, so collectors wait while the
learner trains — strictly on-policy, and with a fixed seed reproducible run to run.
``max_policy_lag=1``: rollout ``k + 1`` is granted as soon as the weights trained on rollouts
``0..k-1`` are out, so collectors gather it with that policy while the learner trains on
rollout ``k``, which was collected one update behind the policy being trained. Taking PPO's
ratio against the behaviour policy would start every update with ratios already near the edge
of the clip range (the previous update moved the policy that far), where the clipped objective
has no gradient: on ``UniLab/Quadruped-v0`` (700k env steps, seed 0, ``VecNormalize``) PPO at lag 1
then learned to stand (return 17.4, tracking error 0.61 m/s) where lag 0 walks (27.6, 0.09 m/s).
So a rollout collected with older weights is trained with the *decoupled* PPO
objective of Hilton, Cobbe and Schulman (2021), "Batch size-invariance for policy
optimization" (arXiv:2110.00641): the proximal policy is the learner's current one (its
log-probs and values are recomputed for the rollout before SB3's GAE, so the ratio starts at 1
and clipping bounds the step from it), and each advantage is weighted by
``pi_prox(a|s) / pi_behaviour(a|s)`` (importance sampling from the policy that acted); the
weight is positive, so scaling the advantage is exactly the decoupled objective. A rollout
collected with the current weights (always at lag 0) is left as collected. The lag of each
rollout (learner version minus behaviour version) is logged as ``unilab/policy_lag_mean`` /
``_max``, with the other pipeline metrics (:mod:`unilab_gym.runtime.metrics`).

**Stopping.** A callback that returns ``False`` mid-rollout drops that rollout, as SB3 does; the
collectors finish it anyway and the next ``learn()`` starts with the rollout after it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from stable_baselines3.common.buffers import DictRolloutBuffer, RolloutBuffer
from stable_baselines3.common.type_aliases import DictRolloutBufferSamples, RolloutBufferSamples

from unilab_gym.runtime.collector import Collector, Sink, autoreset_mode_of, obs_tensor
from unilab_gym.runtime.control import ROLLOUTS, STEP_CALLS, TRANSITIONS
from unilab_gym.runtime.normalization import NormalizationSpec
from unilab_gym.runtime.pool import check_env_count
from unilab_gym.runtime.rollout import SLOTS, RolloutHandle, RolloutStorage, put_obs
from unilab_gym.sb3 import _sb3_private
from unilab_gym.sb3.loops.base import LearnerLoop
from unilab_gym.validation import check_int

if TYPE_CHECKING:
    from unilab_gym.runtime.metrics import RunnerMetrics
    from unilab_gym.runtime.pool import CollectorPool


@dataclass
class RolloutWriter:
    """Collector side: collect granted rollouts with the policy, write them into env columns ``column ..``."""

    #: where this writer writes (:attr:`~unilab_gym.runtime.collector.Writer.sink`).
    sink: ClassVar[Sink] = "rollout"
    rollouts: RolloutHandle
    column: int
    gamma: float
    autoreset_mode: str | None = "SameStep"
    normalization: NormalizationSpec | None = None

    def run(self, c: Collector) -> None:
        """Collect each granted rollout with the policy into this writer's env columns, until ``c`` stops."""
        import torch

        env, row, norm = c.env, c.row, c.normalizer
        policy: Any = c.policy  # an SB3 ActorCriticPolicy (forward, predict_values)
        mode = autoreset_mode_of(env)
        if mode != "SameStep":
            raise ValueError(
                f"on-policy collectors need an env with autoreset_mode='SameStep' (SB3's same-step reset with the "
                f"terminal obs in info['final_obs']); the env has {mode!r}: make env_fn return e.g. "
                "UniLabVectorEnv(n, autoreset_mode='SameStep'), or pass env_id"
            )
        n = env.num_envs
        if n != c.spec.num_envs:
            raise ValueError(f"the collector's env has {n} envs, expected envs_per_collector={c.spec.num_envs}")
        storage = RolloutStorage.attach(self.rollouts)
        cols = slice(self.column, self.column + n)
        n_steps = storage.handle.n_steps
        space = env.single_action_space
        gamma = np.float32(self.gamma)

        def forward(obs: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            with torch.no_grad():
                actions, values, log_probs = policy(obs_tensor(obs))
            return actions.numpy(), values.numpy().ravel(), log_probs.numpy()

        def value(obs: Any) -> np.ndarray:
            with torch.no_grad():
                return policy.predict_values(obs_tensor(obs)).numpy().ravel()

        def normalized(obs: np.ndarray) -> np.ndarray:  # what the policy sees and the rollout stores
            return obs if norm is None else norm.normalize_obs(obs)

        try:
            obs, _ = env.reset(seed=c.spec.env_seed)
            if norm is not None:  # VecNormalize counts reset observations too
                norm.observe(obs)
            episode_starts = np.ones(n, np.float32)
            k = int(row[ROLLOUTS])  # a replacement collector redoes the rollout its predecessor left unfinished
            row[STEP_CALLS] = k * n_steps
            while c.running:
                if k >= c.granted():
                    c.refresh()  # load new weights while waiting: the rollout starts with them at once
                    c.idle()
                    continue
                slot = k % SLOTS
                storage.versions[slot, c.spec.index] = c.refresh()
                for t in range(n_steps):
                    if not c.running:
                        return
                    seen = normalized(obs)
                    actions, values, log_probs = forward(seen)
                    next_obs, reward, terminated, truncated, info = env.step(
                        np.clip(actions, space.low, space.high).astype(space.dtype)
                    )
                    dones = terminated | truncated
                    reward = np.array(reward, np.float32)
                    c.track_episodes(reward, terminated, truncated)  # raw rewards, as VecMonitor under VecNormalize
                    if norm is not None:  # VecNormalize.step_wait: statistics, then normalized rewards (float64)
                        norm.observe(next_obs)
                        reward = norm.normalize_reward(reward.astype(np.float64), dones)
                    # SB3's bootstrap of truncated episodes (its GitHub issue #633); one env at a time as
                    # SB3 does, because a batched forward pass may round differently in the last bit
                    for i in np.flatnonzero(truncated & ~terminated):
                        reward[i] += gamma * value(normalized(_one(info["final_obs"][i])))[0]
                    put_obs(storage.observations, (slot, t, cols), seen)
                    storage.actions[slot, t, cols] = actions.reshape(n, -1)
                    storage.rewards[slot, t, cols] = reward
                    storage.episode_starts[slot, t, cols] = episode_starts
                    storage.values[slot, t, cols] = values
                    storage.log_probs[slot, t, cols] = log_probs
                    obs, episode_starts = next_obs, dones.astype(np.float32)
                    row[TRANSITIONS] += n
                    row[STEP_CALLS] += 1
                seen = normalized(obs)
                put_obs(storage.last_obs, (slot, cols), seen)
                storage.last_values[slot, cols] = value(seen)
                storage.last_dones[slot, cols] = episode_starts
                c.send_moments()  # before the rollout counts as done: the learner merges them with it
                k += 1
                row[ROLLOUTS] = k  # after the data: the learner reads a slot only once every row passed it
        finally:
            storage.close()


def _one(obs: Any) -> Any:
    """One env's observation as a batch of one (a dict of batches of one for a ``Dict`` observation)."""
    return {k: np.asarray(v)[None] for k, v in obs.items()} if isinstance(obs, dict) else np.asarray(obs)[None]


class RunnerRolloutBuffer(RolloutBuffer):
    """SB3's ``RolloutBuffer`` that calls ``between_batches()`` before each minibatch ``get()`` yields.

    The runner sets it to its fault poll while ``train()`` runs, so a collector that fails
    during a long ``train()`` is reported within one minibatch; otherwise it is a stock buffer.
    The model holds it only while the runner is open (``model.save`` never stores a rollout buffer).
    """

    between_batches: Callable[[], None] | None = None

    def get(self, batch_size: int | None = None) -> Generator[RolloutBufferSamples, None, None]:
        """SB3's minibatches of ``batch_size``, calling ``between_batches()`` before each is yielded."""
        for batch in super().get(batch_size):
            if self.between_batches is not None:
                self.between_batches()
            yield batch


class RunnerDictRolloutBuffer(DictRolloutBuffer):
    """:class:`RunnerRolloutBuffer` for ``Dict`` observations (SB3's ``DictRolloutBuffer``)."""

    between_batches: Callable[[], None] | None = None

    def get(self, batch_size: int | None = None) -> Generator[DictRolloutBufferSamples, None, None]:  # type: ignore[override]
        """SB3's minibatches of ``batch_size``, calling ``between_batches()`` before each is yielded."""
        for batch in super().get(batch_size):
            if self.between_batches is not None:
                self.between_batches()
            yield batch


class OnPolicyLoop(LearnerLoop):
    """Learner side for SB3 ``PPO`` / ``A2C`` (see the module docstring).

    Args:
        model: the SB3 model, with ``n_envs == num_collectors * envs_per_collector``.
        num_collectors: collectors filling the rollouts.
        envs_per_collector: envs of each collector (its columns of the rollout).
        max_policy_lag: 0 (strictly on-policy, the default for ``None``) or 1.
        replay_ratio: must be ``None`` (on-policy models train once per rollout).

    Raises:
        ValueError: ``model.n_envs != num_collectors * envs_per_collector``, a ``max_policy_lag``
            other than 0 or 1, a ``replay_ratio``, gSDE, a non-``Box`` observation or action
            space, or a custom rollout buffer class.
    """

    default_log_interval = 1  # iterations, as SB3's on-policy learn()

    def __init__(
        self,
        model: Any,
        num_collectors: int,
        envs_per_collector: int,
        max_policy_lag: int | None,
        replay_ratio: float | None,
    ):
        """Check the model and the arguments and create the shared rollout storage (see the class docstring)."""
        from gymnasium import spaces

        if max_policy_lag is None:
            max_policy_lag = 0
        try:
            max_policy_lag = check_int("max_policy_lag", max_policy_lag, minimum=0, maximum=1)
        except ValueError:
            raise ValueError(
                f"max_policy_lag must be 0 (strictly on-policy) or 1 for on-policy models, got {max_policy_lag!r}"
            ) from None
        if replay_ratio is not None:
            raise ValueError(f"replay_ratio is for off-policy models; {type(model).__name__} trains once per rollout")
        n_envs = num_collectors * envs_per_collector
        check_env_count(model.n_envs, num_collectors, envs_per_collector, off_policy=False)
        if getattr(model, "use_sde", False):
            raise ValueError("AsyncRunner does not support gSDE exploration (use_sde=True)")
        obs_space = model.observation_space
        dict_obs = isinstance(obs_space, spaces.Dict) and all(isinstance(s, spaces.Box) for s in obs_space.values())
        if not (isinstance(obs_space, spaces.Box) or dict_obs) or not isinstance(model.action_space, spaces.Box):
            raise ValueError(
                "AsyncRunner's on-policy collectors support Box (or Dict of Box) observation and Box action spaces, "
                f"got "
                f"{type(model.observation_space).__name__} / {type(model.action_space).__name__}"
            )
        if isinstance(model.rollout_buffer, (RunnerRolloutBuffer, RunnerDictRolloutBuffer)):
            raise ValueError("this model is driven by another AsyncRunner that is still open; close that one first")
        if type(model.rollout_buffer) is not (DictRolloutBuffer if dict_obs else RolloutBuffer):
            raise ValueError(
                f"AsyncRunner fills SB3's RolloutBuffer, the model has a {type(model.rollout_buffer).__name__}"
            )
        super().__init__(model, model.policy)
        self.max_policy_lag = max_policy_lag
        self.envs_per_collector = envs_per_collector
        try:
            self.storage = RolloutStorage.create(
                model.n_steps,
                n_envs,
                {k: s.shape for k, s in obs_space.items()} if dict_obs else obs_space.shape,
                int(np.prod(model.action_space.shape)),
                num_collectors,
            )
        except BaseException:
            super().close()  # no claim on the model is left
            raise
        old = model.rollout_buffer
        buffer_class: Any = RunnerDictRolloutBuffer if dict_obs else RunnerRolloutBuffer
        self._own_buffer = buffer_class(
            old.buffer_size,
            old.observation_space,
            old.action_space,
            device=old.device,
            gae_lambda=old.gae_lambda,
            gamma=old.gamma,
            n_envs=old.n_envs,
        )
        #: the model's own rollout buffer, put back at :meth:`close` (live changes apply to it too).
        self.stock_buffer = old
        model.rollout_buffer = self._own_buffer
        self.next_rollout = 0  # index of the next rollout the learner consumes

    def env_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Collectors' env kwargs for ``env_id``: same-step autoreset (``ValueError`` if another mode was asked for)."""
        mode = kwargs.get("autoreset_mode")
        if mode is not None and str(getattr(mode, "value", mode)) != "SameStep":
            raise ValueError(
                f"on-policy collectors step their env with autoreset_mode='SameStep', env_kwargs asks for {mode!r}"
            )
        return {k: v for k, v in kwargs.items() if k != "autoreset_mode"}

    def writer(self, index: int) -> RolloutWriter:
        """A :class:`RolloutWriter` into collector ``index``'s env columns of the rollout storage."""
        return RolloutWriter(
            self.storage.handle,
            index * self.envs_per_collector,
            float(self.model.gamma),
            normalization=self.normalization,
        )

    def close(self) -> None:
        """Free the rollout storage and give the model back its own rollout buffer. Idempotent."""
        super().close()
        if self.model.rollout_buffer is self._own_buffer:
            self.model.rollout_buffer = self.stock_buffer
        self.storage.close()

    def _grant(self, pool: CollectorPool, end: int) -> None:
        """Let collectors start every rollout up to ``next_rollout + max_policy_lag`` (and before ``end``)."""
        pool.grant_rollouts(min(end, self.next_rollout + 1 + self.max_policy_lag))

    def _run(self, pool: CollectorPool, metrics: RunnerMetrics, total: int, callback: Any, log_interval: int) -> None:
        """Run rollouts and ``train()`` until ``model.num_timesteps >= total``; stop early if a callback says so."""
        model = self.model
        if model.n_steps != self.storage.handle.n_steps:
            raise ValueError(
                f"model.n_steps changed from {self.storage.handle.n_steps} to {model.n_steps}; create a new AsyncRunner"
            )
        rollouts = max(0, math.ceil((total - model.num_timesteps) / (model.n_steps * model.n_envs)))
        end = self.next_rollout + rollouts
        self.publish(pool, metrics, only_if_changed=True)  # e.g. parameters loaded between learn() calls
        self._grant(pool, end)
        pool.start()
        iteration = 0

        def between_batches() -> None:  # one minibatch = one gradient step
            metrics.gradient_steps += 1
            self.poll(pool, metrics)

        self._own_buffer.between_batches = between_batches
        try:
            for k in range(self.next_rollout, end):
                if not self._await_rollout(pool, metrics, k, callback):
                    self.next_rollout = k + 1  # as SB3 drops a rollout a callback stopped: never trained on
                    return
                self.at_boundary()  # before the GAE: a new gamma counts for this rollout
                slot = k % SLOTS
                self.storage.fill(model.rollout_buffer, slot)
                self.next_rollout = k + 1
                lag = pool.weight_version - int(self.storage.versions[slot].min())
                if lag > 0:
                    self._decouple(slot)
                metrics.observe_policy_lag(lag)
                callback.on_rollout_end()
                iteration += 1
                _sb3_private.update_progress_remaining(model, model.num_timesteps, total)
                if iteration % log_interval == 0:
                    metrics.record(model.logger)
                    model.dump_logs(iteration)
                with metrics.learner_phase("train"):
                    model.train()
                self.publish(pool, metrics)
                self._grant(pool, end)
        finally:
            self._own_buffer.between_batches = None

    def _decouple(self, slot: int) -> None:
        """Make ``model.rollout_buffer`` (rollout ``slot``, collected with older weights) train with decoupled PPO.

        The current policy becomes the proximal policy: its values replace the behaviour values and
        SB3's GAE is rerun with them (and with its value of the last observations), its log-probs
        replace the behaviour log-probs, and every advantage is multiplied by
        ``exp(log pi_prox - log pi_behaviour)`` (see the module docstring).
        """
        import torch

        buffer, policy = self.model.rollout_buffer, self.model.policy

        def tensor(obs: Any, flat: bool) -> Any:  # (steps, envs, *shape) -> (steps * envs, *shape); Dict per key
            if isinstance(obs, dict):
                return {k: tensor(v, flat) for k, v in obs.items()}
            return torch.as_tensor(obs.reshape(-1, *obs.shape[2:]) if flat else obs, device=policy.device)

        obs = tensor(buffer.observations, True)
        actions = torch.as_tensor(buffer.actions.reshape(-1, buffer.action_dim), device=policy.device)
        last = self.storage.last_obs
        last_obs = tensor({k: v[slot] for k, v in last.items()} if isinstance(last, dict) else last[slot], False)
        with torch.no_grad():
            values, log_prob, _ = policy.evaluate_actions(obs, actions)
            last_values = policy.predict_values(last_obs)
        behaviour = buffer.log_probs.copy()
        buffer.values[:] = values.cpu().numpy().reshape(buffer.values.shape)
        buffer.log_probs[:] = log_prob.cpu().numpy().reshape(buffer.log_probs.shape)
        buffer.compute_returns_and_advantage(last_values=last_values.cpu(), dones=self.storage.last_dones[slot].copy())
        buffer.advantages *= np.exp(buffer.log_probs - behaviour)

    def _await_rollout(self, pool: CollectorPool, metrics: RunnerMetrics, k: int, callback: Any) -> bool:
        """Wait for rollout ``k``, calling ``on_step`` once per env step of it, as SB3 does.

        Returns:
            ``True`` once every collector finished rollout ``k``; ``False`` if a callback stopped training.
        """
        model = self.model
        first_step = k * model.n_steps
        calls = 0
        callback.on_rollout_start()
        while True:
            self.at_boundary()
            self.poll(pool, metrics)
            rows = pool.counters.rows
            finished = int(rows[:, ROLLOUTS].min()) > k  # read before the step counts: they only grow
            reached = (
                model.n_steps if finished else min(model.n_steps, max(0, int(rows[:, STEP_CALLS].min()) - first_step))
            )
            while calls < reached:
                calls += 1
                model.num_timesteps += model.n_envs
                if not callback.on_step():
                    return False
            if finished:
                if self.normalization is not None:  # the moments each collector sent before finishing rollout k
                    self.poll(pool, metrics)
                return True
            self.wait(pool, metrics, 0.001)
