"""From training to the robot: ONNX export with parity checks, distillation to a small student, a C header.

- :func:`export_onnx`: a SAC, TD3, DDPG, PPO or A2C model (``MlpPolicy``) with its ``VecNormalize``
  folded in, as one ONNX graph ``obs`` ``(batch, 48)`` -> ``action`` ``(batch, 12)``, checked
  against ``model.predict`` on 10,000 env observations.
- :func:`distill`: behaviour cloning with DAgger into a small MLP student, with returns, parameter
  counts and onnxruntime latencies.
- :func:`export_c_header`: the policy as a dependency-free C99 header for microcontrollers.

The functions need the ``export`` extra (``pip install 'unilab-gym[export]'``: onnx and
onnxruntime); without it they raise ``ImportError`` naming that command. Importing this package
imports torch and Stable-Baselines3. Guide: ``docs/export.md``.
"""

from __future__ import annotations

from unilab_gym.export.c_header import export_c_header, weight_bytes
from unilab_gym.export.distill import DistillResult, distill
from unilab_gym.export.policy import PolicyNet, policy_net
from unilab_gym.export.to_onnx import (
    PARITY_OBSERVATIONS,
    PARITY_TOLERANCE,
    env_observations,
    export_onnx,
    onnx_latency_us,
    onnx_metadata,
    run_onnx,
)

__all__ = [
    "PARITY_OBSERVATIONS",
    "PARITY_TOLERANCE",
    "DistillResult",
    "PolicyNet",
    "distill",
    "env_observations",
    "export_c_header",
    "export_onnx",
    "onnx_latency_us",
    "onnx_metadata",
    "policy_net",
    "run_onnx",
    "weight_bytes",
]
