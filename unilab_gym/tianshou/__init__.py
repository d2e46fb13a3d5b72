"""Tianshou wing: everything that imports ``tianshou`` lives in this folder.

- :mod:`unilab_gym.tianshou.venv`: :class:`TianshouVectorEnv` and :func:`make_tianshou_env`
  (Tianshou's ``BaseVectorEnv`` over one batched :class:`~unilab_gym.vector_env.UniLabVectorEnv`);
- :mod:`unilab_gym.tianshou.replay_buffer`: :class:`SharedVectorReplayBuffer` (a ``VectorReplayBuffer``
  in shared memory).

Names are imported on first access (PEP 562), so ``import unilab_gym.tianshou`` alone does not
import Tianshou or torch.
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> module that defines it
_LAZY = {
    "TianshouVectorEnv": "unilab_gym.tianshou.venv",
    "make_tianshou_env": "unilab_gym.tianshou.venv",
    "SharedVectorReplayBuffer": "unilab_gym.tianshou.replay_buffer",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    """Import ``name`` from its module on first access (PEP 562)."""
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'unilab_gym.tianshou' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
