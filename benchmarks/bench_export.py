"""The measured figures of docs/export.md and docs/privileged-observations.md, in one run.

Export parity, distillation, C header sizes and onnxruntime latency:

    python benchmarks/bench_export.py [--teacher examples/pretrained/ppo_quadruped] [--only PARTS] [--out DIR]

Run from the repository root, on an otherwise idle machine (the latencies are wall clock; a busy machine is warned
about). ``--teacher PREFIX`` reads ``PREFIX.zip`` and ``PREFIX_vecnormalize.pkl`` (a PPO under ``VecNormalize``;
default: the shipped policy). Writes ``OUT/bench_export.json`` (default ``OUT``: ``runs/bench_export``) and prints
it. The C figures need a C compiler (``cc``); without one they are left out and the reason is recorded.

Parts (``--only``, comma-separated; default all):

- ``teacher``: the teacher's ONNX parity; ``distill(teacher, vecnormalize=..., eval_episodes=16)`` (its defaults
  otherwise) and its metrics; the student's parity; ``evaluate_gait`` of teacher, student and the zero action over
  32 episodes (seeds 20,000-20,031); parameter bytes, multiply-adds per step; C header bytes, ``size``'s text bytes
  of a test program and C vs onnxruntime on 1,000 env observations, for teacher and student (export.md's
  "Measured figures").
- ``nanrule``: the NaN rule's cost on the teacher: graph nodes and batch-1 latency with the rule, without it, and
  written with ``isfinite``/``all``/``where`` (export.md's "Non-finite observations").
- ``untrained``: ONNX parity of ``tests/tools/test_export.py``'s models (SAC, TD3, DDPG, PPO, A2C, net ``[32, 32]``,
  weights perturbed 0.3) under a ``VecNormalize`` (``clip_obs`` 5) (export.md's parity table).
- ``asym``: asymmetric policies under a dict ``VecNormalize``: ``tests/tools/test_export_privileged.py``'s setup
  (untrained SAC / PPO, ``clip_obs`` 3) and two briefly trained ``[64, 64]`` models (SAC 400 env steps, PPO 512, 4
  envs, ``clip_obs`` 10); max |exported - SB3| of ONNX, ``PolicyNet`` (object and ``.pkl``) and the C header on
  10,000 observations, 20 % of the values moved beyond ``clip_obs`` standard deviations and 1 % set to +-1e30
  (privileged-observations.md's parity table).

``--quick`` runs every part small (distill 1 round of 20 steps, 2 evaluation episodes, asym models trained 64 steps)
to check the script; its figures are not the docs'. Measured run time on 2 idle cores (AMD EPYC, 2026-12-05): see
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import torch
from common import busy_warning, machine_info, sample_load, write_json
from stable_baselines3 import A2C, DDPG, PPO, SAC, TD3
from stable_baselines3.common.vec_env import VecNormalize

from unilab_gym.cli import HelpFormatter
from unilab_gym.evaluation import evaluate_gait
from unilab_gym.export import PolicyNet, distill, export_c_header, export_onnx, policy_net, weight_bytes
from unilab_gym.export.to_onnx import env_observations, onnx_bytes, onnx_latency_us, onnx_metadata, run_onnx
from unilab_gym.sb3.vec_env import AsymmetricActorCriticPolicy, AsymmetricSACPolicy, make_sb3_env

# the export tests' helpers: compile a header with a test main() and run it; their VecNormalize statistics
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "helpers"))
from _c_policy import STRICT, run_binary
from _c_policy import compile_header as _compile_header
from _export_setup import random_action_statistics

ID = "UniLab/Quadruped-v0"
PARTS = ("teacher", "nanrule", "untrained", "asym")


#: The sizes of a full run (the docs' figures) and of ``--quick`` (a check of the script).
FULL = dict(distill={}, eval_episodes=16, gait_episodes=32, asym_steps={"SAC": 400, "PPO": 512})
QUICK = dict(
    distill=dict(num_envs=4, steps=20, dagger_rounds=1, epochs=1),
    eval_episodes=2,
    gait_episodes=2,
    asym_steps={"SAC": 64, "PPO": 64},
)


def compile_header(header: Path) -> Path:
    """The test program of ``header`` compiled with the export tests' strict flags.

    Raises:
        RuntimeError: no C compiler on ``PATH`` (the helper would raise pytest's skip, which is no ``Exception``).
    """
    if not (shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")):
        raise RuntimeError("no C compiler (cc, gcc or clang) on PATH: the C figures are left out")
    return _compile_header(header, STRICT)


def c_figures(header: Path, onnx_path: Path, obs: np.ndarray) -> dict[str, Any]:
    """Header bytes, ``size``'s text bytes of the test program, C vs onnxruntime max abs diff on ``obs``."""
    binary = compile_header(header)
    status, c_actions = run_binary(binary, obs)
    if not (status == 0).all():
        raise RuntimeError(f"unilab_policy_step returned {sorted(set(status.tolist()))} on env observations")
    size = subprocess.run(["size", str(binary)], capture_output=True, text=True, check=True).stdout
    text = int(size.splitlines()[1].split()[0])
    return {
        "header_bytes": header.stat().st_size,
        "size_text_bytes": text,
        "c_vs_onnxruntime": float(np.abs(c_actions - run_onnx(onnx_path, obs)).max()),
    }


class Zero:
    """The zero action (joint targets at the default pose): the floor of the gait table."""

    def predict(self, obs: np.ndarray, deterministic: bool = True, **_: Any) -> tuple[np.ndarray, None]:
        return np.zeros((len(obs), 12), np.float32), None


def part_teacher(prefix: str, out: Path, sizes: dict[str, Any]) -> dict[str, Any]:
    """The ``teacher`` part (module docstring): the PPO at ``prefix`` exported, distilled, evaluated, sized."""
    zip_, pkl = prefix + ".zip", prefix + "_vecnormalize.pkl"
    model = PPO.load(zip_, device="cpu")
    res: dict[str, Any] = {}
    t = time.perf_counter()
    teacher_onnx = export_onnx(model, out / "teacher" / "policy.onnx", vecnormalize=pkl)
    res["teacher_parity"] = float(onnx_metadata(teacher_onnx)["parity_max_abs_diff"])
    res["teacher_export_s"] = time.perf_counter() - t
    result = distill(model, vecnormalize=pkl, eval_episodes=sizes["eval_episodes"], **sizes["distill"])
    res["distill_metrics"] = result.metrics
    student_onnx = result.export_onnx(out / "student" / "policy.onnx")
    res["student_parity"] = float(onnx_metadata(student_onnx)["parity_max_abs_diff"])
    n = sizes["gait_episodes"]  # other episodes than distill's (seeds 20,000 on)
    res["gait_seed20000"] = {
        "episodes": n,
        "teacher": evaluate_gait(model, ID, n, vecnormalize=pkl, seed=20_000),
        "student": evaluate_gait(result.student, ID, n, seed=20_000),
        "zero_action": evaluate_gait(Zero(), ID, n, seed=20_000),
    }
    # the zero action on distill's evaluation episodes (seeds 10,000 on)
    res["zero_action_distill_episodes"] = evaluate_gait(Zero(), ID, sizes["eval_episodes"], seed=10_000)
    teacher_net = policy_net(model, pkl)
    res["teacher_weight_bytes"] = weight_bytes(teacher_net)
    res["student_weight_bytes"] = weight_bytes(result.student)
    res["multiply_adds"] = {  # per step, Linear layers only
        name: int(sum(m.in_features * m.out_features for m in net.layers if isinstance(m, torch.nn.Linear)))
        for name, net in (("teacher", teacher_net), ("student", result.student))
    }
    try:  # no C compiler, or a compiler error: the other figures stand
        obs1k = env_observations(1000)
        teacher_h = export_c_header(model, out / "teacher" / "policy.h", vecnormalize=pkl)
        res["teacher_c"] = c_figures(teacher_h, teacher_onnx, obs1k)
        res["student_c"] = c_figures(export_c_header(result, out / "student" / "policy.h"), student_onnx, obs1k)
    except Exception:
        res["c_error"] = traceback.format_exc()
    return res


class NoRule(PolicyNet):
    """The PolicyNet without the NaN rule's sum (what the graph cost before the rule)."""

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs
        if self.normalizes:
            x = ((obs.double() - self.obs_mean) / self.obs_std).clamp(-self.clip_obs, self.clip_obs).float()
        for layer in self.layers:
            x = layer(x)
        if self.squash_output:
            return self.action_low + 0.5 * (x + 1.0) * (self.action_high - self.action_low)
        return torch.maximum(torch.minimum(x, self.action_high), self.action_low)


class WhereRule(PolicyNet):
    """The rule written with isfinite / all / where instead of the sum of 0 * v."""

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        checked = [obs]
        x = obs
        if self.normalizes:
            x = ((obs.double() - self.obs_mean) / self.obs_std).clamp(-self.clip_obs, self.clip_obs).float()
        for layer in self.layers:
            x = layer(x)
            if isinstance(layer, torch.nn.Linear):
                checked.append(x)
        if self.squash_output:
            action = self.action_low + 0.5 * (x + 1.0) * (self.action_high - self.action_low)
        else:
            action = torch.maximum(torch.minimum(x, self.action_high), self.action_low)
        good = torch.isfinite(torch.cat(checked, dim=-1)).all(dim=-1, keepdim=True)
        return torch.where(good, action, torch.full_like(action, float("nan")))


def part_nanrule(prefix: str) -> dict[str, Any]:
    """The ``nanrule`` part: graph nodes and batch-1 p50 / p99 (µs) of the teacher with, without and another rule."""
    import onnx

    model = PPO.load(prefix + ".zip", device="cpu")
    net = policy_net(model, prefix + "_vecnormalize.pkl")
    obs = env_observations()
    res: dict[str, Any] = {}
    for name, cls in (("rule", None), ("no_rule", NoRule), ("isfinite_where", WhereRule)):
        try:
            variant = copy.deepcopy(net)
            if cls is not None:
                variant.__class__ = cls
            data = onnx_bytes(variant)
            p50, p99 = onnx_latency_us(data, obs)
            res[name] = {"nodes": len(onnx.load_from_string(data).graph.node), "p50_us": p50, "p99_us": p99}
        except Exception:
            res[name] = {"error": traceback.format_exc()}
    return res


def _perturb(model: Any, scale: float) -> Any:
    """``model`` with ``scale`` x N(0, 1) added to every policy parameter (seeded): an untrained policy whose
    actions are not all near 0."""
    with torch.no_grad():
        generator = torch.Generator().manual_seed(0)
        for p in model.policy.parameters():
            p.add_(scale * torch.randn(p.shape, generator=generator))
    return model


def part_untrained(out: Path) -> dict[str, float]:
    """tests/tools/test_export.py's models (net [32, 32], ELU for PPO / A2C, perturbed 0.3) and VecNormalize."""
    env = make_sb3_env(ID, 2, seed=0)
    venv = random_action_statistics(VecNormalize(make_sb3_env(ID, 4, seed=1), clip_obs=5.0), 100)
    res: dict[str, float] = {}
    for cls in (SAC, TD3, DDPG, PPO, A2C):
        kwargs = {"activation_fn": torch.nn.ELU} if cls in (PPO, A2C) else {}
        model = _perturb(
            cls("MlpPolicy", env, device="cpu", seed=0, policy_kwargs={"net_arch": [32, 32], **kwargs}), 0.3
        )
        path = export_onnx(model, out / "untrained" / f"{cls.__name__}.onnx", vecnormalize=venv)
        res[cls.__name__] = float(onnx_metadata(path)["parity_max_abs_diff"])
    env.close()
    venv.close()
    return res


def _parity_obs(venv: VecNormalize, clip: float) -> tuple[np.ndarray, float]:
    """10,000 env observations, 20 % of the values moved to 1.03-4 x ``clip`` standard deviations of the ``"policy"``
    statistics on either side and 1 % set to +-1e30; and the share of normalized values beyond ``clip``."""
    rng = np.random.default_rng(3)
    rms = venv.obs_rms["policy"]
    std = np.sqrt(rms.var + venv.epsilon)
    obs = np.array(env_observations(), dtype=np.float64)
    beyond = rng.random(obs.shape) < 0.2
    z = rng.choice([-1.0, 1.0], obs.shape) * rng.uniform(1.03 * clip, 4 * clip, obs.shape)
    obs[beyond] = (rms.mean + z * std)[beyond]
    huge = rng.random(obs.shape) < 0.01
    obs[huge] = rng.choice([-1e30, 1e30], huge.sum())
    obs = obs.astype(np.float32)
    zn = (obs - rms.mean) / std
    return obs, float(np.mean(np.abs(zn) > clip))


def _asym_row(model: Any, venv: VecNormalize, obs: np.ndarray, folder: Path) -> dict[str, float]:
    """Max |exported - SB3| of the ONNX file, the ``PolicyNet`` (from the object and from a ``.pkl``) and the C header,
    where SB3 is ``model.predict(venv.normalize_obs({"policy": obs, "critic": 0}), deterministic=True)``."""
    full = {"policy": obs, "critic": np.zeros((len(obs), 68), np.float32)}
    expected = model.predict(venv.normalize_obs(full), deterministic=True)[0]
    row = {"PolicyNet": float(np.abs(policy_net(model, venv).act(obs) - expected).max())}
    onnx_path = export_onnx(model, folder / "policy.onnx", vecnormalize=venv)
    row["ONNX"] = float(np.abs(run_onnx(onnx_path, obs) - expected).max())
    try:
        header = export_c_header(model, folder / "policy.h", vecnormalize=venv)
        status, c_actions = run_binary(compile_header(header), obs)
        if not (status == 0).all():  # the +-1e30 values are clipped by the normalization: every row acts
            raise RuntimeError(f"unilab_policy_step returned {sorted(set(status.tolist()))}")
        row["C"] = float(np.abs(c_actions - expected).max())
    except Exception:
        row["c_error"] = traceback.format_exc(limit=1)
    pkl = folder / "stats.pkl"
    venv.save(str(pkl))
    row["PolicyNet_from_pkl"] = float(np.abs(policy_net(model, str(pkl)).act(obs) - expected).max())
    return row


def part_asym(out: Path, sizes: dict[str, Any]) -> dict[str, Any]:
    """The ``asym`` part: :func:`_asym_row` of four asymmetric policies under a dict ``VecNormalize``."""
    res: dict[str, Any] = {}
    # untrained, tests/tools/test_export_privileged.py's fixtures (clip_obs 3, critic statistics shifted)
    venv = random_action_statistics(VecNormalize(make_sb3_env(ID, 4, seed=1, privileged_obs=True), clip_obs=3.0), 60)
    venv.obs_rms["critic"].mean = venv.obs_rms["critic"].mean + 1.0
    venv.obs_rms["critic"].var = venv.obs_rms["critic"].var * 4.0
    obs, clipped = _parity_obs(venv, 3.0)
    res["clipped_share_clip3"] = clipped
    # a fresh policy_kwargs dict per model: SB3's SAC writes use_sde into the dict it is given
    sac = _perturb(
        SAC(AsymmetricSACPolicy, venv, buffer_size=1_000, device="cpu", seed=0, policy_kwargs={"net_arch": [32, 32]}),
        0.3,
    )
    res["SAC_untrained"] = _asym_row(sac, venv, obs, out / "asym" / "sac_untrained")
    ppo = _perturb(
        PPO(
            AsymmetricActorCriticPolicy,
            venv,
            n_steps=16,
            batch_size=32,
            device="cpu",
            seed=0,
            policy_kwargs={"net_arch": [32, 32], "activation_fn": torch.nn.ELU},
        ),
        0.1,
    )
    res["PPO_untrained"] = _asym_row(ppo, venv, obs, out / "asym" / "ppo_untrained")
    venv.close()
    # briefly trained under the VecNormalize (clip_obs 10, [64, 64], 4 envs), as the first measurement (2026-12-02)
    for name, steps in sizes["asym_steps"].items():
        venv = VecNormalize(make_sb3_env(ID, 4, seed=1, privileged_obs=True), clip_obs=10.0)
        if name == "SAC":
            model = SAC(
                AsymmetricSACPolicy,
                venv,
                buffer_size=10_000,
                learning_starts=100,
                device="cpu",
                seed=0,
                policy_kwargs={"net_arch": [64, 64]},
            )
        else:
            model = PPO(
                AsymmetricActorCriticPolicy,
                venv,
                n_steps=128,
                batch_size=128,
                device="cpu",
                seed=0,
                policy_kwargs={"net_arch": [64, 64], "activation_fn": torch.nn.ELU},
            )
        model.learn(steps)
        venv.training = False
        obs, clipped = _parity_obs(venv, 10.0)
        res[f"{name}_trained_{steps}"] = {**_asym_row(model, venv, obs, out / "asym" / name), "clipped_share": clipped}
        venv.close()
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    parser.add_argument(
        "--teacher",
        default="examples/pretrained/ppo_quadruped",
        help="PREFIX of PREFIX.zip and PREFIX_vecnormalize.pkl",
    )
    parser.add_argument("--out", default="runs/bench_export", help="folder of bench_export.json and the exported files")
    parser.add_argument("--only", default=",".join(PARTS), help=f"comma-separated parts, of {', '.join(PARTS)}")
    parser.add_argument("--quick", action="store_true", help="every part small: checks the script, not the figures")
    args = parser.parse_args()
    parts = args.only.split(",")
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        parser.error(f"--only: unknown part(s) {unknown}; the parts are {list(PARTS)}")
    if {"teacher", "nanrule"} & set(parts):
        for suffix in (".zip", "_vecnormalize.pkl"):
            if not os.path.isfile(args.teacher + suffix):
                parser.error(f"--teacher: {args.teacher + suffix} does not exist")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sizes = QUICK if args.quick else FULL
    torch.set_num_threads(1)  # the latencies are one thread's, as onnxruntime's session
    load_start = sample_load()
    report: dict[str, Any] = {"teacher": args.teacher, "quick": args.quick, "machine": machine_info()}
    report["load_start"] = load_start
    path = str(out / "bench_export.json")
    start = time.perf_counter()
    for part in parts:
        t = time.perf_counter()
        try:
            if part == "teacher":
                report[part] = part_teacher(args.teacher, out, sizes)
            elif part == "nanrule":
                report[part] = part_nanrule(args.teacher)
            elif part == "untrained":
                report[part] = part_untrained(out)
            else:
                report[part] = part_asym(out, sizes)
        except Exception:  # one part's failure is recorded; the other parts still run
            report[part] = {"error": traceback.format_exc()}
            print(report[part]["error"], file=sys.stderr, flush=True)
        report[f"{part}_s"] = round(time.perf_counter() - t, 1)
        write_json(path, report)
    report["elapsed_s"] = round(time.perf_counter() - start, 1)
    report["load_end"] = sample_load()
    warning = busy_warning(load_start, report["load_end"])
    report["busy_warning"] = warning
    write_json(path, report)
    print(json.dumps(report, indent=1, default=float))
    if warning:
        print(warning, file=sys.stderr)
    failed = [p for p in parts if isinstance(report[p], dict) and "error" in report[p]]
    if failed:
        raise SystemExit(f"part(s) {failed} failed; see {path}")


if __name__ == "__main__":
    main()
