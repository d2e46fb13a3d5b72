"""Re-export shims for import paths that moved in 0.2 (issue 28): each warns once, then forwards every name.

A shim module is two lines::

    from unilab_gym._deprecated import forward

    __getattr__, __dir__ = forward(__name__, "unilab_gym.sb3.vec_env")

Importing it emits a ``DeprecationWarning`` naming the new path; every attribute (public or
private) is then looked up in the new module, so ``old.Name is new.Name``, ``from old import Name``
works, and pickles (SB3 zips) that name classes by their old path still load. The shims are
removed in 0.3.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any

#: old import path -> new import path, for every shim (tests check that each warns and resolves).
MOVED: dict[str, str] = {
    "unilab_gym.integrations.sb3": "unilab_gym.sb3.vec_env",
    "unilab_gym.integrations.sb3_replay": "unilab_gym.sb3.replay_buffer",
    "unilab_gym.integrations.sb3_policies": "unilab_gym.sb3.policies",
    "unilab_gym.integrations.tianshou": "unilab_gym.tianshou",
    "unilab_gym.control": "unilab_gym.sb3.control",
    "unilab_gym.control.callback": "unilab_gym.sb3.control.callback",
    "unilab_gym.control.controller": "unilab_gym.sb3.control.controller",
    "unilab_gym.control.hyperparams": "unilab_gym.sb3.control.hyperparams",
    "unilab_gym.control.server": "unilab_gym.sb3.control.server",
    "unilab_gym.control.snapshots": "unilab_gym.sb3.control.snapshots",
    "unilab_gym.runtime.runner": "unilab_gym.sb3.runner",
    "unilab_gym.hyperparams": "unilab_gym.sb3.zoo",
}


def forward(old: str, new: str) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """Warn that ``old`` moved to ``new``; return the module ``__getattr__`` and ``__dir__`` that forward to ``new``.

    Args:
        old: the shim's ``__name__``.
        new: the dotted path of the module that now defines the names.

    Returns:
        ``(__getattr__, __dir__)`` for the shim module (PEP 562).
    """
    warnings.warn(
        f"{old} is deprecated and will be removed in unilab-gym 0.3; import from {new} instead",
        DeprecationWarning,
        stacklevel=3,
    )
    target = importlib.import_module(new)

    def __getattr__(name: str) -> Any:
        try:
            return getattr(target, name)
        except AttributeError:
            raise AttributeError(f"module {old!r} (moved to {new!r}) has no attribute {name!r}") from None

    def __dir__() -> list[str]:
        return dir(target)

    return __getattr__, __dir__
