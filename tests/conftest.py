"""Fixtures shared by several test files."""

import pytest
import torch as th

#: Test modules that check determinism: CI runs them again with numpy's SIMD dispatch limited (``-m determinism``).
DETERMINISM_MODULES = {"test_determinism", "test_gait_rewards", "test_domain_randomization", "test_task_seam"}
#: Tests elsewhere whose name says they check that a result reproduces.
DETERMINISM_WORDS = ("bit_for_bit", "determinis", "reproduce", "identical")


def pytest_collection_modifyitems(items):
    """Mark the determinism tests (``determinism`` marker, see ``DETERMINISM_MODULES`` and ``DETERMINISM_WORDS``)."""
    for item in items:
        module = item.module.__name__.rsplit(".", 1)[-1] if item.module is not None else ""
        if module in DETERMINISM_MODULES or any(word in item.name for word in DETERMINISM_WORDS):
            item.add_marker(pytest.mark.determinism)


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
