"""Whether a TCP port is free again: the metrics and control servers' tests check that close() releases theirs."""

import socket


def port_is_free(port):
    """Whether a new server can listen on the port (SO_REUSEADDR, as every HTTP server sets it: the
    server side of closed scrape connections may sit in TIME_WAIT)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            s.listen()
        except OSError:
            return False
    return True
