"""Ollama's model-management endpoints: tags, show, create, copy, delete, blobs, ps, pull, push."""
from __future__ import annotations

import asyncio
import json
import logging
import threading
from typing import Any, AsyncIterator, Iterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ...context import context
from ...model_report import kv_pool, vram_size
from .. import remote
from ..http.errors import APIError, parse_body
from ..http.wire import rfc3339
from ..ollama.request import CopyRequest, CreateRequest, DeleteRequest, PullRequest, ShowRequest

log = logging.getLogger(__name__)
router = APIRouter()


@router.api_route("/api/tags", methods=["GET", "HEAD"])
async def tags(request: Request) -> JSONResponse:
    models = await asyncio.to_thread(context(request).store.list_models)
    return JSONResponse({"models": models})


@router.post("/api/show")
async def show(request: Request) -> JSONResponse:
    req = await parse_body(request, ShowRequest)
    name = req.model or req.name
    if not name:
        raise APIError(400, "model is required")
    info = await asyncio.to_thread(context(request).store.show, name, bool(req.verbose), req.system)
    if info.get("remote"):
        await remote.show_info(request, name, info)
    return JSONResponse(info)


@router.post("/api/create")
async def create(request: Request) -> Response:
    req = await parse_body(request, CreateRequest)
    name = req.model or req.name
    if not name:
        raise APIError(400, "model is required")
    if not req.from_ and not req.files:
        raise APIError(400, "neither 'from' or 'files' was specified")
    store = context(request).store
    # Validation (bad name, missing blob, unknown base, bad template) fails here with a real status.
    steps = await asyncio.to_thread(store.create_iter, name, req)
    done = object()

    async def statuses() -> AsyncIterator[dict[str, Any]]:
        while (status := await asyncio.to_thread(next, steps, done)) is not done:
            yield {"status": status} if isinstance(status, str) else dict(status)

    if req.stream is False:
        last: dict[str, Any] = {"status": "success"}
        async for last in statuses():
            pass
        return JSONResponse(last)

    async def lines() -> AsyncIterator[bytes]:
        try:
            async for item in statuses():
                yield (json.dumps(item) + "\n").encode()
        except APIError as e:
            yield (json.dumps({"error": e.message}) + "\n").encode()
        except Exception as e:  # noqa: BLE001 - reported in Ollama's shape
            log.exception("create %s failed", name)
            yield (json.dumps({"error": f"create failed: {e}"}) + "\n").encode()

    return StreamingResponse(lines(), media_type="application/x-ndjson")


@router.post("/api/copy")
async def copy(request: Request) -> Response:
    req = await parse_body(request, CopyRequest)
    await asyncio.to_thread(context(request).store.copy, req.source, req.destination)
    return Response(status_code=200)


@router.delete("/api/delete")
async def delete(request: Request) -> Response:
    req = await parse_body(request, DeleteRequest)
    name = req.model or req.name
    if not name:
        raise APIError(400, "model is required")
    ctx = context(request)
    record = ctx.manager.resolve(name)  # 404 before touching anything
    await ctx.manager.unload(record.name)
    await asyncio.to_thread(ctx.store.delete, name)
    return Response(status_code=200)


@router.head("/api/blobs/{digest}")
async def blob_exists(request: Request, digest: str) -> Response:
    if await asyncio.to_thread(context(request).store.has_blob, digest):
        return Response(status_code=200)
    raise APIError(404, f'blob "{digest}" not found')


@router.post("/api/blobs/{digest}")
async def blob_upload(request: Request, digest: str) -> Response:
    store = context(request).store
    if await asyncio.to_thread(store.has_blob, digest):  # also validates the digest format (400)
        async for _ in request.stream():  # drain so the client sees a clean 200
            pass
        return Response(status_code=200)
    await store.write_blob(digest, request.stream())
    return Response(status_code=201)


@router.get("/api/ps")
async def ps(request: Request) -> JSONResponse:
    ctx = context(request)
    out = []
    for m in sorted(ctx.manager.loaded(), key=lambda m: m.expires_at, reverse=True):
        details = dict(m.record.details)
        details["parent_model"] = ""
        out.append({"name": m.name, "model": m.name, "size": m.size, "digest": m.record.digest,
                    "details": details, "expires_at": rfc3339(m.expires_at), "size_vram": vram_size(m),
                    # the window it loaded for; a request's num_ctx up to kv_pool.max_context needs no reload
                    "context_length": min(m.context_length, m.max_context), "kv_pool": kv_pool(m)})
    out += await remote.ps_rows(request)
    body: dict[str, Any] = {"models": out}
    if ctx.manager.kv_disk is not None:  # evenflow's own: the disk KV cache (Ollama's clients ignore the key)
        body["kv_cache"] = await asyncio.to_thread(ctx.manager.kv_disk.usage)
    return JSONResponse(body)


async def _progress_response(steps: Iterator[dict[str, Any]], stream: bool | None, what: str) -> Response:
    """Stream Ollama's progress lines (an error becomes a last `{"error"}` line), or only the last (500 on error)."""
    done = object()
    busy = threading.Lock()  # a disconnect can cancel us while a thread is inside next(): close after it returns

    def step() -> Any:
        with busy:
            return next(steps, done)

    def close() -> None:
        with busy:
            getattr(steps, "close", lambda: None)()

    async def items() -> AsyncIterator[dict[str, Any]]:
        while (item := await asyncio.to_thread(step)) is not done:
            yield item

    if stream is False:
        last: dict[str, Any] = {}
        try:
            async for last in items():
                pass
        except Exception as e:  # noqa: BLE001 - Ollama answers a failed non-streamed pull with 500
            log.warning("%s failed: %s", what, e)
            raise APIError(500, str(e)) from None
        return JSONResponse(last)

    async def lines() -> AsyncIterator[bytes]:
        try:
            async for item in items():
                yield (json.dumps(item) + "\n").encode()
        except Exception as e:  # noqa: BLE001 - reported in Ollama's shape after the first byte
            log.warning("%s failed: %s", what, e)
            yield (json.dumps({"error": str(e)}) + "\n").encode()
        finally:  # a client gone mid-pull: it stops waiting (a download no other puller waits for stops)
            await asyncio.to_thread(close)

    return StreamingResponse(lines(), media_type="application/x-ndjson")


@router.post("/api/pull")
async def pull(request: Request) -> Response:
    req = await parse_body(request, PullRequest)
    name = req.model or req.name
    if not name:
        raise APIError(400, "model is required")
    steps = await asyncio.to_thread(context(request).store.pull_iter, name, bool(req.insecure))
    shown = name.split("://", 1)[-1]  # the model as the store will name it (http:// only says how to reach it)
    steps = context(request).events.track_pull(shown, steps)  # the monitor's "pulls in progress"
    return await _progress_response(steps, req.stream, f"pull {name}")


@router.post("/api/push")
async def push(request: Request) -> Response:
    req = await parse_body(request, PullRequest)
    name = req.model or req.name
    if not name:
        raise APIError(400, "model is required")
    steps = await asyncio.to_thread(context(request).store.push_iter, name, bool(req.insecure))
    return await _progress_response(steps, req.stream, f"push {name}")
