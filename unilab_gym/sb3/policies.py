"""Asymmetric actor-critic policies for SB3: the actor reads ``obs["policy"]``, the critic ``obs["critic"]``.

For the ``Dict`` observations of ``UniLab/Quadruped-v0`` with ``privileged_obs=True`` (legged_gym's
``privileged_obs``; Pinto et al. 2018, "Asymmetric Actor Critic for Image-Based Robot Learning",
arXiv:1710.06542): the critic, only used in training, sees privileged simulator state; the actor
sees what the robot measures, so it alone is what runs (and is exported) on the robot::

    from stable_baselines3 import PPO, SAC
    from unilab_gym.sb3.vec_env import AsymmetricActorCriticPolicy, AsymmetricSACPolicy, make_sb3_env

    env = make_sb3_env("UniLab/Quadruped-v0", 64, seed=0, privileged_obs=True)
    SAC(AsymmetricSACPolicy, env)
    PPO(AsymmetricActorCriticPolicy, env)

Both are SB3's own policies (``SACPolicy``, ``ActorCriticPolicy``) whose features extractors are
:class:`KeyExtractor` s, one per key: nothing of SB3's training code changes. ``predict`` takes the
``Dict`` observation or the policy observation alone (the actor reads nothing else).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.preprocessing import get_flattened_obs_dim
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor, MlpExtractor
from stable_baselines3.sac.policies import SACPolicy
from torch import nn

__all__ = ["AsymmetricActorCriticPolicy", "AsymmetricSACPolicy", "KeyExtractor"]

#: The default keys: the actor's observation and the critic's (those of ``privileged_obs=True``).
ACTOR_KEY, CRITIC_KEY = "policy", "critic"


class KeyExtractor(BaseFeaturesExtractor):
    """Features extractor that reads one key of a ``Dict`` observation, flattened (SB3's ``FlattenExtractor`` on it).

    Args:
        observation_space: a ``gymnasium.spaces.Dict`` holding ``key``.
        key: the key read, e.g. ``"policy"`` or ``"critic"``.

    Raises:
        ValueError: ``observation_space`` is not a ``Dict`` or has no ``key`` (the message lists its keys).
    """

    def __init__(self, observation_space: spaces.Space, key: str = ACTOR_KEY):
        """Check that ``observation_space`` holds ``key`` (arguments: see the class docstring)."""
        sub = _subspace(observation_space, key)
        super().__init__(observation_space, get_flattened_obs_dim(sub))
        self.key = key
        self.flatten = nn.Flatten()

    def forward(self, observations: dict[str, th.Tensor]) -> th.Tensor:
        """``observations[key]`` ``(batch, *shape)`` -> ``(batch, features_dim)``."""
        return self.flatten(observations[self.key])


def _subspace(space: spaces.Space, key: str) -> spaces.Space:
    if not isinstance(space, spaces.Dict):
        raise ValueError(
            f"asymmetric policies need a Dict observation space (e.g. make_sb3_env(..., privileged_obs=True)), "
            f"got {space}"
        )
    if key not in space.spaces:
        raise ValueError(f"the observation space has no key {key!r}; its keys: {list(space.spaces)}")
    return space.spaces[key]


class _PredictAnyObs:
    """``predict`` that takes the ``Dict`` observation or the actor's observation alone."""

    observation_space: spaces.Space
    actor_key: str

    def predict(
        self,
        observation: np.ndarray | dict[str, np.ndarray],
        state: tuple[np.ndarray, ...] | None = None,
        episode_start: np.ndarray | None = None,
        deterministic: bool = False,
    ) -> tuple[np.ndarray, tuple[np.ndarray, ...] | None]:
        """SB3's ``predict``; ``observation`` is the ``Dict`` observation or the ``actor_key`` observation alone.

        Args:
            observation: a dict of arrays (every key of the observation space), or one array: the actor's
                observation, ``(*shape)`` or ``(batch, *shape)`` (e.g. ``(48,)`` / ``(n, 48)`` float32). The other
                keys are then filled with zeros, which the actor never reads.
            state: as SB3's ``BasePolicy.predict``.
            episode_start: as SB3's ``BasePolicy.predict``.
            deterministic: as SB3's ``BasePolicy.predict``.

        Returns:
            ``(actions, state)`` as SB3 returns them.

        Raises:
            ValueError: an array whose trailing shape is not the actor observation's.
        """
        if not isinstance(observation, dict):
            obs = np.asarray(observation)
            space = self.observation_space
            assert isinstance(space, spaces.Dict)
            shape = space.spaces[self.actor_key].shape
            assert shape is not None
            if obs.shape[obs.ndim - len(shape) :] != shape:
                raise ValueError(
                    f"predict takes the Dict observation or the {self.actor_key!r} observation of shape {shape} "
                    f"(or (batch, *{shape})), got an array of shape {obs.shape}"
                )
            batch = obs.shape[: obs.ndim - len(shape)]
            observation = {
                key: obs if key == self.actor_key else np.zeros((*batch, *(sub.shape or ())), sub.dtype)
                for key, sub in space.spaces.items()
            }
        return super().predict(observation, state, episode_start, deterministic)  # type: ignore[misc]


class AsymmetricSACPolicy(_PredictAnyObs, SACPolicy):
    """SB3's ``SACPolicy`` with an actor on ``obs[actor_key]`` and Q-networks on ``obs[critic_key]`` (and the action).

    Use it as ``SAC(AsymmetricSACPolicy, env)`` with a ``Dict`` observation env (``make_sb3_env(...,
    privileged_obs=True)``); SB3 then stores transitions in its ``DictReplayBuffer`` (or give
    ``replay_buffer_class``). The critic and its target each get their own :class:`KeyExtractor`.

    Args:
        observation_space: a ``Dict`` holding ``actor_key`` and ``critic_key``.
        action_space: as ``SACPolicy``.
        lr_schedule: as ``SACPolicy``.
        actor_key: the key the actor reads (default ``"policy"``, the 48 values the robot has).
        critic_key: the key the Q-networks read (default ``"critic"``; ``"policy"`` gives the symmetric critic).
        **kwargs: the other arguments of ``SACPolicy`` (``net_arch``, ``activation_fn``, ``n_critics`` ...).
            ``features_extractor_class`` must be :class:`KeyExtractor` (the default).

    Raises:
        ValueError: a space without the keys, another ``features_extractor_class``, or
            ``share_features_extractor=True`` (the actor and critic read different keys).
    """

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Box,
        lr_schedule: Any,
        *,
        actor_key: str = ACTOR_KEY,
        critic_key: str = CRITIC_KEY,
        **kwargs: Any,
    ):
        """Check the keys and options, then build the ``SACPolicy`` (arguments: see the class docstring)."""
        _check_kwargs(observation_space, actor_key, critic_key, kwargs)
        self.actor_key, self.critic_key = actor_key, critic_key
        kwargs["features_extractor_class"] = KeyExtractor
        kwargs["features_extractor_kwargs"] = {"key": actor_key}
        super().__init__(observation_space, action_space, lr_schedule, **kwargs)

    def make_critic(self, features_extractor: BaseFeaturesExtractor | None = None) -> Any:
        """A ``ContinuousCritic`` on ``obs[critic_key]`` (``features_extractor`` is ignored: never the actor's)."""
        return super().make_critic(KeyExtractor(self.observation_space, self.critic_key))

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()
        data.update(actor_key=self.actor_key, critic_key=self.critic_key)
        return data


class AsymmetricActorCriticPolicy(_PredictAnyObs, ActorCriticPolicy):
    """SB3's ``ActorCriticPolicy`` (PPO, A2C): policy net on ``obs[actor_key]``, value net on ``obs[critic_key]``.

    Use it as ``PPO(AsymmetricActorCriticPolicy, env)`` with a ``Dict`` observation env; SB3 then
    collects into its ``DictRolloutBuffer``. The two nets have their own :class:`KeyExtractor`
    (``share_features_extractor=False``) and their own MLP, of ``net_arch`` (``dict(pi=..., vf=...)``).

    Args:
        observation_space: a ``Dict`` holding ``actor_key`` and ``critic_key``.
        action_space: as ``ActorCriticPolicy``.
        lr_schedule: as ``ActorCriticPolicy``.
        actor_key: the key the policy net reads (default ``"policy"``).
        critic_key: the key the value net reads (default ``"critic"``; ``"policy"`` gives the symmetric critic).
        **kwargs: the other arguments of ``ActorCriticPolicy`` (``net_arch``, ``activation_fn``, ``log_std_init`` ...).

    Raises:
        ValueError: a space without the keys, another ``features_extractor_class``, or
            ``share_features_extractor=True``.
    """

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        lr_schedule: Any,
        *,
        actor_key: str = ACTOR_KEY,
        critic_key: str = CRITIC_KEY,
        **kwargs: Any,
    ):
        """Check the keys and options, then build the ``ActorCriticPolicy`` (arguments: see the class docstring)."""
        _check_kwargs(observation_space, actor_key, critic_key, kwargs)
        self.actor_key, self.critic_key = actor_key, critic_key
        kwargs["features_extractor_class"] = KeyExtractor
        kwargs["features_extractor_kwargs"] = {"key": actor_key}
        kwargs["share_features_extractor"] = False
        super().__init__(observation_space, action_space, lr_schedule, **kwargs)

    def _build_mlp_extractor(self) -> None:
        """SB3's ``MlpExtractor`` for the policy features, with the value net rebuilt on the critic's features."""
        self.vf_features_extractor = KeyExtractor(self.observation_space, self.critic_key)
        self.mlp_extractor = MlpExtractor(
            self.features_dim, net_arch=self.net_arch, activation_fn=self.activation_fn, device=self.device
        )
        critic = MlpExtractor(
            self.vf_features_extractor.features_dim,
            net_arch=self.net_arch,
            activation_fn=self.activation_fn,
            device=self.device,
        )
        self.mlp_extractor.value_net = critic.value_net

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()
        data.update(actor_key=self.actor_key, critic_key=self.critic_key)
        return data


def _check_kwargs(space: spaces.Space, actor_key: str, critic_key: str, kwargs: dict[str, Any]) -> None:
    """Refuse what the asymmetric policies cannot honour (raises ValueError naming it)."""
    _subspace(space, actor_key)
    _subspace(space, critic_key)
    extractor = kwargs.get("features_extractor_class", KeyExtractor)
    if extractor is not KeyExtractor:
        raise ValueError(
            f"asymmetric policies read their key with KeyExtractor, got features_extractor_class={extractor!r}"
        )
    if kwargs.get("share_features_extractor"):
        raise ValueError("asymmetric policies cannot share a features extractor: the actor and critic read other keys")
    kwargs.pop("features_extractor_kwargs", None)  # saved models pass back {"key": actor_key}
