"""`/api/events` (NDJSON stream of engine and request events) and `/metrics` (Prometheus text)."""
from __future__ import annotations

import asyncio
import json
import time
from typing import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from ...context import context
from ...events import EventHub

router = APIRouter()


@router.get("/api/events")
async def events(request: Request) -> StreamingResponse:
    ctx = context(request)
    hub: EventHub = ctx.events
    hub.bind(asyncio.get_running_loop())
    sub = hub.subscribe()
    hello = {"type": "hello", "time": time.time(), "log_content": hub.log_content,
             "auth": ctx.settings.api_key is not None, "warnings": list(ctx.warnings), "pulls": hub.pulls(),
             "models": [{"model": m.name, "backend": m.backend, "context_length": m.context_length,
                         "kv_total": m.engine.stats().kv_blocks_total, "slots": m.engine.scheduler.slots.size}
                        for m in ctx.manager.loaded()]}

    async def lines() -> AsyncIterator[bytes]:
        try:
            yield (json.dumps(hello) + "\n").encode()
            while True:
                try:
                    await asyncio.wait_for(sub.ready.wait(), timeout=15.0)
                    batch = sub.take()
                except asyncio.TimeoutError:
                    batch = [{"type": "heartbeat", "time": time.time()}]  # lets readers detect a dead daemon
                notice = sub.drop_notice()
                out = [] if notice is None else [json.dumps(notice)]
                for ev in batch:
                    out.append(json.dumps(ev, default=str))
                    if ev.get("type") == "closing":  # the daemon is stopping: end the stream before uvicorn cancels it
                        yield ("\n".join(out) + "\n").encode()
                        return
                yield ("\n".join(out) + "\n").encode()  # one write per batch
        finally:
            hub.unsubscribe(sub)

    return StreamingResponse(lines(), media_type="application/x-ndjson")


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    ctx = context(request)
    disk = ctx.manager.kv_disk
    usage = await asyncio.to_thread(disk.usage) if disk is not None else None
    ctx.metrics.refresh([(m.name, m.engine) for m in ctx.manager.loaded()], ctx.manager.pending, usage)
    return Response(ctx.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")
