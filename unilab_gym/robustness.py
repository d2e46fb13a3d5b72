"""Kept so that ``python -m unilab_gym.robustness ...`` still works: it runs ``unilab-gym robustness ...``.

The tool lives in :mod:`unilab_gym.cli.robustness`.
"""

from unilab_gym.cli.robustness import main

if __name__ == "__main__":
    main()
