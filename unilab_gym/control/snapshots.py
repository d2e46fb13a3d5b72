"""Deprecated: moved to :mod:`unilab_gym.sb3.control.snapshots` (this re-export warns, and goes in 0.3)."""

from unilab_gym._deprecated import forward

__getattr__, __dir__ = forward(__name__, "unilab_gym.sb3.control.snapshots")
