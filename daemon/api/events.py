"""`/api/events` (NDJSON stream of engine and request events) and `/metrics` (Prometheus text)."""
from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

log = logging.getLogger(__name__)

QUEUE_SIZE = 1024  # per subscriber; a reader this far behind loses events (counted), the engine never waits
_CONTENT_KEYS = ("text", "prompt")


class EventHub:
    """Fans engine events (any thread) out to /api/events subscribers on the event loop, bounded per reader."""

    def __init__(self, log_content: bool, on_drop=None) -> None:
        self.log_content = log_content
        self.on_drop = on_drop
        self.loop: asyncio.AbstractEventLoop | None = None
        self._subs: list[_Subscriber] = []

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    @property
    def has_subscribers(self) -> bool:
        return bool(self._subs)

    def publish(self, event: dict[str, Any]) -> None:
        """Engine-thread safe: one hop onto the loop, nothing done when nobody listens."""
        if not self._subs or self.loop is None:
            return
        ev = self._redact(event)
        try:
            self.loop.call_soon_threadsafe(self._deliver, ev)
        except RuntimeError:  # loop closed during shutdown
            pass

    def _redact(self, event: dict[str, Any]) -> dict[str, Any]:
        if self.log_content:
            return event
        ev = {k: v for k, v in event.items() if k not in _CONTENT_KEYS}
        user = ev.get("user")
        if isinstance(user, dict) and any(k in user for k in _CONTENT_KEYS):
            ev["user"] = {k: v for k, v in user.items() if k not in _CONTENT_KEYS}
        return ev

    def _deliver(self, ev: dict[str, Any]) -> None:
        for sub in self._subs:
            sub.offer(ev, self.on_drop)

    def subscribe(self) -> "_Subscriber":
        sub = _Subscriber()
        self._subs = self._subs + [sub]
        return sub

    def unsubscribe(self, sub: "_Subscriber") -> None:
        self._subs = [s for s in self._subs if s is not sub]


class _Subscriber:
    def __init__(self) -> None:
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(QUEUE_SIZE)
        self.dropped = 0
        self._reported = 0

    def offer(self, ev: dict[str, Any], on_drop) -> None:
        try:
            self.queue.put_nowait(ev)
        except asyncio.QueueFull:
            self.dropped += 1
            if on_drop is not None:
                on_drop()

    def drop_notice(self) -> dict[str, Any] | None:
        if self.dropped > self._reported:
            n, self._reported = self.dropped - self._reported, self.dropped
            return {"type": "dropped", "time": time.time(), "count": n, "total": self.dropped}
        return None


router = APIRouter()


@router.get("/api/events")
async def events(request: Request) -> StreamingResponse:
    ctx = request.app.state.ctx
    hub: EventHub = ctx.events
    hub.bind(asyncio.get_running_loop())
    sub = hub.subscribe()
    hello = {"type": "hello", "time": time.time(), "log_content": hub.log_content,
             "auth": ctx.settings.api_key is not None, "warnings": list(ctx.warnings),
             "models": [{"model": m.name, "backend": m.backend, "context_length": m.context_length,
                         "kv_total": m.engine.stats().kv_blocks_total, "slots": m.engine.scheduler.slots.size}
                        for m in ctx.manager.loaded()]}

    async def lines() -> AsyncIterator[bytes]:
        try:
            yield (json.dumps(hello) + "\n").encode()
            while True:
                try:
                    ev = await asyncio.wait_for(sub.queue.get(), timeout=15.0)
                except asyncio.TimeoutError:
                    ev = {"type": "heartbeat", "time": time.time()}  # lets readers detect a dead daemon
                notice = sub.drop_notice()
                if notice is not None:
                    yield (json.dumps(notice) + "\n").encode()
                yield (json.dumps(ev, default=str) + "\n").encode()
                if ev.get("type") == "closing":  # the daemon is stopping: end the stream before uvicorn cancels it
                    return
        finally:
            hub.unsubscribe(sub)

    return StreamingResponse(lines(), media_type="application/x-ndjson")


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    ctx = request.app.state.ctx
    ctx.metrics.refresh([(m.name, m.engine) for m in ctx.manager.loaded()], ctx.manager.pending)
    return Response(ctx.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")
