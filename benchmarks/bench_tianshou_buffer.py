"""Tianshou buffers at 200k transitions: ``hasnull()`` (called by the off-policy trainer after
every collect), ``add`` of one vector step and a 256-transition gather, for Tianshou's
``VectorReplayBuffer`` and ``SharedVectorReplayBuffer``.

    python benchmarks/bench_tianshou_buffer.py [--size 200000] [--num-envs 64]

Transitions look like the Collector's on UniLab/Quadruped-v0: 48-d obs, 12-d actions, and an
``info`` with ``env_id`` and 7 reward terms.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from tianshou.data import Batch, VectorReplayBuffer

from unilab_gym.cli import HelpFormatter
from unilab_gym.tianshou import SharedVectorReplayBuffer


def step_batch(rng: np.random.Generator, n: int) -> Batch:
    terms = Batch(**{f"term_{k}": rng.standard_normal(n) for k in range(7)})
    return Batch(
        obs=rng.standard_normal((n, 48), dtype=np.float32),
        act=rng.standard_normal((n, 12), dtype=np.float32),
        rew=rng.standard_normal(n),
        terminated=np.zeros(n, bool),
        truncated=np.zeros(n, bool),
        obs_next=rng.standard_normal((n, 48), dtype=np.float32),
        info=Batch(env_id=np.arange(n), reward_terms=terms),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    parser.add_argument("--size", type=int, default=200_000, help="buffer capacity in transitions")
    parser.add_argument("--num-envs", type=int, default=64, help="envs (sub-buffers)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    batch, steps = step_batch(rng, args.num_envs), args.size // args.num_envs + 1
    idx = rng.integers(0, args.size, 256)
    print(f"{'buffer':<26} {'hasnull()':>12} {'add(1 step)':>12} {'buf[256 idx]':>13}")
    for cls in (VectorReplayBuffer, SharedVectorReplayBuffer):
        buf = cls(args.size, args.num_envs)
        t = time.perf_counter()
        for _ in range(steps):
            buf.add(batch)
        add = (time.perf_counter() - t) / steps
        t = time.perf_counter()
        for _ in range(3):
            assert not buf.hasnull()
        hasnull = (time.perf_counter() - t) / 3
        t = time.perf_counter()
        for _ in range(200):
            buf[idx]
        get = (time.perf_counter() - t) / 200
        print(
            f"{cls.__name__:<26} {hasnull * 1e3:>9.3f} ms {add * 1e3:>9.3f} ms {get * 1e3:>10.3f} ms  (len {len(buf)})"
        )


if __name__ == "__main__":
    main()
