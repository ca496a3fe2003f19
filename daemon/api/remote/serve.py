"""Serving a remote model: each endpoint's request goes to the upstream engine, never through our engine.

/api/chat -> /v1/chat/completions, /api/generate -> /v1/completions (raw, suffix) or chat (templated),
/api/embed -> /v1/embeddings, /v1/responses -> /v1/chat/completions (its events made here), /v1/* passed through
with the model name rewritten. Upstream SSE is relayed
chunk by chunk; whichever way a response ends, the upstream response is closed, so a client that leaves
stops the upstream generation too.
"""
from __future__ import annotations

import asyncio
import json
import time
from typing import Any, AsyncIterator, Awaitable, Callable

import numpy as np
from fastapi import Request
from fastapi.responses import JSONResponse, Response

from ....backends.remote import UpstreamError, UpstreamStream
from ..http.errors import APIError
from ..http.wire import NDJSON, SSE, now_rfc3339, streamed
from ..ollama.plan import embed_inputs
from ..ollama.reply import ChatReply, GenerateReply, embed_reply, embeddings_reply
from ..pipeline.options import parse_keep_alive
from ..responses.reply import RESPONSES_SSE, ResponseBuilder, usage
from .convert import Reader, chat_messages, response_format, sampling, thinking
from .hub import RemoteModel, RemoteRun, hub_of


async def serve(request: Request, rm: RemoteModel, endpoint: str, req: Any, t0: int) -> Response:
    """`endpoint`'s request for the remote model `rm`, answered by its upstream engine."""
    if endpoint == "/v1/responses":
        return await responses(request, rm, req, t0)
    if endpoint.startswith("/v1/"):
        return await v1(request, rm, endpoint[len("/v1"):])
    if endpoint == "/api/chat":
        return await chat(request, rm, req, t0)
    if endpoint == "/api/generate":
        return await generate(request, rm, req, t0)
    if endpoint == "/api/embed":
        return await embed(request, rm, req, t0)
    if endpoint == "/api/embeddings":
        return await embeddings(request, rm, req)
    raise ValueError(f"no remote route for {endpoint}")


def _err(rm: RemoteModel, e: UpstreamError) -> APIError:
    return APIError(e.status, f"remote model '{rm.name}': {e.message}")


def _closer(up: UpstreamStream, run: RemoteRun) -> Callable[[], Awaitable[None]]:
    """Closes the upstream response however ours ends (done, error, client gone), and records the end."""

    async def close() -> None:
        await up.aclose()
        run.finish("abort")  # a no-op when the stream finished

    return close


async def _disconnected(request: Request) -> None:
    while (await request.receive()).get("type") != "http.disconnect":
        pass


async def _unless_gone(request: Request, work: Awaitable[Any], on_gone: Callable[[], Awaitable[None]]) -> Any:
    """Await `work` (a non-streamed answer) unless the client leaves first: then cancel it, call `on_gone`."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        task.cancel()
        await on_gone()
        raise APIError(499, "the client disconnected")
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()


async def _open(request: Request, rm: RemoteModel, run: RemoteRun, path: str, body: dict[str, Any],
                reader: Reader) -> UpstreamStream:
    hub = hub_of(request)
    await hub.ensure(request, rm)
    run.emit("queued")
    reader.t_sent = time.perf_counter_ns()  # prompt_eval_duration: from here to the first token
    try:
        up = await hub.upstream(rm.endpoint).open_stream(path, body)
    except UpstreamError as e:
        if e.status in (502, 504):
            hub.forget(rm.endpoint)
        run.finish("error")
        raise _err(rm, e) from None
    run.emit("scheduled")
    return up


async def _pieces(request: Request, rm: RemoteModel, run: RemoteRun, up: UpstreamStream,
                  reader: Reader) -> AsyncIterator[tuple[str, str]]:
    """(content, thinking) per upstream chunk, published as token events; upstream failures -> APIError."""
    try:
        async for obj in up.events():
            content, think = reader.feed(obj)
            if content or think:
                run.token(content or think)
                yield content, think
    except UpstreamError as e:
        hub_of(request).forget(rm.endpoint)
        run.finish("error")
        raise _err(rm, e) from None
    run.finish(reader.done_reason, reader.prompt_tokens, reader.output_tokens)


async def _relay(request: Request, rm: RemoteModel, run: RemoteRun, path: str, body: dict[str, Any], stream: bool,
                 shape: Callable[..., dict[str, Any]], t0: int) -> Response:
    """Run one upstream stream and answer in Ollama's shape: NDJSON pieces, or one object (`stream: false`)."""
    reader = Reader(t0)
    up = await _open(request, rm, run, path, body, reader)
    if not stream:
        async def whole() -> dict[str, Any]:
            parts: list[tuple[str, str]] = [p async for p in _pieces(request, rm, run, up, reader)]
            return shape("".join(c for c, _ in parts), "".join(t for _, t in parts), reader.tool_calls(),
                         {"done": True, "done_reason": reader.done_reason, **reader.metrics()})

        try:
            return JSONResponse(await _unless_gone(request, whole(), up.aclose))
        finally:
            await up.aclose()
            run.finish("abort")

    async def objs() -> AsyncIterator[dict[str, Any]]:
        async for content, think in _pieces(request, rm, run, up, reader):
            yield shape(content, think, None, {"done": False})
        calls = reader.tool_calls()
        if calls:
            yield shape("", "", calls, {"done": False})
        yield shape("", "", None, {"done": True, "done_reason": reader.done_reason, **reader.metrics()})

    return streamed(NDJSON, objs(), _closer(up, run))


def _chat_shape(model: str) -> Callable[..., dict[str, Any]]:
    def shape(content: str, think: str, calls: list | None, tail: dict[str, Any]) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": content}
        if think:
            msg["thinking"] = think
        if calls:
            msg["tool_calls"] = calls
        return {"model": model, "created_at": now_rfc3339(), "message": msg, **tail}
    return shape


def _generate_shape(model: str) -> Callable[..., dict[str, Any]]:
    def shape(content: str, think: str, calls: list | None, tail: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"model": model, "created_at": now_rfc3339(), "response": content}
        if think:
            out["thinking"] = think
        return {**out, **tail}
    return shape


async def _loaded(request: Request, rm: RemoteModel, req: Any,
                  answer: Callable[[str, str], dict[str, Any]]) -> JSONResponse:
    """Empty prompt/messages: check the upstream ("load"); keep_alive 0 answers "unload" (nothing is held)."""
    reason = "unload" if parse_keep_alive(req.keep_alive) == 0 else "load"
    if reason == "load":
        await hub_of(request).ensure(request, rm)
    return JSONResponse(answer(req.model, reason))


def _no_logprobs(req: Any) -> None:
    if req.logprobs or req.top_logprobs:
        raise APIError(400, "logprobs are not supported for remote models yet")


def _ollama_body(rm: RemoteModel, req: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": rm.endpoint.model, "stream": True, "stream_options": {"include_usage": True},
                            **sampling(req.options, rm.params)}
    fmt = response_format(req.format)
    if fmt is not None:
        body["response_format"] = fmt
    return body


async def chat(request: Request, rm: RemoteModel, req: Any, t0: int) -> Response:
    """/api/chat for a remote model -> upstream /v1/chat/completions."""
    _no_logprobs(req)
    if not req.messages:
        return await _loaded(request, rm, req, ChatReply.loaded)
    body = {**_ollama_body(rm, req), "messages": chat_messages(req.messages, rm.system, rm.messages),
            **thinking(req.think)}
    if req.tools:
        body["tools"] = req.tools
    run = RemoteRun(request, rm, "/api/chat", json.dumps(body["messages"], ensure_ascii=False))
    return await _relay(request, rm, run, "/chat/completions", body, req.stream is not False, _chat_shape(req.model), t0)


async def generate(request: Request, rm: RemoteModel, req: Any, t0: int) -> Response:
    """/api/generate: raw prompts and suffixes (FIM) -> upstream /v1/completions; templated -> chat."""
    _no_logprobs(req)
    if req.images:
        raise APIError(400, "images are not supported for remote models yet")
    if req.template or req.context:
        raise APIError(400, "template and context do not apply to a remote model (the upstream engine applies its "
                            "own template; send the conversation to /api/chat)")
    if not req.prompt and not req.suffix:
        return await _loaded(request, rm, req, GenerateReply.loaded)
    body = _ollama_body(rm, req)
    if req.raw or req.suffix:
        path, body["prompt"] = "/completions", req.prompt or ""
        if req.suffix:
            body["suffix"] = req.suffix
    else:
        path = "/chat/completions"
        body["messages"] = chat_messages([{"role": "user", "content": req.prompt}], req.system or rm.system, [])
        body.update(thinking(req.think))
    run = RemoteRun(request, rm, "/api/generate", req.prompt)
    return await _relay(request, rm, run, path, body, req.stream is not False, _generate_shape(req.model), t0)


async def _embeddings(request: Request, rm: RemoteModel, inputs: list[str]) -> tuple[list[np.ndarray], int]:
    hub = hub_of(request)
    await hub.ensure(request, rm)
    try:
        out = await hub.upstream(rm.endpoint).post_json("/embeddings", {"model": rm.endpoint.model, "input": inputs})
    except UpstreamError as e:
        if e.status in (502, 504):
            hub.forget(rm.endpoint)
        raise _err(rm, e) from None
    data = sorted((d for d in out.get("data") or [] if isinstance(d, dict)), key=lambda d: d.get("index", 0))
    if len(data) != len(inputs) or not all(isinstance(d.get("embedding"), list) for d in data):
        raise APIError(502, f"remote model '{rm.name}': the upstream engine answered /embeddings with "
                            f"{len(data)} vectors for {len(inputs)} inputs (or not as float lists)")
    usage = out.get("usage") if isinstance(out.get("usage"), dict) else {}
    return [np.asarray(d["embedding"], dtype=np.float32) for d in data], int(usage.get("prompt_tokens") or 0)


async def embed(request: Request, rm: RemoteModel, req: Any, t0: int) -> JSONResponse:
    """/api/embed -> upstream /v1/embeddings; vectors cut to `dimensions` and L2-normalised here, as local ones."""
    inputs = embed_inputs(req)
    vectors, count = await _embeddings(request, rm, inputs) if inputs else ([], 0)
    return JSONResponse(embed_reply(req, vectors, count, 0, t0))


async def embeddings(request: Request, rm: RemoteModel, req: Any) -> JSONResponse:
    """Legacy /api/embeddings: one prompt, the upstream's vector as it comes."""
    vectors, count = await _embeddings(request, rm, [req.prompt]) if req.prompt else ([], 0)
    return JSONResponse(embeddings_reply(req, vectors, count, 0, 0))


async def v1(request: Request, rm: RemoteModel, path: str) -> Response:
    """/v1/{chat/completions,completions,embeddings} passed through: the model renamed both ways, the model's
    PARAMETERs and SYSTEM as defaults, SSE relayed line by line."""
    body = json.loads(await request.body())  # the handler has validated it
    asked, body["model"] = body.get("model"), rm.endpoint.model
    if path == "/embeddings":
        vectors_out = await _v1_json(request, rm, path, body, None)
        return JSONResponse({**vectors_out, "model": asked})
    for key, value in sampling(None, rm.params).items():
        body.setdefault(key, value)
    if path == "/chat/completions" and rm.system and not any(
            isinstance(m, dict) and m.get("role") in ("system", "developer") for m in body.get("messages") or []):
        body["messages"] = [{"role": "system", "content": rm.system}, *body.get("messages", [])]
    run = RemoteRun(request, rm, "/v1" + path, json.dumps(body.get("messages") or body.get("prompt"),
                                                         ensure_ascii=False))
    if body.get("stream") is not True:
        out = await _v1_json(request, rm, path, body, run)
        return JSONResponse({**out, "model": asked})
    reader = Reader(time.perf_counter_ns())
    up = await _open(request, rm, run, path, body, reader)

    async def objs() -> AsyncIterator[dict[str, Any]]:
        try:
            async for obj in up.events():
                text, think = reader.feed(obj)
                if text or think:
                    run.token(text or think)
                yield {**obj, "model": asked}
            run.finish(reader.done_reason, reader.prompt_tokens, reader.output_tokens)
        except UpstreamError as e:
            hub_of(request).forget(rm.endpoint)
            run.finish("error")
            raise _err(rm, e) from None

    return streamed(SSE, objs(), _closer(up, run))


async def _v1_json(request: Request, rm: RemoteModel, path: str, body: dict[str, Any],
                   run: RemoteRun | None) -> dict[str, Any]:
    """A non-streamed upstream call; the upstream request is dropped if our client leaves first."""
    hub = hub_of(request)
    await hub.ensure(request, rm)
    if run is not None:
        run.emit("queued")
    try:
        out = await _unless_gone(request, hub.upstream(rm.endpoint).post_json(path, body), _noop)
    except UpstreamError as e:
        if e.status in (502, 504):
            hub.forget(rm.endpoint)
        if run is not None:
            run.finish("error")
        raise _err(rm, e) from None
    except BaseException:
        if run is not None:
            run.finish("abort")
        raise
    if run is not None:
        usage = out.get("usage") if isinstance(out.get("usage"), dict) else {}
        choices = out.get("choices") or [{}]
        reason = "length" if isinstance(choices[0], dict) and choices[0].get("finish_reason") == "length" else "stop"
        run.finish(reason, usage.get("prompt_tokens"), usage.get("completion_tokens"))
    return out


async def _noop() -> None:
    return None


async def responses(request: Request, rm: RemoteModel, call: Any, t0: int) -> Response:
    """/v1/responses: the chat request it was translated to goes upstream (/v1/chat/completions, streamed); its
    chunks come back as the Responses events (or the response object) that local models answer with."""
    chat = call.chat
    body: dict[str, Any] = {"model": rm.endpoint.model, "stream": True, "stream_options": {"include_usage": True},
                            **sampling(None, rm.params)}
    messages = [m.model_dump(exclude_none=True, exclude={"reasoning"}) for m in chat.messages]
    if rm.system and not any(m["role"] in ("system", "developer") for m in messages):
        messages.insert(0, {"role": "system", "content": rm.system})
    body["messages"] = messages
    asked = {"max_tokens": chat.max_completion_tokens, "temperature": chat.temperature, "top_p": chat.top_p,
             "seed": chat.seed, "tools": chat.tools, "tool_choice": chat.tool_choice,
             "reasoning_effort": chat.reasoning_effort, "response_format": chat.response_format}
    body.update({k: v for k, v in asked.items() if v is not None})
    run = RemoteRun(request, rm, "/v1/responses", json.dumps(messages, ensure_ascii=False))
    reader = Reader(t0)
    up = await _open(request, rm, run, "/chat/completions", body, reader)
    builder = ResponseBuilder(call.body)

    def end() -> list[dict[str, Any]]:
        details = reader.usage.get("completion_tokens_details")
        thought = details.get("reasoning_tokens") if isinstance(details, dict) else 0
        return builder.feed("", "", reader.tool_calls()) + builder.finish(
            reader.done_reason, usage(reader.prompt_tokens, reader.output_tokens, int(thought or 0)))

    if not chat.stream:
        async def whole() -> dict[str, Any]:
            async for content, think in _pieces(request, rm, run, up, reader):
                builder.feed(think, content, [])
            return end()[-1]["response"]

        try:
            return JSONResponse(await _unless_gone(request, whole(), up.aclose))
        finally:
            await up.aclose()
            run.finish("abort")

    async def events() -> AsyncIterator[dict[str, Any]]:
        for event in builder.start():
            yield event
        try:
            async for content, think in _pieces(request, rm, run, up, reader):
                for event in builder.feed(think, content, []):
                    yield event
            for event in end():
                yield event
        except APIError as e:
            for event in builder.fail(e.message):
                yield event

    return streamed(RESPONSES_SSE, events(), _closer(up, run))
