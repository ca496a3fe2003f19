"""The application context: what every request handler shares (settings, the model store, the model manager,
metrics, the event hub, the worker pool), typed, below the API. The server builds it; a handler reads it with
`context(request)`."""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterable, Callable, Iterator, Protocol, TypeVar

from starlette.requests import HTTPConnection

from .settings import Settings
from .discovery import Advertiser
from .events import EventHub
from .manager import ModelManager
from .model_types import ModelRecord
from .metrics import Metrics

T = TypeVar("T")


class Store(Protocol):
    """The model store as the API sees it (api/models/store_adapter.StoreAdapter: store errors as HTTP statuses)."""

    def list_models(self) -> list[dict[str, Any]]: ...
    def show(self, name: str, verbose: bool = False, system: str | None = None) -> dict[str, Any]: ...
    def resolve(self, name: str) -> ModelRecord: ...
    def create_iter(self, name: str, req: Any) -> Iterator[str]: ...
    def pull_iter(self, name: str, insecure: bool) -> Iterator[dict[str, Any]]: ...
    def push_iter(self, name: str, insecure: bool) -> Iterator[dict[str, Any]]: ...
    def copy(self, src: str, dst: str) -> None: ...
    def delete(self, name: str) -> None: ...
    def has_blob(self, digest: str) -> bool: ...
    async def write_blob(self, digest: str, chunks: AsyncIterable[bytes]) -> bool: ...
    def prune(self) -> None: ...
    def ensure_demo(self) -> None: ...


class Workers(Protocol):
    """The pool that runs a request's CPU work off the event loop (api/http/workers.WorkerPool)."""

    async def run(self, request: Any, fn: Callable[..., T], *args: Any) -> T: ...
    def shutdown(self) -> None: ...


class Closable(Protocol):
    """Something the server closes at shutdown (remote models' connection pools)."""

    async def aclose(self) -> None: ...


@dataclass
class AppContext:
    """What the app's handlers share; one per app, built by server.create_app."""

    settings: Settings
    store: Store
    manager: ModelManager
    metrics: Metrics
    events: EventHub
    workers: Workers  # requests' CPU work, off the event loop
    started: float = field(default_factory=time.time)
    closing: bool = False
    loop: asyncio.AbstractEventLoop | None = None
    warnings: list[str] = field(default_factory=list)  # shown at start and in /api/events' hello
    advertiser: Advertiser | None = None
    remote: Closable | None = None  # remote models' upstream pools and health (api/remote/hub.RemoteHub), on first use


def context(conn: HTTPConnection) -> AppContext:
    """The context of the app serving `conn` (a request)."""
    return conn.app.state.ctx
