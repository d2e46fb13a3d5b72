"""Fixtures shared by several test files."""

import pytest


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
