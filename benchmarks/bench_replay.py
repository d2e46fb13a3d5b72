"""Replay buffer benchmark: add throughput, sample latency and storage bytes, side by side.

Setup (issue 3): obs_dim 48, act_dim 12, capacity 1,000,000 transitions, batch 256, adds of 64
rows (one step of 64 envs). Contenders, measured in ONE run and interleaved (A B C A B C ...),
each number the median over rounds:

- ``sb3``: Stable-Baselines3 ``ReplayBuffer(n_envs=64)``;
- ``shared``: ``unilab_gym.SharedReplayBuffer(n_envs=64)`` (same SB3 add/sample API);
- ``shared_opt``: the same with ``optimize_memory_usage=True`` (each observation stored once,
  final observations in a side table; issue 18);
- ``shared_v1``: ``SharedReplayBuffer`` as of ``--baseline-rev`` (default :data:`BASELINE_REV`, the
  revision before issue 18's replay v2 landed; read with ``git show`` into a temporary package), to
  check that this version costs nothing on the 48-float path; skipped outside a git checkout or
  for a revision without ``integrations/sb3_replay.py`` (0.1's layout);
- ``storage``: the raw ``unilab_gym.replay.ReplayStorage`` (``add`` of 64 rows,
  ``TorchSampler`` to CPU tensors), the path collectors and learners use directly;
- ``tianshou``: Tianshou ``VectorReplayBuffer(buffer_num=64)`` (``Batch.to_torch_`` after sampling);
- ``torchrl``: TorchRL ``ReplayBuffer(LazyMemmapStorage)`` of a ``TensorDict``, if installed.

Every buffer is first filled to capacity (untimed): add throughput and sample latency are
measured on full buffers whose rings wrap, the steady state of a training run. Sample latency
is to CPU tensors. Ratios are against ``sb3``.

torch runs with one intra-op thread for all contenders. Run:
``python benchmarks/bench_replay.py`` (about 1-2 minutes, ~2.5 GB RAM);
``--quick`` for a small smoke run. ``--out DIR`` also writes ``bench_replay.json`` / ``.md``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces

OBS_DIM, ACT_DIM = 48, 12


class Data:
    """A pool of pre-generated 64-row steps, cycled, so that timing excludes data generation."""

    def __init__(self, rows: int, pool: int = 16, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.rows = rows
        self.steps = []
        # a consistent stream, as envs give it (the optimized layout relies on it): step k+1's obs
        # is step k's next_obs, except after an episode end; the pool cycles (state pool = state 0)
        states = [rng.standard_normal((rows, OBS_DIM), dtype=np.float32) for _ in range(pool)]
        for k in range(pool):
            terminated = rng.random(rows) < 0.01
            truncated = rng.random(rows) < 0.01
            next_obs = states[(k + 1) % pool].copy()
            ends = terminated | truncated
            next_obs[ends] = rng.standard_normal((int(ends.sum()), OBS_DIM), dtype=np.float32)  # final obs
            self.steps.append(
                dict(
                    obs=states[k],
                    next_obs=next_obs,
                    action=rng.uniform(-1, 1, (rows, ACT_DIM)).astype(np.float32),
                    reward=rng.standard_normal(rows, dtype=np.float32),
                    terminated=terminated,
                    truncated=truncated,
                    done=terminated | truncated,
                    infos=[{"TimeLimit.truncated": bool(t)} for t in truncated],
                )
            )

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.steps[i % len(self.steps)]


class Contender:
    name: str = ""

    def __init__(self, capacity: int, data: Data) -> None:
        self.capacity, self.data = capacity, data

    def add(self, step: dict[str, Any]) -> None:
        raise NotImplementedError

    def fill_rest(self, added: int) -> None:
        """Fill to capacity (untimed); default: keep adding steps."""
        i = 0
        while added < self.capacity:
            self.add(self.data[i])
            added += self.data.rows
            i += 1

    def sample(self, batch: int) -> Any:
        raise NotImplementedError

    def nbytes(self) -> int:
        raise NotImplementedError

    def close(self) -> None:
        pass


def _sb3_args(step):
    return step["obs"], step["next_obs"], step["action"], step["reward"], step["done"], step["infos"]


class SB3(Contender):
    name = "sb3"

    def __init__(self, capacity, data):
        super().__init__(capacity, data)
        from stable_baselines3.common.buffers import ReplayBuffer

        obs = spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float32)
        act = spaces.Box(-1, 1, (ACT_DIM,), np.float32)
        self.buf = ReplayBuffer(capacity, obs, act, "cpu", n_envs=data.rows)

    def add(self, step):
        self.buf.add(*_sb3_args(step))

    def sample(self, batch):
        return self.buf.sample(batch)

    def nbytes(self):
        b = self.buf
        return sum(a.nbytes for a in (b.observations, b.next_observations, b.actions, b.rewards, b.dones, b.timeouts))


class Shared(SB3):
    name = "shared"

    def __init__(self, capacity, data):
        Contender.__init__(self, capacity, data)
        from unilab_gym import SharedReplayBuffer

        obs = spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float32)
        act = spaces.Box(-1, 1, (ACT_DIM,), np.float32)
        self.buf = SharedReplayBuffer(capacity, obs, act, "cpu", n_envs=data.rows, seed=0)

    def nbytes(self):
        return self.buf.storage.nbytes

    def close(self):
        self.buf.close()


class SharedOptimized(Shared):
    name = "shared_opt"

    def __init__(self, capacity, data):
        Contender.__init__(self, capacity, data)
        from unilab_gym import SharedReplayBuffer

        obs = spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float32)
        act = spaces.Box(-1, 1, (ACT_DIM,), np.float32)
        self.buf = SharedReplayBuffer(capacity, obs, act, "cpu", n_envs=data.rows, seed=0, optimize_memory_usage=True)


BASELINE_REV = "2c4c7b7^"  # the parent of the commit that landed issue 18 (replay v2): replay v1
_BASELINE_FILES = {  # and every module of unilab_gym/replay/ at that revision
    "unilab_gym/shm.py": "shm.py",
    "integrations/sb3_replay.py": "sb3_replay.py",
}


def _baseline_class(rev: str) -> Any:
    """``SharedReplayBuffer`` of git revision ``rev``, as package ``unilab_gym_baseline`` in a temp dir."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tmp = tempfile.mkdtemp(prefix="bench_replay_baseline_")
    pkg = os.path.join(tmp, "unilab_gym_baseline")
    os.makedirs(os.path.join(pkg, "replay"))
    open(os.path.join(pkg, "__init__.py"), "w").close()
    listed = subprocess.run(
        ["git", "ls-tree", "--name-only", rev, "unilab_gym/replay/"], cwd=root, capture_output=True, text=True
    ).stdout.split()
    replay = {src: src.removeprefix("unilab_gym/") for src in listed if src.endswith(".py")}
    for src, dst in {**replay, **_BASELINE_FILES}.items():
        try:
            text = subprocess.run(
                ["git", "show", f"{rev}:{src}"], cwd=root, capture_output=True, text=True, check=True
            ).stdout
        except (OSError, subprocess.CalledProcessError) as e:
            raise ImportError(f"no git revision {rev!r} of {src}: {e}") from None
        for mod in ("replay", "shm", "integrations.sb3_replay"):
            text = text.replace(f"unilab_gym.{mod}", f"unilab_gym_baseline.{mod.replace('integrations.', '')}")
        with open(os.path.join(pkg, dst), "w") as f:
            f.write(text)
    sys.path.insert(0, tmp)
    import importlib

    return importlib.import_module("unilab_gym_baseline.sb3_replay").SharedReplayBuffer


def set_baseline_rev(rev: str) -> None:
    """Make ``rev`` the git revision of the ``shared_v1`` contender."""
    global BASELINE_REV
    BASELINE_REV = rev


class SharedBaseline(Shared):
    name = "shared_v1"

    def __init__(self, capacity, data):
        Contender.__init__(self, capacity, data)
        cls = _baseline_class(BASELINE_REV)
        obs = spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float32)
        act = spaces.Box(-1, 1, (ACT_DIM,), np.float32)
        self.buf = cls(capacity, obs, act, "cpu", n_envs=data.rows, seed=0)


class Storage(Contender):
    name = "storage"

    def __init__(self, capacity, data):
        super().__init__(capacity, data)
        from unilab_gym.replay import ReplayLayout, ReplayStorage, TorchSampler

        self.storage = ReplayStorage(ReplayLayout(OBS_DIM, ACT_DIM), capacity)
        self.sampler = TorchSampler(self.storage.layout.width, "cpu")
        self.rng = np.random.default_rng(0)

    def add(self, step):
        self.storage.add(
            step["obs"], step["next_obs"], step["action"], step["reward"], step["terminated"], step["truncated"]
        )

    def sample(self, batch):
        return self.sampler.sample(self.storage, batch, self.rng)

    def nbytes(self):
        return self.storage.nbytes

    def close(self):
        self.storage.close()


class Tianshou(Contender):
    name = "tianshou"

    def __init__(self, capacity, data):
        super().__init__(capacity, data)
        from tianshou.data import Batch, VectorReplayBuffer

        self.buf = VectorReplayBuffer(capacity, data.rows)
        self.batches = [
            Batch(
                obs=s["obs"],
                act=s["action"],
                rew=s["reward"],
                terminated=s["terminated"],
                truncated=s["truncated"],
                obs_next=s["next_obs"],
                info=Batch(),
            )
            for s in data.steps
        ]
        self._i = 0

    def add(self, step):
        self._i += 1
        self.buf.add(self.batches[self._i % len(self.batches)])

    def sample(self, batch):
        b, _ = self.buf.sample(batch)
        b.to_torch_()
        return b

    def nbytes(self):
        return sum(v.nbytes for _, v in self.buf._meta.items() if isinstance(v, np.ndarray))


class TorchRL(Contender):
    name = "torchrl"

    def __init__(self, capacity, data):
        super().__init__(capacity, data)
        from tensordict import TensorDict
        from torchrl.data import LazyMemmapStorage, ReplayBuffer

        self.tmp = tempfile.TemporaryDirectory(prefix="bench_torchrl_")
        self.buf = ReplayBuffer(storage=LazyMemmapStorage(capacity, scratch_dir=self.tmp.name))
        n = data.rows
        self.tds = [
            TensorDict(
                {
                    "obs": th.from_numpy(s["obs"]),
                    "next_obs": th.from_numpy(s["next_obs"]),
                    "action": th.from_numpy(s["action"]),
                    "reward": th.from_numpy(s["reward"]).unsqueeze(-1),
                    "terminated": th.from_numpy(s["terminated"]).unsqueeze(-1),
                    "truncated": th.from_numpy(s["truncated"]).unsqueeze(-1),
                },
                batch_size=[n],
            )
            for s in data.steps
        ]
        self._i = 0

    def add(self, step):
        self._i += 1
        self.buf.extend(self.tds[self._i % len(self.tds)])

    def fill_rest(self, added):
        big = th.cat([td for td in self.tds] * 64)  # extend in large chunks: fast
        while added < self.capacity:
            self.buf.extend(big[: min(len(big), self.capacity - added)])
            added += len(big)

    def sample(self, batch):
        return self.buf.sample(batch)

    def nbytes(self):
        td = self.buf._storage._storage
        return sum(v.numel() * v.element_size() for v in td.values(include_nested=True, leaves_only=True))

    def close(self):
        self.tmp.cleanup()


CONTENDERS: dict[str, Callable[..., Contender]] = {
    c.name: c for c in (SB3, Shared, SharedOptimized, SharedBaseline, Storage, Tianshou, TorchRL)
}


def _make_all(names, capacity, data):
    made = []
    for name in names:
        try:
            made.append(CONTENDERS[name](capacity, data))
        except ImportError as e:
            print(f"# skipping {name}: {e}", file=sys.stderr)
    return made


def run(args: argparse.Namespace) -> dict[str, Any]:
    # One intra-op thread for every contender: torch's thread pool only adds contention for
    # these small copies (TorchRL's extend/sample were >10x slower with 2 threads on 2 busy cores).
    th.set_num_threads(1)
    data = Data(args.rows_per_add)
    contenders = _make_all(args.only, args.capacity, data)
    add_tps: dict[str, list[float]] = {c.name: [] for c in contenders}
    sample_us: dict[str, list[float]] = {c.name: [] for c in contenders}
    # CPU time too: on a shared machine it is less disturbed by other processes than wall time
    add_tps_cpu: dict[str, list[float]] = {c.name: [] for c in contenders}
    sample_us_cpu: dict[str, list[float]] = {c.name: [] for c in contenders}
    for c in contenders:  # full buffers: the steady state of a training run
        c.fill_rest(0)
    gc.disable()
    try:
        step_i = 0
        for _ in range(args.rounds):  # add: interleaved rounds, the rings wrap
            for c in contenders:
                t0, c0 = time.perf_counter(), time.process_time()
                for k in range(args.adds_per_round):
                    c.add(data[step_i + k])
                dt, dc = time.perf_counter() - t0, time.process_time() - c0
                add_tps[c.name].append(args.adds_per_round * args.rows_per_add / dt)
                add_tps_cpu[c.name].append(args.adds_per_round * args.rows_per_add / max(dc, 1e-9))
            step_i += args.adds_per_round
        for c in contenders:  # warm-up
            for _ in range(20):
                c.sample(args.batch)
        for _ in range(args.rounds):  # sample: interleaved rounds
            for c in contenders:
                t0, c0 = time.perf_counter(), time.process_time()
                for _ in range(args.samples_per_round):
                    c.sample(args.batch)
                sample_us[c.name].append((time.perf_counter() - t0) / args.samples_per_round * 1e6)
                sample_us_cpu[c.name].append((time.process_time() - c0) / args.samples_per_round * 1e6)
    finally:
        gc.enable()
    results = {
        c.name: {
            "add_transitions_per_s": statistics.median(add_tps[c.name]),
            "sample_us_per_batch": statistics.median(sample_us[c.name]),
            "add_transitions_per_cpu_s": statistics.median(add_tps_cpu[c.name]),
            "sample_cpu_us_per_batch": statistics.median(sample_us_cpu[c.name]),
            "storage_bytes": c.nbytes(),
        }
        for c in contenders
    }
    for c in contenders:
        c.close()
    return {
        "setup": {
            "obs_dim": OBS_DIM,
            "act_dim": ACT_DIM,
            "capacity": args.capacity,
            "batch": args.batch,
            "rows_per_add": args.rows_per_add,
            "rounds": args.rounds,
            "adds_per_round": args.adds_per_round,
            "samples_per_round": args.samples_per_round,
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "torch": th.__version__,
            "load_average_at_end": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        },
        "results": results,
    }


def _table(res: dict[str, Any], add_key: str, sample_key: str) -> list[str]:
    base = res.get("sb3")
    lines = [
        "| buffer | add (transitions/s) | add vs SB3 | sample (µs/batch) | sample speed-up vs SB3 "
        "| storage (bytes) | storage vs SB3 |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in res.items():
        add_ratio = r[add_key] / base[add_key] if base else float("nan")
        sample_ratio = base[sample_key] / r[sample_key] if base else float("nan")
        bytes_ratio = r["storage_bytes"] / base["storage_bytes"] if base else float("nan")
        lines.append(
            f"| {name} | {r[add_key]:,.0f} | {add_ratio:.2f}x | {r[sample_key]:.1f} | "
            f"{sample_ratio:.2f}x | {r['storage_bytes']:,} | {bytes_ratio:.6f} |"
        )
    return lines


def table(report: dict[str, Any]) -> str:
    res, s = report["results"], report["setup"]
    lines = ["CPU time of the benchmark process (robust to other load on a shared machine):", ""]
    lines += _table(res, "add_transitions_per_cpu_s", "sample_cpu_us_per_batch")
    lines += ["", "Wall-clock time (same rounds):", ""]
    lines += _table(res, "add_transitions_per_s", "sample_us_per_batch")
    lines.append("")
    lines.append(
        f"obs_dim {s['obs_dim']}, act_dim {s['act_dim']}, capacity {s['capacity']:,}, batch {s['batch']}, "
        f"adds of {s['rows_per_add']} rows; median of {s['rounds']} interleaved rounds "
        f"({s['adds_per_round']} adds / {s['samples_per_round']} samples each); "
        f"Python {s['python']}, torch {s['torch']}, {s['cpus']} CPUs, load average {s['load_average_at_end']:.1f}."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    from unilab_gym.cli import HelpFormatter

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=HelpFormatter)
    p.add_argument("--capacity", type=int, default=1_000_000, help="transitions per buffer")
    p.add_argument("--batch", type=int, default=256, help="transitions per sample")
    p.add_argument("--rows-per-add", type=int, default=64, help="transitions per add (one step of 64 envs)")
    p.add_argument("--rounds", type=int, default=15, help="interleaved rounds (the median is reported)")
    p.add_argument("--adds-per-round", type=int, default=200, help="timed adds per round")
    p.add_argument("--samples-per-round", type=int, default=200, help="timed samples per round")
    p.add_argument("--only", nargs="+", default=list(CONTENDERS), choices=list(CONTENDERS), help="buffers to run")
    p.add_argument("--quick", action="store_true", help="small smoke run (capacity 20k, 3 rounds)")
    p.add_argument("--out", help="directory to write bench_replay.json and bench_replay.md (default: print only)")
    p.add_argument(
        "--baseline-rev",
        default=BASELINE_REV,
        help="git revision of the shared_v1 contender (replay v1, before issue 18)",
    )
    args = p.parse_args(argv)
    set_baseline_rev(args.baseline_rev)
    if args.quick:
        args.capacity, args.rounds, args.adds_per_round, args.samples_per_round = 20_000, 3, 20, 20
    report = run(args)
    text = table(report)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "bench_replay.json"), "w") as f:
            json.dump(report, f, indent=2)
        with open(os.path.join(args.out, "bench_replay.md"), "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
