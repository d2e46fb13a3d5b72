"""Task keyword arguments: :func:`check_task_kwargs`, and ``QuadrupedConfig``.

``QuadrupedConfig`` is defined in :mod:`unilab_gym.tasks.quadruped`, next to its task; it is imported here too,
where it has always been importable from.

``QuadrupedConfig`` holds every constructor argument of ``UniLab/Quadruped-v0`` that shapes its trajectories. The
fields are the task keyword arguments of :class:`~unilab_gym.vector_env.UniLabVectorEnv` and
:class:`~unilab_gym.envs.QuadrupedEnv` (``gym.make(..., **kwargs)``), written here once with their
units and defaults; ``env.task_config`` is :meth:`QuadrupedConfig.to_dict`. The arguments that do not
change a trajectory (``num_envs``, ``envs_per_cluster``, ``render_mode``, ``autoreset_mode``,
``trace_max_records``, ``trace_path``) are not part of it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any

from unilab_gym.tasks.quadruped import QuadrupedConfig

__all__ = ["QuadrupedConfig", "check_task_kwargs"]


def check_task_kwargs(
    owner: str, kwargs: Mapping[str, Any], other_args: Sequence[str], config_type: Any = None
) -> None:
    """Check that every key of ``kwargs`` is a field of the task configuration or one of ``other_args``.

    Args:
        owner: the name of the class taking them, for the message.
        kwargs: keyword arguments given to ``owner``.
        other_args: the arguments ``owner`` takes besides the task configuration.
        config_type: the configuration dataclass (default :class:`QuadrupedConfig`).

    Raises:
        TypeError: naming the unknown keys and listing the valid ones.
    """
    task_args = [f.name for f in fields(config_type or QuadrupedConfig)]
    unknown = sorted(str(k) for k in kwargs if k not in task_args and k not in other_args)
    if unknown:
        raise TypeError(
            f"{owner} got unexpected keyword argument(s) {unknown}; valid arguments: {[*other_args, *task_args]}"
        )
