"""A model built with ``replay_buffer_class=SharedReplayBuffer`` saves as a plain SB3 file (issue 26, item 5):
``SAC.load`` works and predicts in a process where unilab_gym cannot be imported."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

pytest.importorskip("stable_baselines3")
from stable_baselines3 import SAC

from unilab_gym import SharedReplayBuffer

#: run in ONE fresh interpreter for the module's cases (a new Python with SB3 and torch costs ~3 CPU s): a
#: sys.meta_path finder makes every unilab_gym import fail, then SAC.load for each case in turn. argv[1] is a JSON
#: list of {"case", "path", "dict_obs"}; each case's result (or its traceback) is printed as one JSON object
#: keyed by case, so a failing case fails its own test with its own message.
LOAD_WITHOUT_UNILAB_GYM = """
import importlib.abc, json, sys, traceback

class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "unilab_gym" or name.startswith("unilab_gym."):
            raise ImportError(f"{name} is not importable here")
        return None

sys.meta_path.insert(0, Blocked())
try:
    import unilab_gym  # noqa: F401
except ImportError:
    pass
else:
    raise SystemExit("the blocker does not work")

import numpy as np
from stable_baselines3 import SAC

results = {}
for case in json.loads(sys.argv[1]):
    try:
        model = SAC.load(case["path"], device="cpu")
        obs = ({"state": np.array([[0.5, -0.5, 0.25]], np.float32)} if case["dict_obs"]
               else np.array([[0.5, -0.5, 0.25]]))
        action = model.predict(obs, deterministic=True)[0]
        assert not [m for m in sys.modules if m.startswith("unilab_gym")]
        results[case["case"]] = {"action": action.tolist(), "class": model.replay_buffer_class.__name__,
                                 "buffer": type(model.replay_buffer).__name__,
                                 "optimized": model.optimize_memory_usage}
    except BaseException:
        results[case["case"]] = {"error": traceback.format_exc()}
print(json.dumps(results))
"""

CASES = {"plain": (False, False), "optimized": (False, True), "dict": (True, False)}  # id: (dict_obs, optimize)


def pendulum(dict_obs):
    env = gym.make("Pendulum-v1")
    if dict_obs:
        space = spaces.Dict(state=env.observation_space)
        env = gym.wrappers.TransformObservation(env, lambda o: {"state": o}, space)
    return env


def train_and_save(folder, dict_obs, optimize):
    """``(model, expected action)``: a SAC with the shared replay, trained 40 steps and saved to ``folder/model``."""
    model = SAC(
        "MultiInputPolicy" if dict_obs else "MlpPolicy",
        pendulum(dict_obs),
        buffer_size=200,
        learning_starts=20,
        batch_size=16,
        policy_kwargs=dict(net_arch=[16]),
        seed=0,
        device="cpu",
        replay_buffer_class=SharedReplayBuffer,
        optimize_memory_usage=optimize,
        replay_buffer_kwargs={"final_obs_capacity": 20} if optimize else None,
    )
    try:
        model.learn(40)
        model.save(folder / "model")
        obs = {"state": np.array([[0.5, -0.5, 0.25]], np.float32)} if dict_obs else np.array([[0.5, -0.5, 0.25]])
        return model, model.predict(obs, deterministic=True)[0]
    except BaseException:
        model.replay_buffer.close()
        raise


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """``{case: (folder, model, expected action, standalone result)}`` for every case of ``CASES``; a case whose
    training failed holds the exception instead. The standalone loads run in one fresh interpreter."""
    built: dict = {}
    for case, (dict_obs, optimize) in CASES.items():
        folder = tmp_path_factory.mktemp(f"sac_{case}")
        try:
            built[case] = (folder, *train_and_save(folder, dict_obs, optimize))
        except Exception as error:  # reported by that case's test
            built[case] = error
    todo = [
        {"case": c, "path": str(b[0] / "model.zip"), "dict_obs": CASES[c][0]}
        for c, b in built.items()
        if not isinstance(b, Exception)
    ]
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(LOAD_WITHOUT_UNILAB_GYM), json.dumps(todo)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    results = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 and out.stdout.strip() else {}
    try:
        yield {
            c: b if isinstance(b, Exception) else (*b, results.get(c, {"error": out.stderr[-3000:]}))
            for c, b in built.items()
        }
    finally:
        for b in built.values():
            if not isinstance(b, Exception):
                b[1].replay_buffer.close()


@pytest.mark.parametrize("case", list(CASES))
def test_sac_load_works_without_unilab_gym(saved, case):
    dict_obs, optimize = CASES[case]
    if isinstance(saved[case], Exception):
        raise saved[case]
    folder, model, expected, got = saved[case]
    try:
        assert model._n_updates > 0
        # the live model keeps its settings, and trains on from its shared replay
        assert model.replay_buffer_class is SharedReplayBuffer and model.optimize_memory_usage is optimize
        model.learn(10, reset_num_timesteps=False)
        assert isinstance(model.replay_buffer, SharedReplayBuffer)
    finally:
        model.replay_buffer.close()

    assert "error" not in got, f"{case}: SAC.load without unilab_gym failed:\n{got.get('error')}"
    np.testing.assert_allclose(got["action"], expected, rtol=1e-6)
    # SB3's default buffer for the space: a plain SB3 file
    assert got["class"] == got["buffer"] == ("DictReplayBuffer" if dict_obs else "ReplayBuffer")
    assert got["optimized"] is False

    # with unilab_gym, the load takes the shared replay back when asked to
    again = SAC.load(
        folder / "model", device="cpu", replay_buffer_class=SharedReplayBuffer, optimize_memory_usage=optimize
    )
    try:
        assert isinstance(again.replay_buffer, SharedReplayBuffer)
        assert again.replay_buffer.optimize_memory_usage is optimize
    finally:
        again.replay_buffer.close()
