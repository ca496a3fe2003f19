"""One INFO line per request, like Ollama's gin log: status, duration, client address, method and path.

Outermost middleware, so requests the guard refuses (401, 403, 503) and unknown routes (404) leave a trace too.
Never the query string, headers or body: they can carry prompts and keys. The path is quoted (JSON escapes), so
a crafted path cannot forge a log line. The duration runs to the last byte of the response (the end of a stream).
"""
from __future__ import annotations

import json
import logging
import time
from typing import Any, Awaitable, Callable

log = logging.getLogger("evenflow.access")

Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]
MAX_PATH = 200  # characters of the path shown


def go_duration(seconds: float) -> str:
    """A duration as Go prints one (what Ollama's log shows): 812µs, 12.345ms, 1.5s."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f}µs"
    if seconds < 1:
        return f"{seconds * 1e3:.3f}ms"
    return f"{seconds:.3f}s"


def access_line(status: int | None, seconds: float, client: str, method: str, path: str) -> str:
    shown = json.dumps(path if len(path) <= MAX_PATH else path[:MAX_PATH] + "...")
    code = f"{status:3d}" if status is not None else "---"  # the client left before any response
    return f"{code} | {go_duration(seconds):>12} | {client:>15} | {method[:10]:<7} {shown}"


class AccessLogMiddleware:
    """Logs each HTTP request once it has ended (or failed)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not log.isEnabledFor(logging.INFO):
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status: int | None = None

        async def send_logged(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_logged)
        except Exception:
            status = status or 500  # what the server answers for an exception that escaped the app
            raise
        finally:
            client = scope.get("client")
            log.info("%s", access_line(status, time.perf_counter() - start, client[0] if client else "-",
                                       scope.get("method", "?"), scope.get("path", "")))
