"""OpenAI-compatible endpoints (/v1): chat completions, completions, models, embeddings; SSE with `data: [DONE]`."""
from __future__ import annotations

import asyncio
import base64
import json
import random
import struct
import time
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from . import logprobs as lp_format
from . import prepare, prompting, remote
from .errors import APIError, parse_body
from .embedding import embed_ids, normalise
from .engine_stream import EngineChunks, collect_all, engine_stream
from .schemas import ChatCompletionRequest, CompletionRequest, EmbeddingRequest, OAIMessage
from .wire import ClosingStreamingResponse

router = APIRouter(prefix="/v1")
FINGERPRINT = "fp_ollama"


def _ctx(request: Request) -> Any:
    return request.app.state.ctx


def _usage(metrics: list[dict[str, int]]) -> dict[str, int]:
    """The prompt counted once (n choices share it), the completion tokens of every choice summed."""
    p = metrics[0].get("prompt_eval_count", 0) if metrics else 0
    c = sum(m.get("eval_count", 0) for m in metrics)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def _finish(reason: str | None, calls: bool) -> str:
    if calls and reason == "stop":
        return "tool_calls"
    return "length" if reason == "length" else "stop"


def _sse(objs: AsyncIterator[dict[str, Any]], chunks: EngineChunks) -> StreamingResponse:
    """Server-sent events ending in [DONE]; `chunks` (the engine output `objs` reads) is closed however the
    response ends."""

    async def events() -> AsyncIterator[bytes]:
        try:
            async for obj in objs:
                yield f"data: {json.dumps(obj, ensure_ascii=False)}\n\n".encode()
        except APIError as e:
            err = {"error": {"message": e.message, "type": "api_error", "param": None, "code": None}}
            yield f"data: {json.dumps(err)}\n\n".encode()
        yield b"data: [DONE]\n\n"

    return ClosingStreamingResponse(events(), chunks.close, "text/event-stream")


def _text_content(content: Any) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = []
        for p in content:
            if not isinstance(p, dict):
                raise APIError(400, "invalid message content part: expected an object")
            if p.get("type") == "text":
                if not isinstance(p.get("text", ""), str):
                    raise APIError(400, "invalid message content part: 'text' must be a string", param="messages")
                parts.append(p.get("text", ""))
            elif p.get("type") in ("image_url", "input_audio"):
                raise APIError(400, "image and audio inputs are not supported (no multimodal models yet)")
            else:
                raise APIError(400, f"invalid message content part type {p.get('type')!r}")
        return "\n".join(parts)
    raise APIError(400, f"invalid message content: expected a string or a list of parts, got {type(content).__name__}")


def convert_messages(messages: list[OAIMessage]) -> list[dict[str, Any]]:
    """OpenAI messages -> the template's message dicts (tool_calls arguments parsed, tool names resolved)."""
    if not messages:
        raise APIError(400, "[] is too short - 'messages'", param="messages")
    out: list[dict[str, Any]] = []
    call_names: dict[str, str] = {}
    for m in messages:
        role = m.role.lower()
        if role not in ("system", "developer", "user", "assistant", "tool"):
            raise APIError(400, f"invalid message role {m.role!r}", param="messages")
        msg: dict[str, Any] = {"role": "system" if role == "developer" else role, "content": _text_content(m.content)}
        if m.tool_calls:
            calls = []
            for c in m.tool_calls:
                name = c.function.name if c.function else ""
                args: Any = (c.function.arguments if c.function else None) or "{}"
                if isinstance(args, str):
                    try:
                        args = json.loads(args)
                    except (ValueError, RecursionError):
                        raise APIError(400, "invalid tool call arguments: not valid JSON", param="messages") from None
                if not isinstance(args, dict):
                    raise APIError(400, "invalid tool call arguments: expected a JSON object", param="messages")
                calls.append({"function": {"name": name, "arguments": args}})
                if c.id:
                    call_names[c.id] = name
            msg["tool_calls"] = calls
        if m.reasoning:
            msg["thinking"] = m.reasoning
        if role == "tool":
            name = m.name or call_names.get(m.tool_call_id or "", "")
            if name:
                msg["tool_name"] = name
            if m.tool_call_id:
                msg["tool_call_id"] = m.tool_call_id
        out.append(msg)
    return out


def _oai_tool_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"id": f"call_{''.join(random.choices('abcdefghijklmnopqrstuvwxyz0123456789', k=8))}",
             "index": c["function"].get("index", i), "type": "function",
             "function": {"name": c["function"]["name"], "arguments": json.dumps(c["function"]["arguments"])}}
            for i, c in enumerate(calls)]


@router.post("/chat/completions")
async def chat_completions(request: Request) -> Response:
    t0 = time.perf_counter_ns()
    req = await parse_body(request, ChatCompletionRequest)
    if (rm := await remote.lookup(request, req.model)) is not None:
        return await remote.v1(request, rm, "/chat/completions")
    messages = convert_messages(req.messages)
    ctx = _ctx(request)
    effort = req.reasoning_effort
    efforts = {None: None, "none": False, "minimal": "low", "low": "low", "medium": "medium", "high": "high",
               "max": "max", "xhigh": "max", "ultra": "max"}
    if effort not in efforts:
        raise APIError(400, f"invalid reasoning_effort {effort!r}: expected none, minimal, low, medium, high, max",
                       param="reasoning_effort")
    think = efforts[effort]
    lease = await ctx.manager.acquire(req.model)
    try:
        prep = await ctx.workers.run(request, prepare.chat_completion, lease.model, req, messages, think)
        chunks = await engine_stream(request, lease, prep, "/v1/chat/completions", t0)
    except BaseException:
        lease.release()
        raise
    cid, created = f"chatcmpl-{random.randint(0, 998)}", int(time.time())
    replies = [prompting.ReplyParser(lease.model, prep.text, prep.think, prep.tools) for _ in range(prep.n)]
    tokenizer = lease.model.runner.tokenizer
    want_lp = prep.logprobs is not None
    base = {"id": cid, "created": created, "model": req.model, "system_fingerprint": FINGERPRINT}
    if not req.stream:
        choices = []
        gens = await collect_all(chunks)
        for i, (g, reply) in enumerate(zip(gens, replies)):
            thinking, content, calls = reply.parse_all(g.text)
            msg: dict[str, Any] = {"role": "assistant", "content": content}
            if thinking:
                msg["reasoning"] = thinking
            if calls:
                msg["tool_calls"] = _oai_tool_calls(calls)
            choices.append({"index": i, "message": msg, "finish_reason": _finish(g.done_reason, bool(calls)),
                            "logprobs": lp_format.openai_chat(tokenizer, g.logprobs) if want_lp else None})
        return JSONResponse({**base, "object": "chat.completion", "choices": choices,
                             "usage": _usage([g.metrics for g in gens])})
    include_usage = bool(req.stream_options and req.stream_options.include_usage)

    async def objs() -> AsyncIterator[dict[str, Any]]:
        first = [True] * prep.n
        any_calls = [False] * prep.n
        pending: list[list[Any]] = [[] for _ in range(prep.n)]  # logprobs not yet sent (text held back)
        finals: list[dict[str, Any]] = []

        def ch(i: int, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            if first[i]:
                delta = {"role": "assistant", **delta}
                first[i] = False
            choice: dict[str, Any] = {"index": i, "delta": delta, "finish_reason": finish}
            if want_lp:
                choice["logprobs"] = lp_format.openai_chat(tokenizer, pending[i]) if pending[i] else None
                pending[i] = []
            obj = {**base, "object": "chat.completion.chunk", "choices": [choice]}
            if include_usage:
                obj["usage"] = None  # as OpenAI: null on content chunks, the real usage on the last one
            return obj

        async for p in chunks.pieces():
            i = p.index
            pending[i].extend(p.logprobs or [])
            thinking, content, calls = replies[i].feed(p.text, p.final is not None)
            if thinking:
                yield ch(i, {"content": "", "reasoning": thinking})
            if content:
                yield ch(i, {"content": content})
            if calls:
                any_calls[i] = True
                yield ch(i, {"tool_calls": _oai_tool_calls(calls)})
            if p.final is not None:
                yield ch(i, {} if not first[i] else {"content": ""}, _finish(p.final["done_reason"], any_calls[i]))
                finals.append(p.final)
                if include_usage and len(finals) == prep.n:
                    yield {**base, "object": "chat.completion.chunk", "choices": [], "usage": _usage(finals)}

    return _sse(objs(), chunks)


@router.post("/completions")
async def completions(request: Request) -> Response:
    t0 = time.perf_counter_ns()
    req = await parse_body(request, CompletionRequest)
    if (rm := await remote.lookup(request, req.model)) is not None:
        return await remote.v1(request, rm, "/completions")
    ctx = _ctx(request)
    lease = await ctx.manager.acquire(req.model)
    try:
        prep = await ctx.workers.run(request, prepare.completion, lease.model, req)
        chunks = await engine_stream(request, lease, prep, "/v1/completions", t0)
    except BaseException:
        lease.release()
        raise
    tokenizer = lease.model.runner.tokenizer
    want_lp = prep.logprobs is not None
    base = {"id": f"cmpl-{random.randint(0, 998)}", "object": "text_completion", "created": int(time.time()),
            "model": req.model, "system_fingerprint": FINGERPRINT}
    if not req.stream:
        gens = await collect_all(chunks)
        return JSONResponse({**base, "choices": [
            {"text": g.text, "index": i,
             "logprobs": lp_format.legacy(tokenizer, g.logprobs, g.offsets, g.text) if want_lp else None,
             "finish_reason": _finish(g.done_reason, False)} for i, g in enumerate(gens)],
            "usage": _usage([g.metrics for g in gens])})
    include_usage = bool(req.stream_options and req.stream_options.include_usage)

    async def objs() -> AsyncIterator[dict[str, Any]]:
        sizes = [0] * prep.n  # characters streamed per choice: the base of text_offset
        pending: list[list[Any]] = [[] for _ in range(prep.n)]
        finals: list[dict[str, Any]] = []
        async for p in chunks.pieces():
            i = p.index
            pending[i].extend(p.logprobs or [])
            if p.final is None and not p.text:
                continue  # a partial character: its logprobs go with the chunk that completes it
            lp = None
            if want_lp:
                lp = lp_format.legacy(tokenizer, pending[i], [sizes[i]] * len(pending[i]), p.text, sizes[i])
                pending[i] = []
            sizes[i] += len(p.text)
            finish = None if p.final is None else _finish(p.final["done_reason"], False)
            obj = {**base, "choices": [{"text": p.text, "index": i, "logprobs": lp, "finish_reason": finish}]}
            if include_usage:
                obj["usage"] = None  # as OpenAI: null on content chunks, the real usage on the last one
            yield obj
            if p.final is not None:
                finals.append(p.final)
                if include_usage and len(finals) == prep.n:
                    yield {**base, "choices": [], "usage": _usage(finals)}

    return _sse(objs(), chunks)


def _model_obj(m: dict[str, Any]) -> dict[str, Any]:
    from datetime import datetime  # noqa: PLC0415

    name = m["model"]
    try:
        created = int(datetime.fromisoformat(m["modified_at"].replace("Z", "+00:00")[:26] + "+00:00").timestamp()) \
            if m.get("modified_at") else 0
    except ValueError:
        created = 0
    owner = name.split("/")[-2] if name.count("/") >= 1 else "library"
    return {"id": name, "object": "model", "created": created, "owned_by": owner}


@router.get("/models")
async def list_models(request: Request) -> JSONResponse:
    models = await asyncio.to_thread(_ctx(request).store.list_models)
    return JSONResponse({"object": "list", "data": [_model_obj(m) for m in models]})


@router.get("/models/{model:path}")
async def retrieve_model(request: Request, model: str) -> JSONResponse:
    models = await asyncio.to_thread(_ctx(request).store.list_models)
    record = _ctx(request).manager.resolve(model)  # 404 in OpenAI shape for unknown names
    for m in models:
        if m["model"] == record.name:
            return JSONResponse(_model_obj(m))
    raise APIError(404, f"model '{model}' not found")


@router.post("/embeddings")
async def embeddings(request: Request) -> JSONResponse:
    req = await parse_body(request, EmbeddingRequest)
    if (rm := await remote.lookup(request, req.model)) is not None:
        return await remote.v1(request, rm, "/embeddings")
    inputs = req.input
    if isinstance(inputs, str):
        inputs = [inputs]
    if not inputs or not isinstance(inputs, list) or not all(isinstance(s, str) for s in inputs):
        raise APIError(400, "invalid input: expected a string or a list of strings (token arrays are not supported)",
                       param="input")
    fmt = req.encoding_format or "float"
    if fmt not in ("float", "base64"):
        raise APIError(400, f"invalid encoding_format {fmt!r}: expected \"float\" or \"base64\"", param="encoding_format")
    if req.dimensions is not None and req.dimensions < 1:
        raise APIError(400, f"dimensions must be a positive integer, got {req.dimensions}", param="dimensions")
    ctx = _ctx(request)
    lease = await ctx.manager.acquire(req.model)
    data, total = [], 0
    try:
        for i, text in enumerate(inputs):
            ids = await ctx.workers.run(request, prepare.embed_input, lease.model, text, True)
            total += len(ids)
            v = normalise(await embed_ids(lease, ids), req.dimensions)
            emb: Any = base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode() if fmt == "base64" else v
            data.append({"object": "embedding", "embedding": emb, "index": i})
    finally:
        lease.release()
    return JSONResponse({"object": "list", "data": data, "model": req.model,
                         "usage": {"prompt_tokens": total, "total_tokens": total}})
