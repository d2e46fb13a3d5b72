"""A local Ray is local (issue 29, item 11): with ``ray_address=None`` the Ray backend starts its own
instance and never joins a cluster that Ray's address lookup finds; ``"auto"`` keeps Ray's meaning.

A second Ray cluster (``ray.cluster_utils.Cluster`` in a child process) runs on the machine, under
its own ``RAY_TMPDIR`` so that its ``ray_current_cluster`` file is this test's and no other job's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

import pytest

ray = pytest.importorskip("ray")

from unilab_gym.runtime.pool import CollectorSetup  # noqa: E402
from unilab_gym.runtime.ray_pool import RayCollectorPool  # noqa: E402

#: the other job's cluster: prints its GCS address, runs until its stdin closes, then shuts down.
OTHER_CLUSTER = """
import sys
from ray.cluster_utils import Cluster
cluster = Cluster(initialize_head=True, connect=False,
                  head_node_args=dict(num_cpus=1, include_dashboard=False, object_store_memory=80 << 20))
try:
    print(cluster.address, flush=True)
    sys.stdin.read()
finally:
    cluster.shutdown()
"""


@pytest.fixture(scope="module")
def other_cluster():
    """``(gcs address, RAY_TMPDIR)`` of a Ray cluster that this process did not start."""
    if ray.is_initialized():
        pytest.skip("Ray is already initialised in this process")
    tmp = tempfile.mkdtemp(prefix="r29-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_TMPDIR"] = tmp
    child = subprocess.Popen(
        [sys.executable, "-c", OTHER_CLUSTER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True
    )
    try:
        address = child.stdout.readline().strip()  # blocks until the cluster is up (or the child died)
        assert address, f"the other Ray cluster did not start (exit code {child.poll()})"
        with open(os.path.join(tmp, "ray", "ray_current_cluster")) as f:
            assert f.read().strip() == address  # Ray's lookup finds it
        yield address, tmp
    finally:
        child.stdin.close()
        try:
            child.wait(timeout=60)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def setup():
    """Enough of a setup for the pool's constructor (no collector is started)."""
    return CollectorSetup(num_collectors=1, envs_per_collector=1, seed=0, policy=None, weights_size=1, writers=())


def joined(ray_address):
    """The GCS address of the Ray that ``RayCollectorPool(ray_address=...)`` initialises."""
    assert not ray.is_initialized()
    pool = RayCollectorPool(setup(), ray_address=ray_address)
    try:
        return ray.get_runtime_context().gcs_address
    finally:
        pool.close()
        assert not ray.is_initialized()  # the pool shuts down (or disconnects from) the Ray it initialised


@pytest.mark.parametrize("lookup", ["ray_current_cluster", "RAY_ADDRESS"])
def test_none_starts_a_local_ray_and_never_joins_another_cluster(other_cluster, monkeypatch, lookup):
    address, tmp = other_cluster
    monkeypatch.setenv("RAY_TMPDIR", tmp)  # Ray's lookup reads <RAY_TMPDIR>/ray/ray_current_cluster
    if lookup == "RAY_ADDRESS":
        monkeypatch.setenv("RAY_ADDRESS", address)
    else:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    own = joined(None)
    assert own and own != address


def test_auto_keeps_rays_meaning_and_joins_the_cluster_it_finds(other_cluster, monkeypatch):
    address, tmp = other_cluster
    monkeypatch.setenv("RAY_TMPDIR", tmp)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert joined("auto") == address
