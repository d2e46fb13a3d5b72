"""The ``VecNormalize`` statistics the export tests and ``benchmarks/bench_export.py`` fold into exported policies."""

from __future__ import annotations

import numpy as np
from stable_baselines3.common.vec_env import VecNormalize


def random_action_statistics(venv: VecNormalize, steps: int) -> VecNormalize:
    """``venv`` after ``steps`` vector steps of uniform random actions in [-1, 1] (``default_rng(0)``, 12 joints),
    its statistics then frozen (``training = False``): means and variances far from 0 and 1."""
    venv.reset()
    rng = np.random.default_rng(0)
    for _ in range(steps):
        venv.step(rng.uniform(-1, 1, (venv.num_envs, 12)).astype(np.float32))
    venv.training = False
    return venv
