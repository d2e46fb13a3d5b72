"""ONNX export of a policy with its normalization and action post-processing folded in, checked for parity.

The graph has one input ``obs`` ``(batch, O)`` float32 (raw observations, dynamic batch) and one
output ``action`` ``(batch, A)`` float32 (``O``, ``A``: the task's widths, 48 and 12 for
``UniLab/Quadruped-v0``), and is written by ``torch.onnx.export`` (its TorchScript
exporter, ``dynamo=False``: it needs no ``onnxscript`` and writes opset 17 natively) from the
:class:`~unilab_gym.export.policy.PolicyNet` of the model. Before it is written, onnxruntime runs it
on :data:`PARITY_OBSERVATIONS` observations of the model's task (random actions, :func:`env_observations`)
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
from unilab_gym.validation import check_int, check_positive_int, check_seed
from unilab_gym.vector_env import UniLabVectorEnv

logger = logging.getLogger(__name__)

#: Observations the parity check runs on.
PARITY_OBSERVATIONS = 10_000
#: Largest accepted ``max |onnxruntime action - model.predict action|`` (the issue's tolerance).
PARITY_TOLERANCE = 1e-5
#: The packages whose versions go into the metadata.
_PACKAGES = ("unilab-gym", "torch", "stable-baselines3", "onnx", "onnxruntime", "numpy", "gymnasium")


@cache
def env_observations(n: int = PARITY_OBSERVATIONS, seed: int = 0, env_id: str = QUADRUPED_ID) -> np.ndarray:
    """At least ``n`` observations of the task ``env_id`` under uniform random actions (cached, read-only).

    ``min(64, max(1, n // 16))`` envs (64 for the default ``n``; env ``i`` seeded ``seed + i``) are stepped until
    ``n`` observations (the reset ones included) are collected; the env is deterministic, so the result is too.

    Args:
        n: observations (>= 1).
        seed: the seed of the envs and of the actions.
        env_id: a registered id whose vector env is a :class:`~unilab_gym.vector_env.UniLabVectorEnv`
            (default ``UniLab/Quadruped-v0``), made with its default arguments.

    Returns:
        ``(n, O)`` float32, read-only (``O``: the task's observation width, 48 for the quadruped).

    Raises:
        ValueError: ``n`` < 1, a bad ``seed``, or an ``env_id`` that does not make a ``UniLabVectorEnv``.
    """
    n = check_positive_int("n", n)
    seed = check_seed("seed", seed)
    env = _unilab_env(env_id, min(64, max(1, n // 16)))
    rng = np.random.default_rng(seed)
    try:
        obs, _ = env.reset(seed=seed)
        batches = [obs]
        while sum(len(b) for b in batches) < n:
            obs, *_ = env.step(rng.uniform(-1.0, 1.0, env.action_space.shape).astype(np.float32))
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
            (torch.zeros(1, net.obs_dim),),
            Path(folder, "policy.onnx"),
            input_names=["obs"],
            output_names=["action"],
            dynamic_axes={"obs": {0: "batch"}, "action": {0: "batch"}},
            opset_version=opset,
            dynamo=False,
        )
        return Path(folder, "policy.onnx").read_bytes()


def export_onnx(
    model: Any, path: str | Path, *, vecnormalize: Any = None, opset: int = 17, env_id: str | None = None
) -> Path:
    """Write a policy's deterministic action as an ONNX model, after checking it against the policy.

    Args:
        model: a SAC, TD3, DDPG, PPO or A2C model (``MlpPolicy``, or the asymmetric policies of
            ``privileged_obs=True``: the actor alone, on the ``"policy"`` values), or a
            :class:`~unilab_gym.export.policy.PolicyNet` (e.g. a distilled student; a
            :class:`~unilab_gym.export.distill.DistillResult` gives its student), for any registered task.
        path: the ``.onnx`` file to write (its folder is created).
        vecnormalize: the ``VecNormalize`` the model was trained with, or the path of its saved
            statistics (a pickle: only a file you trust), or ``None``. Its mean, variance, epsilon and
            clip are folded into the graph; for a ``VecNormalize`` over a ``Dict`` (an asymmetric
            policy), those of the ``"policy"`` key alone. Must be ``None`` for a ``PolicyNet``.
        opset: the ONNX opset (>= 13).
        env_id: the task the policy acts in: the parity observations are its (:func:`env_observations`) and
            the metadata describe it. Default: the id of the model's own env (an SB3 model built on
            ``make_sb3_env``), else ``UniLab/Quadruped-v0``.

    Returns:
        ``path``. The graph maps ``obs`` ``(batch, O)`` float32 to ``action`` ``(batch, A)`` float32 (the task's
        widths), with NaN rows for non-finite or overflowing observations (see the module docstring). The model's
        ``metadata_props`` hold ``env_id``, ``obs_layout`` (JSON: name ->
        [start, stop) columns), ``action_scale`` (the task's, e.g. rad per unit of action for joint targets),
        ``control_period`` (s),
        ``versions`` (JSON: package -> version), ``algo``, ``parity_max_abs_diff`` and
        ``parity_observations``; the parity figure is also logged at INFO level.

    Raises:
        ImportError: onnx or onnxruntime is missing (the message gives the install command).
        ValueError: an unsupported model, a bad ``vecnormalize`` or ``opset``, an ``env_id`` that does not make
            a ``UniLabVectorEnv``, or whose observation / action widths are not the policy's (the message names
            both and ``env_id``).
        RuntimeError: onnxruntime's actions differ from the model's by more than :data:`PARITY_TOLERANCE`
            on the parity observations (nothing is written).
    """
    onnx, _ = require_onnx()
    net, reference = _net_and_reference(model, vecnormalize)
    env_id = model_env_id(model) if env_id is None else env_id
    task = task_facts(env_id)
    if (task["obs_dim"], task["act_dim"]) != (net.obs_dim, net.act_dim):
        raise ValueError(
            f"the policy maps {net.obs_dim} observations to {net.act_dim} actions, but env_id={env_id!r} has "
            f"{task['obs_dim']} and {task['act_dim']}: pass the env_id of the task the policy was trained on"
        )
    proto = onnx.load_from_string(onnx_bytes(net, opset))
    meta = {
        "env_id": env_id,
        "obs_layout": json.dumps(task["obs_layout"]),
        "action_scale": repr(task["action_scale"]),
        "control_period": repr(task["control_period"]),
        "versions": json.dumps({name: _version(name) for name in _PACKAGES}),
        "algo": type(getattr(model, "student", model)).__name__,
    }
    obs = env_observations(PARITY_OBSERVATIONS, env_id=env_id)
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


def model_env_id(model: Any) -> str:
    """The registered id of the env an SB3 model was built on, else ``UniLab/Quadruped-v0``.

    Found from ``model.get_env()``, through SB3's ``VecEnv`` wrappers down to its
    :class:`~unilab_gym.vector_env.UniLabVectorEnv`, whose ``spec`` ``gym.make_vec`` set; the default is for a
    ``PolicyNet``, a model loaded without an env, or an env not made from an id.
    """
    get_env = getattr(getattr(model, "student", model), "get_env", None)
    env = get_env() if callable(get_env) else None
    for _ in range(16):  # VecMonitor -> SB3VecEnv -> UniLabVectorEnv (and any VecEnvWrapper between)
        if env is None or isinstance(env, UniLabVectorEnv):
            break
        env = getattr(env, "venv", None)
    spec = getattr(env, "spec", None) if isinstance(env, UniLabVectorEnv) else None
    found = getattr(spec, "id", None)
    return found if isinstance(found, str) and found in gym.registry else QUADRUPED_ID


@cache
def task_facts(env_id: str) -> dict[str, Any]:
    """What an export records of the task ``env_id`` (its default arguments; cached).

    ``obs_dim``, ``act_dim``, ``obs_layout`` (name -> [start, stop) columns), ``action_scale`` and
    ``control_period`` (s).

    Raises:
        ValueError: ``env_id`` does not make a :class:`~unilab_gym.vector_env.UniLabVectorEnv`.
    """
    env = _unilab_env(env_id, 1)
    try:
        return {
            "obs_dim": int(np.prod(env.single_observation_space.shape or ())),
            "act_dim": int(np.prod(env.single_action_space.shape or ())),
            "obs_layout": {name: list(cols) for name, cols in env.task.obs_layout.items()},
            "action_scale": env.action_scale,
            "control_period": env.control_dt,
        }
    finally:
        env.close()


def _unilab_env(env_id: Any, num_envs: int) -> UniLabVectorEnv:
    """``gym.make_vec(env_id, num_envs=num_envs)``, which must be a ``UniLabVectorEnv`` (``ValueError`` otherwise)."""
    if not isinstance(env_id, str) or env_id not in gym.registry:
        raise ValueError(f"env_id must be a registered UniLab id (e.g. {QUADRUPED_ID!r}), got {env_id!r}")
    env = gym.make_vec(env_id, num_envs=num_envs)
    if not isinstance(env.unwrapped, UniLabVectorEnv):
        env.close()
        raise ValueError(f"env_id must make a UniLabVectorEnv, {env_id!r} made {type(env.unwrapped).__name__}")
    return env.unwrapped


def run_onnx(model: bytes | str | Path, obs: np.ndarray) -> np.ndarray:
    """Run an exported model on ``obs`` ``(batch, O)`` with onnxruntime (CPU, one thread): ``(batch, A)`` float32.

    Raises:
        ImportError: onnxruntime is missing.
    """
    session = _session(model)
    return session.run(["action"], {"obs": np.ascontiguousarray(obs, np.float32)})[0]


def onnx_latency_us(
    model: bytes | str | Path, obs: np.ndarray, *, runs: int = 2000, warmup: int = 200
) -> tuple[float, float]:
    """Latency of one batch-1 call of an exported model in onnxruntime (CPU, one thread): ``(p50, p99)`` in µs.

    Call ``i`` runs on row ``i % len(obs)`` of ``obs`` ``(n, O)`` (``O``: the model's input width) and is timed with
    ``time.perf_counter_ns``, after ``warmup`` untimed calls. Wall-clock figures: they include
    onnxruntime's call overhead and whatever else the machine runs.

    Raises:
        ImportError: onnxruntime is missing.
        ValueError: ``runs`` < 1, ``warmup`` < 0, or ``obs`` not of shape ``(n, O)``.
    """
    runs = check_positive_int("runs", runs)
    warmup = check_int("warmup", warmup, minimum=0)
    obs = np.asarray(obs, np.float32)
    session = _session(model)
    width = session.get_inputs()[0].shape[-1]
    if obs.ndim != 2 or obs.shape[1] != width or len(obs) == 0:
        raise ValueError(f"obs must have shape (n, {width}) with n >= 1, got {obs.shape}")
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
