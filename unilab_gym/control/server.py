"""The control HTTP API: a FastAPI app, served by uvicorn on one thread.

Routes (every ``/api/`` route needs ``Authorization: Bearer <token>``; 401 without it):

- ``GET /api/v1/hyperparams``: the current values; ``POST`` ``{"name": ..., "value": ...}`` or
  ``{"values": {...}}`` sets them (answers with the current values once applied);
- ``GET /api/v1/hyperparams/history``;
- ``GET /api/v1/snapshots``; ``POST`` ``{"include_replay": bool}`` (body optional) answers ``{"id": ...}``;
- ``POST /api/v1/snapshots/{id}/restore``;
- ``GET /api/v1/status``: counters and collector status;
- ``GET /metrics`` (no token, like any Prometheus endpoint) when a metrics app is given;
- ``GET /docs``, ``GET /openapi.json``: FastAPI's OpenAPI schema and its viewer.

Errors: 400 for a bad name or value (``{"detail": ..., "field": ...}``), 404 for an unknown
snapshot, 422 for a malformed body (FastAPI's validation error), 503 if the learner reached no
boundary in time. Nothing changes on any of them.
"""

import errno
import os
import secrets
import socket
import threading
import time
from pathlib import Path
from typing import Any

#: Environment variable that sets the token (else a random one is made).
TOKEN_ENV = "UNILAB_CONTROL_TOKEN"
#: Name of the token file in the run's directory (mode 0600).
TOKEN_FILE = "control_token"
#: How long the server may take to start or stop, in s.
START_TIMEOUT_S = 10.0

_EXTRA = 'the control API needs FastAPI and uvicorn: pip install "unilab-gym[control]"'


def _require() -> None:
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise ImportError(_EXTRA) from exc


def make_token() -> str:
    """``$UNILAB_CONTROL_TOKEN`` if set (and not empty), else 32 random bytes, URL-safe base64 (``secrets``)."""
    return os.environ.get(TOKEN_ENV) or secrets.token_urlsafe(32)


def write_token(directory: Path, token: str) -> Path:
    """Write ``token`` to ``directory / TOKEN_FILE``, readable by the owner only (0600); return the path."""
    path = Path(directory) / TOKEN_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT
        os.write(fd, token.encode())
    finally:
        os.close(fd)
    return path


def make_app(controller: Any, token: str, metrics_app: Any = None) -> Any:  # no __future__ annotations: FastAPI
    """The FastAPI app over ``controller`` (a :class:`~unilab_gym.control.controller.Controller`).

    Args:
        controller: what the routes call.
        token: the bearer token every ``/api/`` request must carry.
        metrics_app: an ASGI app mounted at ``/metrics`` (prometheus-client's), or ``None``.

    Raises:
        ImportError: FastAPI is not installed.
    """
    _require()
    from fastapi import APIRouter, Body, Depends, FastAPI, HTTPException, Request
    from fastapi.responses import JSONResponse
    from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
    from pydantic import BaseModel, ConfigDict, StrictBool
    from starlette.routing import Route

    bearer = HTTPBearer(auto_error=False)

    def authorized(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:  # noqa: B008
        if credentials is None or not secrets.compare_digest(credentials.credentials.encode(), token.encode()):
            raise HTTPException(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})

    class HyperparamsRequest(BaseModel):
        model_config = ConfigDict(extra="forbid")
        name: str | None = None
        value: Any = None
        values: dict[str, Any] | None = None

    class SnapshotRequest(BaseModel):
        model_config = ConfigDict(extra="forbid")
        include_replay: StrictBool = False

    app = FastAPI(title="unilab-gym control", version="1")
    api = APIRouter(prefix="/api/v1", dependencies=[Depends(authorized)])

    @app.middleware("http")
    async def every_api_path_needs_the_token(request: Request, call_next: Any) -> Any:
        # the router's dependency documents the scheme in OpenAPI; this also covers paths no route matches
        scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
        valid = scheme.lower() == "bearer" and secrets.compare_digest(credentials.encode(), token.encode())
        if request.url.path.startswith("/api/") and not valid:
            return JSONResponse(
                {"detail": "missing or wrong bearer token"}, status_code=401, headers={"WWW-Authenticate": "Bearer"}
            )
        return await call_next(request)

    @app.exception_handler(ValueError)
    async def bad_value(request: Request, exc: ValueError) -> JSONResponse:
        return JSONResponse({"detail": str(exc), "field": getattr(exc, "field", None)}, status_code=400)

    @app.exception_handler(KeyError)
    async def unknown(request: Request, exc: KeyError) -> JSONResponse:
        return JSONResponse({"detail": exc.args[0] if exc.args else str(exc), "field": "id"}, status_code=404)

    @app.exception_handler(TimeoutError)
    async def busy(request: Request, exc: TimeoutError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=503)

    @api.get("/hyperparams")
    def get_hyperparams() -> dict[str, Any]:
        return controller.hyperparameters()

    @api.post("/hyperparams")
    def post_hyperparams(body: HyperparamsRequest) -> dict[str, Any]:
        if (body.values is None) == (body.name is None):
            field = "values" if body.name is None else "name"
            raise HTTPException(422, f"{field}: send either {{'name': ..., 'value': ...}} or {{'values': {{...}}}}")
        values = body.values if body.values is not None else {body.name: body.value}
        return controller.set_hyperparameters(values, source="http")

    @api.get("/hyperparams/history")
    def get_history() -> list[dict[str, Any]]:
        return controller.hyperparameter_history()

    @api.get("/snapshots")
    def get_snapshots() -> list[dict[str, Any]]:
        return controller.snapshots()

    @api.post("/snapshots")
    def post_snapshot(body: SnapshotRequest | None = Body(None)) -> dict[str, str]:  # noqa: B008
        return {"id": controller.snapshot(include_replay=body.include_replay if body is not None else False)}

    @api.post("/snapshots/{snapshot_id}/restore")
    def post_restore(snapshot_id: str) -> dict[str, Any]:
        return {"id": snapshot_id, "hyperparameters": controller.restore(snapshot_id, source="http")}

    @api.get("/status")
    def get_status() -> dict[str, Any]:
        return controller.status()

    app.include_router(api)
    if metrics_app is not None:
        # a route, not a mount: a mount answers GET /metrics with a 307 redirect to /metrics/
        app.router.routes.append(
            Route("/metrics", _AsgiEndpoint(metrics_app), methods=["GET"], include_in_schema=False)
        )
    return app


class _AsgiEndpoint:
    """An ASGI app as a route endpoint (Starlette calls a non-function endpoint as an ASGI app)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)


class ControlServer:
    """Serve :func:`make_app` with uvicorn on a daemon thread; :meth:`close` stops it and releases the port.

    Args:
        controller: the :class:`~unilab_gym.control.controller.Controller` to serve.
        port: TCP port; 0 picks a free one (see :attr:`port`).
        addr: address to bind, ``127.0.0.1`` (loopback only) by default.
        token_dir: where the token file (0600) is written.
        metrics_app: an ASGI app to mount at ``/metrics``, or ``None``.

    Raises:
        ImportError: FastAPI or uvicorn is missing (``pip install "unilab-gym[control]"``).
        ValueError: a bad ``port`` or ``addr``.
        OSError: the port is in use (``errno.EADDRINUSE``) or cannot be bound; nothing is left running.
    """

    def __init__(
        self, controller: Any, port: int, addr: str = "127.0.0.1", *, token_dir: Path, metrics_app: Any = None
    ):
        from unilab_gym.validation import check_int

        _require()
        import uvicorn

        port = check_int("control_port", port, minimum=0, maximum=65535)
        if not isinstance(addr, str) or not addr:
            raise ValueError(f"control_addr must be a host name or IP address, got {addr!r}")
        #: the bearer token (``$UNILAB_CONTROL_TOKEN``, else random).
        self.token = make_token()
        app = make_app(controller, self.token, metrics_app)
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((addr, port))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise OSError(
                        errno.EADDRINUSE,
                        f"control_port {port} on {addr} is already in use; pass another port, or 0 for a free one",
                    ) from exc
                raise
            sock.listen(128)
            #: the token file (mode 0600).
            self.token_path = write_token(token_dir, self.token)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        #: whether ``/metrics`` is served here.
        self.serves_metrics = metrics_app is not None
        #: the bound port (the free one picked when asked for 0).
        self.port: int = sock.getsockname()[1]
        self.addr = addr
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="unilab-control", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.close()
                raise OSError(f"the control server on {addr}:{self.port} did not start")
            time.sleep(0.005)

    @property
    def url(self) -> str:
        """``http://<addr>:<port>`` (an IPv6 address in brackets); the API is under ``/api/v1``."""
        host = f"[{self.addr}]" if ":" in self.addr else self.addr
        return f"http://{host}:{self.port}"

    @property
    def closed(self) -> bool:
        return not self._thread.is_alive() and self._sock.fileno() == -1

    def close(self) -> None:
        """Stop serving, join the server's thread and release the port. Idempotent."""
        self._server.should_exit = True
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(START_TIMEOUT_S)
        self._sock.close()
