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
import fcntl
import os
import secrets
import socket
import stat
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Protocol

#: Environment variable that sets the token (else a random one is made).
TOKEN_ENV = "UNILAB_CONTROL_TOKEN"
#: Name of the token file in the run's directory (mode 0600).
TOKEN_FILE = "control_token"
#: How long the server may take to start or stop, in s.
START_TIMEOUT_S = 10.0

_EXTRA = 'the control API needs FastAPI and uvicorn: pip install "unilab-gym[control]"'


def require_control_extra() -> None:
    """Raise ``ImportError`` (naming the ``control`` extra) if FastAPI or uvicorn is missing."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise ImportError(_EXTRA) from exc


def make_token() -> str:
    """``$UNILAB_CONTROL_TOKEN`` if set (and not empty), else 32 random bytes, URL-safe base64 (``secrets``)."""
    return os.environ.get(TOKEN_ENV) or secrets.token_urlsafe(32)


class TokenFile:
    """The run's token file, ``<directory>/control_token``, mode 0600, held (``flock``) while the run lives.

    Written atomically and never through a link: the token goes to a new temporary file, created with
    ``O_CREAT | O_EXCL | O_NOFOLLOW`` and mode 0600 (so no other user can open it at any time, and a
    link placed at that name makes the open fail), then ``os.replace`` moves it to its name. A reader
    therefore sees the old file or the whole new one, never a partial token; and a symbolic link put at
    ``control_token`` is replaced itself (``rename`` does not follow it): its target is never opened.

    A live run keeps its token file locked (``flock(LOCK_EX)`` on the open file). If another live run
    in the same directory holds ``control_token``, this run's token goes to
    ``control_token-<run id>`` instead (with a warning); a token file no live run holds (one left by
    an earlier run of a resumed job) is replaced. Runs starting at the same moment take turns under
    a lock on ``.control_token.lock`` in the directory.

    Args:
        directory: the run's directory.
        token: the token to write.
        run_id: this run's id (names the temporary file, and the file used when ``control_token`` is taken).

    Raises:
        OSError: the file cannot be written; nothing is left behind.
    """

    def __init__(self, directory: str | os.PathLike[str], token: str, run_id: str):
        """Write and lock the token file (arguments and errors: see the class docstring)."""
        directory = Path(directory)
        serialize = _lock_directory(directory)
        try:
            tmp = directory / f".{TOKEN_FILE}.{run_id}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                os.fchmod(fd, 0o600)  # the umask can only take bits away; say it anyway
                data = token.encode()
                while data:
                    data = data[os.write(fd, data) :]
                os.fsync(fd)
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a fresh inode: nobody else holds it
                path = directory / TOKEN_FILE
                if _held(path):
                    taken, path = path, directory / f"{TOKEN_FILE}-{run_id}"
                    warnings.warn(
                        f"{taken} belongs to another live run; this run's control token is in {path}",
                        stacklevel=3,
                    )
                os.replace(tmp, path)
            except BaseException:
                os.close(fd)
                tmp.unlink(missing_ok=True)
                raise
        finally:
            if serialize is not None:
                os.close(serialize)  # releases the directory lock
        self._fd: int | None = fd
        #: where the token is (``control_token``, or ``control_token-<run id>`` if another live run holds that).
        self.path = path

    def close(self) -> None:
        """Release the file (another run may then take its name); the file stays. Idempotent."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _lock_directory(directory: Path) -> int | None:
    """``.control_token.lock`` in ``directory``, open and locked (``flock``); ``None`` if it cannot be had."""
    try:
        fd = os.open(directory / f".{TOKEN_FILE}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:  # e.g. a link placed at its name: go on without it (it only orders simultaneous starts)
        return None
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _held(path: Path) -> bool:
    """Whether ``path`` is a token file a live run holds (a regular file, locked with ``flock``)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:  # absent, or a link (replaced below, never followed)
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False
    finally:
        os.close(fd)


def write_token(directory: Path, token: str) -> Path:
    """Write ``token`` to ``directory / TOKEN_FILE`` as :class:`TokenFile` does, not held; return the path."""
    from unilab_gym.sb3.control.snapshots import new_run_id

    token_file = TokenFile(directory, token, new_run_id())
    token_file.close()
    return token_file.path


class ControlTarget(Protocol):
    """What the API's routes call: a :class:`~unilab_gym.sb3.control.controller.Controller`, or a stand-in.

    ``ControlCallback``'s stand-in forwards to its controller, and answers 503 until the callback has a model.
    """

    def hyperparameters(self) -> dict[str, Any]:
        """The current values."""
        ...

    def set_hyperparameters(self, values: dict[str, Any], source: str = "python") -> dict[str, Any]:
        """Apply ``values``; return the current values."""
        ...

    def hyperparameter_history(self) -> list[dict[str, Any]]:
        """The changes, oldest first."""
        ...

    def snapshot(self, include_replay: bool = False) -> str:
        """Take a snapshot; return its id."""
        ...

    def snapshots(self) -> list[dict[str, Any]]:
        """The snapshots, oldest first."""
        ...

    def restore(self, snapshot_id: str, source: str = "python") -> dict[str, Any]:
        """Roll back to ``snapshot_id``; return the hyperparameters in force."""
        ...

    def status(self) -> dict[str, Any]:
        """The run's status."""
        ...


class _Target:
    """What the app's routes call, dropped on :meth:`ControlServer.close`.

    FastAPI keeps every endpoint function in a module-level cache for the life of the process, so
    the routes must not close over the controller (and through it the model) themselves.
    """

    def __init__(self, controller: ControlTarget, token: str):
        self.controller: ControlTarget | None = controller
        self.token: str | None = token

    def get(self) -> ControlTarget:
        if self.controller is None:
            raise TimeoutError("the control server is closed")
        return self.controller

    def valid(self, credentials: str) -> bool:
        token = self.token
        return token is not None and secrets.compare_digest(credentials.encode(), token.encode())

    def drop(self) -> None:
        self.controller = self.token = None


def make_app(
    controller: ControlTarget, token: str, metrics_app: Any = None
) -> Any:  # no __future__ annotations: FastAPI
    """The FastAPI app over ``controller`` (a :class:`~unilab_gym.sb3.control.controller.Controller`).

    Args:
        controller: what the routes call.
        token: the bearer token every ``/api/`` request must carry.
        metrics_app: an ASGI app mounted at ``/metrics`` (prometheus-client's), or ``None``.

    Raises:
        ImportError: FastAPI is not installed.
    """
    require_control_extra()
    from fastapi import FastAPI
    from starlette.routing import Route

    target = _Target(controller, token)  # the routes reach the controller only through it (see _Target)
    del controller, token
    app = FastAPI(title="unilab-gym control", version="1")
    _guard(app, target)
    app.include_router(_api_router(target))
    app.state.unilab_target = target  # ControlServer.close drops what it holds
    if metrics_app is not None:
        # a route, not a mount: a mount answers GET /metrics with a 307 redirect to /metrics/
        app.router.routes.append(
            Route("/metrics", _AsgiEndpoint(metrics_app), methods=["GET"], include_in_schema=False)
        )
    return app


def _guard(app: Any, target: _Target) -> None:
    """Refuse every ``/api/`` request without the token (401), and map errors to statuses (400, 404, 503)."""
    from fastapi import Request
    from fastapi.responses import JSONResponse

    @app.middleware("http")
    async def every_api_path_needs_the_token(request: Request, call_next: Any) -> Any:
        # the router's dependency documents the scheme in OpenAPI; this also covers paths no route matches
        scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
        valid = scheme.lower() == "bearer" and target.valid(credentials)
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


def _api_router(target: _Target) -> Any:
    """The ``/api/v1`` routes over ``target``, each behind the bearer token (documented in OpenAPI)."""
    from fastapi import APIRouter, Body, Depends, HTTPException
    from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
    from pydantic import BaseModel, ConfigDict, StrictBool

    bearer = HTTPBearer(auto_error=False)

    def authorized(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:  # noqa: B008
        if credentials is None or not target.valid(credentials.credentials):
            raise HTTPException(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})

    class HyperparamsRequest(BaseModel):
        model_config = ConfigDict(extra="forbid")
        name: str | None = None
        value: Any = None
        values: dict[str, Any] | None = None

    class SnapshotRequest(BaseModel):
        model_config = ConfigDict(extra="forbid")
        include_replay: StrictBool = False

    api = APIRouter(prefix="/api/v1", dependencies=[Depends(authorized)])

    @api.get("/hyperparams")
    def get_hyperparams() -> dict[str, Any]:
        return target.get().hyperparameters()

    @api.post("/hyperparams")
    def post_hyperparams(body: HyperparamsRequest) -> dict[str, Any]:
        if (body.values is None) == (body.name is None):
            field = "values" if body.name is None else "name"
            raise HTTPException(422, f"{field}: send either {{'name': ..., 'value': ...}} or {{'values': {{...}}}}")
        values = body.values if body.values is not None else {str(body.name): body.value}
        return target.get().set_hyperparameters(values, source="http")

    @api.get("/hyperparams/history")
    def get_history() -> list[dict[str, Any]]:
        return target.get().hyperparameter_history()

    @api.get("/snapshots")
    def get_snapshots() -> list[dict[str, Any]]:
        return target.get().snapshots()

    @api.post("/snapshots")
    def post_snapshot(body: SnapshotRequest | None = Body(None)) -> dict[str, str]:  # noqa: B008
        return {"id": target.get().snapshot(include_replay=body.include_replay if body is not None else False)}

    @api.post("/snapshots/{snapshot_id}/restore")
    def post_restore(snapshot_id: str) -> dict[str, Any]:
        return {"id": snapshot_id, "hyperparameters": target.get().restore(snapshot_id, source="http")}

    @api.get("/status")
    def get_status() -> dict[str, Any]:
        return target.get().status()

    return api


class _AsgiEndpoint:
    """An ASGI app as a route endpoint (Starlette calls a non-function endpoint as an ASGI app)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)


class ControlServer:
    """Serve :func:`make_app` with uvicorn on a daemon thread; :meth:`close` stops it and releases the port.

    Args:
        controller: the :class:`~unilab_gym.sb3.control.controller.Controller` to serve.
        port: TCP port; 0 picks a free one (see :attr:`port`).
        addr: address to bind, ``127.0.0.1`` (loopback only) by default.
        token_dir: where the token file (0600, :class:`TokenFile`) is written.
        metrics_app: an ASGI app to mount at ``/metrics``, or ``None``.
        run_id: the run's id (:attr:`SnapshotStore.run_id <unilab_gym.sb3.control.snapshots.SnapshotStore.run_id>`),
            which names the token file if another live run holds ``control_token``; default a new one.

    Raises:
        ImportError: FastAPI or uvicorn is missing (``pip install "unilab-gym[control]"``).
        ValueError: a bad ``port`` or ``addr``.
        OSError: the port is in use (``errno.EADDRINUSE``) or cannot be bound; nothing is left running.
    """

    def __init__(
        self,
        controller: ControlTarget,
        port: int,
        addr: str = "127.0.0.1",
        *,
        token_dir: Path,
        metrics_app: Any = None,
        run_id: str | None = None,
    ):
        """Bind the port, write the token file and start the server thread (arguments: see the class docstring)."""
        from unilab_gym.sb3.control.snapshots import new_run_id
        from unilab_gym.validation import check_int

        require_control_extra()
        import uvicorn

        port = check_int("control_port", port, minimum=0, maximum=65535)
        if not isinstance(addr, str) or not addr:
            raise ValueError(f"control_addr must be a host name or IP address, got {addr!r}")
        #: the bearer token (``$UNILAB_CONTROL_TOKEN``, else random).
        self.token = make_token()
        app = make_app(controller, self.token, metrics_app)
        self._target: _Target = app.state.unilab_target
        del controller
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
            self._token_file = TokenFile(token_dir, self.token, run_id or new_run_id())
        except BaseException:
            sock.close()
            self._target.drop()
            raise
        #: the token file (mode 0600): ``control_token`` in ``token_dir``, unless another live run holds it.
        self.token_path = self._token_file.path
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
        """Whether the server thread has stopped and its socket is closed."""
        return not self._thread.is_alive() and self._sock.fileno() == -1

    def close(self) -> None:
        """Stop serving, join the server's thread, release the port and the token file. Idempotent.

        Drops every reference the app, the uvicorn server and the thread hold to the controller (and
        so to the model and the runner): FastAPI caches endpoint functions for the life of the process.
        """
        self._server.should_exit = True
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(START_TIMEOUT_S)
        self._sock.close()
        self._token_file.close()
        self._target.drop()
