"""Parameter trace: one record per finished episode, enough to replay it bit for bit.

A record (a dict of JSON types)::

    {"env": 5,                      # env index in its vector env
     "episode": 2,                  # index of the episode in that env (0 = the first since the env was made)
     "episode_seed": 8412...,       # the seed every random draw of the episode comes from
     "command": [0.71, 0.0, 0.0],   # vx m/s, vy m/s, yaw rate rad/s
     "parameters": {"friction": 0.5, "added_mass": 0.0, ..., "latency": 0, ...},  # see unilab_gym.randomization
     "return": -0.42,               # sum of the episode's rewards (float64)
     "length": 57,                  # control steps
     "termination": "fall",         # "fall" (terminated) or "time_limit" (truncated)
     "fall_conditions": ["tilt"]}   # for a fall, which of "height", "tilt", "trunk_contact" held

Other tasks use the same record with their own widths and names (``ParameterTrace(command_dim=,
condition_names=, parameter_names=)``, from the task's ``command_dim``, ``termination_names`` and
``episode_parameter_names``): ``"command"`` is the task's command or target, ``"parameters"`` holds the
physics parameters and then the task's episode parameters (e.g. an object's size), and ``"fall_conditions"``
lists which of the task's termination conditions held.

Only finished episodes (terminated or truncated) are recorded; an episode cut short by
``reset()`` is not. Memory is bounded: a :class:`ParameterTrace` keeps the last ``max_records``
records (:data:`RECORD_BYTES` bytes each, in a numpy ring) and, when given a ``path``, streams
every record to that file as it is made. The file, like :func:`write_jsonl`'s export, is JSON
Lines: one header line that records, once, the package versions, the env's registered id (``"env_id"``:
which env class made the trace, :func:`unilab_gym.registration.env_id_of`; ``None`` for an unregistered class)
and its ``task_config``::

    {"type": "header", "format": "unilab-gym/parameter-trace", "format_version": 1,
     "packages": {"unilab-gym": "0.1.0", "pybullet": "3.2.7", ...}, "env_id": "UniLab/Quadruped-v0",
     "env": {...}}
    {"type": "episode", "env": 0, ...}

Replaying a record: the ``env_id``'s vector env class (:func:`unilab_gym.registration.vector_env_type`),
``cls(1, **{**header["env"], "domain_randomization": <the record's physics parameters>})`` (plus what the task needs
to start that episode again, :meth:`unilab_gym.tasks.base.Task.replay_kwargs`, e.g. a rough-terrain level), then
``reset(options={"episode_seed": record["episode_seed"]})`` and the episode's actions
(:func:`unilab_gym.trace_replay.replay_env(header, record) <unilab_gym.trace_replay.replay_env>` does all but the
actions). A header without ``"env_id"`` (written before it existed) is ``UniLab/Quadruped-v0``'s.
"""

from __future__ import annotations

import fcntl
import json
import os
from importlib import metadata
from pathlib import Path
from typing import IO, Any

import numpy as np

from unilab_gym.randomization import PARAMETER_NAMES, PARAMETERS
from unilab_gym.validation import check_int

TRACE_FORMAT = "unilab-gym/parameter-trace"
TRACE_FORMAT_VERSION = 1

#: Fall conditions, in the column order of the ``conditions`` arrays
#: (see :func:`unilab_gym.tasks.quadruped.fall_conditions`).
FALL_CONDITIONS: tuple[str, ...] = ("height", "tilt", "trunk_contact")

#: Records kept in memory by default (``trace_max_records``): 10,000 x :data:`RECORD_BYTES` = 1.6 MB per env
#: object, which :meth:`ParameterTrace.records` turns into dicts in 0.1-0.4 s (measured on a busy 2-core machine).
DEFAULT_TRACE_MAX_RECORDS = 10_000


def record_dtype(command_dim: int = 3, num_parameters: int = len(PARAMETER_NAMES), num_conditions: int = 3) -> np.dtype:
    """The in-memory row of one record: a numpy structured dtype (see :meth:`ParameterTrace.append`).

    Args:
        command_dim: the task's command width (``Task.command_dim``; 3 for the quadrupeds).
        num_parameters: physics parameters (:data:`~unilab_gym.randomization.PARAMETER_NAMES`) plus the task's
            episode parameters (``Task.episode_parameter_names``).
        num_conditions: the task's termination conditions (``Task.termination_names``).
    """
    return np.dtype(
        [
            ("env", np.int64),
            ("episode", np.int64),
            ("episode_seed", np.int64),
            ("command", np.float64, (command_dim,)),
            ("parameters", np.float64, (num_parameters,)),
            ("returns", np.float64),
            ("lengths", np.int64),
            ("terminated", np.bool_),
            ("conditions", np.bool_, (num_conditions,)),
        ]
    )


#: The record row of the quadruped tasks (a 3-float command, the physics parameters, :data:`FALL_CONDITIONS`).
RECORD_DTYPE = record_dtype(3, len(PARAMETER_NAMES), len(FALL_CONDITIONS))
#: Bytes of memory per kept record of the quadruped tasks (156 with the 11 parameters).
RECORD_BYTES = RECORD_DTYPE.itemsize

_PACKAGES = ("unilab-gym", "pybullet", "numpy", "gymnasium")
_FIRST_CAPACITY = 64  # rows allocated at the first record; doubled when full, up to max_records


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
    """Finished-episode records: the last ``max_records`` in a numpy ring, and every one in ``path`` if given.

    Memory stays at most ``max_records * RECORD_BYTES`` bytes however long the run (the ring grows by
    doubling up to that size); records are turned into dicts only when asked for.

    Args:
        max_records: records kept in memory, an int >= 0 (0: none, e.g. when only streaming to ``path``).
        path: ``None``, or a file to stream every record to as JSON Lines (:func:`read_jsonl` reads it). It
            is created (with its parent folders) or truncated, starts with :func:`header` line, gets one line
            per record as episodes finish (flushed at each step that finished some), and is closed by
            :meth:`close`. It is locked (``flock``) while open, so two envs cannot write the same file.
        env_config: the env's ``task_config``, for the header line.
        env_id: the env's registered id, for the header line (``None``: an unregistered env class).
        command_dim: the width of each record's ``"command"`` (the task's ``command_dim``).
        condition_names: the task's termination conditions, the names a record's ``"fall_conditions"`` lists
            (default :data:`FALL_CONDITIONS`, the quadrupeds').
        parameter_names: the names of each record's ``"parameters"``, in column order: the physics parameters
            (:data:`~unilab_gym.randomization.PARAMETER_NAMES`) and then the task's episode parameters.

    Raises:
        ValueError: ``max_records`` is not an int >= 0 (named ``trace_max_records``), or ``path`` is not a
            ``str`` / ``os.PathLike``, is empty, is a folder, cannot be opened for writing, or is being
            written by another env (named ``trace_path``). Nothing is created then.
    """

    def __init__(
        self,
        max_records: int = DEFAULT_TRACE_MAX_RECORDS,
        path: str | os.PathLike[str] | None = None,
        env_config: dict[str, Any] | None = None,
        *,
        env_id: str | None = None,
        command_dim: int = 3,
        condition_names: tuple[str, ...] = FALL_CONDITIONS,
        parameter_names: tuple[str, ...] = PARAMETER_NAMES,
    ) -> None:
        """Validate the arguments and open ``path`` if given (arguments: see the class docstring)."""
        self.max_records = check_int("trace_max_records", max_records, minimum=0)
        self.path = None if path is None else _check_path(path)
        self.condition_names = tuple(condition_names)
        self.parameter_names = tuple(parameter_names)
        self.dtype = record_dtype(command_dim, len(self.parameter_names), len(self.condition_names))
        self._rows = np.zeros(0, dtype=self.dtype)
        self._start = 0  # ring index of the oldest kept record
        self._count = 0  # records kept
        self._file: IO[str] | None = None
        if self.path is not None:
            self._file = _open_locked(self.path)
            try:
                self._file.write(json.dumps(header(env_config or {}, env_id)) + "\n")
                self._file.flush()
            except BaseException:
                self._file.close()
                raise

    def __len__(self) -> int:
        """Records kept in memory (<= ``max_records``)."""
        return self._count

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
        """Record k finished episodes (copies every array): write them to ``path``, keep the last ``max_records``.

        Args:
            env: (k,) ints, the env indices.
            episode: (k,) ints, each env's episode index.
            episode_seed: (k,) ints.
            command: (k, C) floats.
            parameters: (k, P) floats in ``parameter_names`` order.
            returns: (k,) float64.
            lengths: (k,) ints, control steps.
            terminated: (k,) bool (False: truncated by the time limit).
            conditions: (k, len(condition_names)) bool, columns ``condition_names``.
        """
        new = np.zeros(len(env), dtype=self.dtype)
        for name, value in (
            ("env", env),
            ("episode", episode),
            ("episode_seed", episode_seed),
            ("command", command),
            ("parameters", parameters),
            ("returns", returns),
            ("lengths", lengths),
            ("terminated", terminated),
            ("conditions", conditions),
        ):
            new[name] = value
        if self._file is not None:
            self._file.write("".join(json.dumps({"type": "episode", **r}) + "\n" for r in self._to_dicts(new)))
            self._file.flush()
        self._keep(new)

    def records(self) -> list[dict[str, Any]]:
        """The kept records (the last ``max_records``; see the module docstring), oldest first.

        In the order the episodes finished (by env index within a step).
        """
        return self._to_dicts(self._ordered())

    def close(self) -> None:
        """Close (and unlock) the ``path`` file, if any; the records in memory stay readable. Idempotent."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def _ordered(self) -> np.ndarray:
        capacity = len(self._rows)
        if self._start + self._count <= capacity:
            return self._rows[self._start : self._start + self._count]
        return np.concatenate([self._rows[self._start :], self._rows[: self._start + self._count - capacity]])

    def _keep(self, new: np.ndarray) -> None:
        """Add ``new`` rows to the ring, dropping the oldest beyond ``max_records``."""
        k, limit = len(new), self.max_records
        if k >= limit:
            self._rows, self._start, self._count = new[k - limit :].copy(), 0, limit
            return
        if self._count + k > len(self._rows) and len(self._rows) < limit:  # grow (doubling) up to the limit
            capacity = min(limit, max(_FIRST_CAPACITY, 2 * len(self._rows), self._count + k))
            grown = np.zeros(capacity, dtype=self.dtype)
            grown[: self._count] = self._ordered()
            self._rows, self._start = grown, 0
        capacity = len(self._rows)
        self._rows[(self._start + self._count + np.arange(k)) % capacity] = new
        self._count += k
        if self._count > capacity:  # the ring is full: the oldest were overwritten
            self._start = (self._start + self._count - capacity) % capacity
            self._count = capacity

    def _to_dicts(self, rows: np.ndarray) -> list[dict[str, Any]]:
        """Records (dicts of JSON types) of ``rows``, converted column by column (``tolist``)."""
        return _to_dicts(rows, self.parameter_names, self.condition_names)


def _to_dicts(
    rows: np.ndarray, parameter_names: tuple[str, ...], condition_names: tuple[str, ...]
) -> list[dict[str, Any]]:
    """Records (dicts of JSON types) of :func:`record_dtype` ``rows``, converted column by column (``tolist``)."""
    columns = [
        rows[name].tolist()
        for name in ("env", "episode", "episode_seed", "command", "parameters", "returns", "lengths", "terminated")
    ]
    conditions = rows["conditions"].tolist()
    integer = [name for name in parameter_names if name in PARAMETERS and PARAMETERS[name].integer]
    dicts = [dict(zip(parameter_names, row)) for row in columns[4]]
    for parameters in dicts:
        for name in integer:
            parameters[name] = int(parameters[name])
    columns[4] = dicts
    return [
        {
            "env": env,
            "episode": episode,
            "episode_seed": seed,
            "command": command,
            "parameters": parameters,
            "return": ret,
            "length": length,
            "termination": "fall" if fell else "time_limit",
            "fall_conditions": [n for n, hit in zip(condition_names, held) if hit] if fell else [],
        }
        for env, episode, seed, command, parameters, ret, length, fell, held in zip(*columns, conditions)
    ]


def _check_path(path: Any) -> Path:
    """``path`` as a :class:`Path` if it can name a trace file (ValueError naming ``trace_path`` otherwise)."""
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise ValueError(f"trace_path must be None or a non-empty file path (str or os.PathLike), got {path!r}")
    out = Path(path)
    if out.is_dir():
        raise ValueError(f"trace_path must be a file path, got the folder {path!r}")
    return out


def _open_locked(path: Path) -> IO[str]:
    """``path`` opened for writing, emptied, and locked against other envs (ValueError naming ``trace_path``)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        f = open(path, "a")  # noqa: SIM115 - kept open while the env streams; "a": not emptied before the lock
    except OSError as error:
        raise ValueError(f"trace_path {str(path)!r} cannot be opened for writing: {error}") from None
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        raise ValueError(
            f"trace_path {str(path)!r} is being written by another env: give each env (and each AsyncRunner "
            "collector) its own file"
        ) from None
    f.truncate(0)
    return f


def header(env_config: dict[str, Any], env_id: str | None = None) -> dict[str, Any]:
    """The header line of a trace export: format, package versions, the env's registered id and ``task_config``."""
    return {
        "type": "header",
        "format": TRACE_FORMAT,
        "format_version": TRACE_FORMAT_VERSION,
        "packages": package_versions(),
        "env_id": env_id,
        "env": env_config,
    }


def write_jsonl(
    path: str | Path, env_config: dict[str, Any], records: list[dict[str, Any]], env_id: str | None = None
) -> Path:
    """Write a header line (with ``env_id``, the env's registered id) then one line per record to ``path``.

    JSON Lines; floats round-trip exactly.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        f.write(json.dumps(header(env_config, env_id)) + "\n")
        for record in records:
            f.write(json.dumps({"type": "episode", **record}) + "\n")
    return path


def read_jsonl(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(header, records) of a trace written by :func:`write_jsonl` or streamed by :class:`ParameterTrace`.

    Raises:
        ValueError: the file does not start with a parameter-trace header.
    """
    with open(path) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    if not lines or lines[0].get("type") != "header" or lines[0].get("format") != TRACE_FORMAT:
        raise ValueError(f"{path} is not a unilab-gym parameter trace (no {TRACE_FORMAT!r} header line)")
    records = [{k: v for k, v in line.items() if k != "type"} for line in lines[1:]]
    return lines[0], records
