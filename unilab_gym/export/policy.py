"""``PolicyNet``: a policy's deterministic action as one self-contained torch module, raw obs in, action out.

:func:`policy_net` builds it from a Stable-Baselines3 model (SAC, TD3, DDPG, PPO, A2C with
``MlpPolicy``) and the ``VecNormalize`` it was trained with. It computes what
``model.predict(vecnormalize.normalize_obs(obs), deterministic=True)`` returns, step by step as SB3
and ``VecNormalize`` do (SB3 ``BasePolicy.predict``, ``VecNormalize._normalize_obs``):

1. normalize: ``clip((obs - mean) / sqrt(var + epsilon), -clip_obs, clip_obs)`` in float64 (numpy's
   promotion of the float32 obs by the float64 statistics), then cast to float32;
2. the actor's layers (``Linear`` and activations), ending in ``tanh`` for squashed policies
   (SAC, TD3, DDPG);
3. the action: ``low + 0.5 * (a + 1) * (high - low)`` (SB3 ``unscale_action``) if the policy squashes
   its output, else ``clip(a, low, high)``.

**Bad inputs are never hidden** (the rule of every exported form, :data:`NONFINITE_RULE`): a row
whose observation holds a NaN or an infinity, or whose computation overflows (a ``Linear`` layer
gives a non-finite value, as a huge finite observation can without normalization), gets an action
row of NaN, whatever ``VecNormalize``'s clip or the final ``tanh`` / clip would have made of it.
SB3's ``predict`` differs there: ``clip`` maps an infinite observation to ``±clip_obs`` and ``tanh``
maps an overflow to ``±1``, plausible actions from a faulty sensor. On finite inputs without
overflow, the action is SB3's.

The distilled student of :func:`unilab_gym.export.distill` is a ``PolicyNet`` too, so both export
the same way.
"""

from __future__ import annotations

import copy
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from unilab_gym.tasks.quadruped import OBS_DIM

#: Layer types a ``PolicyNet`` may hold (the C header implements exactly these).
LAYER_TYPES: tuple[type[nn.Module], ...] = (nn.Linear, nn.ReLU, nn.Tanh, nn.ELU, nn.LeakyReLU, nn.Hardtanh)

#: The rule for bad inputs, the same in the torch module, the ONNX graph and the C header.
NONFINITE_RULE = (
    "an observation row with a NaN or an infinity, or whose computation overflows (a Linear layer "
    "gives a non-finite value), gets NaN actions (torch, ONNX) / an error code and no action (C)"
)


class PolicyNet(nn.Module):
    """Raw observations ``(batch, O)`` float32 -> deterministic actions ``(batch, A)`` float32.

    ``O`` (:attr:`obs_dim`) is the first ``Linear`` layer's input width and ``A`` (:attr:`act_dim`) the length of
    the action bounds: 48 and 12 for ``UniLab/Quadruped-v0``, the task's widths for another task.

    Args:
        layers: the network from (normalized) observation to pre-scaling action: ``Linear`` layers and
            the activations of :data:`LAYER_TYPES`, in order.
        action_low: ``(A,)`` lower action bounds (the action space's ``low``).
        action_high: ``(A,)`` upper action bounds.
        squash_output: the last layer squashes to ``[-1, 1]`` and the output is rescaled to the bounds;
            otherwise the output is clipped to them.
        obs_mean: ``(O,)`` observation mean (``VecNormalize.obs_rms.mean``), or ``None`` for no normalization.
        obs_var: ``(O,)`` observation variance (``obs_rms.var``); needed with ``obs_mean``.
        epsilon: added to the variance before the square root (``VecNormalize.epsilon``).
        clip_obs: normalized observations are clipped to ``[-clip_obs, clip_obs]`` (``VecNormalize.clip_obs``).

    Attributes:
        obs_dim: ``O``, the observation width.
        act_dim: ``A``, the action width.

    Raises:
        ValueError: a layer type outside :data:`LAYER_TYPES`, no ``Linear`` layer, bounds or statistics of the
            wrong shape (the last ``Linear`` layer's output width must be ``A``), or non-finite statistics.
    """

    obs_mean: torch.Tensor
    obs_std: torch.Tensor
    action_low: torch.Tensor
    action_high: torch.Tensor

    def __init__(
        self,
        layers: nn.Sequential,
        *,
        action_low: np.ndarray,
        action_high: np.ndarray,
        squash_output: bool,
        obs_mean: np.ndarray | None = None,
        obs_var: np.ndarray | None = None,
        epsilon: float = 1e-8,
        clip_obs: float = 10.0,
    ):
        """Check the layers and statistics and store them as buffers (arguments: see the class docstring)."""
        super().__init__()
        for layer in layers:
            if not isinstance(layer, LAYER_TYPES):
                names = ", ".join(t.__name__ for t in LAYER_TYPES)
                raise ValueError(f"PolicyNet layers must be among {names}; got {type(layer).__name__}")
        linear = [layer for layer in layers if isinstance(layer, nn.Linear)]
        if not linear:
            raise ValueError("PolicyNet layers must hold at least one Linear layer")
        self.obs_dim = int(linear[0].in_features)
        self.act_dim = int(np.size(action_low))
        if linear[-1].out_features != self.act_dim:
            raise ValueError(
                f"PolicyNet's last Linear layer gives {linear[-1].out_features} values, but action_low has "
                f"{self.act_dim}: they must match"
            )
        self.layers = layers
        self.squash_output = bool(squash_output)
        self.register_buffer(
            "action_low", torch.as_tensor(_vector("action_low", action_low, self.act_dim), dtype=torch.float32)
        )
        self.register_buffer(
            "action_high", torch.as_tensor(_vector("action_high", action_high, self.act_dim), dtype=torch.float32)
        )
        self.normalizes = obs_mean is not None
        if obs_mean is not None:
            if obs_var is None:
                raise ValueError("PolicyNet needs obs_var with obs_mean")
            std = np.sqrt(_vector("obs_var", obs_var, self.obs_dim).astype(np.float64) + float(epsilon))
            self.register_buffer(
                "obs_mean", torch.as_tensor(_vector("obs_mean", obs_mean, self.obs_dim), dtype=torch.float64)
            )
            self.register_buffer("obs_std", torch.as_tensor(std, dtype=torch.float64))
            self.clip_obs = float(clip_obs)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """``(batch, O)`` float32 raw observations -> ``(batch, A)`` float32 actions within the bounds.

        A row whose observation is not finite, or in which a ``Linear`` layer's output is not finite
        (an overflow), is all NaN (:data:`NONFINITE_RULE`); the other rows are unaffected.
        """
        checked = [obs]  # the values whose non-finiteness a later clip or activation could hide
        x = obs
        if self.normalizes:
            x = ((obs.double() - self.obs_mean) / self.obs_std).clamp(-self.clip_obs, self.clip_obs).float()
        for layer in self.layers:
            x = layer(x)
            if isinstance(layer, nn.Linear):
                checked.append(x)
        if self.squash_output:
            action = self.action_low + 0.5 * (x + 1.0) * (self.action_high - self.action_low)
        else:
            action = torch.maximum(torch.minimum(x, self.action_high), self.action_low)
        # 0 * v is 0 for a finite v and NaN for NaN or +-inf (IEEE 754), so this is 0 for a good row and NaN for a
        # bad one; adding it leaves a good row's action as it is. Concat, Mul, ReduceSum, Add (the graph of the
        # shipped policy grows from 14 to 20 ONNX nodes, measured 2026-12-05): at batch 1, per-node overhead
        # dominates, and isfinite / all / where cost ~25 nodes (twice the latency)
        return action + (torch.cat(checked, dim=-1) * 0.0).sum(dim=-1, keepdim=True)

    def num_params(self) -> int:
        """Weights and biases of :attr:`layers` (the normalization constants and bounds are not counted)."""
        return sum(p.numel() for p in self.layers.parameters())

    @torch.no_grad()
    def act(self, obs: np.ndarray) -> np.ndarray:
        """:meth:`forward` on numpy: ``(batch, O)`` observations -> ``(batch, A)`` float32 actions."""
        return self(torch.tensor(obs, dtype=torch.float32)).numpy()

    def predict(self, obs: np.ndarray, deterministic: bool = True, **_: Any) -> tuple[np.ndarray, None]:
        """SB3-style ``predict`` (so :func:`~unilab_gym.evaluation.evaluate_gait` can run it): ``(actions, None)``."""
        return self.act(obs), None


def load_vecnormalize(vecnormalize: Any) -> Any:
    """A ``VecNormalize`` (returned as is), the path of its saved statistics (a pickle: trust the file), or ``None``.

    Both kinds of SB3 ``VecNormalize`` are accepted: over a flat ``Box`` observation (``obs_rms`` one
    ``RunningMeanStd``) and over a ``Dict`` observation, e.g. ``privileged_obs=True`` (``obs_rms`` a
    dict key -> ``RunningMeanStd`` over its ``norm_obs_keys``); one with ``norm_obs=False`` too (it
    has no ``obs_rms``). Which statistics a policy reads is :func:`normalization`'s choice.

    Raises:
        ValueError: anything else (the message shows it), e.g. a pickle of another object.
    """
    if vecnormalize is None:
        return None
    if isinstance(vecnormalize, (str, Path)):
        with open(vecnormalize, "rb") as f:  # SB3's VecNormalize.save format is a pickle
            vecnormalize = pickle.load(f)
    rms = getattr(vecnormalize, "obs_rms", None)
    stats = list(rms.values()) if isinstance(rms, dict) else [rms]
    has_stats = all(hasattr(r, "mean") and hasattr(r, "var") for r in stats) or not getattr(
        vecnormalize, "norm_obs", True
    )
    if not (hasattr(vecnormalize, "clip_obs") and hasattr(vecnormalize, "epsilon") and has_stats):
        raise ValueError(
            f"vecnormalize must be a VecNormalize, the path of its saved statistics, or None; got {vecnormalize!r}"
        )
    return vecnormalize


def normalization(stats: Any, actor_key: str | None, obs_dim: int = OBS_DIM) -> dict[str, Any]:
    """The normalization arguments of :class:`PolicyNet` (``obs_mean``, ``obs_var``, ``epsilon``, ``clip_obs``).

    Args:
        stats: a ``VecNormalize`` (as :func:`load_vecnormalize` returns it) or ``None``.
        actor_key: the ``Dict`` key the actor reads (``"policy"`` for the asymmetric policies), or
            ``None`` for a model with flat ``Box`` observations.
        obs_dim: the width of the observation the actor reads (48 for ``UniLab/Quadruped-v0``).

    Returns:
        ``{}`` (no normalization) for ``None``, ``norm_obs=False``, or a ``Dict`` ``VecNormalize`` whose
        ``norm_obs_keys`` leave ``actor_key`` out (SB3 then passes that key through unchanged); else the
        statistics of the flat observation, or those of ``actor_key`` alone (a ``Dict`` ``VecNormalize``:
        the other keys' statistics, e.g. the critic's, are left out).

    Raises:
        ValueError: a ``Dict`` ``VecNormalize`` for a flat-observation model or the reverse, or statistics
            whose shape is not ``(obs_dim,)``.
    """
    if stats is None or not getattr(stats, "norm_obs", True):
        return {}
    rms = stats.obs_rms
    if isinstance(rms, dict):
        if actor_key is None:
            raise ValueError(
                f"vecnormalize normalizes a Dict observation (keys {sorted(rms)}), but the model observes a flat "
                f"({obs_dim},) Box: pass the VecNormalize the model was trained with"
            )
        if actor_key not in rms:
            return {}
        rms, where = rms[actor_key], f"vecnormalize.obs_rms[{actor_key!r}]"
    elif actor_key is not None:
        raise ValueError(
            f"vecnormalize normalizes a flat observation of shape {np.shape(rms.mean)}, but the model observes a "
            f"Dict (the actor reads {actor_key!r}): pass the VecNormalize over the Dict the model was trained with"
        )
    else:
        where = "vecnormalize.obs_rms"
    if np.shape(rms.mean) != (obs_dim,) or np.shape(rms.var) != (obs_dim,):
        raise ValueError(
            f"{where} has mean / var of shape {np.shape(rms.mean)} / {np.shape(rms.var)}; the actor reads ({obs_dim},)"
        )
    return {"obs_mean": rms.mean, "obs_var": rms.var, "epsilon": stats.epsilon, "clip_obs": stats.clip_obs}


def policy_net(model: Any, vecnormalize: Any = None) -> PolicyNet:
    """The deterministic action of an SB3 model as a :class:`PolicyNet` (a copy: later training does not change it).

    Args:
        model: a SAC, TD3, DDPG, PPO or A2C model (``MlpPolicy``, flat ``(O,)`` Box observations,
            ``(A,)`` Box actions, any widths: 48 and 12 for ``UniLab/Quadruped-v0``), or a SAC / PPO / A2C model
            with ``AsymmetricSACPolicy`` / ``AsymmetricActorCriticPolicy`` (``Dict`` observations): its actor
            alone, on the ``O``-value ``"policy"`` observation (the critic and its privileged inputs are left out).
        vecnormalize: the ``VecNormalize`` the model was trained with, the path of its saved statistics,
            or ``None``. Its statistics are folded in (read, never updated); for an asymmetric model
            trained under a ``VecNormalize`` over the ``Dict``, those of the ``"policy"`` key
            (``actor_key``) alone (:func:`normalization`).

    Returns:
        A ``PolicyNet`` in eval mode equal to ``model.predict(normalize(obs), deterministic=True)`` on finite
        observations (bad inputs give NaN: :data:`NONFINITE_RULE`).

    Raises:
        ValueError: an unsupported model or policy (another algorithm, a custom features extractor,
            a non-Gaussian action distribution, other observation/action shapes:
            :func:`unilab_gym.sb3.models.deterministic_actor`), or a bad ``vecnormalize``.
    """
    from unilab_gym.sb3.models import deterministic_actor  # the SB3 wing reads the model; torch from here on

    actor = deterministic_actor(model)
    norm = normalization(load_vecnormalize(vecnormalize), actor.actor_key, actor.obs_dim)
    net = PolicyNet(
        nn.Sequential(*_flat(copy.deepcopy(nn.Sequential(*actor.layers)).cpu().float())),
        action_low=actor.action_low,
        action_high=actor.action_high,
        squash_output=actor.squash_output,
        **norm,
    )
    return net.eval()


def _flat(module: nn.Module) -> list[nn.Module]:
    """The leaf modules of nested ``nn.Sequential`` s, in order."""
    if isinstance(module, nn.Sequential):
        return [leaf for child in module for leaf in _flat(child)]
    return [module]


def _vector(name: str, value: Any, size: int) -> np.ndarray:
    arr = np.asarray(value, np.float64)
    if arr.shape != (size,) or not np.isfinite(arr).all():
        raise ValueError(f"{name} must be {size} finite numbers, got shape {arr.shape}: {value!r}")
    return arr
