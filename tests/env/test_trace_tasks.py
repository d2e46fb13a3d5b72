"""The parameter trace takes its widths and names from the task: command, termination conditions, episode
parameters (issue 27: a task's own per-episode parameters are recorded next to the physics parameters)."""

import numpy as np
import pytest
from test_task_seam import HoldPoseTask

from unilab_gym import UniLabVectorEnv
from unilab_gym.randomization import PARAMETER_NAMES
from unilab_gym.trace import ParameterTrace, read_jsonl
from unilab_gym.trace_replay import replay_env


class TargetTask(HoldPoseTask):
    """HoldPoseTask with a 2-float target command, one termination condition and two episode parameters."""

    command_dim = 2
    termination_names = ("low",)
    episode_parameter_names = ("target_size", "target_mass")

    def sample_episode(self, env, rng):
        self.command[env] = rng.uniform(-1.0, 1.0, 2)
        self.episode_parameters[env] = rng.uniform([0.02, 0.1], [0.05, 1.0])
        return super().sample_episode(env, rng)

    def evaluate(self, state, action, previous_action, restarting):
        terms, conditions = super().evaluate(state, action, previous_action, restarting)
        low = conditions[:, :1].copy()
        low[0] = True  # env 0 "falls" at every step: its episodes end with the condition held
        return terms, low


class TargetEnv(UniLabVectorEnv):
    task_type = TargetTask


def test_records_carry_the_tasks_command_conditions_and_episode_parameters(tmp_path):
    env = TargetEnv(2, max_episode_steps=3, trace_path=tmp_path / "trace.jsonl")
    try:
        env.reset(seed=1)
        drawn = {0: env.task.episode_parameters[0].copy(), 1: env.task.episode_parameters[1].copy()}
        commands = {0: env.command[0].copy(), 1: env.command[1].copy()}
        for _ in range(3):
            env.step(np.zeros((2, 12)))
        records = env.parameter_trace()
    finally:
        env.close()
    first = {r["env"]: r for r in records if r["episode"] == 0}
    assert set(first) == {0, 1}
    for i in (0, 1):
        record = first[i]
        assert list(record["parameters"]) == [*PARAMETER_NAMES, "target_size", "target_mass"]
        assert [record["parameters"]["target_size"], record["parameters"]["target_mass"]] == drawn[i].tolist()
        assert record["command"] == commands[i].tolist()
    assert first[0]["termination"] == "fall" and first[0]["fall_conditions"] == ["low"]
    assert first[1]["termination"] == "time_limit" and first[1]["length"] == 3
    header, streamed = read_jsonl(tmp_path / "trace.jsonl")
    assert streamed == records and header["env"]["max_episode_steps"] == 3


def test_a_record_with_episode_parameters_replays_its_physics_parameters():
    """replay_env fixes the physics parameters and leaves the task's to the episode seed (drawn again from it)."""
    env = TargetEnv(1, max_episode_steps=2, domain_randomization={"friction": (0.4, 1.2)})
    try:
        env.reset(seed=3)
        for _ in range(2):
            env.step(np.zeros((1, 12)))
        (record,) = env.parameter_trace()
    finally:
        env.close()
    assert "target_size" in record["parameters"]
    replayed, _, info = replay_env({}, record)
    try:
        assert info["parameters"]["friction"][0] == record["parameters"]["friction"]
        assert "target_size" not in info["parameters"]
    finally:
        replayed.close()


@pytest.mark.parametrize("bad", [np.zeros((1, 3)), np.zeros((1, 2, 1))])
def test_a_trace_of_another_width_refuses_a_command_of_the_wrong_shape(bad):
    trace = ParameterTrace(10, command_dim=2, condition_names=("low",), parameter_names=("a",))
    one = np.zeros(1, np.int64)
    with pytest.raises(ValueError):
        trace.append(one, one, one, bad, np.zeros((1, 1)), np.zeros(1), one, np.zeros(1, bool), np.zeros((1, 1), bool))
    assert len(trace) == 0
