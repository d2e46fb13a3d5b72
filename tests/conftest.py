"""Fixtures shared by several test files, and the helpers' folder on ``sys.path``.

The tests mirror the package (docs/development.md, "Tests"): ``env/``, ``replay/``, ``runtime/``, ``sb3/``,
``tianshou/`` and ``tools/``. What several test files share (model factories, env factories that spawned
collectors import, child-process bodies) lives in ``helpers/``, one module per job; this file puts that folder
on ``sys.path`` so that test modules import them by name (``from _runner_common import make_sac``) and spawned
collectors, which inherit ``sys.path``, can unpickle what they name.
"""

import os
import sys
from pathlib import Path

import pytest
import torch as th

HELPERS = Path(__file__).resolve().parent / "helpers"
if str(HELPERS) not in sys.path:
    sys.path.insert(0, str(HELPERS))

# Tiny networks: one intra-op torch thread is faster, and idle OpenMP threads spinning after each op cost a 2-core
# machine a core. Set here once for the session, so that a run of one file measures and behaves as the full suite
# (where test modules that set it at import, e.g. sb3/test_control_server.py, made it session-wide at collection).
th.set_num_threads(1)
# The same for the Python subprocesses the tests start (examples, benchmarks, rl-zoo3, collectors, Ray workers): in
# torch's OpenMP pool the idle thread spins after each small op; rl-zoo3's 300-step SAC run took 23.5 CPU s with two
# threads and 4.5 with one. setdefault: a CI that sets OMP_NUM_THREADS keeps its own.
os.environ.setdefault("OMP_NUM_THREADS", "1")

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


@pytest.fixture(scope="module")
def local_ray():
    """The ``ray`` module with the session's shared local instance running (``helpers/_shared_ray.py``: one Ray
    start for every module that asks, instead of one per module)."""
    pytest.importorskip("ray")
    import _shared_ray

    return _shared_ray.start()


@pytest.fixture(scope="module", autouse=True)
def _shared_ray_only_where_asked(request):
    """A module none of whose tests asks for ``local_ray`` starts with the shared Ray shut down (modules that
    build their own cluster, or check that a pool initialises Ray itself, see no Ray whatever ran before)."""
    asks = (
        getattr(item, "module", None) is request.module and "local_ray" in getattr(item, "fixturenames", ())
        for item in request.session.items
    )
    if not any(asks):
        import _shared_ray

        _shared_ray.stop()
    yield


@pytest.fixture(scope="session", autouse=True)
def _stop_shared_ray():
    """Shut the shared Ray down when the session ends."""
    yield
    import _shared_ray

    _shared_ray.stop()


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
