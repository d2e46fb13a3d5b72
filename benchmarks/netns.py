"""Two Linux network namespaces joined by an emulated link: a veth pair with a rate limit and a one-way delay.

    head namespace                                              worker namespace
    ┌──────────────────────┐                                   ┌──────────────────────┐
    │ <tag>h0  10.231.0.1/30├── veth ── (delay line) ── veth ──┤10.231.0.2/30  <tag>w0│
    └──────────────────────┘     (link namespace <tag>l)        └──────────────────────┘

Used by ``benchmarks/bench_ray_netns.py`` (a Ray head and a worker node in separate namespaces) and by
``tests/runtime/test_netns.py``. It needs root and ``ip`` / ``tc`` from iproute2; :func:`unavailable` says why
not when it cannot run. Only the namespaces' own addresses are used (``10.231.0.1`` and ``10.231.0.2`` on a /30):
no route leads anywhere else, and forwarding is off in every namespace this module creates.

The link, per direction (a :class:`Profile`: rate and one-way delay, so a ping's round trip is twice the delay):

- **netem**, where the kernel has it (``CONFIG_NET_SCH_NETEM``): the veth pair joins the two namespaces directly,
  and each end's egress gets ``tc qdisc add dev <end> root netem delay <d>ms rate <r>`` (tc-netem(8)).
- **tbf + a delay line**, where it does not (this machine's kernel: ``tc`` answers "Specified qdisc kind is
  unknown"): each end's egress gets a token bucket, ``tc qdisc add dev <end> root tbf rate <r> burst <b> latency
  100ms`` (tc-tbf(8)), and the two ends reach each other through a third namespace where :func:`delay_line` (a
  process of this module) forwards every frame between two veth pairs after the delay. It reads frames with
  kernel receive time stamps (``SO_TIMESTAMPNS``), so a frame leaves at its arrival time + the delay, and keeps
  the kernel's segmentation offload (``PACKET_VNET_HDR``: a 64 KB TCP segment is one frame, as on a veth pair).
  Its precision is that of a Python process: ~50-100 µs of jitter on an idle machine, more on a busy one.

Tear-down (:meth:`Link.down`) kills every process whose network namespace is one of the link's (``ip netns pids``:
Ray's raylet, workers and the delay line started in them, and nothing else on the machine; ``ray stop`` is not
used because it kills every Ray process of the machine by name), deletes the veths and the namespaces. It runs on
leaving a ``with`` block, on an exception during set-up, at interpreter exit (``atexit``) and on SIGINT, SIGTERM
and SIGHUP (handlers installed by :meth:`Link.up` in the main thread). Names carry the owner's pid
(``ux<pid>h``...): :func:`sweep_stale` removes what an owner killed with SIGKILL left behind.
"""

from __future__ import annotations

import atexit
import contextlib
import heapq
import itertools
import os
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

#: Addresses of the two ends (a /30: nothing else is reachable).
HEAD_ADDR, WORKER_ADDR, PREFIX_LEN = "10.231.0.1", "10.231.0.2", 30
#: Name prefix of every namespace and interface this module creates (then the owner's pid and a role letter).
PREFIX = "ux"
_SIDES = ("head", "worker")


@dataclass(frozen=True)
class Profile:
    """One direction of the emulated link: rate (``tc`` syntax, e.g. ``"1gbit"``; ``None``: unlimited) and delay.

    :ivar name: label in results and tables.
    :ivar rate: ``tc`` rate, or ``None`` for no rate limit.
    :ivar delay_ms: one-way delay, in ms (a ping's round trip is twice this).
    """

    name: str
    rate: str | None
    delay_ms: float

    @property
    def emulated(self) -> bool:
        """Whether the link shapes anything (a rate or a delay)."""
        return self.rate is not None or self.delay_ms > 0


#: The issue's two profiles and the plain veth (baseline: no shaping).
PROFILES = {
    "veth": Profile("veth", None, 0.0),
    "1gbit-0.2ms": Profile("1gbit-0.2ms", "1gbit", 0.2),
    "100mbit-5ms": Profile("100mbit-5ms", "100mbit", 5.0),
}


def unavailable() -> str | None:
    """Why a :class:`Link` cannot be built here (not root, no ``ip``/``tc``, namespaces not permitted), or ``None``."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return "network namespaces need root (run as root, e.g. in the CI container)"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not found: apt-get install -y iproute2"
    name = f"{PREFIX}{os.getpid()}p"
    try:
        _run("ip", "netns", "add", name)
    except RuntimeError as exc:
        return f"creating a network namespace is not permitted here: {exc}"
    with contextlib.suppress(RuntimeError):
        _run("ip", "netns", "del", name)
    return None


def _run(*args: str, check: bool = True) -> str:
    """Run a command; return its stdout. Raises ``RuntimeError`` with its stderr if it fails and ``check``."""
    proc = subprocess.run(args, capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def namespaces() -> list[str]:
    """Names of the network namespaces of this machine (``ip netns list``)."""
    return [line.split()[0] for line in _run("ip", "netns", "list", check=False).splitlines() if line.strip()]


def links() -> list[str]:
    """Names of the network interfaces of the root namespace (``ip -o link``)."""
    out = _run("ip", "-o", "link", "show", check=False)
    return [m.group(1) for m in re.finditer(r"^\d+: ([^:@]+)", out, re.M)]


def _owner(name: str) -> int | None:
    m = re.fullmatch(rf"{PREFIX}(\d+)[a-z]\d?", name)
    return int(m.group(1)) if m else None


def sweep_stale() -> list[str]:
    """Delete the namespaces and root-namespace interfaces of this module whose owner process is gone."""
    import psutil

    removed = []
    for name in namespaces():
        pid = _owner(name)
        if pid is not None and not psutil.pid_exists(pid):
            _kill_namespace_pids(name)
            with contextlib.suppress(RuntimeError):
                _run("ip", "netns", "del", name)
                removed.append(name)
    for name in links():
        pid = _owner(name)
        if pid is not None and not psutil.pid_exists(pid):
            with contextlib.suppress(RuntimeError):
                _run("ip", "link", "del", name)
                removed.append(name)
    return removed


def _namespace_pids(name: str) -> list[int]:
    return [int(p) for p in _run("ip", "netns", "pids", name, check=False).split() if p.isdigit()]


def _kill_namespace_pids(name: str, grace_s: float = 3.0) -> None:
    """SIGTERM every process in namespace ``name``, SIGKILL what is left after ``grace_s``."""
    pids = [p for p in _namespace_pids(name) if p != os.getpid()]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            pids = [p for p in _namespace_pids(name) if p != os.getpid()]
            if not pids:
                return
            time.sleep(0.05)


_LIVE: list[Link] = []  # links up in this process (torn down at exit and on the signals)
_HANDLED: dict[int, Any] = {}


def _down_all() -> None:
    for link in list(_LIVE):
        link.down()


def _on_signal(signum: int, frame: Any) -> None:
    _down_all()
    previous = _HANDLED.get(signum)
    if callable(previous):
        previous(signum, frame)
    elif signum == signal.SIGINT:
        raise KeyboardInterrupt
    else:
        raise SystemExit(128 + signum)


def _install_handlers() -> None:
    if _HANDLED or threading.current_thread() is not threading.main_thread():
        return
    atexit.register(_down_all)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        _HANDLED[sig] = signal.signal(sig, _on_signal)


class Link:
    """The two namespaces and the link between them (see the module docstring); a context manager.

    Args:
        profile: rate and delay of each direction.
        netem: use netem (``True``), the tbf + delay-line fallback (``False``), or netem where the kernel has it
            (``None``, the default).
        fail_after: testing only: raise ``RuntimeError`` after this many set-up steps (to check that a
            failure mid-set-up leaves nothing behind).

    :ivar ns: ``{"head": name, "worker": name}``, the namespaces of the two ends.
    :ivar mode: ``"netem"``, ``"tbf+delay-line"`` or ``"veth"`` (no shaping) once up.
    """

    def __init__(self, profile: Profile, netem: bool | None = None, fail_after: int | None = None):
        """Name the namespaces and interfaces (nothing is created before :meth:`up`)."""
        tag = f"{PREFIX}{os.getpid()}"
        self.profile = profile
        self.ns = {"head": f"{tag}h", "worker": f"{tag}w"}
        self.link_ns = f"{tag}l"
        self.ifs = {"head": f"{tag}h0", "worker": f"{tag}w0"}  # the ends, in the head / worker namespaces
        self.peers = {"head": f"{tag}h1", "worker": f"{tag}w1"}  # their peers, in the link namespace (fallback)
        self._netem = netem
        self._fail_after = fail_after
        self._steps = 0
        self._delay_line: subprocess.Popen[bytes] | None = None
        self.mode = ""
        self.is_up = False

    # ------------------------------------------------------------------ set-up
    def _step(self, *args: str) -> None:
        if self._fail_after is not None and self._steps >= self._fail_after:
            raise RuntimeError(f"injected failure after {self._steps} set-up steps")
        self._steps += 1
        _run(*args)

    def in_ns(self, side: str, *args: str) -> list[str]:
        """``["ip", "netns", "exec", <namespace of side>, *args]`` (``side``: ``"head"``, ``"worker"``)."""
        return ["ip", "netns", "exec", self.ns[side], *args]

    def up(self) -> Link:
        """Create the namespaces, the veths, the addresses and the shaping; on any failure tear down and raise."""
        _install_handlers()
        _LIVE.append(self)
        self.is_up = True
        try:
            self._up()
        except BaseException:
            self.down()
            raise
        return self

    def _up(self) -> None:
        p = self.profile
        netem = self._netem
        if netem is None:
            netem = p.emulated and _has_netem()
        for side in _SIDES:
            self._step("ip", "netns", "add", self.ns[side])
            self._step("ip", "-n", self.ns[side], "link", "set", "lo", "up")
        direct = not p.emulated or netem
        if direct:  # one veth pair, end to end
            self._step("ip", "link", "add", self.ifs["head"], "type", "veth", "peer", "name", self.ifs["worker"])
            for side in _SIDES:
                self._step("ip", "link", "set", self.ifs[side], "netns", self.ns[side])
        else:  # two veth pairs through the link namespace, where the delay line joins them
            self._step("ip", "netns", "add", self.link_ns)
            for side in _SIDES:
                self._step("ip", "link", "add", self.ifs[side], "type", "veth", "peer", "name", self.peers[side])
                self._step("ip", "link", "set", self.ifs[side], "netns", self.ns[side])
                self._step("ip", "link", "set", self.peers[side], "netns", self.link_ns)
                self._step("ip", "-n", self.link_ns, "link", "set", self.peers[side], "up")
        for side, addr in zip(_SIDES, (HEAD_ADDR, WORKER_ADDR)):
            ns, dev = self.ns[side], self.ifs[side]
            self._step("ip", "-n", ns, "addr", "add", f"{addr}/{PREFIX_LEN}", "dev", dev)
            self._step("ip", "-n", ns, "link", "set", dev, "up")
            if p.emulated and netem:
                args = ["netem", "delay", f"{p.delay_ms}ms"] + (["rate", p.rate] if p.rate else [])
                self._step("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", *args)
            elif p.rate is not None:
                burst = "128kb" if _rate_bits(p.rate) >= 500e6 else "64kb"
                tbf = ["tbf", "rate", p.rate, "burst", burst, "latency", "100ms"]
                self._step("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", *tbf)
        self.mode = "veth" if not p.emulated else ("netem" if netem else "tbf+delay-line")
        if not direct:
            self._start_delay_line()

    def _start_delay_line(self) -> None:
        if self._fail_after is not None and self._steps >= self._fail_after:
            raise RuntimeError(f"injected failure after {self._steps} set-up steps")
        args = [sys.executable, os.path.abspath(__file__), "delay-line"]
        args += [self.peers["head"], self.peers["worker"], str(self.profile.delay_ms / 1e3)]
        self._delay_line = subprocess.Popen(
            ["ip", "netns", "exec", self.link_ns, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        assert self._delay_line.stdout is not None
        line = self._delay_line.stdout.readline()  # "ready" once its sockets are bound
        if line.strip() != b"ready":
            err = self._delay_line.stderr.read().decode() if self._delay_line.stderr else ""
            raise RuntimeError(f"the delay line did not start: {line!r} {err.strip()}")

    # ------------------------------------------------------------------ tear-down
    def down(self) -> list[str]:
        """Kill every process in the link's namespaces, delete the veths and namespaces; return what failed.

        Idempotent and best effort: each step runs even if an earlier one failed.
        """
        if not self.is_up:
            return []
        self.is_up = False
        errors = []
        names = [self.ns["head"], self.ns["worker"], self.link_ns]
        present = set(namespaces())
        for name in names:
            if name in present:
                _kill_namespace_pids(name)
        if self._delay_line is not None:
            with contextlib.suppress(Exception):
                self._delay_line.kill()
                self._delay_line.wait(5)
        for name in names:
            if name in present:  # deleting a namespace deletes the veths in it (and their peers)
                try:
                    _run("ip", "netns", "del", name)
                except RuntimeError as exc:
                    errors.append(str(exc))
        on_root = set(links())
        for name in [*self.ifs.values(), *self.peers.values()]:
            if name in on_root:  # created, not yet moved into a namespace
                try:
                    _run("ip", "link", "del", name)
                except RuntimeError as exc:
                    errors.append(str(exc))
        with contextlib.suppress(ValueError):
            _LIVE.remove(self)
        return errors

    def leftovers(self) -> list[str]:
        """The link's namespaces and interfaces that still exist (in the root namespace)."""
        ours = {*self.ns.values(), self.link_ns, *self.ifs.values(), *self.peers.values()}
        return sorted(ours & (set(namespaces()) | set(links())))

    def __enter__(self) -> Link:
        """Bring the link up (:meth:`up`)."""
        return self.up()

    def __exit__(self, *exc: Any) -> None:
        """Tear it down (:meth:`down`)."""
        self.down()

    # ------------------------------------------------------------------ use
    def ping(self, count: int = 5, interval_s: float = 0.2) -> list[float]:
        """Round trips of ``count`` pings from the head's address to the worker's, in ms (``ping`` from iputils)."""
        out = _run(*self.in_ns("head", "ping", "-n", "-c", str(count), "-i", str(interval_s), "-W", "2", WORKER_ADDR))
        return [float(m) for m in re.findall(r"time=([\d.]+) ms", out)]

    def pids(self, side: str) -> list[int]:
        """Processes whose network namespace is ``side``'s."""
        return _namespace_pids(self.ns[side])


def _rate_bits(rate: str) -> float:
    m = re.fullmatch(r"([\d.]+)([kmg]?)bit", rate.lower())
    if not m:
        raise ValueError(f"rate must look like '100mbit' or '1gbit', got {rate!r}")
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]


def _has_netem() -> bool:
    """Whether this kernel has the netem qdisc (tried on a throwaway veth in a throwaway namespace)."""
    ns = f"{PREFIX}{os.getpid()}t"
    try:
        _run("ip", "netns", "add", ns)
        _run("ip", "-n", ns, "link", "add", "nt0", "type", "veth", "peer", "name", "nt1")
        return (
            subprocess.run(
                ["tc", "-n", ns, "qdisc", "add", "dev", "nt0", "root", "netem", "delay", "1ms"], capture_output=True
            ).returncode
            == 0
        )
    except RuntimeError:
        return False
    finally:
        with contextlib.suppress(RuntimeError):
            _run("ip", "netns", "del", ns)


# ---------------------------------------------------------------------- the delay line (fallback)
_ETH_P_ALL = 0x0003
_SOL_PACKET = 263
_PACKET_VNET_HDR = 15
_PACKET_IGNORE_OUTGOING = 23
_SO_TIMESTAMPNS = 35
_SCM_TIMESTAMPNS = _SO_TIMESTAMPNS


def delay_line(a: str, b: str, delay_s: float) -> None:
    """Forward every frame between interfaces ``a`` and ``b`` (of this namespace), each after ``delay_s``.

    Frames keep their order per direction and leave at their kernel receive time + ``delay_s`` (both on
    ``CLOCK_REALTIME``, the clock of ``SO_TIMESTAMPNS``). Runs until killed; prints ``ready`` once bound.
    """
    with contextlib.suppress(Exception):  # timers to the microsecond, not Linux's default 50 µs slack
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(29, 1, 0, 0, 0)  # PR_SET_TIMERSLACK, 1 ns
    socks = []
    for name in (a, b):
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(_ETH_P_ALL))
        s.setsockopt(_SOL_PACKET, _PACKET_VNET_HDR, 1)  # GSO frames pass whole, with their offload header
        s.setsockopt(_SOL_PACKET, _PACKET_IGNORE_OUTGOING, 1)  # not the frames this process sends
        s.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        s.bind((name, 0))
        s.setblocking(False)
        socks.append(s)
    other = {socks[0].fileno(): socks[1], socks[1].fileno(): socks[0]}
    by_fd = {s.fileno(): s for s in socks}
    poller = select.epoll()
    for s in socks:
        poller.register(s.fileno(), select.EPOLLIN)
    queue: list[tuple[float, int, socket.socket, bytes]] = []  # (due, arrival number, egress, frame)
    numbers = itertools.count()
    ancsize = socket.CMSG_SPACE(16)
    print("ready", flush=True)
    while True:
        if queue:
            wait = queue[0][0] - time.time()
            if wait > 2e-3:
                events = poller.poll(wait - 1e-3)  # epoll's resolution is 1 ms: wake early, sleep the rest
            else:
                if wait > 0:
                    time.sleep(wait)
                events = poller.poll(0)
        else:
            events = poller.poll()
        for fd, _ in events:
            sock, out = by_fd[fd], other[fd]
            while True:
                try:
                    data, anc, _, _ = sock.recvmsg(1 << 18, ancsize)
                except (BlockingIOError, InterruptedError):
                    break
                arrived = time.time()
                for level, kind, value in anc:
                    if level == socket.SOL_SOCKET and kind == _SCM_TIMESTAMPNS and len(value) >= 16:
                        sec, nsec = struct.unpack("qq", value[:16])
                        arrived = sec + nsec * 1e-9
                heapq.heappush(queue, (arrived + delay_s, next(numbers), out, data))
        now = time.time()
        while queue and queue[0][0] <= now:
            _, _, out, data = heapq.heappop(queue)
            with contextlib.suppress(OSError):  # a full egress queue drops the frame, as a congested link does
                out.send(data)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "delay-line":
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        delay_line(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    else:
        print(f"usage: {sys.argv[0]} delay-line IFACE_A IFACE_B DELAY_S", file=sys.stderr)
        sys.exit(2)
