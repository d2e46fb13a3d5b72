"""``unilab-gym play``: load a saved SB3 model and write a video of env 0 of any UniLab task.

    unilab-gym play runs/sac_sb3/model.zip                      # -> runs/sac_sb3/model.mp4
    unilab-gym play runs/ppo_sb3/model.zip --out ppo.gif --steps 250
    unilab-gym play models/PandaReach-v0_panda.zip --env-id UniLab/PandaReach-v0 --out reach.gif
    unilab-gym play --random --env-id UniLab/Quadrotor-v0 --out rotor.gif   # no model: uniform random actions

``python examples/play.py ...`` runs the same command. A tqdm progress bar on stderr counts the
recorded steps (rendering a frame takes most of the time, 0.05 to 0.1 s a step on 2 cores: 500
steps take half a minute to a minute); ``--no-progress`` turns it off.

The env is ``--env-id`` (default ``UniLab/Quadruped-v0``) with ``--robot``, ``--max-episode-steps`` and
``--env-kwargs`` (JSON) given to it; a model whose observation or action space is not the env's is refused
(naming both). ``--steps`` defaults to one episode of the env (its ``max_episode_steps``). Frames are the task's
camera (:attr:`unilab_gym.tasks.base.Task.camera`) at ``--width`` x ``--height``; ``--every K`` keeps every K-th
frame (the video then plays at ``render_fps / K`` frames per second, in real time), for small GIFs.

The algorithm is read from the saved file. ``VecNormalize`` statistics are loaded only when asked:
``--vecnormalize PATH``, or ``--sibling-vecnormalize`` for ``<model>_vecnormalize.pkl`` next to the
model (written by ``train_ppo_sb3.py`` and ``benchmarks/learning_check.py --save-model``; the path is printed). Both
the model and the statistics are code (pickles): load only files you trust. ``.mp4`` needs ``imageio-ffmpeg``,
``.gif`` only Pillow.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
from tqdm.auto import tqdm

from unilab_gym.cli import HelpFormatter
from unilab_gym.cli._video import write_video
from unilab_gym.sb3.algorithms import ALGORITHMS
from unilab_gym.sb3.models import algorithm_of, load_model, load_vec_normalize, original_rewards
from unilab_gym.sb3.vec_env import make_sb3_env

if TYPE_CHECKING:
    from stable_baselines3.common.base_class import BaseAlgorithm

#: the algorithms ``--algo`` accepts (the one table, :data:`unilab_gym.sb3.algorithms.ALGORITHMS`).
ALGOS = ALGORITHMS


def algo_of(path: Path) -> type[BaseAlgorithm]:
    """The SB3 algorithm class that saved ``path``, from the hyperparameters it stored.

    See :func:`unilab_gym.sb3.models.algorithm_of`, which reads it.

    Raises:
        ValueError: the file holds none of the hyperparameters that tell SAC, PPO, TD3 and A2C apart.
    """
    return algorithm_of(path)


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
        description="Load a saved SB3 model (or play random actions) and write a video of env 0.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("model", type=Path, nargs="?", default=None, help="a model .zip saved by SB3")
    parser.add_argument("--random", action="store_true", help="no model: uniform random actions in [-1, 1]")
    parser.add_argument("--out", type=Path, default=None, help="video file, .mp4 or .gif (default: next to the model)")
    parser.add_argument("--env-id", default="UniLab/Quadruped-v0", help="the task (a registered UniLab id)")
    parser.add_argument("--robot", default=None, help="the task's robot (e.g. aliengo); default: the task's")
    parser.add_argument("--max-episode-steps", type=int, default=None, help="episode length; default: the task's")
    parser.add_argument("--env-kwargs", default=None, help="other task arguments as a JSON object, e.g. '{\"kp\": 30}'")
    parser.add_argument("--steps", type=int, default=None, help="control steps to record; default: one episode")
    parser.add_argument("--every", type=int, default=1, help="keep every K-th frame (smaller GIFs)")
    parser.add_argument("--width", type=int, default=320, help="frame width in pixels")
    parser.add_argument("--height", type=int, default=240, help="frame height in pixels")
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


def env_kwargs_of(args: argparse.Namespace) -> dict[str, Any]:
    """The env arguments of ``args``: ``--env-kwargs`` (a JSON object), then ``--robot`` and ``--max-episode-steps``.

    Raises:
        SystemExit: ``--env-kwargs`` is not a JSON object, or ``--max-episode-steps`` < 1.
    """
    kwargs: dict[str, Any] = {}
    if args.env_kwargs is not None:
        try:
            kwargs = json.loads(args.env_kwargs)
        except json.JSONDecodeError as exc:
            raise SystemExit(f"--env-kwargs must be a JSON object, got {args.env_kwargs!r} ({exc})") from None
        if not isinstance(kwargs, dict):
            raise SystemExit(f"--env-kwargs must be a JSON object, got {args.env_kwargs!r}")
    if args.robot is not None:
        kwargs["robot"] = args.robot
    if args.max_episode_steps is not None:
        if args.max_episode_steps < 1:
            raise SystemExit(f"--max-episode-steps must be a positive int, got {args.max_episode_steps}")
        kwargs["max_episode_steps"] = args.max_episode_steps
    return kwargs


def check_spaces(model: BaseAlgorithm, env: Any, env_id: str) -> None:
    """Refuse a model trained on other spaces than ``env``'s (another task, robot or ``privileged_obs``).

    Raises:
        SystemExit: naming the model's and the env's observation and action spaces, and ``--env-id``.
    """
    if model.observation_space != env.observation_space or model.action_space != env.action_space:
        raise SystemExit(
            f"the model's spaces (observation {model.observation_space}, action {model.action_space}) are not "
            f"{env_id}'s (observation {env.observation_space}, action {env.action_space}): pass the --env-id "
            "(and --robot, --env-kwargs) it was trained on"
        )


def main(argv: list[str] | None = None) -> Path:
    """Run ``unilab-gym play`` (see the module docstring) and return the path of the video written.

    Raises:
        SystemExit: no model at the given path (or both a model and ``--random``, or neither), ``--steps``,
            ``--every``, ``--width`` or ``--height`` < 1, ``--out`` is neither ``.mp4`` nor ``.gif`` (or missing
            with ``--random``), an ``--env-id`` that is not registered, bad env arguments, a model whose spaces
            are not the env's (:func:`check_spaces`), or bad ``VecNormalize`` options (see
            :func:`vecnormalize_to_load`).
    """
    args = parse_args(argv)
    if args.random == (args.model is not None):
        raise SystemExit("give a model .zip or --random, not both" if args.random else "give a model .zip or --random")
    if args.model is not None and not args.model.exists():
        raise SystemExit(f"no model at {args.model}")
    for name in ("steps", "every", "width", "height"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise SystemExit(f"--{name} must be a positive int, got {value}")
    if args.out is None and args.random:
        raise SystemExit("--random needs --out (a .mp4 or .gif path)")
    out = args.out or args.model.with_suffix(".mp4")
    if out.suffix not in (".mp4", ".gif"):
        raise SystemExit(f"--out must end in .mp4 or .gif, got {out}")
    if args.env_id not in gym.registry:
        raise SystemExit(f"--env-id {args.env_id!r} is not registered (UniLab ids: {unilab_ids()})")
    env_kwargs = env_kwargs_of(args)
    stats = None
    if args.model is not None:
        try:
            stats = vecnormalize_to_load(args.model, args.vecnormalize, args.sibling_vecnormalize)
        except ValueError as exc:
            raise SystemExit(str(exc)) from None
    try:
        env = make_sb3_env(args.env_id, 1, seed=args.seed, render_mode="rgb_array", **env_kwargs)
    except (TypeError, ValueError) as exc:
        raise SystemExit(f"{args.env_id} with {env_kwargs}: {exc}") from None
    venv: Any = env.unwrapped.venv  # type: ignore[attr-defined]  # the UniLabVectorEnv (render_env takes a size)
    model: BaseAlgorithm | None = None
    try:
        if args.model is not None:
            model = load_model(args.model, args.algo)
            check_spaces(model, env, args.env_id)
        if stats is not None:
            env = load_vec_normalize(stats, env)
        steps = args.steps or venv.max_episode_steps
        record(env, venv, model, out, steps, args)
    finally:
        env.close()
    return out


def record(env: Any, venv: Any, model: BaseAlgorithm | None, out: Path, steps: int, args: argparse.Namespace) -> None:
    """Step ``env`` ``steps`` times with ``model``'s actions, write every ``args.every``-th frame to ``out``.

    ``env`` is an SB3 ``VecEnv`` of one env over ``venv``; ``model=None`` takes random actions. Prints the return.
    """
    fps = venv.metadata["render_fps"] / args.every
    rng = np.random.default_rng(args.seed)
    obs = env.reset()

    def frame() -> np.ndarray:
        return venv.render_env(0, args.width, args.height)

    frames, total, episodes = [frame()], 0.0, 0
    with tqdm(total=steps, desc="play", unit="step", disable=args.no_progress) as bar:
        for step in range(steps):
            if model is None:
                action = rng.uniform(-1.0, 1.0, env.action_space.shape).astype(np.float32)[None]
            else:
                action, _ = model.predict(obs, deterministic=not args.stochastic)
            obs, reward, done, _ = env.step(action)
            total += float(original_rewards(env, reward)[0])
            episodes += int(done[0])
            if (step + 1) % args.every == 0:
                frames.append(frame())
            bar.update()
        bar.set_postfix_str(f"writing {out.name}")  # a GIF of 500 frames takes ~10 s
        write_video(out, frames, fps)
    policy = "random actions" if model is None else "the model"
    print(
        f"wrote {out}: {len(frames)} frames at {fps:g} fps, {policy}, return {total:.2f} over {steps} steps "
        f"({episodes} episode ends)"
    )


def unilab_ids() -> list[str]:
    """The registered ``UniLab/`` ids."""
    return sorted(name for name in gym.registry if name.startswith("UniLab/"))


if __name__ == "__main__":
    main()
