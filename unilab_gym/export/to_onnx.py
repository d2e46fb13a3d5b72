"""ONNX export of a policy with its normalization and action post-processing folded in, checked for parity.

The graph has one input ``obs`` ``(batch, 48)`` float32 (raw observations, dynamic batch) and one
output ``action`` ``(batch, 12)`` float32, and is written by ``torch.onnx.export`` (its TorchScript
exporter, ``dynamo=False``: it needs no ``onnxscript`` and writes opset 17 natively) from the
:class:`~unilab_gym.export.policy.PolicyNet` of the model. Before it is written, onnxruntime runs it
on :data:`PARITY_OBSERVATIONS` observations of the env (random actions, :func:`env_observations`)
and its actions are compared with ``model.predict(obs, deterministic=True)``.

Bad inputs are never hidden (:data:`~unilab_gym.export.policy.NONFINITE_RULE`): a row of ``obs``
holding a NaN or an infinity, or whose computation overflows float32, gets an ``action`` row of NaN
(the graph adds ``sum(0 * v)`` over the row's input and every ``Gemm`` output ``v`` to the action: 0
for finite values, NaN otherwise, IEEE 754); the other rows of the batch are unaffected, bit for bit.
The C header returns an error code for the same rows.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
import warnings
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from unilab_gym.export._deps import require_onnx
from unilab_gym.export.policy import PolicyNet, load_vecnormalize, policy_net
from unilab_gym.registration import QUADRUPED_ID
from unilab_gym.tasks.config import QuadrupedConfig
from unilab_gym.tasks.quadruped import OBS_DIM, OBS_LAYOUT
from unilab_gym.validation import check_int, check_positive_int, check_seed

logger = logging.getLogger(__name__)

#: Observations the parity check runs on.
PARITY_OBSERVATIONS = 10_000
#: Largest accepted ``max |onnxruntime action - model.predict action|`` (the issue's tolerance).
PARITY_TOLERANCE = 1e-5
#: The packages whose versions go into the metadata.
_PACKAGES = ("unilab-gym", "torch", "stable-baselines3", "onnx", "onnxruntime", "numpy", "gymnasium")


@cache
def env_observations(n: int = PARITY_OBSERVATIONS, seed: int = 0) -> np.ndarray:
    """At least ``n`` observations of ``UniLab/Quadruped-v0`` under uniform random actions (cached, read-only).

    64 envs (env ``i`` seeded ``seed + i``) are stepped until ``n`` observations (the reset ones
    included) are collected; the env is deterministic, so the result is too.

    Returns:
        ``(n, 48)`` float32, read-only.

    Raises:
        ValueError: ``n`` < 1 or a bad ``seed``.
    """
    n = check_positive_int("n", n)
    seed = check_seed("seed", seed)
    env = gym.make_vec(QUADRUPED_ID, num_envs=64)
    rng = np.random.default_rng(seed)
    try:
        obs, _ = env.reset(seed=seed)
        batches = [obs]
        while sum(len(b) for b in batches) < n:
            obs, *_ = env.step(rng.uniform(-1.0, 1.0, (64, 12)).astype(np.float32))
            batches.append(obs)
    finally:
        env.close()
    out = np.concatenate(batches)[:n]
    out.flags.writeable = False
    return out


def onnx_bytes(net: PolicyNet, opset: int = 17) -> bytes:
    """The serialized ONNX model of ``net`` (no metadata, not checked): input ``obs``, output ``action``, dynamic batch.

    Raises:
        ValueError: a bad ``opset``.
    """
    opset = check_int("opset", opset, minimum=13)
    with (
        tempfile.TemporaryDirectory() as folder,
        warnings.catch_warnings(),
    ):  # torch >= 2.9 warns that the TorchScript exporter is deprecated
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            net.eval(),
            (torch.zeros(1, OBS_DIM),),
            Path(folder, "policy.onnx"),
            input_names=["obs"],
            output_names=["action"],
            dynamic_axes={"obs": {0: "batch"}, "action": {0: "batch"}},
            opset_version=opset,
            dynamo=False,
        )
        return Path(folder, "policy.onnx").read_bytes()


def export_onnx(model: Any, path: str | Path, *, vecnormalize: Any = None, opset: int = 17) -> Path:
    """Write a policy's deterministic action as an ONNX model, after checking it against the policy.

    Args:
        model: a SAC, TD3, DDPG, PPO or A2C model (``MlpPolicy``, or the asymmetric policies of
            ``privileged_obs=True``: the actor alone, on the 48 ``"policy"`` values), or a
            :class:`~unilab_gym.export.policy.PolicyNet` (e.g. a distilled student; a
            :class:`~unilab_gym.export.distill.DistillResult` gives its student).
        path: the ``.onnx`` file to write (its folder is created).
        vecnormalize: the ``VecNormalize`` the model was trained with, or the path of its saved
            statistics (a pickle: only a file you trust), or ``None``. Its mean, variance, epsilon and
            clip are folded into the graph; for a ``VecNormalize`` over a ``Dict`` (an asymmetric
            policy), those of the ``"policy"`` key alone. Must be ``None`` for a ``PolicyNet``.
        opset: the ONNX opset (>= 13).

    Returns:
        ``path``. The graph maps ``obs`` ``(batch, 48)`` float32 to ``action`` ``(batch, 12)`` float32, with
        NaN rows for non-finite or overflowing observations (see the module docstring). The model's
        ``metadata_props`` hold ``env_id``, ``obs_layout`` (JSON: name ->
        [start, stop) columns), ``action_scale`` (rad per unit of action), ``control_period`` (s),
        ``versions`` (JSON: package -> version), ``algo``, ``parity_max_abs_diff`` and
        ``parity_observations``; the parity figure is also logged at INFO level.

    Raises:
        ImportError: onnx or onnxruntime is missing (the message gives the install command).
        ValueError: an unsupported model, a bad ``vecnormalize`` or ``opset``.
        RuntimeError: onnxruntime's actions differ from the model's by more than :data:`PARITY_TOLERANCE`
            on the parity observations (nothing is written).
    """
    onnx, _ = require_onnx()
    net, reference = _net_and_reference(model, vecnormalize)
    proto = onnx.load_from_string(onnx_bytes(net, opset))
    config = QuadrupedConfig()
    meta = {
        "env_id": QUADRUPED_ID,
        "obs_layout": json.dumps(OBS_LAYOUT),
        "action_scale": repr(config.action_scale),
        "control_period": repr(config.control_dt),
        "versions": json.dumps({name: _version(name) for name in _PACKAGES}),
        "algo": type(getattr(model, "student", model)).__name__,
    }
    obs = env_observations()
    diff = float(np.max(np.abs(run_onnx(proto.SerializeToString(), obs) - reference(obs))))
    logger.info("ONNX parity on %d env observations: max abs diff %.3g", len(obs), diff)
    if not diff <= PARITY_TOLERANCE:
        raise RuntimeError(
            f"ONNX actions differ from the policy's by up to {diff:.3g} on {len(obs)} env observations "
            f"(tolerance {PARITY_TOLERANCE}); not written"
        )
    meta |= {"parity_max_abs_diff": repr(diff), "parity_observations": str(len(obs))}
    onnx.helper.set_model_props(proto, meta)
    proto.producer_name, proto.producer_version = "unilab-gym", _version("unilab-gym")
    onnx.checker.check_model(proto, full_check=True)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(proto, path)
    return path


def onnx_metadata(path: str | Path) -> dict[str, str]:
    """The ``metadata_props`` of an ONNX file as a dict (see :func:`export_onnx` for the keys it writes).

    Raises:
        ImportError: onnx is missing.
    """
    onnx, _ = require_onnx()
    return {prop.key: prop.value for prop in onnx.load(str(path)).metadata_props}


def run_onnx(model: bytes | str | Path, obs: np.ndarray) -> np.ndarray:
    """Run an exported model on ``obs`` ``(batch, 48)`` with onnxruntime (CPU, one thread): ``(batch, 12)`` float32.

    Raises:
        ImportError: onnxruntime is missing.
    """
    session = _session(model)
    return session.run(["action"], {"obs": np.ascontiguousarray(obs, np.float32)})[0]


def onnx_latency_us(
    model: bytes | str | Path, obs: np.ndarray, *, runs: int = 2000, warmup: int = 200
) -> tuple[float, float]:
    """Latency of one batch-1 call of an exported model in onnxruntime (CPU, one thread): ``(p50, p99)`` in µs.

    Call ``i`` runs on row ``i % len(obs)`` of ``obs`` ``(n, 48)`` and is timed with
    ``time.perf_counter_ns``, after ``warmup`` untimed calls. Wall-clock figures: they include
    onnxruntime's call overhead and whatever else the machine runs.

    Raises:
        ImportError: onnxruntime is missing.
        ValueError: ``runs`` < 1, ``warmup`` < 0, or ``obs`` not of shape ``(n, 48)``.
    """
    runs = check_positive_int("runs", runs)
    warmup = check_int("warmup", warmup, minimum=0)
    obs = np.asarray(obs, np.float32)
    if obs.ndim != 2 or obs.shape[1] != OBS_DIM or len(obs) == 0:
        raise ValueError(f"obs must have shape (n, {OBS_DIM}) with n >= 1, got {obs.shape}")
    session = _session(model)
    times = np.empty(runs)
    for i in range(warmup + runs):
        feed = {"obs": obs[i % len(obs)][None]}
        start = time.perf_counter_ns()
        session.run(None, feed)
        if i >= warmup:
            times[i - warmup] = (time.perf_counter_ns() - start) / 1e3
    return float(np.percentile(times, 50)), float(np.percentile(times, 99))


def _session(model: bytes | str | Path) -> Any:
    _, ort = require_onnx()
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    source = model if isinstance(model, bytes) else str(model)
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def _net_and_reference(model: Any, vecnormalize: Any) -> tuple[PolicyNet, Any]:
    """The net to export and the function obs -> actions it must match (a ``DistillResult`` gives its student)."""
    model = getattr(model, "student", model)
    if isinstance(model, PolicyNet):
        if vecnormalize is not None:
            raise ValueError("a PolicyNet has its normalization folded in already: pass vecnormalize=None")
        return model.eval(), model.act
    stats = load_vecnormalize(vecnormalize)
    net = policy_net(model, stats)

    space, key = model.observation_space, getattr(model.policy, "actor_key", None)

    def reference(obs: np.ndarray) -> np.ndarray:
        full: Any = obs
        if key is not None and isinstance(space, gym.spaces.Dict):  # an asymmetric policy: the actor's key alone
            full = {k: obs if k == key else np.zeros((len(obs), *(s.shape or ())), s.dtype) for k, s in space.items()}
        normalized = stats.normalize_obs(full) if stats is not None else full
        return model.predict(normalized, deterministic=True)[0]

    return net, reference


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "unknown"
