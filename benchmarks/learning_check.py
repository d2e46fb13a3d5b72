"""Learning check: SB3 SAC and PPO on UniLab/Quadruped-v0 with 64 envs, against a random policy.

    python benchmarks/learning_check.py                  # both, ~12 + ~10 min on 2 cores
    python benchmarks/learning_check.py --algo ppo --minutes 10
    python benchmarks/learning_check.py --plot-only      # redraw the PNG from the CSVs

For each algorithm it trains (the settings of ``examples/train_*_sb3.py``) until a wall-clock
budget or a step budget runs out, recording every finished training episode and, every
``--eval-every`` seconds of training, the return of the deterministic policy on 16 evaluation
envs. At the end it evaluates the deterministic policy and a uniform random policy on the same
64 evaluation envs (same seeds; the first episode of each: 64 episodes of up to 1000 steps).
Wall clock counts training only (evaluations excluded).

Writes to ``benchmarks/results/``:
- ``learning_<algo>.csv``: one row per finished training episode: env_steps, wall_clock_s,
  episode_return, episode_length (returns of the exploring policy).
- ``learning_<algo>_eval.csv``: one row per periodic evaluation: env_steps, wall_clock_s,
  return_mean, return_std, episodes.
- ``learning_summary.csv``: per algorithm: env steps and seconds trained, mean +- std of the
  final evaluation return of the trained policy, of the random policy and of the zero action
  (standing in the nominal pose: what a policy gets for not moving), and mean episode lengths.
- ``learning_curves.png``: evaluation and training returns against env steps and against
  wall clock, with the random policy's return.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

import numpy as np
import torch
from stable_baselines3 import PPO, SAC
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import VecNormalize

import unilab_gym  # noqa: F401
from unilab_gym.integrations.sb3 import make_sb3_env
from unilab_gym.integrations.sb3_replay import SharedReplayBuffer

ID = "UniLab/Quadruped-v0"
RESULTS = Path(__file__).parent / "results"
EVAL_SEED = 10_000


class EpisodeRecorder(BaseCallback):
    """Records finished episodes (VecMonitor's ``info["episode"]``), evaluates every ``eval_every``
    seconds of training, and stops after ``seconds`` of training (evaluation time excluded)."""

    def __init__(self, seconds: float, eval_every: float, eval_envs: int):
        super().__init__()
        self.seconds, self.eval_every, self.eval_envs = seconds, eval_every, eval_envs
        self.rows: list[tuple[int, float, float, int]] = []
        self.evals: list[tuple[int, float, float, float, int]] = []
        self.start = self.paused = 0.0
        self.next_eval = 0.0

    def elapsed(self) -> float:
        return time.perf_counter() - self.start - self.paused

    def _on_training_start(self) -> None:
        self.start = time.perf_counter()
        self.next_eval = self.eval_every

    def evaluate(self) -> None:
        t0, at = time.perf_counter(), self.elapsed()
        model = self.model
        returns, _ = evaluate(
            lambda o: model.predict(o, deterministic=True)[0], self.eval_envs, model.get_vec_normalize_env()
        )
        self.evals.append((self.num_timesteps, at, returns.mean(), returns.std(), returns.size))
        self.paused += time.perf_counter() - t0

    def _on_step(self) -> bool:
        elapsed = self.elapsed()
        for info in self.locals["infos"]:
            if "episode" in info:
                self.rows.append((self.num_timesteps, elapsed, float(info["episode"]["r"]), int(info["episode"]["l"])))
        if elapsed >= self.next_eval:
            self.evaluate()
            self.next_eval += self.eval_every
        return elapsed < self.seconds


def make_model(algo: str, num_envs: int, seed: int):
    env = make_sb3_env(ID, num_envs, seed=seed)
    if algo == "sac":
        return SAC(
            "MlpPolicy",
            env,
            replay_buffer_class=SharedReplayBuffer,
            buffer_size=1_000_000,
            learning_starts=10_000,
            batch_size=256,
            learning_rate=3e-4,
            gamma=0.98,
            train_freq=1,
            ent_coef="auto_0.01",
            gradient_steps=8,
            policy_kwargs=dict(net_arch=[256, 256]),
            seed=seed,
            device="cpu",
            verbose=0,
        )
    env = VecNormalize(env, gamma=0.99)
    return PPO(
        "MlpPolicy",
        env,
        n_steps=64,
        batch_size=1024,
        n_epochs=5,
        learning_rate=3e-4,
        gamma=0.99,
        gae_lambda=0.95,
        clip_range=0.2,
        ent_coef=0.0,
        max_grad_norm=1.0,
        policy_kwargs=dict(net_arch=dict(pi=[256, 128], vf=[256, 128]), activation_fn=torch.nn.ELU, log_std_init=-0.5),
        seed=seed,
        device="cpu",
        verbose=0,
    )


def evaluate(policy, num_envs: int, normalizer: VecNormalize | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Return and length of the first episode of each of ``num_envs`` eval envs (seeded EVAL_SEED + i).

    ``policy(obs) -> actions``; ``normalizer``'s frozen statistics normalize the obs it sees.
    """
    env = make_sb3_env(ID, num_envs, seed=EVAL_SEED, monitor=False)
    obs = env.reset()
    returns, lengths = np.zeros(num_envs), np.zeros(num_envs, dtype=int)
    running = np.ones(num_envs, dtype=bool)
    while running.any():
        seen = normalizer.normalize_obs(obs) if normalizer is not None else obs
        obs, reward, done, _ = env.step(policy(seen))
        returns += np.where(running, reward, 0.0)
        lengths += running
        running &= ~done
    env.close()
    return returns, lengths


def run(algo: str, minutes: float, max_steps: int, num_envs: int, seed: int, eval_every: float) -> dict:
    model = make_model(algo, num_envs, seed)
    recorder = EpisodeRecorder(minutes * 60, eval_every, eval_envs=16)
    model.learn(total_timesteps=max_steps, callback=recorder, progress_bar=sys.stderr.isatty())
    trained_s = recorder.elapsed()
    normalizer = model.get_vec_normalize_env()
    trained = evaluate(lambda o: model.predict(o, deterministic=True)[0], num_envs, normalizer)
    rng = np.random.default_rng(seed)
    random = evaluate(lambda o: rng.uniform(-1, 1, (num_envs, 12)).astype(np.float32), num_envs)
    zero = evaluate(lambda o: np.zeros((num_envs, 12), np.float32), num_envs)  # holds the nominal pose
    with open(RESULTS / f"learning_{algo}.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["env_steps", "wall_clock_s", "episode_return", "episode_length"])
        writer.writerows((s, f"{t:.2f}", f"{r:.4f}", length) for s, t, r, length in recorder.rows)
    evals = [*recorder.evals, (model.num_timesteps, trained_s, trained[0].mean(), trained[0].std(), trained[0].size)]
    with open(RESULTS / f"learning_{algo}_eval.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["env_steps", "wall_clock_s", "return_mean", "return_std", "episodes"])
        writer.writerows((s, f"{t:.2f}", f"{m:.4f}", f"{sd:.4f}", n) for s, t, m, sd, n in evals)
    model.env.close()
    return {
        "algo": algo.upper(),
        "num_envs": num_envs,
        "env_steps": model.num_timesteps,
        "train_seconds": round(trained_s, 1),
        "trained_return_mean": round(trained[0].mean(), 3),
        "trained_return_std": round(trained[0].std(), 3),
        "trained_length_mean": round(trained[1].mean(), 1),
        "random_return_mean": round(random[0].mean(), 3),
        "random_return_std": round(random[0].std(), 3),
        "random_length_mean": round(random[1].mean(), 1),
        "zero_action_return_mean": round(zero[0].mean(), 3),
        "zero_action_return_std": round(zero[0].std(), 3),
        "eval_episodes": num_envs,
    }


def write_summary(rows: list[dict]) -> None:
    path = RESULTS / "learning_summary.csv"
    old = []
    if path.exists():
        with open(path) as f:
            old = [r for r in csv.DictReader(f) if r["algo"] not in {row["algo"] for row in rows}]
    rows = sorted(old + rows, key=lambda r: r["algo"])
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _binned(x: np.ndarray, y: np.ndarray, bins: int = 12) -> tuple[np.ndarray, np.ndarray]:
    """Mean of ``y`` in ``bins`` equal-width bins of ``x`` (empty bins dropped)."""
    edges = np.linspace(x.min(), x.max() + 1e-9, bins + 1)
    which = np.digitize(x, edges) - 1
    keep = [k for k in range(bins) if np.any(which == k)]
    return np.array([x[which == k].mean() for k in keep]), np.array([y[which == k].mean() for k in keep])


def plot() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = {}
    if (RESULTS / "learning_summary.csv").exists():
        with open(RESULTS / "learning_summary.csv") as f:
            summary = {r["algo"]: r for r in csv.DictReader(f)}
    fig, axes = plt.subplots(1, 2, figsize=(12, 5.4))
    random_drawn = False
    for color, algo in zip(("tab:blue", "tab:orange"), ("sac", "ppo")):
        name = algo.upper()
        for ax, x in zip(axes, ("env_steps", "wall_clock_s")):
            path = RESULTS / f"learning_{algo}_eval.csv"
            if path.exists():
                ev = np.atleast_1d(np.genfromtxt(path, delimiter=",", names=True))
                ax.plot(ev[x], ev["return_mean"], "o-", color=color, label=f"{name}: deterministic policy (eval)")
                ax.fill_between(
                    ev[x],
                    ev["return_mean"] - ev["return_std"],
                    ev["return_mean"] + ev["return_std"],
                    color=color,
                    alpha=0.15,
                )
            path = RESULTS / f"learning_{algo}.csv"
            if path.exists():
                tr = np.atleast_1d(np.genfromtxt(path, delimiter=",", names=True))
                if tr.size:
                    ax.plot(tr[x], tr["episode_return"], ".", color=color, alpha=0.06, markersize=2)
                    bx, by = _binned(tr[x], tr["episode_return"])
                    ax.plot(bx, by, "--", color=color, lw=1, label=f"{name}: training episodes (binned mean)")
            row = summary.get(name)
            if row and not random_drawn:
                ax.axhline(float(row["random_return_mean"]), color="gray", ls=":", label="uniform random policy (eval)")
                if "zero_action_return_mean" in row:
                    ax.axhline(
                        float(row["zero_action_return_mean"]),
                        color="black",
                        ls="-.",
                        lw=1,
                        label="zero action: stand in the nominal pose (eval)",
                    )
        random_drawn = random_drawn or bool(summary)
    for ax, label in zip(axes, ("env steps", "training wall clock (s), 2 shared CPU cores")):
        ax.set_xlabel(label)
        ax.set_ylabel("episode return (1000 steps max)")
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="lower center", ncol=3)
    fig.suptitle("UniLab/Quadruped-v0, 64 envs: SB3 SAC and PPO vs a random policy")
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    fig.savefig(RESULTS / "learning_curves.png", dpi=120)
    print(f"wrote {RESULTS / 'learning_curves.png'}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", choices=["sac", "ppo", "both"], default="both")
    parser.add_argument(
        "--minutes", type=float, default=None, help="training budget per algorithm (default: SAC 12, PPO 10)"
    )
    parser.add_argument("--max-steps", type=int, default=5_000_000, help="env-step budget per algorithm")
    parser.add_argument("--num-envs", type=int, default=64)
    parser.add_argument("--eval-every", type=float, default=120.0, help="seconds of training between evaluations")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot-only", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # small nets: one thread is fastest, and it does not fight the env for the 2 cores
    RESULTS.mkdir(parents=True, exist_ok=True)
    if not args.plot_only:
        for algo in ("sac", "ppo") if args.algo == "both" else (args.algo,):
            minutes = args.minutes if args.minutes is not None else {"sac": 12, "ppo": 10}[algo]
            row = run(algo, minutes, args.max_steps, args.num_envs, args.seed, args.eval_every)
            print(row, flush=True)
            write_summary([row])
    plot()


if __name__ == "__main__":
    main()
