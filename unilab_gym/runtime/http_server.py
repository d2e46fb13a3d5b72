"""A small HTTP server that slow or idle clients cannot exhaust: one thread, bounded connections, idle timeouts.

:class:`~unilab_gym.runtime.metrics.MetricsServer` serves Prometheus scrapes with it. The server
of ``prometheus_client.start_http_server`` starts one thread per connection with no timeout, so
200 half-open connections made 200 threads that outlived its shutdown (issue 19, item 8). This
one runs an ``asyncio`` event loop on a single daemon thread:

- a connection costs a coroutine, not a thread; at most :data:`MAX_CONNECTIONS` are open at once.
  A new connection beyond that closes the **oldest idle** one (a connection that has not sent its
  whole request yet), so clients that hold connections open cannot lock out a scrape (issue 29,
  item 12: 300 held connections made most scrapes fail while the newest was refused). Only if
  every open connection is being answered is the new one closed unanswered;
- a connection that has not sent its whole request (or read the reply) within
  :data:`IDLE_TIMEOUT_S` is closed;
- one request per connection (``Connection: close``), ``GET`` or ``HEAD``;
- :meth:`BoundedHTTPServer.close` cancels every connection, stops the loop, joins the thread
  and releases the port.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Callable
from urllib.parse import urlsplit

#: Most connections open at once; one more closes the oldest idle one (or, if none is idle, itself).
MAX_CONNECTIONS = 256
#: Longest a connection may take to send its request, and then to read the reply, in s.
IDLE_TIMEOUT_S = 5.0
#: Longest request head (request line and headers) read, in bytes.
MAX_HEAD_BYTES = 16 * 1024

#: What a route returns: (body, content type).
Page = tuple[bytes, str]

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 500: "Internal Server Error"}


class BoundedHTTPServer:
    """Serve ``routes`` (``{path: function returning (body, content type)}``) on ``addr:port``.

    Args:
        routes: the pages, by path (e.g. ``"/metrics"``); a function is called on the server's
            thread at every request for its path.
        port: TCP port; 0 picks a free one (see :attr:`port`).
        addr: address to bind (IPv4 or IPv6).
        name: the thread's name.

    Raises:
        OSError: the address cannot be bound (e.g. ``errno.EADDRINUSE``); nothing is left open.
    """

    def __init__(self, routes: dict[str, Callable[[], Page]], port: int, addr: str, name: str = "http-server"):
        """Bind the listening socket and start the server thread (arguments: see the class docstring)."""
        self._routes = dict(routes)
        family, _, _, _, sockaddr = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as http.server does
            sock.bind(sockaddr)
            sock.listen(64)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        #: the bound port (the free one picked when asked for 0).
        self.port: int = sock.getsockname()[1]
        self._tasks: set[asyncio.Task[None]] = set()  # the open connections, counted against the bound
        # connections still reading their request, oldest first (dicts keep insertion order)
        self._idle: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        self._evicted: set[asyncio.Task[None]] = set()  # closed for a newer one, still ending
        #: idle connections closed so far to make room for a new one.
        self.evicted_connections = 0
        self._loop = asyncio.new_event_loop()
        try:
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._handle, sock=sock, limit=MAX_HEAD_BYTES)
            )
        except BaseException:
            sock.close()
            self._loop.close()
            raise
        self._thread: threading.Thread | None = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()

    @property
    def open_connections(self) -> int:
        """Connections being served now."""
        return len(self._tasks)

    def close(self) -> None:
        """Close every connection and the listening socket, stop and join the thread. Idempotent."""
        if self._thread is None:
            return
        thread, self._thread = self._thread, None

        async def shutdown() -> None:
            self._server.close()
            tasks = self._tasks | self._evicted
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._server.wait_closed()

        with contextlib.suppress(Exception):  # a loop that already died has nothing left to close
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(IDLE_TIMEOUT_S)
        self._loop.call_soon_threadsafe(self._loop.stop)
        thread.join()
        self._loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self._tasks) >= MAX_CONNECTIONS and not self._evict_oldest_idle():
            writer.close()  # every open connection is being answered: refuse this one
            return
        self._tasks.add(task)
        self._idle[task] = writer
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), IDLE_TIMEOUT_S)
            self._idle.pop(task, None)  # a whole request: it is answered, never evicted
            status, body, content_type, method = self._respond(head)
            lines = [
                f"HTTP/1.1 {status} {_REASONS[status]}",
                f"Content-Type: {content_type}",
                f"Content-Length: {len(body)}",
                "Connection: close",
            ]
            writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
            if method != "HEAD":
                writer.write(body)
            await asyncio.wait_for(writer.drain(), IDLE_TIMEOUT_S)
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass  # idle, half-open, oversized or gone: close it
        except asyncio.CancelledError:
            pass  # close(): end quietly (asyncio logs a cancelled connection handler as an error)
        finally:
            self._tasks.discard(task)
            self._idle.pop(task, None)
            self._evicted.discard(task)
            writer.close()

    def _evict_oldest_idle(self) -> bool:
        """Close the connection that has waited longest for its request; False if none is idle."""
        if not self._idle:
            return False
        victim, writer = next(iter(self._idle.items()))
        del self._idle[victim]
        self._tasks.discard(victim)
        self._evicted.add(victim)
        writer.close()
        victim.cancel()
        self.evicted_connections += 1
        return True

    def _respond(self, head: bytes) -> tuple[int, bytes, str, str]:
        """(status, body, content type, method) for the request ``head``."""
        text = "text/plain; charset=utf-8"
        parts = head.split(b"\r\n", 1)[0].decode("latin-1").split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return 400, b"bad request\n", text, ""
        method, target = parts[0], parts[1]
        if method not in ("GET", "HEAD"):
            return 405, b"only GET and HEAD\n", text, method
        route = self._routes.get(urlsplit(target).path)
        if route is None:
            return 404, b"not found\n", text, method
        try:
            body, content_type = route()
        except Exception as exc:  # a broken page must not take the server down
            return 500, f"{type(exc).__name__}: {exc}\n".encode(), text, method
        return 200, body, content_type, method
