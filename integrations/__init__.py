"""Framework adapters: ``unilab_gym.integrations.sb3`` and ``unilab_gym.integrations.tianshou``.

Each adapter imports its framework (and torch) only when it is imported itself,
so ``import unilab_gym`` stays light.
"""
