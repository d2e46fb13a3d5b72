"""Deprecated: the framework adapters moved to :mod:`unilab_gym.sb3` and :mod:`unilab_gym.tianshou`.

``unilab_gym.integrations.sb3``, ``.sb3_replay``, ``.sb3_policies`` and ``.tianshou`` are
re-exports that emit a ``DeprecationWarning``; they go in 0.3.
"""
