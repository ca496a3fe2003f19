"""Pure-ASGI middleware for what must hold whatever a handler does: request bodies stay under the size limit
(413), and an unexpected exception is answered with a plain 500 while the connection stays usable."""
from __future__ import annotations

import json
import logging
from typing import Any, Awaitable, Callable

from .errors import INTERNAL_ERROR, error_body

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

UNLIMITED_PREFIXES = ("/api/blobs/",)  # model files are uploaded here: gigabytes, streamed to disk


class BodyTooLarge(Exception):
    """Raised from `receive` once a body passes the limit; answered with 413."""


def too_large_message(limit: int) -> str:
    return (f"request body too large: the limit is {limit} bytes ({limit / 2**20:g} MiB); send less, or raise "
            f"EVENFLOW_MAX_BODY_MB")


class LimitsMiddleware:
    """413 for bodies over `max_body` bytes (Content-Length up front, chunked bodies as they arrive; 0 = no
    limit), and a JSON 500 for exceptions nothing else handled. Starlette's own 500 handler re-raises after
    answering, which makes uvicorn drop the keep-alive connection; this one does not."""

    def __init__(self, app: ASGIApp, max_body: int) -> None:
        self.app = app
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        limit = 0 if path.startswith(UNLIMITED_PREFIXES) else self.max_body
        if limit:
            length = _content_length(scope)
            if length is not None and length > limit:
                await _answer(send, path, 413, too_large_message(limit))
                return
            receive = _counting(receive, limit)
        started = False

        async def tracking_send(message: dict) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except BodyTooLarge:
            if not started:
                await _answer(send, path, 413, too_large_message(limit))
        except Exception:  # noqa: BLE001 - the last line of defence: log it, answer 500, keep the connection
            log.exception("unhandled error on %s %s", scope.get("method"), path)
            if not started:
                await _answer(send, path, 500, INTERNAL_ERROR)


def _content_length(scope: Scope) -> int | None:
    for k, v in scope.get("headers", ()):
        if k == b"content-length":
            try:
                return int(v)
            except ValueError:
                return None
    return None


def _counting(receive: Receive, limit: int) -> Receive:
    seen = 0

    async def wrapped() -> dict:
        nonlocal seen
        msg = await receive()
        if msg["type"] == "http.request":
            seen += len(msg.get("body", b""))
            if seen > limit:
                raise BodyTooLarge()
        return msg

    return wrapped


async def _answer(send: Send, path: str, status: int, message: str) -> None:
    body = json.dumps(error_body(path, status, message)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
