"""``unilab-gym export``: a saved SB3 model to ONNX (parity-checked), optionally distilled, optionally as a C header.

    unilab-gym export runs/ppo_sb3/model.zip --out policy.onnx
    unilab-gym export runs/ppo_sb3/model.zip --out student.onnx --distill 64,64 --c-header student.h

The algorithm is read from the saved file; an asymmetric policy (``privileged_obs=True``,
``AsymmetricSACPolicy`` / ``AsymmetricActorCriticPolicy``) exports its actor, on the 48 ``"policy"``
values, with the ``"policy"`` statistics of a ``VecNormalize`` over the ``Dict``.
``VecNormalize`` statistics are loaded only when asked,
as ``unilab-gym play`` does: ``--vecnormalize PATH``, or ``--sibling-vecnormalize`` for
``<model>_vecnormalize.pkl`` (both the model and the statistics are pickles: load only files you
trust). With ``--distill``, the ONNX file and the header hold the student; the teacher's figures
are printed next to it. A tqdm bar on stderr counts the stages (load the model, collect the parity
observations, export and check, or distil, measure the latency, write the header) and names the
one running: a plain export takes about half a minute on 2 cores, a distillation minutes;
``--no-progress`` turns it off. Needs the export extra: ``pip install 'unilab-gym[export]'``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from unilab_gym.cli import HelpFormatter
from unilab_gym.cli.play import ALGOS, algo_of, vecnormalize_to_load
from unilab_gym.export import PolicyNet, distill, export_c_header, export_onnx, policy_net, weight_bytes
from unilab_gym.export.policy import load_vecnormalize
from unilab_gym.export.to_onnx import env_observations, onnx_bytes, onnx_latency_us, onnx_metadata


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options of ``unilab-gym export`` (``argv`` defaults to ``sys.argv[1:]``)."""
    parser = argparse.ArgumentParser(
        prog="unilab-gym export",
        description="Export a saved SB3 model to ONNX with a parity check; optionally distil it and write a C header.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("model", type=Path, help="a model .zip saved by SB3 (SAC, TD3, DDPG, PPO, A2C)")
    parser.add_argument("--out", type=Path, required=True, help="the .onnx file to write")
    parser.add_argument("--vecnormalize", type=Path, default=None, help="VecNormalize statistics to fold in")
    parser.add_argument(
        "--sibling-vecnormalize", action="store_true", help="fold in <model>_vecnormalize.pkl next to the model"
    )
    parser.add_argument("--distill", type=_widths, default=None, metavar="W1,W2", help="distil into an MLP student")
    parser.add_argument("--c-header", type=Path, default=None, help="also write a C99 header of the exported policy")
    parser.add_argument("--distill-steps", type=int, default=250, help="vector-env steps per DAgger round")
    parser.add_argument("--dagger-rounds", type=int, default=4, help="rounds with the student driving")
    parser.add_argument("--algo", choices=sorted(ALGOS), default=None, help="default: read from the file")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> Path:
    """Run ``unilab-gym export`` (see the module docstring) and return the path of the ONNX file written.

    Raises:
        SystemExit: no model or statistics file at the given path, or a bad option (the message names it).
    """
    args = parse_args(argv)
    if not args.model.exists():
        raise SystemExit(f"no model at {args.model}")
    try:
        stats = load_vecnormalize(vecnormalize_to_load(args.model, args.vecnormalize, args.sibling_vecnormalize))
    except ValueError as error:
        raise SystemExit(str(error)) from None
    stages = 4 + (args.c_header is not None)
    with _stages(stages, disable=args.no_progress) as stage:
        with stage("load the model"):
            model = (ALGOS[args.algo] if args.algo else algo_of(args.model)).load(args.model, device="cpu")
            try:
                teacher = policy_net(model, stats)
            except ValueError as error:  # e.g. statistics of another observation than the model's
                raise SystemExit(f"{args.model}: {error}") from None
        with stage("collect env observations"):
            obs = env_observations()
        if args.distill is None:
            with stage("export and check parity"):
                export_onnx(model, args.out, vecnormalize=stats)
                net, name = teacher, "policy"
        else:
            with stage(f"distil ({args.dagger_rounds} DAgger rounds) and export"):
                result = distill(
                    model,
                    hidden=args.distill,
                    vecnormalize=stats,
                    steps=args.distill_steps,
                    dagger_rounds=args.dagger_rounds,
                )
                result.export_onnx(args.out)
                net, name = result.student, "student"
            m = result.metrics
            tqdm.write(
                f"distilled: return {m['student_return']:.2f} vs teacher {m['teacher_return']:.2f} "
                f"(ratio {m['return_ratio']:.3f}), held-out action MSE {m['action_mse']:.3g}"
            )
        with stage("measure the latency"):
            if args.distill is not None:
                _print_net("teacher", teacher, None, obs)
            _print_net(name, net, args.out, obs)
        if args.c_header is not None:
            with stage("write the C header"):
                export_c_header(net, args.c_header)
                size = args.c_header.stat().st_size
            tqdm.write(f"wrote {args.c_header}: {weight_bytes(net)} bytes of constants, {size} bytes of text")
    return args.out


@contextmanager
def _stages(total: int, disable: bool) -> Iterator[Callable[[str], AbstractContextManager[None]]]:
    """A tqdm bar of ``total`` stages: ``with stage(name): ...`` names the stage running, then counts it."""
    with tqdm(total=total, desc="export", unit="stage", disable=disable) as bar:

        @contextmanager
        def stage(name: str) -> Iterator[None]:
            bar.set_postfix_str(name)
            yield
            bar.update()

        yield stage


def _print_net(name: str, net: PolicyNet, path: Path | None, obs: np.ndarray) -> None:
    """One line per net: parameters, bytes of constants, parity (if written) and onnxruntime batch-1 latency."""
    line = f"{name}: {net.num_params()} parameters, {weight_bytes(net)} bytes of constants"
    if path is not None:
        meta = onnx_metadata(path)
        diff, n = float(meta["parity_max_abs_diff"]), meta["parity_observations"]
        line += f"; wrote {path}, parity max |diff| {diff:.3g} on {n} env observations"
    p50, p99 = onnx_latency_us(onnx_bytes(net), obs)
    tqdm.write(f"{line}; onnxruntime batch-1 latency p50 {p50:.1f} µs, p99 {p99:.1f} µs")


def _widths(text: str) -> tuple[int, ...]:
    try:
        widths = tuple(int(w) for w in text.split(","))
    except ValueError:
        widths = ()
    if not widths or min(widths) < 1:
        raise argparse.ArgumentTypeError(f"--distill takes hidden widths like 64,64; got {text!r}")
    return widths


if __name__ == "__main__":
    main()
