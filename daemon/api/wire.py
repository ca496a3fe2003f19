"""What the replies of both APIs share on the wire: Ollama's timestamps, NDJSON lines and SSE events, and a
streamed response that frees what it reads from however it ends."""
from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, AsyncIterator, Callable

from fastapi.responses import StreamingResponse

from .errors import APIError


def now_rfc3339() -> str:
    """Go's RFC3339Nano in UTC (9 fractional digits are fine for every client; we give 6)."""
    return datetime.now(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def rfc3339(ts: float) -> str:
    if ts == float("inf") or ts > 4e10:
        ts = 4e10  # "forever": far in the future (year 3237), still a valid timestamp
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def openai_error(message: str) -> dict[str, Any]:
    """An error told inside an SSE stream (its status line has gone out)."""
    return {"error": {"message": message, "type": "api_error", "param": None, "code": None}}


@dataclass(frozen=True)
class Wire:
    """A streamed body's format: how one object is framed, how an error after the first byte is told, its end."""

    media_type: str
    frame: Callable[[dict[str, Any]], bytes]
    error: Callable[[str], bytes]
    end: bytes = b""


NDJSON = Wire("application/x-ndjson",
              lambda obj: (json.dumps(obj, ensure_ascii=False) + "\n").encode(),
              lambda message: (json.dumps({"error": message}) + "\n").encode())
SSE = Wire("text/event-stream",
           lambda obj: f"data: {json.dumps(obj, ensure_ascii=False)}\n\n".encode(),
           lambda message: f"data: {json.dumps(openai_error(message))}\n\n".encode(),
           b"data: [DONE]\n\n")


class ClosingStreamingResponse(StreamingResponse):
    """A StreamingResponse that calls `close` (plain or async) however the response ends, so freeing what it
    streams from does not depend on whether the server and starlette ever get to start the body (a body
    cancelled before its first step runs no `finally`)."""

    def __init__(self, content: AsyncIterator[bytes], close: Callable[[], Any], media_type: str,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(content, media_type=media_type, headers=headers)
        self.on_close = close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            closing = self.on_close()
            if inspect.isawaitable(closing):
                await closing


def streamed(wire: Wire, objs: AsyncIterator[dict[str, Any]], close: Callable[[], Any],
             headers: dict[str, str] | None = None) -> ClosingStreamingResponse:
    """`objs` framed as `wire` (with `headers`); an APIError after the first byte becomes the wire's error, then its
    end."""

    async def body() -> AsyncIterator[bytes]:
        try:
            async for obj in objs:
                yield wire.frame(obj)
        except APIError as e:
            yield wire.error(e.message)
        if wire.end:
            yield wire.end

    return ClosingStreamingResponse(body(), close, wire.media_type, headers)
