"""Fixtures shared by several test files."""

import pytest
import torch as th


@pytest.fixture
def closing():
    """``closing(env) -> env``: close every env the test passed through it when the test ends."""
    envs = []

    def _keep(env):
        envs.append(env)
        return env

    yield _keep
    for env in envs:
        env.close()


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny networks: one intra-op torch thread is faster, and immune to a busy machine (restored after the module)."""
    before = th.get_num_threads()
    th.set_num_threads(1)
    yield
    th.set_num_threads(before)
