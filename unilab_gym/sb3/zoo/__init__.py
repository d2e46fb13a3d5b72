r"""Tuned hyperparameters for rl-zoo3, shipped as YAML files (one per algorithm).

Example::

    python -m rl_zoo3.train --algo ppo --env UniLab/Quadruped-v0 --gym-packages unilab_gym \
        --conf-file "$(python -c 'import unilab_gym.sb3.zoo as h; print(h.path("ppo"))')"
"""

from __future__ import annotations

from pathlib import Path

#: Algorithms with a YAML file here.
ALGOS: tuple[str, ...] = ("ppo", "sac")


def path(algo: str) -> Path:
    """The YAML file of ``algo`` (``"ppo"`` or ``"sac"``) for rl-zoo3's ``--conf-file``.

    Raises:
        ValueError: no file for ``algo``.
    """
    if algo not in ALGOS:
        raise ValueError(f"no rl-zoo3 hyperparameters for {algo!r}; available: {list(ALGOS)}")
    return Path(__file__).with_name(f"{algo}.yml")
