"""Models, settings and process checks shared by the AsyncRunner tests (sb3/ and runtime/).

Quick SAC / PPO models on a small ``UniLab/Quadruped-v0``, the runner's own ``/dev/shm`` segments, and the
check that no child process is left. ``tests/conftest.py`` puts this folder on ``sys.path``.
"""

import psutil
from stable_baselines3 import PPO, SAC

from unilab_gym import SharedReplayBuffer

ID = "UniLab/Quadruped-v0"
SMALL_ENV = dict(max_episode_steps=20, envs_per_cluster=4)


def fast():
    """Small, quick SAC/TD3 settings (a fresh dict each time: SB3 writes into policy_kwargs)."""
    return dict(batch_size=32, policy_kwargs=dict(net_arch=[32, 32]), buffer_size=5_000)


def runner_segments(runner):
    """/dev/shm paths of the runner's own segments (weights, control, on-policy the rollouts, and once
    collectors started the policy module they load)."""
    pool = runner._pool  # a ProcessCollectorPool
    names = [pool._weights.handle.name, pool._control.handle.name]
    if getattr(runner._loop, "storage", None) is not None:
        names.append(runner._loop.storage.handle.name)
    if pool._policy_segment is not None:
        names.append(pool._policy_segment.name)
    return [f"/dev/shm/{name}" for name in names]


def make_sac(**kwargs):
    from unilab_gym.sb3.vec_env import make_sb3_env

    env = make_sb3_env(ID, 1, seed=0, **SMALL_ENV)
    return SAC("MlpPolicy", env, replay_buffer_class=SharedReplayBuffer, seed=0, **{**fast(), **kwargs})


def ppo_fast():
    return dict(n_steps=16, batch_size=32, n_epochs=2, policy_kwargs=dict(net_arch=[32, 32]))


def make_ppo(n_envs, algo=PPO, **kwargs):
    """An on-policy model whose env has ``n_envs`` envs (= num_collectors * envs_per_collector)."""
    from unilab_gym.sb3.vec_env import make_sb3_env

    env = make_sb3_env(ID, n_envs, seed=0, **SMALL_ENV)
    defaults = ppo_fast() if algo is PPO else dict(n_steps=16, policy_kwargs=dict(net_arch=[32, 32]))
    return algo("MlpPolicy", env, seed=0, **{**defaults, **kwargs})


def make_model(family, n_envs):
    """A quick SAC (``"sac"``) or PPO (``"ppo"``) model for a runner with ``n_envs`` collector envs in total."""
    return make_sac(learning_starts=10) if family == "sac" else make_ppo(n_envs)


def release(model):
    """Free what the model itself owns in shared memory (SAC's replay)."""
    if isinstance(model, SAC):
        model.replay_buffer.close()


def env_fn_kwargs(family):
    """On-policy collectors need same-step autoreset from an env_fn."""
    return {} if family == "sac" else {"autoreset_mode": "SameStep"}


FAMILIES = ["sac", "ppo"]
#: the learner-loop tests run over both: the loops are the same, the pools differ
BACKENDS = ["inline", "process"]


def assert_no_children():
    kids = [p for p in psutil.Process().children(recursive=True) if "resource_tracker" not in " ".join(p.cmdline())]
    assert not kids, f"child processes left: {[(p.pid, p.cmdline()) for p in kids]}"
