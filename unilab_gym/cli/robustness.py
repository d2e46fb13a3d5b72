r"""Robustness report: evaluate a saved Stable-Baselines3 policy over a grid of physics perturbations.

    unilab-gym robustness --model runs/ppo_dr/model.zip --algo ppo --episodes 1000 \
        --grid friction=0.3:1.2:4,mass=-1:3:4 --out robustness/
    unilab-gym robustness --replay robustness/results.json --model runs/ppo_dr/model.zip --video fail.mp4

Each grid axis is ``name=low:high:n`` (``n`` evenly spaced values, ``numpy.linspace``) over a
parameter of :data:`unilab_gym.randomization.PARAMETERS` (``mass`` is short for ``added_mass``);
every combination of axis values is a *cell*, and parameters off the grid stay nominal. The
episodes (``--episodes`` in total, split evenly over the cells, rounded up) run batched on
:class:`~unilab_gym.vector_env.UniLabVectorEnv` (at most ``--num-envs`` robots at a time), one
episode per robot, with ``model.predict(obs, deterministic=True)``. Every cell sees the same
episode seeds (so the same commands and initial poses: common random numbers).

*Success* is an episode that reaches the time limit (``--max-episode-steps`` control steps)
without a fall; the fall rate is one minus the success rate, broken down by the conditions that
held at the fall (height, tilt, trunk contact; they can co-occur).

Every episode also gets :func:`unilab_gym.evaluation.evaluate_gait`'s per-episode gait figures
(tracking error, duty factor, base height, tilt; :class:`~unilab_gym.evaluation.GaitMeter`).

Writes to ``--out``: ``report.md`` (cells worst first: success rate, fall rate, mean return, gait),
``heatmap.png`` (success rate over the first two axes, averaged over any further ones) and
``results.json`` (the raw data: every episode's record, as in :mod:`unilab_gym.trace`, plus its cell).

``--replay results.json[:INDEX] --model X.zip`` re-runs one episode (by default the first failure
of the worst cell) with the policy the user names and checks it against its record; ``--video``
records it. To get the very same actions, the policy is run on a batch of the original shape with
the episode's observation at its original row (matrix products round differently for other batch
shapes), with torch on one thread (``--threads``, the same as the evaluation's).

SB3 ``.zip`` models and ``VecNormalize`` ``.pkl`` statistics are code (pickles): loading one runs
whatever it holds. This tool loads only the files named on its command line: a ``results.json``
records which model and statistics were used, but they are never loaded from it, and
``<model stem>_vecnormalize.pkl`` next to ``--model`` is loaded only with ``--vecnormalize PATH`` or
``--sibling-vecnormalize`` (which prints what it loads).

This module imports torch, Stable-Baselines3 and matplotlib only when its functions run.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from unilab_gym.cli import HelpFormatter
from unilab_gym.cli._video import write_video
from unilab_gym.randomization import PARAMETERS, DomainRandomization
from unilab_gym.trace import FALL_CONDITIONS, package_versions
from unilab_gym.validation import check_positive_int

RESULTS_FORMAT = "unilab-gym/robustness"
RESULTS_FORMAT_VERSION = 1

#: Per-episode gait figures of :func:`unilab_gym.evaluation.evaluate_gait` in every record and cell.
GAIT_KEYS = ("tracking_error_mps", "duty_factor", "base_height_m", "tilt_rad")

#: Short axis names accepted by ``--grid``.
AXIS_ALIASES = {"mass": "added_mass"}

#: The env ``--env-id`` evaluates by default.
DEFAULT_ENV_ID = "UniLab/Quadruped-v0"

#: ``(n, 48) float32 observations -> (n, 12) actions``
Policy = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Axis:
    """One grid axis: a parameter name and its values.

    ``field`` is ``None`` for a physics parameter (:data:`~unilab_gym.randomization.PARAMETERS`, set through
    ``domain_randomization``), or the task configuration field a task axis sets to ``(value, value)`` (e.g.
    ``object_size`` sets ``object_size_range``; :func:`task_axes`).
    """

    name: str
    values: tuple[float, ...]
    field: str | None = None


def task_axes(env_id: str = DEFAULT_ENV_ID) -> dict[str, str]:
    """The task axes of ``env_id``: axis name -> task configuration field.

    One per ``<name>_range`` field that is a (low, high) pair of numbers (``UniLab/PandaPick-v0``: ``object_size``,
    ``object_mass``, ``object_friction``, ``object_x`` ...; ``UniLab/Quadruped-v0``: the command ranges
    ``lin_vel_x`` ...). A cell's value ``v`` of an axis sets the field to ``(v, v)``: every episode of the cell
    draws exactly ``v``.

    Raises:
        ValueError: ``env_id`` is not a registered UniLab id (:func:`~unilab_gym.registration.vector_env_type`).
    """
    from unilab_gym.registration import vector_env_type

    config_type = vector_env_type(env_id).task_type.config_type()
    defaults = config_type()
    out = {}
    for f in dataclasses.fields(config_type):
        value = getattr(defaults, f.name)
        pair = isinstance(value, tuple) and len(value) == 2
        if f.name.endswith("_range") and pair and all(isinstance(v, (int, float)) for v in value):
            out[f.name.removesuffix("_range")] = f.name
    return out


def _check_task_value(env_id: str, field: str, value: float) -> None:
    """The task configuration's own validation of ``field = (value, value)``, with its message."""
    from unilab_gym.registration import vector_env_type

    vector_env_type(env_id).task_type.config_type()(**{field: (value, value)})


def parse_grid(text: str, env_id: str = DEFAULT_ENV_ID) -> list[Axis]:
    """Parse ``"name=low:high:n,name=low:high:n,..."`` into axes.

    Args:
        text: the axes, comma-separated; each ``name=low:high:n`` gives ``n`` evenly spaced values
            (``numpy.linspace``). ``name`` is a physics parameter (:data:`~unilab_gym.randomization.PARAMETERS`,
            or an alias of :data:`AXIS_ALIASES`) or a task axis of ``env_id`` (:func:`task_axes`).
        env_id: the registered id whose task axes are valid.

    Raises:
        ValueError: a malformed axis, an unknown name (the message lists the valid ones for ``env_id``), a
            repeated name, ``n < 1``, ``low > high``, or values a parameter or the task does not accept.
    """
    task = task_axes(env_id)
    valid = sorted([*PARAMETERS, *AXIS_ALIASES, *task])
    axes: list[Axis] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, spec = part.partition("=")
        name = name.strip()
        fields = spec.split(":")
        if not sep or len(fields) != 3:
            raise ValueError(f"grid axis {part!r} must look like name=low:high:n, e.g. friction=0.3:1.2:4")
        if name not in PARAMETERS and name not in AXIS_ALIASES and name not in task:
            raise ValueError(f"unknown grid axis {name!r}; valid names: {valid} (for {env_id})")
        name = AXIS_ALIASES.get(name, name)
        if any(a.name == name for a in axes):
            raise ValueError(f"grid axis {name!r} given twice")
        try:
            lo, hi, n = float(fields[0]), float(fields[1]), int(fields[2])
        except ValueError:
            raise ValueError(f"grid axis {part!r}: low and high must be numbers and n an integer") from None
        if n < 1 or lo > hi or (n == 1 and lo != hi):
            raise ValueError(f"grid axis {part!r}: need low <= high and n >= 1 (n = 1 needs low == high)")
        values = tuple(float(v) for v in np.linspace(lo, hi, n))
        field = task.get(name) if name not in PARAMETERS else None
        for v in values:  # the env's own validation, with its message
            if field is None:
                DomainRandomization({name: v})
            else:
                _check_task_value(env_id, field, v)
        axes.append(Axis(name, values, field))
    if not axes:
        raise ValueError("the grid needs at least one axis, e.g. friction=0.3:1.2:4")
    return axes


def grid_cells(axes: Sequence[Axis]) -> list[dict[str, float]]:
    """Every combination of axis values, as ``{name: value}``, the last axis varying fastest."""
    return [dict(zip((a.name for a in axes), combo)) for combo in itertools.product(*(a.values for a in axes))]


def _cell_kwargs(axes: Sequence[Axis], cell: dict[str, float]) -> tuple[dict[str, float], dict[str, Any]]:
    """A cell as ``(domain_randomization, task keyword arguments)``: physics values, and ``field=(v, v)``."""
    fields = {a.name: a.field for a in axes}
    physics = {k: v for k, v in cell.items() if fields.get(k) is None}
    task = {str(fields[k]): (v, v) for k, v in cell.items() if fields.get(k) is not None}
    return physics, task


def _is_quadruped(env_id: str) -> bool:
    """Whether ``env_id``'s task is a quadruped's (it gets the gait figures)."""
    from unilab_gym.registration import vector_env_type
    from unilab_gym.tasks.quadruped import QuadrupedTask

    return issubclass(vector_env_type(env_id).task_type, QuadrupedTask)


def evaluate(
    policy: Policy,
    axes: Sequence[Axis],
    episodes: int,
    *,
    env_id: str = DEFAULT_ENV_ID,
    env_kwargs: dict[str, Any] | None = None,
    num_envs: int = 64,
    seed: int = 0,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Run ``episodes`` episodes (rounded up to a multiple of the number of cells) over the grid.

    Args:
        policy: maps (n, obs_dim) float32 observations to (n, act_dim) actions (Quadruped-v0: 48 and 12).
        axes: the grid (see :func:`parse_grid`, with the same ``env_id``).
        episodes: total number of episodes, split evenly over the cells (rounded up).
        env_id: the registered UniLab id to evaluate on (its vector env class).
        env_kwargs: task arguments of the env (``max_episode_steps`` ...); not ``domain_randomization``, which
            the grid sets, nor a task field of a task axis.
        num_envs: most robots stepped at once.
        seed: episode ``j`` of every cell runs in an env seeded ``seed + j``.
        progress: show a tqdm progress bar of finished episodes.

    Returns:
        One trace record per episode (see :mod:`unilab_gym.trace`) with ``"cell"`` (the cell's
        axis values) and ``"num_envs"`` (the batch it ran in; ``"env"`` is its row). A task that reports
        ``info["is_success"]`` adds ``"is_success"`` (bool, at the episode's last step: Gymnasium-Robotics'
        convention); a quadruped adds the episode's gait figures of :func:`unilab_gym.evaluation.evaluate_gait`:
        ``"tracking_error_mps"``, ``"duty_factor"``, ``"base_height_m"``, ``"tilt_rad"``
        (:meth:`~unilab_gym.evaluation.GaitRecord.episode_figures`).

    Raises:
        ValueError: ``env_kwargs`` sets ``domain_randomization`` or a field a task axis sets.
    """
    from tqdm.auto import tqdm

    from unilab_gym.evaluation import GaitMeter
    from unilab_gym.registration import vector_env_type

    env_type = vector_env_type(env_id)
    quadruped = _is_quadruped(env_id)
    env_kwargs = dict(env_kwargs or {})
    if "domain_randomization" in env_kwargs:
        raise ValueError("env_kwargs must not set domain_randomization: the grid sets the parameters")
    clash = sorted(a.field for a in axes if a.field is not None and a.field in env_kwargs)
    if clash:
        raise ValueError(f"env_kwargs must not set {clash}: the grid's task axes set them")
    cells = grid_cells(axes)
    per_cell = math.ceil(episodes / len(cells))
    records: list[dict[str, Any]] = []
    with tqdm(total=per_cell * len(cells), desc="robustness", unit="episode", disable=not progress) as bar:
        for cell in cells:
            physics, task_kwargs = _cell_kwargs(axes, cell)
            for start in range(0, per_cell, num_envs):
                n = min(num_envs, per_cell - start)
                env = env_type(n, autoreset_mode="Disabled", domain_randomization=physics, **task_kwargs, **env_kwargs)
                try:
                    obs, info = env.reset(seed=seed + start)
                    has_success = "is_success" in env.task.step_info()
                    gait = GaitMeter(info["parameters"]["added_mass"]) if quadruped else None
                    active, success = np.ones(n, dtype=bool), np.zeros(n, dtype=bool)
                    while active.any():
                        # the finished envs idle, left out of the step (the run ends when all have finished)
                        obs, reward, terminated, truncated, info = env.step(policy(obs), active=active.copy())
                        ended = (terminated | truncated) & active
                        if has_success:  # Gymnasium-Robotics: the success of the episode's last step
                            success[ended] = np.asarray(info["is_success"])[ended]
                        if gait is not None:
                            gait.update(obs, reward, terminated, truncated, env.robot_state)
                        active &= ~ended
                        bar.update(int(ended.sum()))
                    figures = gait.record() if gait is not None else None
                    for record in env.parameter_trace():  # the first episode of each env
                        extra: dict[str, Any] = {}
                        if figures is not None:
                            extra.update(figures.episode_figures(record["env"]))
                        if has_success:
                            extra["is_success"] = bool(success[record["env"]])
                        records.append({**record, **extra, "cell": dict(cell), "num_envs": n})
                finally:
                    env.close()
    return records


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (Wilson 1927), 95 % for z = 1.96."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def summarize(
    records: Sequence[dict[str, Any]],
    axes: Sequence[Axis],
    condition_names: Sequence[str] = FALL_CONDITIONS,
    train_ranges: dict[str, tuple[float, float]] | None = None,
) -> list[dict[str, Any]]:
    """Per-cell statistics, worst cells first (lowest success rate, then lowest mean return).

    Each: ``cell``, ``episodes``, ``success_rate``, ``success_ci95`` (Wilson interval),
    ``fall_rate`` (the fraction terminated: a fall of a quadruped, e.g. ``object_lost`` for a Pick),
    ``fall_conditions`` (fraction of the cell's episodes that terminated with each of ``condition_names``
    holding: the task's ``termination_names``), ``mean_return``, ``std_return``,
    ``mean_length`` (control steps), and the means over the cell's episodes of the gait figures
    ``tracking_error_mps`` (m/s), ``duty_factor``, ``base_height_m`` (m) and ``tilt_rad`` (rad)
    (``None`` for records without them: a task that is not a quadruped, or a results file of an older version);
    with ``train_ranges`` (axis name -> the (low, high) the policy was trained on), ``held_out``: some axis value
    of the cell is outside its training range.

    Success is ``is_success`` where every record has it (a task that reports ``info["is_success"]``), else an
    episode that reaches the time limit without terminating.
    """
    out = []
    for cell in grid_cells(axes):
        rs = [r for r in records if r["cell"] == cell]
        if not rs:
            continue
        falls = [r for r in rs if r["termination"] == "fall"]
        if all("is_success" in r for r in rs):
            successes = sum(bool(r["is_success"]) for r in rs)
        else:
            successes = len(rs) - len(falls)
        returns = np.array([r["return"] for r in rs])
        held_out = {}
        if train_ranges:
            held_out["held_out"] = any(
                not lo <= cell[name] <= hi for name, (lo, hi) in train_ranges.items() if name in cell
            )
        out.append(
            {
                "cell": cell,
                "episodes": len(rs),
                "success_rate": successes / len(rs),
                "success_ci95": wilson_interval(successes, len(rs)),
                **held_out,
                "fall_rate": len(falls) / len(rs),
                "fall_conditions": {
                    c: sum(c in r["fall_conditions"] for r in falls) / len(rs) for c in condition_names
                },
                "mean_return": float(returns.mean()),
                "std_return": float(returns.std()),
                "mean_length": float(np.mean([r["length"] for r in rs])),
                **{
                    key: float(np.mean([r[key] for r in rs])) if all(key in r for r in rs) else None
                    for key in GAIT_KEYS
                },
            }
        )
    return sorted(out, key=lambda s: (s["success_rate"], s["mean_return"]))


#: Units of the task axes the report labels (a task axis without one is labelled by its name alone).
TASK_AXIS_UNITS = {"object_size": "m", "object_mass": "kg", "goal_height": "m", "object_x": "m", "object_y": "m"}


def _axis_label(name: str) -> str:
    unit = PARAMETERS[name].unit if name in PARAMETERS else TASK_AXIS_UNITS.get(name, "")
    return f"{name} ({unit})" if unit not in ("", "×") else name


def write_heatmap(path: Path, summary: Sequence[dict[str, Any]], axes: Sequence[Axis]) -> Path:
    """Success rate over the first two axes (x: first, y: second), averaged over any further ones."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x_axis = axes[0]
    y_axis = axes[1] if len(axes) > 1 else None
    grid = np.zeros((len(y_axis.values) if y_axis else 1, len(x_axis.values)))
    counts = np.zeros_like(grid)
    for s in summary:
        col = x_axis.values.index(s["cell"][x_axis.name])
        row = y_axis.values.index(s["cell"][y_axis.name]) if y_axis else 0
        grid[row, col] += s["success_rate"]
        counts[row, col] += 1
    grid /= np.maximum(counts, 1)
    fig, ax = plt.subplots(figsize=(1.3 * len(x_axis.values) + 2.5, 1.0 * grid.shape[0] + 2.0))
    image = ax.imshow(grid, origin="lower", cmap="RdYlGn", vmin=0.0, vmax=1.0, aspect="auto")
    for (row, col), value in np.ndenumerate(grid):
        ax.text(col, row, f"{value:.0%}", ha="center", va="center", color="black", fontsize=9)
    ax.set_xticks(range(len(x_axis.values)), [f"{v:.3g}" for v in x_axis.values])
    ax.set_xlabel(_axis_label(x_axis.name))
    if y_axis:
        ax.set_yticks(range(len(y_axis.values)), [f"{v:.3g}" for v in y_axis.values])
        ax.set_ylabel(_axis_label(y_axis.name))
    else:
        ax.set_yticks([])
    counts_per_cell = sorted({s["episodes"] for s in summary})
    span = f"{counts_per_cell[0]}" if len(counts_per_cell) == 1 else f"{counts_per_cell[0]}-{counts_per_cell[-1]}"
    title = f"success rate ({span} episodes per cell)"
    if len(axes) > 2:
        title += f" (mean over {', '.join(a.name for a in axes[2:])})"
    ax.set_title(title)
    fig.colorbar(image, ax=ax, format=matplotlib.ticker.PercentFormatter(1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_report(out: Path, results: dict[str, Any]) -> Path:
    """``report.md``: settings, the per-cell table (worst first), the heat map and how to replay a failure."""
    axes = [Axis(name, tuple(values)) for name, values in results["grid"].items()]
    summary = results["cells"]
    episodes = results["episodes"]
    steps = results["env"]["max_episode_steps"]
    seconds = steps * results["env"]["dt"] * results["env"]["substeps"]
    names = list(results.get("condition_names", FALL_CONDITIONS))
    gait = any(s.get(key) is not None for s in summary for key in GAIT_KEYS)
    held = any("held_out" in s for s in summary)
    succeeded = sum(s["success_rate"] * s["episodes"] for s in summary)
    if results.get("success_rule") == "is_success":
        success = (
            f"- Success: `info[\"is_success\"]` at the episode's last step (Gymnasium-Robotics' convention); "
            f"episodes of at most {steps} control steps ({seconds:g} s). The termination columns give the share "
            f"of episodes that terminated ({', '.join(names)}). The 95 % interval of the success rate is Wilson's."
        )
    elif "termination" in results["env"] and "min_base_height" in results["env"]["termination"]:
        term = results["env"]["termination"]
        success = (
            f"- Success: the episode reaches the time limit ({steps} control steps, {seconds:g} s) without a fall "
            f"(base height < {term['min_base_height']} m, |roll| or |pitch| > {term['max_tilt']} rad"
            + (", or the trunk touching the ground" if term["trunk_contact"] else "")
            + "). Fall rate = 1 − success rate; its columns give the share of episodes that fell with each "
            "condition holding. The 95 % interval of the success rate is Wilson's."
        )
    else:
        success = (
            f"- Success: the episode reaches the time limit ({steps} control steps, {seconds:g} s) without "
            f"terminating ({', '.join(names)}). The 95 % interval of the success rate is Wilson's."
        )
    task_axes_line = []
    fields = results.get("task_axes", {})
    if fields:
        task_axes_line = [
            "- Task axes set the task configuration's range to the cell's value: "
            + ", ".join(f"`{name}` sets `{field}` = (v, v)" for name, field in fields.items())
            + "; the rest of the task configuration is the env's default (`results.json`'s `env`)."
        ]
    if results.get("train_ranges"):
        task_axes_line.append(
            "- Trained on: "
            + ", ".join(f"{name} {lo:g}-{hi:g}" for name, (lo, hi) in results["train_ranges"].items())
            + "; a cell with a value outside is *held out*."
        )
    fall_word = "fall" if results.get("success_rule") != "is_success" and gait else "terminated"
    lines = [
        f"# Robustness report: `{Path(results['model']).name}` on `{results.get('env_id', DEFAULT_ENV_ID)}`",
        "",
        f"- Policy: `{results['model']}` ({results['algo'].upper()}, deterministic actions"
        + (f", observations normalized with `{Path(results['vecnormalize']).name}`" if results["vecnormalize"] else "")
        + ").",
        f"- {len(episodes)} episodes: {results['episodes_per_cell']} per cell over {len(summary)} cells; "
        f"episode `j` of every cell has env seed {results['seed']} + `j` "
        "(the same commands and initial poses in every cell).",
        success,
        "- Parameters off the grid are nominal: "
        + ", ".join(f"{name} {PARAMETERS[name].nominal:g}" for name in PARAMETERS if name not in results["grid"])
        + ".",
        *task_axes_line,
        f"- Overall success rate: {succeeded / len(episodes):.1%}.",
        "- Versions: " + ", ".join(f"{k} {v}" for k, v in results["packages"].items() if v) + ".",
        "",
        "| rank | "
        + " | ".join(_axis_label(a.name) for a in axes)
        + (" | held out" if held else "")
        + f" | episodes | success [95% CI] | {fall_word} | {fall_word}: "
        + " / ".join(n.replace("_", " ") for n in names)
        + " | mean return ± std | mean length (steps)"
        + (" | tracking error (m/s) | duty factor | base height (m) | tilt (rad)" if gait else "")
        + " |",
        "|---:|" + "---:|" * len(axes) + ("---|" if held else "") + "---:|" * (6 + (len(GAIT_KEYS) if gait else 0)),
    ]
    for rank, s in enumerate(summary, 1):
        fc = s["fall_conditions"]
        lines.append(
            f"| {rank} | "
            + " | ".join(f"{s['cell'][a.name]:.3g}" for a in axes)
            + ((" | yes" if s.get("held_out") else " | no") if held else "")
            + f" | {s['episodes']} | {s['success_rate']:.0%} [{s['success_ci95'][0]:.0%}, {s['success_ci95'][1]:.0%}]"
            f" | {s['fall_rate']:.0%} | "
            + " / ".join(f"{fc.get(n, 0.0):.0%}" for n in names)
            + f" | {s['mean_return']:.2f} ± {s['std_return']:.2f} | {s['mean_length']:.0f}"
            + ("".join(" | —" if s.get(key) is None else f" | {s[key]:.3f}" for key in GAIT_KEYS) if gait else "")
            + " |"
        )
    lines += ["", "![success rate heat map](heatmap.png)", ""]
    if results.get("train_ranges"):
        lines += ["![success on values held out of training](generalization.png)", ""]
    failure = first_failure(results)
    if failure is not None:
        r = episodes[failure]
        cell = ", ".join(f"{k}={v:.3g}" for k, v in r["cell"].items())
        if r["termination"] == "fall":
            how = f"{fall_word} after {r['length']} steps: {', '.join(r['fall_conditions'])}"
        else:
            how = f"not a success after {r['length']} steps"
        lines += [
            f"Replay the first failure of the worst cell ({cell}; episode seed {r['episode_seed']}, "
            f"{how}) and record it:",
            "",
            "```bash",
            f"unilab-gym robustness --replay {out / 'results.json'}:{failure} --model {results['model']}"
            + (f" --vecnormalize {results['vecnormalize']}" if results["vecnormalize"] else "")
            + " --video failure.mp4",
            "```",
            "",
        ]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path


def failed(record: dict[str, Any]) -> bool:
    """Whether an episode record is a failure.

    Not ``is_success`` where the record has it, else a fall (a termination).
    """
    return not record["is_success"] if "is_success" in record else record["termination"] == "fall"


def first_failure(results: dict[str, Any]) -> int | None:
    """Index in ``results["episodes"]`` of the first failure of the worst cell that has one, or ``None``.

    A failure as :func:`failed` says.
    """
    for s in results["cells"]:
        for k, r in enumerate(results["episodes"]):
            if r["cell"] == s["cell"] and failed(r):
                return k
    return None


def write_generalization(
    path: Path, summary: Sequence[dict[str, Any]], axis: Axis, train_range: tuple[float, float]
) -> Path:
    """Plot the success rate (with its 95 % Wilson interval) over the values of ``axis``.

    Averaged over any other axes, with the training range shaded: the values outside it are held out of training.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    values = np.array(axis.values)
    rate, lo, hi = (np.zeros(len(values)) for _ in range(3))
    for k, v in enumerate(axis.values):
        cells = [s for s in summary if s["cell"][axis.name] == v]
        n = sum(s["episodes"] for s in cells)
        wins = sum(round(s["success_rate"] * s["episodes"]) for s in cells)
        rate[k] = wins / n
        lo[k], hi[k] = wilson_interval(wins, n)
    inside = (values >= train_range[0]) & (values <= train_range[1])
    fig, ax = plt.subplots(figsize=(6.0, 3.6))
    ax.axvspan(train_range[0], train_range[1], color="tab:green", alpha=0.15, label="training range")
    yerr = [np.maximum(rate - lo, 0.0), np.maximum(hi - rate, 0.0)]  # Wilson's bounds may round past the rate
    ax.errorbar(values, rate, yerr=yerr, color="black", lw=1, capsize=3, zorder=1)
    ax.scatter(values[inside], rate[inside], color="tab:green", zorder=2, label="in training range")
    ax.scatter(values[~inside], rate[~inside], color="tab:red", marker="s", zorder=2, label="held out")
    ax.set_xlabel(_axis_label(axis.name))
    ax.set_ylabel("success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
    n_per = sorted({s["episodes"] for s in summary})
    ax.set_title(f"success on {axis.name} held out of training ({n_per[0]}+ episodes per cell, 95 % CI)")
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def parse_train_ranges(text: str, axes: Sequence[Axis]) -> dict[str, tuple[float, float]]:
    """Parse ``--train-ranges "name=low:high,..."``: the range each grid axis was trained on.

    Raises:
        ValueError: a malformed entry, a name that is not a grid axis (the message lists them), or low > high.
    """
    names = [a.name for a in axes]
    out: dict[str, tuple[float, float]] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, spec = part.partition("=")
        name = AXIS_ALIASES.get(name.strip(), name.strip())
        bounds = spec.split(":")
        if not sep or len(bounds) != 2:
            raise ValueError(f"train range {part!r} must look like name=low:high, e.g. object_size=0.03:0.05")
        if name not in names:
            raise ValueError(f"train range {name!r} is not a grid axis; the grid's axes: {names}")
        try:
            lo, hi = float(bounds[0]), float(bounds[1])
        except ValueError:
            raise ValueError(f"train range {part!r}: low and high must be numbers") from None
        if lo > hi:
            raise ValueError(f"train range {part!r}: need low <= high")
        out[name] = (lo, hi)
    return out


# ---------------------------------------------------------------------------------------- policy
#: the algorithms this tool evaluates (names of :data:`unilab_gym.sb3.algorithms.ALGORITHMS`)
POLICY_ALGORITHMS = ("ppo", "sac", "td3")


def load_policy(model: str | Path, algo: str, vecnormalize: str | Path | None = None) -> Policy:
    """A batched deterministic policy from an SB3 ``.zip`` (loaded on the CPU).

    Both files are code (pickles): loading them runs what they hold. Pass only files you trust,
    never a path read from a data file.

    Args:
        model: path of the saved model.
        algo: ``"ppo"``, ``"sac"`` or ``"td3"``.
        vecnormalize: a pickled SB3 ``VecNormalize`` whose observation statistics the policy was
            trained with (they are applied, frozen), or ``None``.

    Raises:
        ValueError: an unknown ``algo``. FileNotFoundError: a missing file.
    """
    import pickle

    if algo not in POLICY_ALGORITHMS:
        raise ValueError(f"algo must be one of {sorted(POLICY_ALGORITHMS)}, got {algo!r}")
    for path in (model, vecnormalize):
        if path is not None and not Path(path).exists():
            raise FileNotFoundError(f"no such file: {path}")
    from unilab_gym.sb3.models import load_model  # the SB3 wing loads the model (SB3 and torch import here)

    sb3_model = load_model(str(model), algo)
    normalizer = None
    if vecnormalize is not None:
        with open(vecnormalize, "rb") as f:
            normalizer = pickle.load(f)  # what VecNormalize.load does, without needing an env
        normalizer.training = False

    def policy(obs: np.ndarray) -> np.ndarray:
        if normalizer is not None:
            obs = normalizer.normalize_obs(obs)
        return sb3_model.predict(obs, deterministic=True)[0]

    return policy


# ---------------------------------------------------------------------------------------- replay
def replay(
    results: dict[str, Any],
    index: int,
    policy: Policy,
    video: str | Path | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Re-run episode ``index`` of ``results`` with ``policy``; optionally write a video of it.

    The episode's observation is fed to the policy at its original row of a batch of the
    original shape, so the actions are the evaluation's bit for bit (same torch thread count).
    ``progress`` shows a tqdm bar of the control steps, out of the recorded episode's length
    (rendering makes a step 0.05 to 0.1 s on 2 cores: a 1000-step episode takes a minute or more).

    Returns:
        The replayed episode's ``return``, ``length``, ``termination``, ``fall_conditions`` and
        ``matches`` (all four equal to the record's).
    """
    from tqdm.auto import tqdm

    from unilab_gym.trace_replay import replay_env

    record = results["episodes"][index]
    render = video is not None
    fields = results.get("task_axes", {})  # a task axis's cell value is part of the episode's configuration
    config = {**results["env"], **{fields[k]: (v, v) for k, v in record["cell"].items() if k in fields}}
    env, obs, _ = replay_env(
        config,
        record,
        env_id=results.get("env_id", DEFAULT_ENV_ID),
        autoreset_mode="Disabled",
        render_mode="rgb_array" if render else None,
    )
    batch = np.zeros((record["num_envs"], obs.shape[1]), dtype=obs.dtype)
    row = record["env"]
    frames = [env.render_env(0)] if render else []
    total, length = 0.0, 0
    bar = tqdm(total=record["length"], desc="replay", unit="step", disable=not progress)
    try:
        while True:
            batch[row] = obs[0]
            action = policy(batch)[row : row + 1]
            obs, reward, terminated, truncated, info = env.step(action)
            total += float(reward[0])
            length += 1
            bar.update()
            if render:
                frames.append(env.render_env(0))
            if terminated[0] or truncated[0]:
                break
        conditions = env.parameter_trace()[0]["fall_conditions"]
    finally:
        bar.close()
        env.close()
    if video is not None:
        write_video(Path(video), frames, fps=round(1.0 / (results["env"]["dt"] * results["env"]["substeps"])))
    out = {
        "return": total,
        "length": length,
        "termination": "fall" if terminated[0] else "time_limit",
        "fall_conditions": conditions,
    }
    keys = ["return", "length", "termination", "fall_conditions"]
    if "is_success" in record:
        out["is_success"] = bool(np.asarray(info["is_success"])[0])
        keys.append("is_success")
    out["matches"] = all(out[k] == record[k] for k in keys)
    return out


# ---------------------------------------------------------------------------------------- CLI
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="unilab-gym robustness",
        description="Evaluate a saved SB3 policy over a grid of physics perturbations; write a Markdown "
        "report, a success-rate heat map and the raw JSON. Or replay one episode of such a run.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "--model", type=Path, help="SB3 model .zip (also with --replay: a results file never loads one on its own)"
    )
    parser.add_argument("--algo", choices=list(POLICY_ALGORITHMS), help="algorithm that saved --model (default: read)")
    parser.add_argument(
        "--vecnormalize",
        type=Path,
        default=None,
        help="VecNormalize statistics (.pkl) to apply, frozen (none by default); a pickle runs code: name only "
        "a file you trust",
    )
    parser.add_argument(
        "--sibling-vecnormalize",
        action="store_true",
        help="load <model stem>_vecnormalize.pkl next to --model (prints the path it loads)",
    )
    parser.add_argument(
        "--env-id",
        default=DEFAULT_ENV_ID,
        help="registered UniLab id to evaluate on (e.g. UniLab/PandaPick-v0); its task axes join the grid's names",
    )
    parser.add_argument(
        "--grid",
        help="axes name=low:high:n, comma-separated, e.g. friction=0.3:1.2:4,mass=-1:3:4 (physics parameters) or "
        "object_size=0.02:0.07:6 (a task axis: sets the task's object_size_range to (v, v))",
    )
    parser.add_argument(
        "--train-ranges",
        default=None,
        help="the range each axis was trained on, name=low:high, comma-separated: marks the held-out cells and "
        "draws generalization.png over the first such axis",
    )
    parser.add_argument("--episodes", type=int, default=1000, help="total episodes, split evenly over the cells")
    parser.add_argument(
        "--max-episode-steps",
        type=int,
        default=None,
        help="episode length in control steps (default: the task's; Quadruped-v0 1000 = 20 s)",
    )
    parser.add_argument("--num-envs", type=int, default=64, help="robots stepped at once")
    parser.add_argument("--seed", type=int, default=0, help="episode j of every cell runs in an env seeded seed + j")
    parser.add_argument("--out", type=Path, default=Path("robustness"), help="output directory")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (a replay needs the evaluation's value)"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument(
        "--replay",
        metavar="RESULTS[:INDEX]",
        help="re-run episode INDEX of a results.json (default: the first failure of the worst cell)",
    )
    parser.add_argument(
        "--video", type=Path, default=None, help="with --replay: write a video of the episode (.mp4 or .gif)"
    )
    return parser


def _checked_policy_files(args: argparse.Namespace, parser: argparse.ArgumentParser) -> tuple[str, Path | None]:
    """The algorithm of ``--model`` (checked against ``--algo``) and the statistics the user asked for."""
    from unilab_gym.cli.play import algo_of, vecnormalize_to_load

    if not args.model.exists():
        parser.error(f"no model at {args.model}")
    try:
        vecnormalize = vecnormalize_to_load(args.model, args.vecnormalize, args.sibling_vecnormalize)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        saved = algo_of(args.model).__name__.lower()
    except (ValueError, OSError) as exc:  # not an SB3 zip
        parser.error(f"cannot read {args.model}: {exc}")
    if saved not in POLICY_ALGORITHMS:
        parser.error(f"{args.model} was saved by {saved.upper()}; this tool evaluates PPO, SAC and TD3 policies")
    if args.algo is not None and saved != args.algo:
        parser.error(f"--algo {args.algo}, but {args.model} was saved by {saved.upper()}: pass --algo {saved}")
    return saved, vecnormalize


def _run_report(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Path:
    if args.model is None or args.algo is None or args.grid is None:
        parser.error("--model, --algo and --grid are required (or use --replay)")
    try:
        for flag in ("episodes", "num_envs", "max_episode_steps", "threads"):
            if getattr(args, flag) is not None:
                check_positive_int("--" + flag.replace("_", "-"), getattr(args, flag))
        axes = parse_grid(args.grid, args.env_id)
        train_ranges = parse_train_ranges(args.train_ranges, axes) if args.train_ranges else {}
    except ValueError as exc:
        parser.error(str(exc))
    env_kwargs = {} if args.max_episode_steps is None else {"max_episode_steps": args.max_episode_steps}
    _, vecnormalize = _checked_policy_files(args, parser)
    _set_threads(args.threads)
    policy = load_policy(args.model, args.algo, vecnormalize)
    records = evaluate(
        policy,
        axes,
        args.episodes,
        env_id=args.env_id,
        env_kwargs=env_kwargs,
        num_envs=args.num_envs,
        seed=args.seed,
        progress=not args.no_progress,
    )
    from unilab_gym.registration import vector_env_type

    probe = vector_env_type(args.env_id)(1, **env_kwargs)  # its task_config, for the record
    env_config = {k: v for k, v in probe.task_config.items() if k != "domain_randomization"}
    condition_names = list(probe.task.termination_names)
    has_success = "is_success" in probe.task.step_info()
    probe.close()
    results = {
        "format": RESULTS_FORMAT,
        "format_version": RESULTS_FORMAT_VERSION,
        "model": str(args.model),
        "algo": args.algo,
        "vecnormalize": str(vecnormalize) if vecnormalize else None,
        "threads": args.threads,
        "seed": args.seed,
        "env_id": args.env_id,
        "success": (
            'info["is_success"] at the episode\'s last step'
            if has_success
            else "the episode reaches the time limit without a fall"
        ),
        "success_rule": "is_success" if has_success else "time_limit",
        "condition_names": condition_names,
        "grid": {a.name: list(a.values) for a in axes},
        "task_axes": {a.name: a.field for a in axes if a.field is not None},
        "train_ranges": {name: list(bounds) for name, bounds in train_ranges.items()},
        "episodes_per_cell": math.ceil(args.episodes / len(grid_cells(axes))),
        "packages": package_versions(),
        "env": env_config,
        "cells": summarize(records, axes, condition_names, train_ranges),
        "episodes": records,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results))
    write_heatmap(args.out / "heatmap.png", results["cells"], axes)
    for axis in axes:  # the generalization figure over the first axis with a training range
        if axis.name in train_ranges:
            write_generalization(args.out / "generalization.png", results["cells"], axis, train_ranges[axis.name])
            break
    report = write_report(args.out, results)
    worst = results["cells"][0]
    print(f"wrote {report}, {args.out / 'heatmap.png'}, {args.out / 'results.json'}")
    print(f"worst cell {worst['cell']}: success {worst['success_rate']:.0%}, mean return {worst['mean_return']:.2f}")
    return report


def _run_replay(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict[str, Any]:
    path, _, index_text = args.replay.rpartition(":") if ":" in Path(args.replay).name else (args.replay, "", "")
    path = Path(path)
    if not path.exists():
        parser.error(f"no results file at {path}")
    results = json.loads(path.read_text())
    if results.get("format") != RESULTS_FORMAT:
        parser.error(f"{path} is not a results.json written by unilab-gym robustness")
    if index_text:
        try:
            index = int(index_text)
        except ValueError:
            parser.error(f"--replay index must be an integer, got {index_text!r}")
        if not 0 <= index < len(results["episodes"]):
            parser.error(f"--replay index {index} out of range: {path} has {len(results['episodes'])} episodes")
    else:
        failure = first_failure(results)
        if failure is None:
            parser.error(f"{path} has no failing episode; give an index, e.g. {path}:0")
        index = failure
    if args.model is None:  # the results name a model and statistics, but a data file never loads code
        recorded = f"--model {results.get('model')}" + (
            f" --vecnormalize {results['vecnormalize']}" if results.get("vecnormalize") else ""
        )
        parser.error(
            f"--replay needs the policy: pass --model (and --vecnormalize if it was trained with one). "
            f"{path} records `{recorded}`, but a results file never loads them on its own: SB3 .zip models "
            "and .pkl statistics are code, so pass only files you trust"
        )
    algo, vecnormalize = _checked_policy_files(args, parser)
    if results.get("vecnormalize") and vecnormalize is None:
        print(
            f"warning: the evaluation normalized observations with {results['vecnormalize']}, this replay does not "
            "(pass --vecnormalize PATH if you trust that file)",
            file=sys.stderr,
        )
    if args.threads != results.get("threads", args.threads):
        print(
            f"warning: the evaluation used {results['threads']} torch thread(s), this replay {args.threads}",
            file=sys.stderr,
        )
    _set_threads(args.threads)
    outcome = replay(
        results, index, load_policy(args.model, algo, vecnormalize), video=args.video, progress=not args.no_progress
    )
    record = results["episodes"][index]
    print(
        f"episode {index} (cell {record['cell']}, episode seed {record['episode_seed']}): "
        f"return {outcome['return']:.4f}, {outcome['length']} steps, {outcome['termination']}"
        + (f" ({', '.join(outcome['fall_conditions'])})" if outcome["fall_conditions"] else "")
        + (
            " — identical to the record"
            if outcome["matches"]
            else f" — DIFFERS from the record (return {record['return']:.4f}, "
            f"{record['length']} steps, {record['termination']})"
        )
    )
    if args.video:
        print(f"wrote {args.video}")
    return outcome


def _set_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def main(argv: Sequence[str] | None = None) -> Any:
    """CLI entry point (see the module docstring)."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.replay:
        return _run_replay(args, parser)
    return _run_report(args, parser)


if __name__ == "__main__":
    main()
