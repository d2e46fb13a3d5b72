"""``AsyncRunner``'s declared configuration: its settings in three documented groups.

:class:`~unilab_gym.sb3.runner.AsyncRunner` takes its settings either as keyword arguments (as since 0.1) or
grouped in three frozen dataclasses, one per job::

    AsyncRunner(
        model,
        collectors=CollectorConfig(env_id="UniLab/Quadruped-v0", num_collectors=4, envs_per_collector=16, seed=0),
        control=ControlConfig(control_port=0, snapshot_on_change=True),
        metrics=MetricsConfig(metrics_port=9100),
    )

is the same runner as ``AsyncRunner(model, env_id="UniLab/Quadruped-v0", num_collectors=4, envs_per_collector=16,
seed=0, control_port=0, snapshot_on_change=True, metrics_port=9100)``.

- :class:`CollectorConfig`: what the collectors run and where: the env, the counts, the seed, the backend
  and its options, fault handling, ingest;
- :class:`ControlConfig`: live control (:mod:`unilab_gym.sb3.control`): the control server, the run's snapshot
  directory;
- :class:`MetricsConfig`: the Prometheus endpoint of the pipeline metrics.

The learner's own settings, ``max_policy_lag`` and ``replay_ratio``, stay keyword arguments of the runner: they
belong to the model's learner loop and change live (``set_hyperparameters``).

Each field has the name of the keyword argument it replaces, with the same default, and is checked when the
config is made, by the checks the runner applies to the keyword (the same ``ValueError`` messages, naming the
field). What needs the model or other groups (``env_id`` / ``env_fn`` given once, the env count against the
model's, the env's registration or picklability, Ray being installed) is checked by the runner.

Keywords and configs mix: a setting may come from either, but not from both. A config remembers which fields
were given when it was made (:meth:`CollectorConfig.given`); passing one of them as a keyword too raises a
``ValueError`` naming it (:func:`merge_settings`), even when the two values are equal.
"""

from __future__ import annotations

import dataclasses
import enum
import multiprocessing as mp
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from unilab_gym.validation import check_host, check_int, check_positive_int, check_real, check_seed

if TYPE_CHECKING:
    from typing import Self

    from gymnasium.vector import VectorEnv

#: The collector pools ``AsyncRunner(backend=...)`` builds: spawned processes, Ray actors, or in the learner.
BACKENDS = ("process", "ray", "inline")


class Default(enum.Enum):
    """Type of :data:`DEFAULT`, the default of ``AsyncRunner``'s grouped keyword arguments."""

    DEFAULT = "DEFAULT"

    def __repr__(self) -> str:
        """``DEFAULT``."""
        return "DEFAULT"


#: "Not passed": a runner keyword left at ``DEFAULT`` takes its value from the group's config, if one is given,
#: else the config field's default. Any other value, ``None`` included, counts as passed.
DEFAULT = Default.DEFAULT


class _Given:
    """Mixin of the configs: records which fields the caller gave (by position or keyword) when the config was made."""

    __given: frozenset[str]

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        """Make the instance and record the names of the fields given to the constructor."""
        self = super().__new__(cls)
        names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]  # the subclasses are dataclasses
        object.__setattr__(self, "_Given__given", frozenset(names[: len(args)]) | frozenset(kwargs))
        return self

    def given(self) -> frozenset[str]:
        """The fields given when this config was made; the others hold their defaults.

        A copy made by ``dataclasses.replace`` gives every field (``replace`` passes them all).
        """
        return self.__given


@dataclass(frozen=True)
class CollectorConfig(_Given):
    """What the collectors run and where (``AsyncRunner(collectors=...)``).

    Collector ``c`` makes its env with ``gym.make_vec(env_id, num_envs=envs_per_collector, **env_kwargs)``
    or ``env_fn(envs_per_collector)``; the model's env must have ``num_collectors * envs_per_collector``
    envs (off-policy: or 1, an env that only gives the spaces). Exactly one of ``env_id`` / ``env_fn`` must
    be given, by this config or a runner keyword (checked by the runner).

    Attributes:
        env_id: a registered gymnasium id; each collector makes ``gym.make_vec(env_id,
            num_envs=envs_per_collector, **env_kwargs)`` (on-policy: with same-step autoreset). ``None`` with
            ``env_fn``.
        env_fn: instead of ``env_id``: a picklable ``env_fn(num_envs) -> gymnasium.vector.VectorEnv``
            (on-policy: with ``autoreset_mode="SameStep"``).
        num_collectors: collectors (processes, Ray actors, or inline turns), >= 1.
        envs_per_collector: envs per collector (its EIC cluster size), >= 1.
        env_kwargs: keyword arguments for ``gym.make_vec`` (a mapping), or ``None``.
        seed: collector ``c`` seeds its env with ``seed + c * envs_per_collector`` (env ``i`` of it gets
            ``+ i``, so env ``j`` of all collectors gets ``seed + j``, as ``make_sb3_env`` seeds them) and
            torch / numpy with ``seed + c``; ``None``: ``model.seed``, else random.
        backend: ``"process"`` (default): collectors are processes on this machine, sharing memory with
            the learner. ``"ray"``: each collector is a Ray actor, on any node of a Ray cluster, shipping its
            data through the object store (:mod:`unilab_gym.runtime.ray_pool`, ``docs/ray.md``).
            ``"inline"``: no process; the learner steps the collectors itself, one at a time, between its
            training calls (:mod:`unilab_gym.runtime.inline_pool`): deterministic, and a breakpoint in the
            env works; for tests and debugging. ``max_collector_restarts`` must be 0 there, and
            ``collector_timeout_s`` and ``start_method`` are not used; no main guard is needed.
        start_method: multiprocessing start method of ``backend="process"`` (``"spawn"``, safe with torch);
            one of ``multiprocessing.get_all_start_methods()``.
        max_collector_restarts: how many collector faults (an exception in a collector, or a collector that
            died, e.g. SIGKILL, or hung) the runner survives over its life by starting a new collector in its
            place (with a new env seed; a warning names the fault), >= 0. The next fault raises
            :class:`~unilab_gym.runtime.errors.CollectorError`. Default 0: the first fault raises.
        collector_timeout_s: a collector whose heartbeat (a progress counter and time it updates at every
            iteration of its loop, idle ones included) does not move for this many seconds (> 0) is hung
            (stopped, deadlocked, stuck in its env's step): a fault like a death, killed, then restarted
            within ``max_collector_restarts`` or raised as ``CollectorError`` (naming it, its pid and the
            seconds since its last progress). A collector still starting gets at least ``START_TIMEOUT_S``
            (60 s, :mod:`~unilab_gym.runtime.pool`). Default 60: a healthy collector beats every few
            milliseconds.
        ray_address: ``backend="ray"`` only: if Ray is not initialised, the runner calls
            ``ray.init(address=ray_address)`` (``None``: a local instance, dashboard off; ``"auto"``: this
            machine's cluster) and shuts it down on ``close()``; an initialised Ray is used and left running.
        collector_resources: ``backend="ray"`` only: the Ray resource request of each collector actor, e.g.
            ``{"collector": 1}`` for nodes that advertise a custom ``collector`` resource. ``None``: one CPU.
        ingest_workers: learner-side workers that pull the collectors' answers and write them into the
            replay or rollout storage, >= 1; more than 1 only with ``backend="ray"`` (the process and inline
            collectors write into the storage themselves). Carried to the pool as
            :attr:`~unilab_gym.runtime.pool.CollectorSetup.ingest_workers`.

    Raises:
        ValueError: a field out of its range or of the wrong type (the message names the field, as the runner
            keyword of the same name does), an unknown ``backend`` or ``start_method``, Ray options without
            ``backend="ray"``, restarts with ``backend="inline"``, or ``ingest_workers > 1`` without
            ``backend="ray"``.
    """

    env_id: str | None = None
    env_fn: Callable[[int], VectorEnv] | None = None
    num_collectors: int = 2
    envs_per_collector: int = 32
    env_kwargs: Mapping[str, Any] | None = None
    seed: int | None = None
    backend: str = "process"
    start_method: str = "spawn"
    max_collector_restarts: int = 0
    collector_timeout_s: float = 60.0
    ray_address: str | None = None
    collector_resources: dict[str, float] | None = None
    ingest_workers: int = 1

    def __post_init__(self) -> None:
        """Check every field and store it converted (numpy integers as ``int``, ...); ``ValueError`` names a bad one."""
        _set(self, "num_collectors", check_positive_int("num_collectors", self.num_collectors))
        _set(self, "envs_per_collector", check_positive_int("envs_per_collector", self.envs_per_collector))
        restarts = check_int("max_collector_restarts", self.max_collector_restarts, minimum=0)
        _set(self, "max_collector_restarts", restarts)
        timeout = check_real("collector_timeout_s", self.collector_timeout_s, minimum=0.0, exclusive_minimum=True)
        _set(self, "collector_timeout_s", timeout)
        if self.env_kwargs is not None and not isinstance(self.env_kwargs, Mapping):
            raise ValueError(
                f"env_kwargs must be a dict of keyword arguments for gym.make_vec, got {self.env_kwargs!r}"
            )
        if self.seed is not None:
            _set(self, "seed", check_seed("seed", self.seed))
        _check_backend(self.backend, self.start_method, self.ray_address, self.collector_resources, restarts)
        _set(self, "ingest_workers", check_ingest_workers(self.ingest_workers, self.backend))


@dataclass(frozen=True)
class ControlConfig(_Given):
    """Live control of the run (``AsyncRunner(control=...)``): the control server and the snapshot directory.

    The Python methods of live control (``set_hyperparameters``, ``snapshot``, ``restore``, ...) work without a
    server; ``control_port`` adds the HTTP API (:mod:`unilab_gym.sb3.control`, needs ``unilab-gym[control]``).

    Attributes:
        control_port: serve the control API on this TCP port (0: a free port, see ``runner.control_url``;
            0-65535), bearer token in the run's token file; ``None``: no server.
        control_addr: the address the control server binds (an IP address or a host name that resolves);
            loopback only by default.
        snapshot_dir: the run's directory (snapshot files, the token file), a ``str`` or ``os.PathLike``;
            ``None``: a fresh directory under ``runs/``, made when first needed.
        snapshot_on_change: take a snapshot before every hyperparameter change (a ``bool``).

    Raises:
        ValueError: a bad field (the message names it, as the runner keyword of the same name does).
    """

    control_port: int | None = None
    control_addr: str = "127.0.0.1"
    snapshot_dir: str | os.PathLike[str] | None = None
    snapshot_on_change: bool = False

    def __post_init__(self) -> None:
        """Check every field (``ValueError`` naming a bad one) and store it converted."""
        if self.control_port is not None:
            _set(self, "control_port", check_int("control_port", self.control_port, minimum=0, maximum=65535))
        _set(self, "control_addr", check_host("control_addr", self.control_addr))
        if not isinstance(self.snapshot_on_change, bool):
            raise ValueError(f"snapshot_on_change must be a bool, got {self.snapshot_on_change!r}")
        if self.snapshot_dir is not None and not isinstance(self.snapshot_dir, (str, os.PathLike)):
            raise ValueError(f"snapshot_dir must be a path (str or os.PathLike) or None, got {self.snapshot_dir!r}")


@dataclass(frozen=True)
class MetricsConfig(_Given):
    """The Prometheus endpoint of the pipeline metrics (``AsyncRunner(metrics=...)``).

    The same figures go to the SB3 logger under ``unilab/*`` whenever the runner logs, with or without a server.

    Attributes:
        metrics_port: serve :data:`unilab_gym.runtime.metrics.METRICS` at
            ``http://<metrics_addr>:<port>/metrics`` (0: a free port, see ``runner.metrics_url``; 0-65535);
            ``None``: no server. With ``ControlConfig.control_port`` too, ``/metrics`` is served on the
            control server instead (one port per runner). Needs ``prometheus-client``.
        metrics_addr: the address the metrics server binds (an IP address or a host name that resolves);
            loopback only by default.

    Raises:
        ValueError: a bad field (the message names it, as the runner keyword of the same name does).
    """

    metrics_port: int | None = None
    metrics_addr: str = "127.0.0.1"

    def __post_init__(self) -> None:
        """Check every field (``ValueError`` naming a bad one) and store it converted."""
        if self.metrics_port is not None:
            _set(self, "metrics_port", check_int("metrics_port", self.metrics_port, minimum=0, maximum=65535))
        _set(self, "metrics_addr", check_host("metrics_addr", self.metrics_addr))


_Config = TypeVar("_Config", CollectorConfig, ControlConfig, MetricsConfig)


def merge_settings(kind: type[_Config], argument: str, config: _Config | None, keywords: Mapping[str, Any]) -> _Config:
    """One config of ``kind`` from the runner's ``argument=config`` and the group's keyword arguments.

    Args:
        kind: :class:`CollectorConfig`, :class:`ControlConfig` or :class:`MetricsConfig`.
        argument: the runner's argument that takes ``config`` (``"collectors"``, ...), for the messages.
        config: the config passed, or ``None``.
        keywords: the group's keyword arguments by field name; those at :data:`DEFAULT` were not passed.

    Returns:
        ``config`` with the passed keywords added (checked as any config is), or a config of the keywords.

    Raises:
        ValueError: ``config`` is not a ``kind`` (nor ``None``); a keyword passed for a field ``config`` was
            given (the message names each such setting and both values), or a bad value (named).
    """
    passed = {name: value for name, value in keywords.items() if value is not DEFAULT}
    if config is None:
        return kind(**passed)
    if not isinstance(config, kind):
        raise ValueError(f"{argument} must be a {kind.__name__} or None, got {config!r}")
    twice = sorted(set(passed) & config.given())
    if twice:
        both = "; ".join(f"{n}={passed[n]!r} and {kind.__name__}({n}={getattr(config, n)!r})" for n in twice)
        raise ValueError(
            f"{', '.join(twice)}: passed twice, as an argument of AsyncRunner and in {argument}= ({both}); pass "
            "each setting one way"
        )
    if not passed:
        return config
    return kind(**{name: getattr(config, name) for name in config.given()}, **passed)


def check_ingest_workers(ingest_workers: Any, backend: str) -> int:
    """``ingest_workers`` as an ``int`` >= 1, and 1 unless ``backend="ray"``.

    Raises:
        ValueError: not an integer >= 1, or > 1 with a backend other than ``"ray"`` (the message names both).
    """
    workers = check_positive_int("ingest_workers", ingest_workers)
    if workers > 1 and backend != "ray":
        raise ValueError(
            f'ingest_workers > 1 needs backend="ray" (the learner-side ingest of the Ray collectors\' answers; '
            f"the {backend!r} collectors write into the storage themselves), got ingest_workers={workers} "
            f"with backend={backend!r}"
        )
    return workers


def _check_backend(
    backend: Any,
    start_method: Any,
    ray_address: Any,
    collector_resources: Any,
    max_collector_restarts: int,
) -> None:
    """Check the backend and its options (Ray's import and ``collector_resources``' contents: the runner).

    Raises:
        ValueError: an unknown ``backend`` or ``start_method``, Ray options without ``backend="ray"``, a
            ``ray_address`` that is not a str, or restarts with ``backend="inline"``.
    """
    if backend not in BACKENDS:
        raise ValueError(f'backend must be "process", "ray" or "inline", got {backend!r}')
    methods = mp.get_all_start_methods()
    if start_method not in methods:
        raise ValueError(f"start_method must be one of {methods} (multiprocessing start methods), got {start_method!r}")
    if backend != "ray" and (ray_address is not None or collector_resources is not None):
        raise ValueError('ray_address and collector_resources need backend="ray"')
    if ray_address is not None and not isinstance(ray_address, str):
        raise ValueError(f"ray_address must be a str such as 'auto' or 'host:6379', or None, got {ray_address!r}")
    if backend == "inline" and max_collector_restarts:
        raise ValueError(
            f'backend="inline" does not restart collectors: max_collector_restarts must be 0, got '
            f'{max_collector_restarts} (a fault raises CollectorError at once; backend="process" restarts)'
        )


def _set(config: object, name: str, value: Any) -> None:
    """Store the checked ``value`` in field ``name`` of a frozen config (in ``__post_init__``)."""
    object.__setattr__(config, name, value)
