"""The metrics HTTP server under slow clients (issue 19, item 8): bounded threads, idle timeouts, joined on close."""

import socket
import threading
import time
import urllib.request

import psutil
import pytest

pytest.importorskip("stable_baselines3")
pytest.importorskip("prometheus_client")

from _ports import port_is_free
from _runner_common import ID, SMALL_ENV, make_sac, release

from unilab_gym import AsyncRunner
from unilab_gym.runtime import http_server


def half_open(port, count):
    """``count`` connections that send part of a request (every other one) or nothing, and never finish."""
    socks = []
    for i in range(count):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        if i % 2:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # no blank line: the request never ends
        socks.append(s)
    return socks


def wait_until(predicate, what, deadline_s=60.0):
    """Poll ``predicate`` until it is true; fail naming ``what`` after ``deadline_s`` (generous: a loaded 2-core
    CI machine may keep the server's thread off the CPU for seconds)."""
    deadline = time.monotonic() + deadline_s
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} (after {deadline_s} s)")
        time.sleep(0.01)


def accepted(port):
    """Connections this process's server side has accepted on ``port`` (not those still in the listen backlog)."""
    return sum(
        1
        for c in psutil.Process().net_connections("tcp")
        if c.laddr and c.laddr.port == port and c.status == psutil.CONN_ESTABLISHED
    )


# "Served in order of arrival" holds for connections the server has accepted. Beyond the listen backlog (64), the
# kernel drops a handshake's last ACK: the client sees its connection made, but the server accepts it only after a
# retransmission (~1 s later), possibly after a later connection. So the tests wait until the server has taken in
# every held connection before they scrape or close.


def test_half_open_connections_cost_no_thread_and_close_joins_everything():
    model = make_sac()
    baseline = threading.active_count()
    runner = AsyncRunner(model, env_id=ID, num_collectors=1, envs_per_collector=2, env_kwargs=SMALL_ENV, metrics_port=0)
    port = int(runner.metrics_url.rsplit(":", 1)[1].split("/")[0])
    socks = half_open(port, 200)
    try:
        wait_until(lambda: accepted(port) == 200, "the server did not accept the 200 held connections")
        # served in order of arrival: the scrape is answered after the server took in all 200 (before: 200 threads)
        text = urllib.request.urlopen(runner.metrics_url, timeout=10).read().decode()
        assert "unilab_collector_seconds_since_progress" in text
        assert threading.active_count() <= baseline + 1  # the server's one thread
        runner.close()
        assert threading.active_count() == baseline
        assert port_is_free(port)
        for s in socks:  # every connection was closed by the server
            assert s.recv(1) == b""
    finally:
        runner.close()
        for s in socks:
            s.close()
    release(model)


def test_an_idle_connection_is_closed_after_the_timeout(monkeypatch):
    monkeypatch.setattr(http_server, "IDLE_TIMEOUT_S", 0.2)
    server = http_server.BoundedHTTPServer({"/": lambda: (b"ok", "text/plain")}, 0, "127.0.0.1")
    try:
        (idle,) = half_open(server.port, 1)
        with idle:
            assert idle.recv(1) == b""  # closed by the server, not by our 10 s socket timeout
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
            s.sendall(b"GET / HTTP/1.1\r\n\r\n")
            reply = s.makefile("rb").read()
        assert reply.startswith(b"HTTP/1.1 200 OK") and reply.endswith(b"\r\n\r\nok")
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
            s.sendall(b"GET /nope HTTP/1.1\r\n\r\n")
            assert s.makefile("rb").read().startswith(b"HTTP/1.1 404")
    finally:
        server.close()
    assert server.open_connections == 0 and port_is_free(server.port)


def still_open(sock):
    """Whether the server has not closed ``sock`` (no EOF, no reset, no data waiting)."""
    sock.setblocking(False)
    try:
        return sock.recv(1) != b""
    except BlockingIOError:
        return True
    except ConnectionResetError:  # closed with part of a request unread: the kernel resets
        return False
    finally:
        sock.setblocking(True)


def closed_by_server(sock):
    """Waits (up to the socket's timeout) for the server to close ``sock``."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def scrape(port, path="/"):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\n\r\n".encode())
        return s.makefile("rb").read()


def test_more_connections_than_the_bound_evict_the_oldest_idle_one(monkeypatch):
    monkeypatch.setattr(http_server, "MAX_CONNECTIONS", 4)
    monkeypatch.setattr(http_server, "IDLE_TIMEOUT_S", 60.0)  # only eviction closes a held connection here
    server = http_server.BoundedHTTPServer({"/": lambda: (b"ok", "text/plain")}, 0, "127.0.0.1")
    socks = half_open(server.port, 6)
    try:
        # served in order of arrival: the 5th and 6th closed the two oldest held ones, and the
        # scrape (before: closed unanswered) closes the 3rd
        assert scrape(server.port).endswith(b"\r\n\r\nok")
        assert all(closed_by_server(s) for s in socks[:3])
        assert all(still_open(s) for s in socks[3:])
        assert server.open_connections == 3 and server.evicted_connections == 3
    finally:
        server.close()
        for s in socks:
            s.close()
    assert server.open_connections == 0 and port_is_free(server.port)


def test_held_connections_do_not_starve_the_metrics_endpoint(monkeypatch):
    """The issue's attack: more held connections than the bound, each one re-opened when the server
    closes it; every scrape in between is answered."""
    monkeypatch.setattr(http_server, "IDLE_TIMEOUT_S", 60.0)
    server = http_server.BoundedHTTPServer({"/metrics": lambda: (b"up 1\n", "text/plain")}, 0, "127.0.0.1")
    held = half_open(server.port, http_server.MAX_CONNECTIONS + 44)  # 300
    evicted = 44  # connections the server has closed to make room, once it took in every held one

    def taken_in():
        return server.evicted_connections == evicted and server.open_connections == http_server.MAX_CONNECTIONS

    try:
        wait_until(taken_in, f"the server did not take in the held connections ({evicted} evicted expected)")
        for _ in range(3):
            assert scrape(server.port, "/metrics").startswith(b"HTTP/1.1 200 OK")
            closed = [i for i, s in enumerate(held) if not still_open(s)]
            assert closed  # the server made room by closing held ones, oldest first
            for i in closed:  # the attacker re-opens them
                held[i].close()
                held[i] = half_open(server.port, 1)[0]
            # the scrape's room, then one per re-opened connection but the first (the finished scrape left a slot)
            evicted += len(closed)
            wait_until(taken_in, f"the server did not take in the re-opened connections ({evicted} evicted expected)")
        assert server.open_connections <= http_server.MAX_CONNECTIONS
    finally:
        server.close()
        for s in held:
            s.close()
    assert server.open_connections == 0 and port_is_free(server.port)
