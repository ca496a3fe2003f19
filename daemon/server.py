"""The app factory (`create_app`) and `serve()`: FastAPI + uvicorn in one process, graceful shutdown."""
from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import time
from dataclasses import replace
from typing import Any, AsyncIterator

import uvicorn
from fastapi import FastAPI

from ..backends import gpu_report
from . import heap
from .api.anthropic import routes as anthropic
from .api.http import event_routes as events_api
from .api.http.access_log import AccessLogMiddleware
from .api.http.errors import install_handlers
from .api.http.guard import GuardMiddleware
from .api.http.limits import LimitsMiddleware
from .api.http.workers import WorkerPool
from .api.models import routes as models
from .api.models.store_adapter import make_store, record_resolver
from .api.ollama import routes as ollama
from .api.ollama.routes import VERSION
from .api.openai import routes as openai
from .api.responses import routes as responses
from .settings import Settings, exposure_error
from .context import AppContext, Store
from .discovery import MODEL_CHANGING, Advertiser
from .events import EventHub
from .manager import ModelManager
from .metrics import Metrics

log = logging.getLogger(__name__)

SHUTDOWN_GRACE_S = 5  # in-flight requests may finish for this long after SIGINT/SIGTERM; uvicorn allows 10


class ServeError(RuntimeError):
    """The server cannot start (port taken, bad address); the message says what to do."""


def security_warnings(settings: Settings) -> list[str]:
    """What a user exposing the daemon should hear loudly."""
    if settings.host.is_loopback or settings.api_key:
        return []
    return [f"INSECURE: listening on {settings.host.host}:{settings.host.port} without an API key "
            "(--insecure-no-auth): anyone who can reach this address can use the models, read /api/events and "
            "create or delete models"]


def create_app(settings: Settings, store: Store | None = None, manager: ModelManager | None = None) -> FastAPI:
    """Build the app: store (created from settings if not given), model manager, metrics, events, routes."""
    if store is None:
        store = make_store(settings)
    manager = manager or ModelManager(settings, record_resolver(store))
    metrics = Metrics()
    hub = EventHub(settings.log_content, on_drop=metrics.events_dropped.inc)
    ctx = AppContext(settings, store, manager, metrics, hub, WorkerPool(), warnings=security_warnings(settings))
    manager.add_listener(metrics.observe_event)
    manager.add_listener(hub.publish)
    if settings.advertise:
        ctx.advertiser = Advertiser(settings, VERSION, lambda: [m["name"] for m in store.list_models()])

    refreshes: set[asyncio.Task] = set()

    def on_complete(label: str, status: int) -> None:
        if ctx.advertiser is not None and label in MODEL_CHANGING and status == 200 and ctx.loop is not None:
            task = ctx.loop.create_task(_logged(ctx.advertiser.refresh(), "could not update the advertised models"))
            refreshes.add(task)  # the loop holds tasks weakly: keep each until it is done
            task.add_done_callback(refreshes.discard)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        ctx.loop = asyncio.get_running_loop()
        hub.bind(ctx.loop)
        if not settings.noprune:
            try:
                await asyncio.to_thread(store.prune)
            except Exception:  # noqa: BLE001 - a store we cannot tidy still serves
                log.warning("could not prune unreferenced blobs", exc_info=True)
        if not settings.no_demo:
            try:
                await asyncio.to_thread(store.ensure_demo)
            except Exception:  # noqa: BLE001 - the daemon serves without the demo
                log.warning("could not create the demo model", exc_info=True)
        for w in ctx.warnings:
            log.warning(w)
        trimmer = asyncio.create_task(heap.trim_periodically(), name="evenflow-malloc-trim")
        if ctx.advertiser is not None and not await _logged(ctx.advertiser.start(), "cannot advertise"):
            ctx.advertiser = None
        yield
        ctx.closing = True
        trimmer.cancel()
        if ctx.advertiser is not None:
            await _logged(ctx.advertiser.close(), "could not withdraw the zeroconf record")
        await manager.shutdown()
        if ctx.remote is not None:  # upstream pools of remote models (daemon/api/remote/)
            await ctx.remote.aclose()
        ctx.workers.shutdown()

    app = FastAPI(title="evenflow", version=VERSION, lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.ctx = ctx
    install_handlers(app)
    app.add_middleware(LimitsMiddleware, max_body=settings.max_body_mb * 2**20)  # inside the guard: it counts these
    app.include_router(ollama.router)
    app.include_router(models.router)
    app.include_router(openai.router)
    app.include_router(anthropic.router)
    app.include_router(responses.router)
    app.include_router(events_api.router)
    app.add_middleware(GuardMiddleware, origins=settings.origins, loopback=settings.host.is_loopback,
                       is_closing=lambda: ctx.closing, on_response=metrics.observe_response,
                       api_key=settings.api_key, on_complete=on_complete)
    if not settings.no_access_log:  # outermost: the guard's refusals are requests too
        app.add_middleware(AccessLogMiddleware)
    return app


async def _logged(coro: Any, what: str) -> Any:
    """Await `coro`; zeroconf trouble (no multicast route, a closed socket) is logged, never fatal."""
    try:
        return await coro
    except Exception as e:  # noqa: BLE001 - advertising is optional, serving goes on
        log.warning("%s: %s", what, e, exc_info=log.isEnabledFor(logging.DEBUG))
        return None


def bind_socket(settings: Settings) -> socket.socket:
    """Bind the listening socket ourselves so a taken port is one clear sentence, not a traceback."""
    host, port = settings.host.host, settings.host.port
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise ServeError(f"cannot resolve OLLAMA_HOST address {host!r}: {e}") from None
    family, _, _, _, addr = infos[0]
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on accepted sockets whose proto says TCP. Without it, on a
    # kept-alive connection (every Python client's default) each response's first chunk waited for the client's
    # delayed ACK of the headers: 40 ms more to the first token.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise ServeError(f"cannot listen on {host}:{port}: the port is already in use (is another evenflow or "
                             f"ollama running?). Stop it or choose another address with OLLAMA_HOST / --host.") from None
        raise ServeError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.listen(2048)
    sock.setblocking(False)
    if port == 0:  # an ephemeral port: the real one is what gets advertised and logged
        settings.host = replace(settings.host, port=sock.getsockname()[1])
    return sock


async def _drain(ctx: AppContext) -> None:
    """After the grace period, abort what still runs so every stream ends with a final line, not a cut."""
    await asyncio.sleep(SHUTDOWN_GRACE_S)
    await ctx.manager.abort_all()


class _Server:
    """uvicorn.Server that marks the app closing (503 for new requests) as soon as a signal arrives."""

    def __init__(self, app: FastAPI, config: Any) -> None:
        ctx: AppContext = app.state.ctx  # set by create_app

        class Server(uvicorn.Server):
            def handle_exit(self, sig: int, frame: Any) -> None:  # noqa: D401 - uvicorn hook
                if not ctx.closing and ctx.loop is not None:
                    log.info("signal %d: no new requests; in-flight ones get %ds, then are aborted", sig,
                             SHUTDOWN_GRACE_S)
                    ctx.loop.call_soon_threadsafe(lambda: ctx.loop.create_task(_drain(ctx)))
                    ctx.events.publish({"type": "closing", "time": time.time()})  # ends /api/events streams
                ctx.closing = True
                super().handle_exit(sig, frame)
                # uvicorn re-raises the signal after its graceful shutdown; a clean stop should exit 0
                self._captured_signals.clear()

        self.server = Server(config)


def serve(settings: Settings, log_level: str = "info") -> None:
    """Run the daemon until SIGINT/SIGTERM; raises ServeError when it cannot start."""
    refusal = exposure_error(settings)
    if refusal:
        raise ServeError(refusal)
    sock = bind_socket(settings)
    gpu_report.log_report()  # the llama.cpp build, its devices, an NVIDIA GPU it would leave unused
    app = create_app(settings)
    tls = {"ssl_certfile": str(settings.tls_cert), "ssl_keyfile": str(settings.tls_key)} if settings.tls_cert else {}
    config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=10, access_log=False, **tls)
    log.info("evenflow listening on %s (backend %s, store %s; %s)", settings.host.url, settings.backend,
             settings.models, f"API key from {settings.api_key_source}" if settings.api_key else "no API key")
    _Server(app, config).server.run(sockets=[sock])
    log.info("evenflow stopped")
