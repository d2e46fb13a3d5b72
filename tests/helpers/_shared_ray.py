"""One local Ray instance shared by the test modules that need a plain local Ray (issue 28, item 3: suite time).

A Ray start and shutdown costs ~5 s on the 2-core CI machine; the modules that only need *a* local Ray
(``tests/runtime/test_every_task_runtime.py``, ``test_ingest_workers.py``, ``test_nonfinite.py``) ask for the
``local_ray`` fixture of ``tests/conftest.py`` and share this one. Every other module starts with it shut down
(``tests/conftest.py``'s autouse fixture calls :func:`stop`), so modules that build their own cluster or check
that the pool initialises Ray itself (``test_ray_backend.py``, ``test_ray_local.py``) see no Ray, in any order.
"""

from __future__ import annotations

import os

HELPERS = os.path.dirname(os.path.abspath(__file__))
#: whether the running Ray instance is the one :func:`start` began (a Ray someone else started is left alone)
_ours = False


def start():
    """The ``ray`` module with a local instance running: the shared one, started on first use.

    Four logical CPUs (the most a sharing module asks for: two collectors and two ingest workers), an 80 MiB
    object store, no dashboard, no worker logs on the driver; its workers find ``tests/helpers/`` (collectors
    unpickle the env factories there) through ``PYTHONPATH``, set for the raylet while ``ray.init`` starts it.
    """
    global _ours
    import ray

    if not ray.is_initialized():
        # the raylet that ray.init starts, and so every worker it starts, inherits this environment; a job
        # runtime_env instead would make Ray start a fresh worker for each actor (~3 s each on a loaded machine)
        before = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (HELPERS, before) if p)
        try:
            ray.init(
                address="local",
                num_cpus=4,
                include_dashboard=False,
                object_store_memory=80 << 20,
                log_to_driver=False,
                configure_logging=False,
            )
        finally:
            if before is None:
                del os.environ["PYTHONPATH"]
            else:
                os.environ["PYTHONPATH"] = before
        _ours = True
    return ray


def stop() -> None:
    """Shut the shared instance down if it is running (no-op otherwise)."""
    global _ours
    if _ours:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        _ours = False
