"""``unilab-gym play``: load a saved SB3 model and write a video of env 0 of UniLab/Quadruped-v0.

    unilab-gym play runs/sac_sb3/model.zip                      # -> runs/sac_sb3/model.mp4
    unilab-gym play runs/ppo_sb3/model.zip --out ppo.gif --steps 250

``python examples/play.py ...`` runs the same command. A tqdm progress bar on stderr counts the
recorded steps (rendering a frame takes most of the time, 0.05 to 0.1 s a step on 2 cores: 500
steps take half a minute to a minute); ``--no-progress`` turns it off.

The algorithm is read from the saved file. ``VecNormalize`` statistics are loaded only when asked:
``--vecnormalize PATH``, or ``--sibling-vecnormalize`` for ``<model>_vecnormalize.pkl`` next to the
model (written by ``train_ppo_sb3.py``; the path is printed). Both the model and the statistics are
code (pickles): load only files you trust. Frames come from the env's ``render_mode="rgb_array"``
(240x320); ``.mp4`` needs ``imageio-ffmpeg``, ``.gif`` only Pillow.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from stable_baselines3 import A2C, DDPG, PPO, SAC, TD3
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.save_util import load_from_zip_file
from stable_baselines3.common.vec_env import VecNormalize
from tqdm.auto import tqdm

from unilab_gym.cli import HelpFormatter
from unilab_gym.cli._video import write_video
from unilab_gym.integrations.sb3 import make_sb3_env

ALGOS = {cls.__name__.lower(): cls for cls in (SAC, PPO, TD3, DDPG, A2C)}


def algo_of(path: Path) -> type[BaseAlgorithm]:
    """The SB3 algorithm class that saved ``path``, from the hyperparameters it stored.

    Raises:
        ValueError: the file holds none of the hyperparameters that tell SAC, PPO, TD3 and A2C apart.
    """
    data, _, _ = load_from_zip_file(path, load_data=True, device="cpu")
    if data is None:
        raise ValueError(f"{path} holds no SB3 model data")
    for key, cls in (("target_entropy", SAC), ("clip_range", PPO), ("policy_delay", TD3), ("normalize_advantage", A2C)):
        if key in data:
            return cls
    raise ValueError(f"{path} was not saved by one of {sorted(ALGOS)}")


def sibling_vecnormalize(model: Path) -> Path:
    """``<model stem>_vecnormalize.pkl`` next to ``model``: where the training examples save the statistics."""
    return model.with_name(model.stem + "_vecnormalize.pkl")


def vecnormalize_to_load(model: Path, named: Path | None, sibling: bool) -> Path | None:
    """The ``VecNormalize`` statistics file to load with ``model``: only one the user asked for.

    A statistics file is a pickle, so loading it runs code. It is loaded only when named
    (``--vecnormalize PATH``) or asked for with ``--sibling-vecnormalize``, which prints the path
    it loads. A sibling file nobody asked for is mentioned on stderr and not loaded.

    Args:
        model: the model ``.zip``.
        named: the ``--vecnormalize`` path, or ``None``.
        sibling: ``--sibling-vecnormalize``: load :func:`sibling_vecnormalize` of ``model``.

    Returns:
        The path to load, or ``None`` (no normalization).

    Raises:
        ValueError: both ``named`` and ``sibling``, a named file that does not exist, or
            ``sibling`` without a sibling file.
    """
    found = sibling_vecnormalize(model)
    if named is not None and sibling:
        raise ValueError("give --vecnormalize PATH or --sibling-vecnormalize, not both")
    if named is not None:
        if not named.exists():
            raise ValueError(f"no VecNormalize statistics at {named}")
        return named
    if sibling:
        if not found.exists():
            raise ValueError(f"--sibling-vecnormalize: no {found.name} next to {model}")
        print(f"loading VecNormalize statistics {found} (a pickle: it runs code when loaded)", file=sys.stderr)
        return found
    if found.exists():
        print(
            f"note: {found} is not loaded (a pickle runs code when loaded); if you trust it, pass "
            f"--vecnormalize {found} or --sibling-vecnormalize",
            file=sys.stderr,
        )
    return None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options of ``unilab-gym play`` (``argv`` defaults to ``sys.argv[1:]``)."""
    parser = argparse.ArgumentParser(
        prog="unilab-gym play",
        description="Load a saved SB3 model and write a video of env 0.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("model", type=Path, help="a model .zip saved by SB3")
    parser.add_argument("--out", type=Path, default=None, help="video file, .mp4 or .gif (default: next to the model)")
    parser.add_argument("--steps", type=int, default=500, help="control steps to record (50 per second)")
    parser.add_argument("--algo", choices=sorted(ALGOS), default=None, help="default: read from the file")
    parser.add_argument("--seed", type=int, default=0, help="seed of the env (its commands and initial pose)")
    parser.add_argument("--stochastic", action="store_true", help="sample actions instead of the deterministic ones")
    parser.add_argument(
        "--vecnormalize",
        type=Path,
        default=None,
        help="VecNormalize statistics (.pkl) to apply, frozen; a pickle runs code: name only a file you trust",
    )
    parser.add_argument(
        "--sibling-vecnormalize",
        action="store_true",
        help="load <model stem>_vecnormalize.pkl next to the model (prints the path it loads)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> Path:
    """Run ``unilab-gym play`` (see the module docstring) and return the path of the video written.

    Raises:
        SystemExit: no model at the given path, ``--steps`` < 1, ``--out`` is neither ``.mp4`` nor ``.gif``,
            or bad ``VecNormalize`` options (see :func:`vecnormalize_to_load`).
    """
    args = parse_args(argv)
    if not args.model.exists():
        raise SystemExit(f"no model at {args.model}")
    if args.steps < 1:
        raise SystemExit(f"--steps must be a positive int, got {args.steps}")
    out = args.out or args.model.with_suffix(".mp4")
    if out.suffix not in (".mp4", ".gif"):
        raise SystemExit(f"--out must end in .mp4 or .gif, got {out}")
    try:
        stats = vecnormalize_to_load(args.model, args.vecnormalize, args.sibling_vecnormalize)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    algo = ALGOS[args.algo] if args.algo else algo_of(args.model)
    model = algo.load(args.model, device="cpu")
    env = make_sb3_env("UniLab/Quadruped-v0", 1, seed=args.seed, render_mode="rgb_array")
    if stats is not None:
        env = VecNormalize.load(str(stats), env)
        env.training, env.norm_reward = False, False
    fps = env.unwrapped.metadata["render_fps"]
    obs = env.reset()
    frames, total, episodes = [env.render()], 0.0, 0
    with tqdm(total=args.steps, desc="play", unit="step", disable=args.no_progress) as bar:
        for _ in range(args.steps):
            action, _ = model.predict(obs, deterministic=not args.stochastic)
            obs, reward, done, _ = env.step(action)
            total += float(env.get_original_reward()[0]) if isinstance(env, VecNormalize) else float(reward[0])
            episodes += int(done[0])
            frames.append(env.render())
            bar.update()
        bar.set_postfix_str(f"writing {out.name}")  # a GIF of 500 frames takes ~10 s
        write_video(out, frames, fps)
    print(f"wrote {out}: {len(frames)} frames, return {total:.2f} over {args.steps} steps ({episodes} episode ends)")
    env.close()
    return out


if __name__ == "__main__":
    main()
