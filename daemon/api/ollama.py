"""Ollama's inference endpoints: /api/generate, /api/chat, /api/embed, /api/embeddings, and the root/version."""
from __future__ import annotations

import json
import logging
import time
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from ... import __version__
from . import logprobs as lp_format
from . import prepare, prompting, remote
from .errors import APIError, not_found, parse_body
from .embedding import embed_ids, normalise
from .engine_stream import EngineChunks, collect_all, engine_stream
from .ollama_models import router as models_router
from .options import parse_keep_alive, requested_num_ctx
from .schemas import ChatRequest, EmbeddingsRequest, EmbedRequest, GenerateRequest
from .wire import ClosingStreamingResponse, now_rfc3339

log = logging.getLogger(__name__)
router = APIRouter()
router.include_router(models_router)

NDJSON = "application/x-ndjson"
VERSION = "0.13.0"  # the Ollama API version we answer /api/version with (clients gate features on it)


def _ctx(request: Request) -> Any:
    return request.app.state.ctx


@router.api_route("/", methods=["GET", "HEAD"])
async def root() -> PlainTextResponse:
    return PlainTextResponse("Ollama is running")


@router.api_route("/api/version", methods=["GET", "HEAD"])
async def version() -> JSONResponse:
    return JSONResponse({"version": VERSION, "evenflow": __version__})


def _check_common(req: Any) -> None:
    prepare.ollama_logprobs(req)  # a bad top_logprobs is a 400 before the model loads


def ndjson(gen: AsyncIterator[dict[str, Any]], chunks: EngineChunks) -> StreamingResponse:
    """One JSON object per line; an error after the first byte becomes a final {"error": ...} line. `chunks`
    (the engine output `gen` reads) is closed however the response ends."""

    async def lines() -> AsyncIterator[bytes]:
        try:
            async for obj in gen:
                yield (json.dumps(obj, ensure_ascii=False) + "\n").encode()
        except APIError as e:
            yield (json.dumps({"error": e.message}) + "\n").encode()

    return ClosingStreamingResponse(lines(), chunks.close, NDJSON)


async def _load_or_unload(request: Request, name: str, keep_alive: float | None, shape: dict[str, Any]) -> JSONResponse:
    """Empty prompt/messages: load the model (done_reason "load"), or unload it with keep_alive 0."""
    ctx = _ctx(request)
    record = ctx.manager.resolve(name)
    base = {"model": name, "created_at": now_rfc3339(), **shape, "done": True}
    if keep_alive == 0:
        await ctx.manager.unload(record.name)
        return JSONResponse({**base, "done_reason": "unload"})
    lease = await ctx.manager.acquire(name, keep_alive=keep_alive)
    lease.release()
    return JSONResponse({**base, "done_reason": "load"})


@router.post("/api/generate")
async def generate(request: Request) -> Response:
    t0 = time.perf_counter_ns()
    req = await parse_body(request, GenerateRequest)
    ctx = _ctx(request)
    if not req.model:
        raise not_found("")
    if (rm := await remote.lookup(request, req.model)) is not None:
        return await remote.generate(request, rm, req, t0)
    _check_common(req)
    if req.raw and (req.template or req.system or req.context):
        raise APIError(400, "raw mode does not support template, system, or context")
    if req.images:
        raise APIError(400, f"model '{req.model}' does not support images (no vision models yet)")
    keep_alive = parse_keep_alive(req.keep_alive)
    num_ctx = requested_num_ctx(req.options)
    stream = req.stream is not False
    if not req.prompt and not req.suffix:
        return await _load_or_unload(request, req.model, keep_alive, {"response": ""})
    lease = await ctx.manager.acquire(req.model, keep_alive=keep_alive, num_ctx=num_ctx)
    try:
        prep = await ctx.workers.run(request, prepare.generate, lease.model, req, num_ctx)
        chunks = await engine_stream(request, lease, prep, "/api/generate", t0)
    except BaseException:
        lease.release()
        raise
    prompt_ids = prep.prompt_ids
    reply = prompting.ReplyParser(lease.model, prep.text, prep.think, None)
    tokenizer = lease.model.runner.tokenizer

    def final_obj(g_ids: list[int], final: dict[str, Any]) -> dict[str, Any]:
        out = {"model": req.model, "created_at": now_rfc3339(), "response": "", "done": True, **final}
        if not req.raw:
            out["context"] = prompt_ids + g_ids
        return out

    if not stream:
        g = (await collect_all(chunks))[0]
        body = final_obj(g.token_ids, {"done_reason": g.done_reason, **g.metrics})
        thinking, content, _ = reply.parse_all(g.text)
        body["response"] = content
        if thinking:
            body["thinking"] = thinking
        if g.logprobs:
            body["logprobs"] = lp_format.ollama(tokenizer, g.logprobs)
        return JSONResponse(body)

    async def objs() -> AsyncIterator[dict[str, Any]]:
        out_ids: list[int] = []
        async for p in chunks.pieces():
            out_ids.extend(p.token_ids)
            thinking, content, _ = reply.feed(p.text, p.final is not None)
            if content or thinking or p.logprobs:  # logprobs go out even while the parser holds text back
                obj = {"model": req.model, "created_at": now_rfc3339(), "response": content, "done": False}
                if thinking:
                    obj["thinking"] = thinking
                if p.logprobs:
                    obj["logprobs"] = lp_format.ollama(tokenizer, p.logprobs)
                yield obj
            if p.final is not None:
                yield final_obj(out_ids, p.final)

    return ndjson(objs(), chunks)


@router.post("/api/chat")
async def chat(request: Request) -> Response:
    t0 = time.perf_counter_ns()
    req = await parse_body(request, ChatRequest)
    ctx = _ctx(request)
    if not req.model:
        raise APIError(400, "model is required")
    if (rm := await remote.lookup(request, req.model)) is not None:
        return await remote.chat(request, rm, req, t0)
    _check_common(req)
    keep_alive = parse_keep_alive(req.keep_alive)
    num_ctx = requested_num_ctx(req.options)
    stream = req.stream is not False
    if not req.messages:
        return await _load_or_unload(request, req.model, keep_alive, {"message": {"role": "assistant", "content": ""}})
    if any(m.images for m in req.messages):
        raise APIError(400, f"model '{req.model}' does not support images (no vision models yet)")
    lease = await ctx.manager.acquire(req.model, keep_alive=keep_alive, num_ctx=num_ctx)
    try:
        prep = await ctx.workers.run(request, prepare.chat, lease.model, req, num_ctx)
        chunks = await engine_stream(request, lease, prep, "/api/chat", t0)
    except BaseException:
        lease.release()
        raise
    reply = prompting.ReplyParser(lease.model, prep.text, prep.think, prep.tools)
    tokenizer = lease.model.runner.tokenizer

    def chunk(content: str = "", thinking: str = "", tool_calls: list | None = None) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": content}
        if thinking:
            msg["thinking"] = thinking
        if tool_calls:
            msg["tool_calls"] = tool_calls
        return {"model": req.model, "created_at": now_rfc3339(), "message": msg, "done": False}

    if not stream:
        g = (await collect_all(chunks))[0]
        thinking, content, calls = reply.parse_all(g.text)
        body = chunk(content, thinking, calls)
        body.update(done=True, done_reason=g.done_reason, **g.metrics)
        if g.logprobs:
            body["logprobs"] = lp_format.ollama(tokenizer, g.logprobs)
        return JSONResponse(body)

    async def objs() -> AsyncIterator[dict[str, Any]]:
        async for p in chunks.pieces():
            final = p.final
            thinking, content, calls = reply.feed(p.text, final is not None)
            out = ([chunk("", thinking)] if thinking else []) + ([chunk(content)] if content else []) \
                + ([chunk("", "", calls)] if calls else [])
            if p.logprobs:  # on the piece's first chunk, or their own while the parser holds text back
                out = out or [chunk()]
                out[0]["logprobs"] = lp_format.ollama(tokenizer, p.logprobs)
            for obj in out:
                yield obj
            if final is not None:
                done = chunk()
                done.update(done=True, **final)
                yield done

    return ndjson(objs(), chunks)


@router.post("/api/embed")
async def embed(request: Request) -> JSONResponse:
    t0 = time.perf_counter_ns()
    req = await parse_body(request, EmbedRequest)
    ctx = _ctx(request)
    if not req.model:
        raise APIError(400, "model is required")
    if (rm := await remote.lookup(request, req.model)) is not None:
        return await remote.embed(request, rm, req, t0)
    inputs = req.input
    if isinstance(inputs, str):
        inputs = [inputs] if inputs else []
    elif inputs is None:
        inputs = []
    elif not isinstance(inputs, list) or not all(isinstance(s, str) for s in inputs):
        raise APIError(400, "invalid input type")
    if req.dimensions is not None and req.dimensions < 1:
        raise APIError(400, f"dimensions must be a positive integer, got {req.dimensions}")
    keep_alive = parse_keep_alive(req.keep_alive)
    lease = await ctx.manager.acquire(req.model, keep_alive=keep_alive, num_ctx=requested_num_ctx(req.options))
    try:
        vectors, count = [], 0
        for text in inputs:
            ids = await ctx.workers.run(request, prepare.embed_input, lease.model, text, req.truncate is not False)
            vectors.append(normalise(await embed_ids(lease, ids), req.dimensions))
            count += len(ids)
    finally:
        lease.release()
    if not inputs:
        return JSONResponse({"model": req.model, "embeddings": []})
    return JSONResponse({"model": req.model, "embeddings": vectors, "total_duration": time.perf_counter_ns() - t0,
                         "load_duration": lease.load_duration_ns, "prompt_eval_count": count})


@router.post("/api/embeddings")
async def embeddings(request: Request) -> JSONResponse:
    req = await parse_body(request, EmbeddingsRequest)
    ctx = _ctx(request)
    if not req.model:
        raise APIError(400, "model is required")
    if (rm := await remote.lookup(request, req.model)) is not None:
        return await remote.embeddings(request, rm, req)
    lease = await ctx.manager.acquire(req.model, keep_alive=parse_keep_alive(req.keep_alive),
                                      num_ctx=requested_num_ctx(req.options))
    try:
        if not req.prompt:
            return JSONResponse({"embedding": []})
        ids = await ctx.workers.run(request, prepare.embed_input, lease.model, req.prompt, True)
        vec = await embed_ids(lease, ids)
    finally:
        lease.release()
    return JSONResponse({"embedding": [float(x) for x in vec.astype("float64")]})
