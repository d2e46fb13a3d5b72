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

#: run in a fresh interpreter: a sys.meta_path finder makes every unilab_gym import fail, then SAC.load
LOAD_WITHOUT_UNILAB_GYM = """
import importlib.abc, json, sys

class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "unilab_gym" or name.startswith("unilab_gym."):
            raise ImportError(f"{{name}} is not importable here")
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

model = SAC.load({path!r}, device="cpu")
obs = {obs}
action = model.predict(obs, deterministic=True)[0]
assert not [m for m in sys.modules if m.startswith("unilab_gym")]
print(json.dumps({{"action": action.tolist(), "class": model.replay_buffer_class.__name__,
                   "buffer": type(model.replay_buffer).__name__, "optimized": model.optimize_memory_usage}}))
"""


def pendulum(dict_obs):
    env = gym.make("Pendulum-v1")
    if dict_obs:
        space = spaces.Dict(state=env.observation_space)
        env = gym.wrappers.TransformObservation(env, lambda o: {"state": o}, space)
    return env


@pytest.mark.parametrize(
    "dict_obs, optimize", [(False, False), (False, True), (True, False)], ids=["plain", "optimized", "dict"]
)
def test_sac_load_works_without_unilab_gym(tmp_path, dict_obs, optimize):
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
        assert model._n_updates > 0
        model.save(tmp_path / "model")
        obs = {"state": np.array([[0.5, -0.5, 0.25]], np.float32)} if dict_obs else np.array([[0.5, -0.5, 0.25]])
        expected = model.predict(obs, deterministic=True)[0]
        # the live model keeps its settings, and trains on from its shared replay
        assert model.replay_buffer_class is SharedReplayBuffer and model.optimize_memory_usage is optimize
        model.learn(10, reset_num_timesteps=False)
        assert isinstance(model.replay_buffer, SharedReplayBuffer)
    finally:
        model.replay_buffer.close()

    obs_code = "{'state': np.array([[0.5, -0.5, 0.25]], np.float32)}" if dict_obs else "np.array([[0.5, -0.5, 0.25]])"
    code = LOAD_WITHOUT_UNILAB_GYM.format(path=str(tmp_path / "model.zip"), obs=obs_code)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(got["action"], expected, rtol=1e-6)
    # SB3's default buffer for the space: a plain SB3 file
    assert got["class"] == got["buffer"] == ("DictReplayBuffer" if dict_obs else "ReplayBuffer")
    assert got["optimized"] is False

    # with unilab_gym, the load takes the shared replay back when asked to
    again = SAC.load(
        tmp_path / "model", device="cpu", replay_buffer_class=SharedReplayBuffer, optimize_memory_usage=optimize
    )
    try:
        assert isinstance(again.replay_buffer, SharedReplayBuffer)
        assert again.replay_buffer.optimize_memory_usage is optimize
    finally:
        again.replay_buffer.close()
