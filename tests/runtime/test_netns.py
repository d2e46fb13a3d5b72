"""benchmarks/netns.py (issue 30, item 3): two network namespaces joined by a shaped veth link, and their tear-down.

The Ray network benchmark (``benchmarks/bench_ray_netns.py``) runs a Ray head and a worker node at the two ends;
this test checks the link itself: a ping between the two namespace addresses takes at least the profile's round
trip, and nothing is left after (no namespace, no veth, no process in them), also when set-up fails midway.
Skipped, with the reason, where the machine does not allow it (not root, no iproute2, namespaces not permitted).
"""

import os
import shutil
import subprocess
import sys
from subprocess import PIPE

import psutil
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
try:
    import netns
finally:
    sys.path.pop(0)

_reason = netns.unavailable()
if _reason is None and shutil.which("ping") is None:
    _reason = "ping not found: apt-get install -y iputils-ping"
pytestmark = pytest.mark.skipif(_reason is not None, reason=str(_reason))

PROFILE = netns.PROFILES["100mbit-5ms"]


def _ours():
    """This process's namespaces and interfaces (named after its pid)."""
    tag = f"{netns.PREFIX}{os.getpid()}"
    return sorted(n for n in netns.namespaces() + netns.links() if n.startswith(tag))


def test_ping_between_the_namespaces_takes_the_links_delay_and_nothing_is_left_after():
    assert _ours() == []
    with netns.Link(PROFILE) as link:
        assert link.mode in ("netem", "tbf+delay-line")
        assert set(link.ns.values()) <= set(netns.namespaces())
        # "ready" is printed inside the namespace: from then on the process is in it (exec keeps its pid)
        sleeper = subprocess.Popen(link.in_ns("worker", "sh", "-c", "echo ready; exec sleep 300"), stdout=PIPE)
        assert sleeper.stdout.readline() == b"ready\n"
        assert sleeper.pid in link.pids("worker")
        rtts = link.ping(count=4, interval_s=0.1)
        started = [p for side in ("head", "worker") for p in link.pids(side)]
    assert len(rtts) == 4
    # both directions delayed: a round trip is at least twice the one-way delay (ping rounds to 3 digits)
    assert min(rtts) >= 2 * PROFILE.delay_ms * 0.99, rtts
    assert sleeper.wait(5) is not None  # killed with its namespace
    sleeper.stdout.close()
    assert not [p for p in started if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert link.leftovers() == [] and _ours() == []
    assert link.down() == []  # idempotent


def test_the_unshaped_veth_links_the_two_addresses_and_is_removed():
    with netns.Link(netns.PROFILES["veth"]) as link:
        assert link.mode == "veth"
        assert len(link.ping(count=3, interval_s=0.1)) == 3  # every ping answered
    assert _ours() == []


@pytest.mark.parametrize("fail_after", [1, 4, 9, 15, 19])
def test_a_failure_mid_set_up_tears_down_what_was_built(fail_after):
    link = netns.Link(PROFILE, netem=False, fail_after=fail_after)
    with pytest.raises(RuntimeError, match="injected failure"):
        link.up()
    assert link.leftovers() == [] and _ours() == []
    assert not link.is_up


def test_a_link_left_by_a_killed_owner_is_swept():
    """What SIGKILL leaves (no handler runs): the next run's sweep_stale removes it."""
    code = (
        "import os, sys; sys.path.insert(0, sys.argv[1]); import netns; "
        "netns.Link(netns.PROFILES['veth']).up(); print(os.getpid(), flush=True); os.kill(os.getpid(), 9)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, os.path.join(ROOT, "benchmarks")], capture_output=True, text=True
    )
    pid = int(proc.stdout.split()[0])
    left = [n for n in netns.namespaces() if n.startswith(f"{netns.PREFIX}{pid}")]
    assert len(left) == 2, left
    removed = netns.sweep_stale()
    assert set(left) <= set(removed)
    assert not [n for n in netns.namespaces() + netns.links() if n.startswith(f"{netns.PREFIX}{pid}")]
