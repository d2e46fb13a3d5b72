"""Every call into Stable-Baselines3's private API, in one place (SB3 2.x; checked against 2.3 - 2.7).

The runner drives stock SB3 models with its own learn() body, and the replay buffer and the live
control adjust what ``model.save`` writes; both need members SB3 does not document. Each one is
reached only through a function here, so an SB3 release that renames one breaks this module, and
``grep _sb3_private`` lists every dependency:

- ``BaseAlgorithm._setup_learn`` (:func:`setup_learn`), ``_update_current_progress_remaining``
  (:func:`update_progress_remaining`), ``_current_progress_remaining`` (:func:`progress_remaining`);
- ``OffPolicyAlgorithm._dump_logs`` (public ``dump_logs`` from SB3 2.6) (:func:`dump_logs`);
- ``_episode_num`` (:func:`episode_count`, :func:`add_episodes`), ``_n_updates`` (:func:`update_count`),
  ``_logger`` (:func:`logger_or_none`: the logger, if ``learn`` set one up);
- ``_excluded_save_params`` (:func:`exclude_from_save`, :func:`restore_instance_attributes`): the names
  ``model.save`` leaves out;
- the model that is building a replay buffer, found from the buffer's constructor through the
  call stack (:func:`algorithm_building`): SB3 passes the buffer no reference to its model.

``ReplayBuffer._get_samples``, which :class:`~unilab_gym.sb3.replay_buffer.SharedReplayBuffer` overrides,
is the one private member met elsewhere: an override of SB3's sampling hook, not a call.
"""

from __future__ import annotations

from types import FrameType
from typing import Any

__all__ = [
    "TRIAL_ATTRIBUTES",
    "ExcludedSaveParams",
    "add_episodes",
    "algorithm_building",
    "dump_logs",
    "episode_count",
    "exclude_from_save",
    "instance_attributes",
    "logger_or_none",
    "progress_remaining",
    "restore_instance_attributes",
    "setup_learn",
    "update_count",
    "update_progress_remaining",
]


def setup_learn(
    model: Any, total_timesteps: int, callback: Any, reset_num_timesteps: bool, tb_log_name: str, progress_bar: bool
) -> tuple[int, Any]:
    """``model._setup_learn(...)``: the logger, the callback list, the timestep counters; ``(total, callback)``."""
    return model._setup_learn(total_timesteps, callback, reset_num_timesteps, tb_log_name, progress_bar)


def update_progress_remaining(model: Any, num_timesteps: int, total_timesteps: int) -> None:
    """``model._update_current_progress_remaining``: what the learning-rate and clip schedules read."""
    model._update_current_progress_remaining(num_timesteps, total_timesteps)


def progress_remaining(model: Any) -> float:
    """``model._current_progress_remaining`` (1.0 before the first ``learn``)."""
    return float(getattr(model, "_current_progress_remaining", 1.0))


def dump_logs(model: Any) -> None:
    """An off-policy model's ``dump_logs()`` (SB3 >= 2.6), or its private ``_dump_logs()`` before."""
    (model.dump_logs if hasattr(model, "dump_logs") else model._dump_logs)()


def episode_count(model: Any) -> int:
    """``model._episode_num``: episodes finished since ``learn`` started counting (0 if never)."""
    return int(getattr(model, "_episode_num", 0))


def add_episodes(model: Any, n: int) -> None:
    """Count ``n`` more finished episodes in ``model._episode_num`` (SB3's loops count them there)."""
    model._episode_num += n


def update_count(model: Any) -> int:
    """``model._n_updates``: gradient steps taken (0 if never)."""
    return int(getattr(model, "_n_updates", 0))


def logger_or_none(model: Any) -> Any:
    """``model._logger``: the logger ``learn`` set up, or ``None`` (``model.logger`` raises before that)."""
    return getattr(model, "_logger", None)


class ExcludedSaveParams:
    """A model's ``_excluded_save_params`` replaced by a fixed list; holds no reference to the model.

    Args:
        names: the names ``model.save`` leaves out (duplicates dropped, order kept).
    """

    def __init__(self, names: list[str]) -> None:
        self.names = tuple(dict.fromkeys(names))

    def __call__(self) -> list[str]:
        """The names, as SB3's own ``_excluded_save_params()`` returns them."""
        return list(self.names)


def exclude_from_save(model: Any, names: tuple[str, ...] | list[str]) -> None:
    """Make ``model.save`` also leave out ``names`` (an attribute of the model instance), on top of SB3's list.

    Idempotent: names already left out are not added twice (and the list is not rebuilt).
    """
    current = model._excluded_save_params
    if isinstance(current, ExcludedSaveParams) and set(names) <= set(current.names):
        return
    model._excluded_save_params = ExcludedSaveParams([*current(), *names])


def instance_attributes(model: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """The ones of ``names`` set on the model instance itself (not its class), by name."""
    return {name: model.__dict__[name] for name in names if name in model.__dict__}


def restore_instance_attributes(model: Any, names: tuple[str, ...], saved: dict[str, Any]) -> None:
    """Put back the instance attributes ``saved`` by :func:`instance_attributes`; drop the others of ``names``."""
    for name in names:
        if name in saved:
            setattr(model, name, saved[name])
        else:
            model.__dict__.pop(name, None)


#: instance attributes a change on trial sets on the model (its ``train`` wrapper, and the save list leaving it out)
TRIAL_ATTRIBUTES = ("train", "_excluded_save_params")


def algorithm_building(frame: FrameType | None, buffer_class: type) -> Any:
    """The SB3 algorithm building its ``replay_buffer_class`` buffer with the constructor in ``frame``, or ``None``.

    The algorithm's ``_setup_model`` calls that constructor: it is ``frame``'s caller, or a few frames up
    through subclasses' ``__init__``. Returned only if its ``replay_buffer_class`` is a ``buffer_class``
    and it has no replay buffer yet.
    """
    from stable_baselines3.common.base_class import BaseAlgorithm

    frame = frame.f_back if frame is not None else None
    for _ in range(8):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if isinstance(owner, BaseAlgorithm):
            cls = getattr(owner, "replay_buffer_class", None)
            building = getattr(owner, "replay_buffer", None) is None
            return owner if building and isinstance(cls, type) and issubclass(cls, buffer_class) else None
        frame = frame.f_back
    return None
