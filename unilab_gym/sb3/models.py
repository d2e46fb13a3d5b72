"""Saved SB3 models for the tools: which algorithm saved a file, loading it, its statistics, its actor.

What ``unilab-gym play``, ``unilab-gym robustness`` and ``unilab-gym export`` (:mod:`unilab_gym.cli`) and the
exporter (:mod:`unilab_gym.export.policy`) need from Stable-Baselines3, gathered in the wing so that no module
outside ``unilab_gym/sb3/`` imports ``stable_baselines3`` (issue 28). The tools call these functions and import
this module when they need it.

- :func:`algorithm_of`: the SB3 class that saved a ``.zip``, from the hyperparameters it stored;
- :func:`load_model`: a saved model, on the CPU;
- :func:`load_vec_normalize` / :func:`original_rewards`: the ``VecNormalize`` statistics a model was trained
  with, frozen, over an env; the raw rewards under it;
- :func:`deterministic_actor`: the layers of a model's deterministic action (:class:`DeterministicActor`),
  what :func:`unilab_gym.export.policy.policy_net` turns into a ``PolicyNet``.

Loading a model or a statistics file runs the pickles it holds: pass only files you trust.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from stable_baselines3 import A2C, PPO, SAC, TD3
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.save_util import load_from_zip_file
from stable_baselines3.common.vec_env import VecEnv, VecNormalize
from torch import nn

from unilab_gym.sb3.algorithms import ALGORITHMS

__all__ = [
    "DeterministicActor",
    "algorithm_of",
    "deterministic_actor",
    "load_model",
    "load_vec_normalize",
    "original_rewards",
]

#: a hyperparameter only one algorithm's saved data holds -> that algorithm (DDPG saves TD3's, as a TD3 subclass)
_TELLTALES: tuple[tuple[str, type[BaseAlgorithm]], ...] = (
    ("target_entropy", SAC),
    ("clip_range", PPO),
    ("policy_delay", TD3),
    ("normalize_advantage", A2C),
)


def algorithm_of(path: str | Path) -> type[BaseAlgorithm]:
    """The SB3 algorithm class that saved ``path``, from the hyperparameters it stored.

    Reads the ``data`` entry of SB3's zip (JSON; the pickled parameters are not loaded).

    Raises:
        ValueError: the file holds no model data, or none of the hyperparameters that tell SAC, PPO, TD3 and
            A2C apart (the message names the file and :data:`~unilab_gym.sb3.algorithms.ALGORITHMS`).
        OSError: the file cannot be read (e.g. not a zip).
    """
    data, _, _ = load_from_zip_file(path, load_data=True, device="cpu")
    if data is None:
        raise ValueError(f"{path} holds no SB3 model data")
    for key, cls in _TELLTALES:
        if key in data:
            return cls
    raise ValueError(f"{path} was not saved by one of {sorted(ALGORITHMS)}")


def load_model(
    path: str | Path,
    algo: str | None = None,
    algorithms: Mapping[str, type[BaseAlgorithm]] = ALGORITHMS,
) -> BaseAlgorithm:
    """The model saved at ``path``, loaded on the CPU (``cls.load(path, device="cpu")``).

    Args:
        path: a ``.zip`` written by SB3's ``model.save`` (a pickle inside: trust the file).
        algo: the algorithm's name in ``algorithms`` (``"sac"``, ``"ppo"``, ...), or ``None``: the one
            :func:`algorithm_of` reads from the file.
        algorithms: the names ``algo`` may take, each to its SB3 class (default: every algorithm of
            :data:`~unilab_gym.sb3.algorithms.ALGORITHMS`).

    Raises:
        KeyError: ``algo`` is not in ``algorithms`` (callers check it first, with their own message).
        ValueError: ``algo=None`` and the algorithm cannot be read from the file (:func:`algorithm_of`).
    """
    cls = algorithms[algo] if algo else algorithm_of(path)
    return cls.load(path, device="cpu")


def load_vec_normalize(path: str | os.PathLike[str], env: VecEnv) -> VecNormalize:
    """The ``VecNormalize`` statistics saved at ``path`` (a pickle: trust the file) over ``env``, frozen.

    Frozen: ``training=False`` (the statistics are not updated) and ``norm_reward=False`` (rewards come out
    raw), as for evaluation.
    """
    normalized = VecNormalize.load(str(path), env)
    normalized.training, normalized.norm_reward = False, False
    return normalized


def original_rewards(env: VecEnv, rewards: np.ndarray) -> np.ndarray:
    """The raw rewards of ``env``'s last step: ``get_original_reward()`` under a ``VecNormalize``, else ``rewards``."""
    return env.get_original_reward() if isinstance(env, VecNormalize) else rewards


@dataclass(frozen=True)
class DeterministicActor:
    """The layers that compute an SB3 model's deterministic action (the model's own modules, not copies).

    Attributes:
        layers: the torch modules in order, from the actor's (flat) input to its action before unscaling:
            the actor's MLP and output layer, ending in ``nn.Tanh()`` for a squashed policy.
        obs_dim: the width ``O`` of the ``(O,)`` observation the actor reads.
        action_low: ``(A,)`` lower bounds of the action space.
        action_high: ``(A,)`` upper bounds of the action space.
        squash_output: whether the actor ends in ``tanh`` and its output is unscaled to the bounds (SAC, TD3,
            DDPG; PPO / A2C with ``squash_output``), rather than clipped to them.
        actor_key: the ``Dict`` observation key the actor reads (the asymmetric policies' ``"policy"``), or
            ``None`` for a flat ``Box`` observation.
    """

    layers: list[nn.Module]
    obs_dim: int
    action_low: np.ndarray
    action_high: np.ndarray
    squash_output: bool
    actor_key: str | None


def deterministic_actor(model: Any) -> DeterministicActor:
    """The layers of ``model.predict(obs, deterministic=True)``: SAC, TD3, DDPG, PPO or A2C.

    ``MlpPolicy`` (a ``FlattenExtractor``, flat ``(O,)`` Box observations) or the asymmetric policies
    (:mod:`unilab_gym.sb3.policies`: the actor alone, on the ``"policy"`` key of a ``Dict`` observation),
    ``(A,)`` Box actions. SAC: ``latent_pi``, ``mu``, ``tanh``; TD3 / DDPG: ``mu`` (ending in ``Tanh``);
    PPO / A2C: the policy MLP and ``action_net`` (the Gaussian's mode is its mean), ``tanh`` if squashed.

    Raises:
        ValueError: not an SB3 model, another algorithm or policy, observations or actions that are not flat
            Boxes, a non-Gaussian action distribution, or a custom features extractor (the message names it).
    """
    from gymnasium import spaces
    from stable_baselines3.common.distributions import DiagGaussianDistribution, StateDependentNoiseDistribution
    from stable_baselines3.common.policies import ActorCriticPolicy
    from stable_baselines3.common.torch_layers import FlattenExtractor
    from stable_baselines3.sac.policies import SACPolicy
    from stable_baselines3.td3.policies import TD3Policy

    policy = getattr(model, "policy", None)
    if not isinstance(model, BaseAlgorithm):
        raise ValueError(f"model must be a SAC, TD3, DDPG, PPO or A2C model (SB3); got {type(model).__name__}")
    obs_space, act_space = getattr(policy, "observation_space", None), getattr(policy, "action_space", None)
    actor_key = getattr(policy, "actor_key", None)  # an asymmetric policy: the actor reads obs[actor_key] alone
    if isinstance(obs_space, spaces.Dict) and actor_key in obs_space.spaces:
        obs_space = obs_space.spaces[actor_key]
    else:
        actor_key = None
    if not (isinstance(obs_space, spaces.Box) and len(obs_space.shape) == 1):
        raise ValueError(
            f"model must be an SB3 model with flat (O,) Box observations; got {type(model).__name__} "
            f"observing {obs_space}"
        )
    if not (isinstance(act_space, spaces.Box) and len(act_space.shape) == 1):
        raise ValueError(f"model must have flat (A,) Box actions; got {act_space}")
    layers: list[nn.Module]
    if isinstance(policy, SACPolicy):
        extractor, layers = policy.actor.features_extractor, [policy.actor.latent_pi, policy.actor.mu, nn.Tanh()]
    elif isinstance(policy, TD3Policy):  # TD3 and DDPG: mu ends in Tanh
        extractor, layers = policy.actor.features_extractor, [policy.actor.mu]
    elif isinstance(policy, ActorCriticPolicy):  # PPO, A2C: the Gaussian's mode is its mean
        if not isinstance(policy.action_dist, (DiagGaussianDistribution, StateDependentNoiseDistribution)):
            raise ValueError(f"unsupported action distribution {type(policy.action_dist).__name__}")
        extractor = policy.pi_features_extractor
        layers = [policy.mlp_extractor.policy_net, policy.action_net, *([nn.Tanh()] if policy.squash_output else [])]
    else:
        raise ValueError(f"model must be SAC, TD3, DDPG, PPO or A2C; got {type(model).__name__}")
    if not isinstance(extractor, FlattenExtractor) and not (
        actor_key is not None and getattr(extractor, "key", None) == actor_key
    ):
        raise ValueError(
            "only MlpPolicy (FlattenExtractor) and the asymmetric policies (KeyExtractor) are supported; "
            f"got {type(extractor).__name__}"
        )
    return DeterministicActor(
        layers=layers,
        obs_dim=int(obs_space.shape[0]),
        action_low=act_space.low,
        action_high=act_space.high,
        squash_output=bool(policy.squash_output),
        actor_key=actor_key,
    )
