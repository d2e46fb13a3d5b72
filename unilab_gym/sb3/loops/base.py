"""What the off-policy and on-policy learner loops share: :class:`LearnerLoop`.

A loop is built from the model (and checks it), gives each collector its *writer*, and runs
``learn()``'s body against a :class:`~unilab_gym.runtime.pool.CollectorPool`, never against the
runner: it publishes the policy's weights, polls the pool for faults and finished episodes
(which go to ``model.ep_info_buffer`` as SB3's own loop puts them), and waits for data.
"""

from __future__ import annotations

import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from unilab_gym.runtime.weights import flatten_into, vector_size
from unilab_gym.sb3 import _sb3_private
from unilab_gym.sb3.normalization import merge_moments, normalization_spec, pack_statistics

if TYPE_CHECKING:
    from unilab_gym.runtime.collector import Writer
    from unilab_gym.runtime.metrics import ReplayInfo, RunnerMetrics
    from unilab_gym.runtime.pool import CollectorPool, Reports

#: Models a loop drives now (an open ``AsyncRunner``): a model trained by two runners at once is refused.
DRIVEN: weakref.WeakSet[Any] = weakref.WeakSet()


class LearnerLoop(ABC):
    """Learner side of one algorithm family (see the module docstring).

    Args:
        model: the SB3 model. If its env is a ``VecNormalize``, that wrapper's statistics are
            published after the policy's parameters, under the same version, and collectors'
            observation moments are merged into it (:mod:`unilab_gym.runtime.normalization`).
        policy: the torch module collectors run (its ``state_dict`` is the start of the published
            weight vector).

    :ivar max_policy_lag: most weight versions a collector may act behind the learner.
    :ivar default_log_interval: ``learn()``'s ``log_interval`` when ``None`` is passed.
    :ivar normalization: the ``VecNormalize`` settings collectors apply, or ``None``.

    Raises:
        ValueError: another loop (another open ``AsyncRunner``) drives ``model``.
    """

    default_log_interval: int
    max_policy_lag: int
    #: called on the learner's thread at every boundary between gradient steps (the runner's
    #: :class:`~unilab_gym.sb3.control.controller.Controller` applies queued changes there), or ``None``.
    boundary: Callable[[], None] | None = None

    def __init__(self, model: Any, policy: Any):
        """Claim ``model`` and size the published weight vector (arguments: see the class docstring)."""
        if model in DRIVEN:
            raise ValueError("this model is driven by another AsyncRunner that is still open; close that one first")
        self.model = model
        self.policy = policy
        self._params = list(policy.state_dict().values())
        self._vec_normalize = model.get_vec_normalize_env()
        self.normalization = None if self._vec_normalize is None else normalization_spec(self._vec_normalize)
        self._params_size = vector_size(self._params)
        #: float32 values of the published weight vector: the parameters, then any normalization statistics.
        self.weights_size = self._params_size + (0 if self.normalization is None else self.normalization.size)
        self._flat = np.empty(self.weights_size, np.float32)
        self._published = np.full(self.weights_size, np.nan, np.float32)
        self._t0 = time.monotonic()
        DRIVEN.add(model)  # last: a loop that failed to build holds no claim

    # ------------------------------------------------------------------ collector side
    @abstractmethod
    def writer(self, index: int) -> Writer:
        """The writer collector ``index`` runs (picklable)."""

    def env_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The collectors' ``gym.make_vec`` kwargs for ``env_id``, given the user's (``ValueError`` if unusable)."""
        return kwargs

    def replay_info(self) -> ReplayInfo | None:
        """What the replay metrics read, or ``None`` (no replay)."""
        return None

    # ------------------------------------------------------------------ learner side
    def run(self, pool: CollectorPool, metrics: RunnerMetrics, total: int, callback: Any, log_interval: int) -> None:
        """Collect and train until ``model.num_timesteps`` reaches ``total``; return early if a callback says stop."""
        self._t0 = time.monotonic()
        self._run(pool, metrics, total, callback, log_interval)

    @abstractmethod
    def _run(self, pool: CollectorPool, metrics: RunnerMetrics, total: int, callback: Any, log_interval: int) -> None:
        """The family's ``learn()`` body (the collectors may not have started yet: call ``pool.start()``)."""

    def at_boundary(self) -> None:
        """Between gradient steps: run :attr:`boundary` (hyperparameter changes, snapshots, restores)."""
        if self.boundary is not None:
            self.boundary()

    def close(self) -> None:
        """Free what the loop owns and let another runner drive the model. Idempotent."""
        DRIVEN.discard(self.model)

    def publish(self, pool: CollectorPool, metrics: RunnerMetrics, *, only_if_changed: bool = False) -> int:
        """Publish the policy's weights as the next version; return it.

        With ``only_if_changed``, weights equal to the last published ones are not published again
        (the current version is returned).
        """
        with metrics.learner_phase("publish_weights"):
            flatten_into(self._params, self._flat[: self._params_size])
            if self._vec_normalize is not None:
                pack_statistics(self._vec_normalize, self._flat[self._params_size :])
            if only_if_changed and np.array_equal(self._flat, self._published):
                return pool.weight_version
            self._published[:] = self._flat
            return pool.publish_weights(self._flat)

    def poll(self, pool: CollectorPool, metrics: RunnerMetrics) -> None:
        """Update the metrics' rates, take in the pool's news; finished episodes go to ``model.ep_info_buffer``.

        Raises:
            CollectorError: a collector failed and no restart is left.
        """
        metrics.tick()
        reports = pool.poll()
        if reports.episode_returns:
            self._record_episodes(reports)
        for obs_moments, return_moments in reports.moments:
            merge_moments(self._vec_normalize, obs_moments, return_moments)

    def wait(self, pool: CollectorPool, metrics: RunnerMetrics, timeout: float) -> None:
        """Wait for a collector's news, at most ``timeout`` s (counted as learner time waiting for data).

        A pool whose ``wait()`` wakes on every piece of news, data included, names a longer wait in its
        ``news_wait_s`` (the Ray pool: its answers arrive through a queue); the loop then waits that long,
        since nothing it waits for can arrive unannounced (collector processes write the storage and their
        counters directly, so with them the loop looks every ``timeout`` s).
        """
        with metrics.learner_phase("wait_for_data"):
            pool.wait(max(timeout, float(getattr(pool, "news_wait_s", 0.0))))

    def _record_episodes(self, reports: Reports) -> None:
        model = self.model
        t = round(time.monotonic() - self._t0, 6)
        for ep_return, ep_length in zip(reports.episode_returns, reports.episode_lengths):
            model.ep_info_buffer.append({"r": ep_return, "l": ep_length, "t": t})
        _sb3_private.add_episodes(model, len(reports.episode_returns))
