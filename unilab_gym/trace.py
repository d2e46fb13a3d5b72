"""Parameter trace: one record per finished episode, enough to replay it bit for bit.

A record (a dict of JSON types)::

    {"env": 5,                      # env index in its vector env
     "episode": 2,                  # index of the episode in that env (0 = the first since the env was made)
     "episode_seed": 8412...,       # the seed every random draw of the episode comes from
     "command": [0.71, 0.0, 0.0],   # vx m/s, vy m/s, yaw rate rad/s
     "parameters": {"friction": 0.5, "added_mass": 0.0, ..., "latency": 0, ...},  # see unilab_gym.randomization
     "return": -0.42,               # sum of the episode's rewards (float64)
     "length": 57,                  # control steps
     "termination": "fall",         # "fall" or "time_limit"
     "fall_conditions": ["tilt"]}   # for a fall, which of "height", "tilt", "trunk_contact" held

Only finished episodes (terminated or truncated) are recorded; an episode cut short by
``reset()`` is not. The JSON Lines export starts with one header line that records, once, the
package versions and the env's ``task_config``::

    {"type": "header", "format": "unilab-gym/parameter-trace", "format_version": 1,
     "packages": {"unilab-gym": "0.1.0", "pybullet": "3.2.7", ...}, "env": {...}}
    {"type": "episode", "env": 0, ...}

Replaying a record: ``UniLabVectorEnv(1, **{**header["env"], "domain_randomization": record["parameters"]})``,
then ``reset(options={"episode_seed": record["episode_seed"]})`` and the episode's actions
(:func:`unilab_gym.vector_env.replay_env` does the first two steps).
"""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from unilab_gym.randomization import parameters_dict

TRACE_FORMAT = "unilab-gym/parameter-trace"
TRACE_FORMAT_VERSION = 1

#: Fall conditions, in the column order of the ``conditions`` arrays
#: (see :func:`unilab_gym.tasks.quadruped.fall_conditions`).
FALL_CONDITIONS: tuple[str, ...] = ("height", "tilt", "trunk_contact")

_PACKAGES = ("unilab-gym", "pybullet", "numpy", "gymnasium")


def package_versions() -> dict[str, str | None]:
    """Installed versions of the packages a trajectory depends on (``None`` if not installed)."""
    out: dict[str, str | None] = {}
    for name in _PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


class ParameterTrace:
    """Finished-episode records, kept as numpy arrays (one small chunk per step in which episodes
    finished) and turned into dicts only when asked for."""

    def __init__(self) -> None:
        self._chunks: list[dict[str, np.ndarray]] = []

    def append(
        self,
        env: np.ndarray,
        episode: np.ndarray,
        episode_seed: np.ndarray,
        command: np.ndarray,
        parameters: np.ndarray,
        returns: np.ndarray,
        lengths: np.ndarray,
        terminated: np.ndarray,
        conditions: np.ndarray,
    ) -> None:
        """Record k finished episodes (copies every array).

        Args:
            env: (k,) ints, the env indices.
            episode: (k,) ints, each env's episode index.
            episode_seed: (k,) ints.
            command: (k, 3) floats.
            parameters: (k, P) floats in :data:`~unilab_gym.randomization.PARAMETER_NAMES` order.
            returns: (k,) float64.
            lengths: (k,) ints, control steps.
            terminated: (k,) bool (False: truncated by the time limit).
            conditions: (k, 3) bool, columns :data:`FALL_CONDITIONS`.
        """
        self._chunks.append(
            dict(
                env=np.array(env),
                episode=np.array(episode),
                episode_seed=np.array(episode_seed),
                command=np.array(command),
                parameters=np.array(parameters),
                returns=np.array(returns),
                lengths=np.array(lengths),
                terminated=np.array(terminated),
                conditions=np.array(conditions),
            )
        )

    def records(self) -> list[dict[str, Any]]:
        """The records (see the module docstring), in the order the episodes finished (by env index within a step)."""
        out = []
        for c in self._chunks:
            for k in range(len(c["env"])):
                fell = bool(c["terminated"][k])
                out.append(
                    {
                        "env": int(c["env"][k]),
                        "episode": int(c["episode"][k]),
                        "episode_seed": int(c["episode_seed"][k]),
                        "command": c["command"][k].tolist(),
                        "parameters": parameters_dict(c["parameters"][k]),
                        "return": float(c["returns"][k]),
                        "length": int(c["lengths"][k]),
                        "termination": "fall" if fell else "time_limit",
                        "fall_conditions": [n for n, hit in zip(FALL_CONDITIONS, c["conditions"][k]) if hit and fell],
                    }
                )
        return out


def header(env_config: dict[str, Any]) -> dict[str, Any]:
    """The header line of a trace export: format, package versions and the env's ``task_config``."""
    return {
        "type": "header",
        "format": TRACE_FORMAT,
        "format_version": TRACE_FORMAT_VERSION,
        "packages": package_versions(),
        "env": env_config,
    }


def write_jsonl(path: str | Path, env_config: dict[str, Any], records: list[dict[str, Any]]) -> Path:
    """Write a header line then one line per record to ``path`` (JSON Lines; floats round-trip exactly)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        f.write(json.dumps(header(env_config)) + "\n")
        for record in records:
            f.write(json.dumps({"type": "episode", **record}) + "\n")
    return path


def read_jsonl(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(header, records) of a trace written by :func:`write_jsonl`.

    Raises:
        ValueError: the file does not start with a parameter-trace header.
    """
    with open(path) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    if not lines or lines[0].get("type") != "header" or lines[0].get("format") != TRACE_FORMAT:
        raise ValueError(f"{path} is not a unilab-gym parameter trace (no {TRACE_FORMAT!r} header line)")
    records = [{k: v for k, v in line.items() if k != "type"} for line in lines[1:]]
    return lines[0], records
