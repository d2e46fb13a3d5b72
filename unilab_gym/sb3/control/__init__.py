"""Live control of a training run: hyperparameter changes, snapshots and rollback, over Python and HTTP.

- :class:`~unilab_gym.sb3.control.hyperparams.Hyperparameters`: which hyperparameters a model takes live,
  their ranges, and where SB3 reads each one (:data:`~unilab_gym.sb3.control.hyperparams.HYPERPARAMETERS`);
- :class:`~unilab_gym.sb3.control.snapshots.SnapshotStore`: snapshots as ordinary SB3 zips;
- :class:`~unilab_gym.sb3.control.controller.Controller`: applies requests on the learner's thread, keeps the history;
- :class:`~unilab_gym.sb3.control.server.ControlServer`: the authenticated FastAPI app, served by uvicorn;
- :class:`ControlCallback`: all of it for a stock SB3 ``model.learn(callback=...)``.

``AsyncRunner(..., control_port=0)`` gives the same API for a runner. The HTTP part needs the
``control`` extra (``pip install "unilab-gym[control]"``).
"""

from unilab_gym.sb3.control.controller import Controller
from unilab_gym.sb3.control.hyperparams import HYPERPARAMETERS, HyperparameterError, Hyperparameters
from unilab_gym.sb3.control.snapshots import SnapshotStore


def __getattr__(name: str) -> object:
    if name == "ControlCallback":  # imports stable_baselines3
        from unilab_gym.sb3.control.callback import ControlCallback

        return ControlCallback
    if name == "ControlServer":
        from unilab_gym.sb3.control.server import ControlServer

        return ControlServer
    raise AttributeError(f"module 'unilab_gym.sb3.control' has no attribute {name!r}")


__all__ = [
    "HYPERPARAMETERS",
    "ControlCallback",
    "ControlServer",
    "Controller",
    "HyperparameterError",
    "Hyperparameters",
    "SnapshotStore",
]
