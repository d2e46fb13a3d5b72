"""The live hyperparameters: which ones a model takes, their valid ranges, and where SB3 reads each one.

Setting the attribute SB3 was built with is often not enough, because SB3 reads many values from
derived objects (checked against stable-baselines3 2.3 to 2.9):

==================  =========================  ===============================================================
name                models                     applied to (what SB3 reads)
==================  =========================  ===============================================================
``learning_rate``   all                        ``model.lr_schedule`` (``_update_learning_rate`` re-applies it at
                                               every ``train()``, SB3 #735, #1336) and every optimizer's
                                               ``param_groups[*]["lr"]`` at once
``gamma``           all                        ``model.gamma`` (SAC/TD3 targets, PPO timeout bootstrap) and
                                               ``rollout_buffer.gamma`` (PPO/A2C GAE), ``replay_buffer.gamma``
                                               if the buffer has one (n-step)
``ent_coef``        SAC, PPO, A2C              SAC fixed: ``ent_coef_tensor``; SAC auto: ``log_ent_coef`` reset
                                               to ``log(init)`` and its Adam state cleared (SB3 #1403);
                                               PPO/A2C: ``model.ent_coef``
``tau``             SAC, TD3, DDPG             ``model.tau`` (``polyak_update``)
``batch_size``      SAC, TD3, DDPG, PPO        ``model.batch_size``; at most the replay's capacity (off-policy) or
                                               the rollout's ``n_steps * n_envs`` (PPO)
``gradient_steps``  SAC, TD3, DDPG             ``model.gradient_steps`` (and the runner's replay ratio)
``replay_ratio``    SAC, TD3, DDPG             the runner's gradient steps per transition; plain SB3: the
                                               ``gradient_steps`` it maps to
``clip_range``      PPO                        ``model.clip_range`` (a schedule ``train()`` calls)
``n_epochs``        PPO                        ``model.n_epochs``
``max_grad_norm``   PPO, A2C                   ``model.max_grad_norm``
``max_policy_lag``  ``AsyncRunner`` only       the loop's publish / grant gate
==================  =========================  ===============================================================

Refused (``ValueError``), because they would not take effect: a string ``ent_coef`` on a SAC model
built with a fixed coefficient, and a float on one built with ``"auto"`` (SAC keeps the mode it was
built with: switching would change which tensors ``save`` writes); any name not live for the model
(e.g. ``clip_range`` on SAC, ``max_policy_lag`` without ``AsyncRunner``); ``n_steps`` / ``buffer_size``
and network sizes (they size buffers and modules).

Every value is checked against its range (:attr:`Hyperparameter.valid`, the table in
``docs/live-control.md``) before anything is applied; :meth:`Hyperparameters.save` captures what
:meth:`Hyperparameters.apply` may change, so a change (or a restore) can be undone exactly.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from unilab_gym.sb3 import _sb3_private
from unilab_gym.validation import check_int, check_real

if TYPE_CHECKING:
    from unilab_gym.sb3.loops.base import LearnerLoop
    from unilab_gym.sb3.loops.off_policy import OffPolicyLoop


class HyperparameterError(ValueError):
    """A bad hyperparameter name or value (a ``ValueError``); :attr:`field` names it."""

    def __init__(self, field: str, message: str):
        """An error about hyperparameter ``field``, with ``message``."""
        super().__init__(message)
        #: the hyperparameter's name as given.
        self.field = field


@dataclass
class Target:
    """What the hyperparameters act on.

    :ivar model: the SB3 model.
    :ivar loop: the ``AsyncRunner``'s learner loop (it owns ``replay_ratio`` and ``max_policy_lag``), or ``None``.
    """

    model: Any
    loop: LearnerLoop | None = None

    def runner_loop(self) -> LearnerLoop:
        """The runner's loop (``RuntimeError`` without one: hyperparameters that need it are not live then)."""
        if self.loop is None:
            raise RuntimeError("this hyperparameter needs an AsyncRunner's learner loop")
        return self.loop

    def replay_loop(self) -> OffPolicyLoop | None:
        """The runner's off-policy loop (it owns ``replay_ratio``), or ``None`` for a plain SB3 model.

        Called by the replay-ratio hyperparameters only, which are live for off-policy models only, whose
        runner loop is an ``OffPolicyLoop``.
        """
        return cast("OffPolicyLoop | None", self.loop)


@dataclass(frozen=True)
class Hyperparameter:
    """One live hyperparameter.

    :ivar name: its name (the SB3 constructor argument, or the ``AsyncRunner`` one).
    :ivar valid: the valid values, as error messages state them.
    :ivar live: whether the target takes it.
    :ivar check: the value as applied, or ``ValueError``.
    :ivar read: the current value.
    :ivar apply: set it where SB3 reads it.
    :ivar save: capture everything :attr:`apply` writes; returns the function that puts it back.
    """

    name: str
    valid: str
    live: Callable[[Target], bool]
    check: Callable[[Target, Any], Any]
    read: Callable[[Target], Any]
    apply: Callable[[Target, Any], None]
    save: Callable[[Target], Callable[[], None]]


def _kind(model: Any) -> str:
    """``"sac"``, ``"td3"`` (DDPG too: a TD3 with other defaults), ``"ppo"``, ``"a2c"`` or ``"other"``."""
    from unilab_gym.sb3.algorithms import algorithm_name

    name = algorithm_name(model)
    return "td3" if name == "ddpg" else name or "other"


def _off_policy(t: Target) -> bool:
    return _kind(t.model) in ("sac", "td3")


def _optimizers(model: Any) -> list[Any]:
    found = [getattr(getattr(model, name, None), "optimizer", None) for name in ("actor", "critic")]
    if not any(found):
        found = [model.policy.optimizer]
    found.append(getattr(model, "ent_coef_optimizer", None))
    return [o for o in found if o is not None]


# ------------------------------------------------------------------ learning_rate
def _set_learning_rate(t: Target, value: float) -> None:
    from stable_baselines3.common.utils import FloatSchedule, update_learning_rate

    t.model.learning_rate = value
    t.model.lr_schedule = FloatSchedule(value)
    for optimizer in _optimizers(t.model):
        update_learning_rate(optimizer, value)


# ------------------------------------------------------------------ gamma
def _set_gamma(t: Target, value: float) -> None:
    model = t.model
    model.gamma = value
    buffers = [getattr(model, "rollout_buffer", None), getattr(model, "replay_buffer", None)]
    buffers.append(getattr(t.loop, "stock_buffer", None))  # the on-policy runner swaps in its own buffer
    for buffer in buffers:
        if buffer is not None and hasattr(buffer, "gamma"):
            buffer.gamma = value
    if t.loop is not None and _kind(model) in ("ppo", "a2c"):
        warnings.warn(
            "gamma: AsyncRunner's on-policy collectors bootstrap time-limit truncations with the gamma they were "
            "started with; the GAE (learner side) uses the new one",
            stacklevel=2,
        )


# ------------------------------------------------------------------ ent_coef
def _sac_auto(model: Any) -> bool:
    return getattr(model, "ent_coef_optimizer", None) is not None


def _check_ent_coef(t: Target, value: Any) -> Any:
    model = t.model
    if _kind(model) != "sac":
        return check_real("ent_coef", value, minimum=0.0)
    if _sac_auto(model):
        init = None
        if isinstance(value, str) and value == "auto":
            init = 1.0
        elif isinstance(value, str) and value.startswith("auto_"):
            try:
                init = float(value[5:])
            except ValueError:
                init = None
        if init is None or not math.isfinite(init) or init <= 0:
            raise ValueError(
                f"ent_coef must be 'auto' or 'auto_<init>' with init > 0 (the model learns its coefficient: it was "
                f"built with ent_coef={model.ent_coef!r}; a fixed float needs a model built with one), got {value!r}"
            )
        return value
    if isinstance(value, str):
        raise ValueError(
            f"ent_coef must be a finite number >= 0 (the model was built with the fixed coefficient "
            f"{model.ent_coef!r}; 'auto' needs a model built with ent_coef='auto'), got {value!r}"
        )
    return check_real("ent_coef", value, minimum=0.0)


def _set_ent_coef(t: Target, value: Any) -> None:
    import torch as th

    model = t.model
    model.ent_coef = value
    if _kind(model) != "sac":
        return
    if _sac_auto(model):
        init = 1.0 if value == "auto" else float(value[5:])
        with th.no_grad():
            model.log_ent_coef.fill_(math.log(init))
        model.ent_coef_optimizer.state.clear()  # Adam's moments belonged to the old coefficient
    else:
        model.ent_coef_tensor = th.tensor(float(value), device=model.device)


# ------------------------------------------------------------------ replay ratio / gradient steps
def _per_call(model: Any) -> int:
    """Transitions per SB3 ``train()`` call: ``train_freq * n_envs``."""
    return int(model.train_freq.frequency) * int(model.n_envs)


#: Upper bounds of the live values that have no natural one: beyond them a run stalls (gradient steps) or
#: diverges (learning rate) without an error to roll back on. Replay ratios of high-UTD methods are ~20 gradient
#: steps per transition (REDQ, Chen et al. 2021; DroQ, Hiraoka et al. 2022): 64 leaves room above them. Adam
#: moves each weight by about ``learning_rate`` per step (Kingma and Ba 2015, sec. 2.1): above 1 a step is larger
#: than the weights themselves. PPO's epochs per rollout are 3-30 in the published settings (SB3 default 10).
MAX_REPLAY_RATIO = 64.0
MAX_LEARNING_RATE = 1.0
MAX_N_EPOCHS = 100


def _check_gradient_steps(t: Target, value: Any) -> int:
    limit = int(MAX_REPLAY_RATIO * _per_call(t.model))
    return check_int("gradient_steps", value, minimum=-1, maximum=limit)


def _set_gradient_steps(t: Target, value: int) -> None:
    t.model.gradient_steps = value
    loop = t.replay_loop()
    if loop is not None:
        loop.set_replay_ratio(1.0 if value < 0 else value / _per_call(t.model))


def _read_replay_ratio(t: Target) -> float:
    loop = t.replay_loop()
    if loop is not None:
        return float(loop.replay_ratio)
    steps = t.model.gradient_steps
    return 1.0 if steps < 0 else steps / _per_call(t.model)


def _check_replay_ratio(t: Target, value: Any) -> float:
    ratio = check_real("replay_ratio", value, minimum=0.0, maximum=MAX_REPLAY_RATIO)
    if t.loop is None:
        steps = ratio * _per_call(t.model)
        if abs(steps - round(steps)) > 1e-9:
            raise ValueError(
                f"replay_ratio must be a multiple of 1 / (train_freq * n_envs) = 1/{_per_call(t.model)} for a plain "
                f"SB3 model (it sets gradient_steps = replay_ratio * {_per_call(t.model)}), got {value!r}"
            )
    return ratio


def _set_replay_ratio(t: Target, value: float) -> None:
    steps = value * _per_call(t.model)
    if abs(steps - round(steps)) <= 1e-9:  # what a saved model keeps, when the ratio maps to whole steps
        t.model.gradient_steps = round(steps)
    loop = t.replay_loop()
    if loop is not None:
        loop.set_replay_ratio(value)


# ------------------------------------------------------------------ PPO
def _set_clip_range(t: Target, value: float) -> None:
    from stable_baselines3.common.utils import FloatSchedule

    t.model.clip_range = FloatSchedule(value)


def replay_capacity(model: Any) -> int | None:
    """Transitions the model's replay holds (``buffer_size * n_envs``, SB3's and ``SharedReplayBuffer``'s).

    ``None`` without a replay buffer.
    """
    buffer = getattr(model, "replay_buffer", None)
    if buffer is None:
        return None
    return int(buffer.buffer_size) * int(buffer.n_envs)


def _check_batch_size(t: Target, value: Any) -> int:
    model = t.model
    high: int | None
    if _kind(model) == "ppo":
        low = 2 if getattr(model, "normalize_advantage", False) else 1  # SB3 asserts > 1 to normalize advantages
        high, what = int(model.n_steps) * int(model.n_envs), "the rollout's n_steps * n_envs transitions"
    else:  # a batch is sampled from the replay: more rows than it holds is memory the run may not have
        low, high, what = 1, replay_capacity(model), "the replay's capacity (buffer_size)"
    try:
        return check_int("batch_size", value, minimum=low, maximum=high)
    except ValueError as exc:
        if high is None or not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise
        raise ValueError(f"{exc}: a batch holds at most {what}, {high}") from None


def _check_max_policy_lag(t: Target, value: Any) -> int:
    if _kind(t.model) in ("ppo", "a2c"):
        return check_int("max_policy_lag", value, minimum=0, maximum=1)
    return check_int("max_policy_lag", value, minimum=1)


def _attr(name: str) -> Callable[[Target], Any]:
    return lambda t: getattr(t.model, name)


# ------------------------------------------------------------------ save: what apply writes, to put back
def _keep(*pairs: tuple[Any, str]) -> Callable[[], None]:
    """Put back attributes ``(obj, name)`` as they are now (absent ones stay absent)."""
    kept = [(obj, name, getattr(obj, name)) for obj, name in pairs if obj is not None and hasattr(obj, name)]

    def undo() -> None:
        for obj, name, value in kept:
            setattr(obj, name, value)

    return undo


def _save_attr(name: str) -> Callable[[Target], Callable[[], None]]:
    return lambda t: _keep((t.model, name))


def _save_learning_rate(t: Target) -> Callable[[], None]:
    attrs = _keep((t.model, "learning_rate"), (t.model, "lr_schedule"))
    # by index: an optimizer's load_state_dict (a restore) replaces its param_groups dicts
    groups = [(o, i, g["lr"]) for o in _optimizers(t.model) for i, g in enumerate(o.param_groups)]

    def undo() -> None:
        attrs()
        for optimizer, i, lr in groups:
            optimizer.param_groups[i]["lr"] = lr

    return undo


def _save_gamma(t: Target) -> Callable[[], None]:
    model = t.model
    buffers = [getattr(model, "rollout_buffer", None), getattr(model, "replay_buffer", None)]
    buffers.append(getattr(t.loop, "stock_buffer", None))
    return _keep((model, "gamma"), *[(b, "gamma") for b in buffers])


def _save_ent_coef(t: Target) -> Callable[[], None]:
    model = t.model
    attrs = _keep((model, "ent_coef"), (model, "ent_coef_tensor"))
    log_ent = getattr(model, "log_ent_coef", None)
    kept = None if log_ent is None else log_ent.detach().clone()
    optimizer = getattr(model, "ent_coef_optimizer", None)
    state = None if optimizer is None else copy.deepcopy(optimizer.state_dict())

    def undo() -> None:
        import torch as th

        attrs()
        if log_ent is not None and kept is not None:
            with th.no_grad():
                log_ent.copy_(kept)
        if optimizer is not None and state is not None:
            optimizer.load_state_dict(state)

    return undo


def _save_ratio(t: Target) -> Callable[[], None]:
    attrs = _keep((t.model, "gradient_steps"))
    loop = t.replay_loop()
    ratio = None if loop is None else float(loop.replay_ratio)

    def undo() -> None:
        attrs()
        if loop is not None and ratio is not None and float(loop.replay_ratio) != ratio:
            loop.set_replay_ratio(ratio)

    return undo


def _save_policy_lag(t: Target) -> Callable[[], None]:
    return _keep((t.loop, "max_policy_lag"))


def _set_attr(name: str) -> Callable[[Target, Any], None]:
    return lambda t, v: setattr(t.model, name, v)


def _kinds(*kinds: str) -> Callable[[Target], bool]:
    return lambda t: _kind(t.model) in kinds


def _progress(t: Target) -> float:
    return _sb3_private.progress_remaining(t.model)


#: Every live hyperparameter, in the order :meth:`Hyperparameters.values` lists them.
HYPERPARAMETERS: tuple[Hyperparameter, ...] = (
    Hyperparameter(
        "learning_rate",
        "a finite number > 0 and <= 1 (MAX_LEARNING_RATE)",
        lambda t: True,
        lambda t, v: check_real("learning_rate", v, minimum=0.0, maximum=MAX_LEARNING_RATE, exclusive_minimum=True),
        lambda t: float(t.model.lr_schedule(_progress(t))),
        _set_learning_rate,
        _save_learning_rate,
    ),
    Hyperparameter(
        "gamma",
        "a finite number >= 0 and <= 1",
        lambda t: True,
        lambda t, v: check_real("gamma", v, minimum=0.0, maximum=1.0),
        lambda t: float(t.model.gamma),
        _set_gamma,
        _save_gamma,
    ),
    Hyperparameter(
        "ent_coef",
        "SAC: a float >= 0 (fixed), or 'auto' / 'auto_<init>' (learned); PPO/A2C: a float >= 0",
        _kinds("sac", "ppo", "a2c"),
        _check_ent_coef,
        lambda t: t.model.ent_coef if isinstance(t.model.ent_coef, str) else float(t.model.ent_coef),
        _set_ent_coef,
        _save_ent_coef,
    ),
    Hyperparameter(
        "tau",
        "a finite number >= 0 and <= 1",
        _off_policy,
        lambda t, v: check_real("tau", v, minimum=0.0, maximum=1.0),
        lambda t: float(t.model.tau),
        _set_attr("tau"),
        _save_attr("tau"),
    ),
    Hyperparameter(
        "batch_size",
        "an int >= 1 and <= the replay's capacity (PPO: >= 2 with normalize_advantage, <= n_steps * n_envs)",
        _kinds("sac", "td3", "ppo"),
        _check_batch_size,
        lambda t: int(t.model.batch_size),
        _set_attr("batch_size"),
        _save_attr("batch_size"),
    ),
    Hyperparameter(
        "gradient_steps",
        "an int >= -1 (-1: one per transition) and <= 64 (MAX_REPLAY_RATIO) * train_freq * n_envs",
        _off_policy,
        _check_gradient_steps,
        lambda t: int(t.model.gradient_steps),
        _set_gradient_steps,
        _save_ratio,
    ),
    Hyperparameter(
        "replay_ratio",
        "a finite number >= 0 and <= 64 (MAX_REPLAY_RATIO)",
        _off_policy,
        _check_replay_ratio,
        _read_replay_ratio,
        _set_replay_ratio,
        _save_ratio,
    ),
    Hyperparameter(
        "clip_range",
        "a finite number > 0",
        _kinds("ppo"),
        lambda t, v: check_real("clip_range", v, minimum=0.0, exclusive_minimum=True),
        lambda t: float(t.model.clip_range(_progress(t))),
        _set_clip_range,
        _save_attr("clip_range"),
    ),
    Hyperparameter(
        "n_epochs",
        "an int >= 1 and <= 100 (MAX_N_EPOCHS)",
        _kinds("ppo"),
        lambda t, v: check_int("n_epochs", v, minimum=1, maximum=MAX_N_EPOCHS),
        _attr("n_epochs"),
        _set_attr("n_epochs"),
        _save_attr("n_epochs"),
    ),
    Hyperparameter(
        "max_grad_norm",
        "a finite number > 0",
        _kinds("ppo", "a2c"),
        lambda t, v: check_real("max_grad_norm", v, minimum=0.0, exclusive_minimum=True),
        lambda t: float(t.model.max_grad_norm),
        _set_attr("max_grad_norm"),
        _save_attr("max_grad_norm"),
    ),
    Hyperparameter(
        "max_policy_lag",
        "an int >= 1 off-policy, 0 or 1 on-policy",
        lambda t: t.loop is not None,
        _check_max_policy_lag,
        lambda t: int(t.runner_loop().max_policy_lag),
        lambda t, v: setattr(t.runner_loop(), "max_policy_lag", v),
        _save_policy_lag,
    ),
)

_BY_NAME = {h.name: h for h in HYPERPARAMETERS}


class Hyperparameters:
    """The live hyperparameters of one model (and its ``AsyncRunner`` loop, if any).

    Not thread-safe: call :meth:`apply` on the learner's thread, between gradient steps
    (:class:`~unilab_gym.sb3.control.controller.Controller` does).

    Args:
        model: an SB3 ``SAC``, ``TD3``, ``DDPG``, ``PPO`` or ``A2C``.
        loop: the ``AsyncRunner``'s learner loop, or ``None`` for a plain SB3 model.
    """

    def __init__(self, model: Any, loop: LearnerLoop | None = None):
        """Find the hyperparameters ``model`` (and ``loop``) take (arguments: see the class docstring)."""
        self._target = Target(model, loop)
        self._live = [h for h in HYPERPARAMETERS if h.live(self._target)]

    def names(self) -> list[str]:
        """The names this model takes."""
        return [h.name for h in self._live]

    def values(self) -> dict[str, Any]:
        """Current values (JSON types: float, int, str for a learned SAC ``ent_coef``), by name."""
        return {h.name: h.read(self._target) for h in self._live}

    def check(self, values: dict[str, Any]) -> dict[str, Any]:
        """The values as they would be applied; nothing is applied.

        Raises:
            HyperparameterError: (a ``ValueError``) ``values`` is empty, names a hyperparameter this
                model does not take (the message lists the live ones), or a value is of the wrong type
                or out of range (the message names it and its valid range).
        """
        if not isinstance(values, dict) or not values:
            raise HyperparameterError("values", f"pass at least one hyperparameter, by name: {self.names()}")
        live = {h.name: h for h in self._live}
        out: dict[str, Any] = {}
        for name, value in values.items():
            if name not in live:
                why = "not a live hyperparameter" if name not in _BY_NAME else "not live for this model"
                raise HyperparameterError(str(name), f"{name!r} is {why}; live ones: {self.names()}")
            try:
                out[name] = live[name].check(self._target, value)
            except ValueError as exc:
                raise HyperparameterError(name, str(exc)) from None
        return out

    def save(self) -> Callable[[], None]:
        """Capture everything :meth:`apply` may change; return the function that puts it all back.

        (The attributes, optimizer learning rates, buffers' ``gamma``, SAC's ``log_ent_coef`` and its
        optimizer state, the runner's replay ratio and lag gate: :attr:`Hyperparameter.save` of each.)
        """
        undos = [h.save(self._target) for h in self._live]

        def undo() -> None:
            for put_back in reversed(undos):
                put_back()

        return undo

    def apply(self, values: dict[str, Any]) -> list[tuple[str, Any, Any]]:
        """Check ``values``, then apply all of them; return ``(name, old, new)`` per value.

        ``old`` is the value before the whole call and ``new`` the value after it (one value can move
        another: ``gradient_steps`` sets the runner's ``replay_ratio``). All or nothing: if applying
        one raises, the ones before it are put back (:meth:`save`) and the error is raised.

        Raises:
            ValueError: as :meth:`check`; nothing is applied.
        """
        checked = self.check(values)
        before = self.values()
        undo = self.save()
        try:
            for name, value in checked.items():
                _BY_NAME[name].apply(self._target, value)
        except BaseException:
            undo()
            raise
        after = self.values()
        return [(name, before[name], after[name]) for name in checked]
