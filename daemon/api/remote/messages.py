"""/v1/messages for a remote model: the Anthropic request, in /api/chat's terms, goes to the upstream engine's
/v1/chat/completions (which need not speak Anthropic); its stream comes back as Anthropic's message or events."""
from __future__ import annotations

import json
from typing import Any, AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from ..anthropic.reply import ANTHROPIC_SSE, MessageWriter, stop_reason, usage
from ..anthropic.request import MessagesRequest, check_sampling, conversation
from ..http.errors import APIError, anthropic_error
from ..http.wire import streamed
from .convert import Reader, chat_messages, response_format, sampling, thinking
from .hub import RemoteModel, RemoteRun
from .serve import _closer, _open, _pieces, _unless_gone


def _body(rm: RemoteModel, req: MessagesRequest) -> dict[str, Any]:
    conv = conversation(req)
    body: dict[str, Any] = {"model": rm.endpoint.model, "stream": True, "stream_options": {"include_usage": True},
                            **sampling(None, rm.params), "max_tokens": req.max_tokens,
                            "messages": chat_messages(conv.messages, rm.system, rm.messages), **thinking(conv.think)}
    for key, value in (("temperature", req.temperature), ("top_p", req.top_p), ("top_k", req.top_k),
                       ("stop", req.stop_sequences or None)):
        if value is not None:
            body[key] = value
    if conv.schema is not None:
        body["response_format"] = response_format(conv.schema)
    if conv.tools:
        body["tools"] = conv.tools
    if conv.forced:  # OpenAI's tool_choice: one named function, or "required" (any of them)
        body["tool_choice"] = ({"type": "function", "function": {"name": conv.forced[0]["function"]["name"]}}
                               if len(conv.forced) == 1 and len(conv.tools or []) > 1 else "required")
    return body


async def messages(request: Request, rm: RemoteModel, req: MessagesRequest, t0: int) -> Response:
    """Stop sequences are sent upstream; which one matched is not reported back (stop_reason end_turn)."""
    check_sampling(req)
    body = _body(rm, req)
    run = RemoteRun(request, rm, "/v1/messages", json.dumps(body["messages"], ensure_ascii=False))
    reader = Reader(t0)
    up = await _open(request, rm, run, "/chat/completions", body, reader)
    writer = MessageWriter(req.model, 0)  # the upstream tells the prompt's size with its usage, at the end

    def end(calls: bool) -> tuple[str, None, dict[str, int]]:
        out = reader.output_tokens
        return stop_reason(reader.done_reason, calls, None, out, req.max_tokens), None, \
            usage(reader.prompt_tokens, 0, out)

    if not req.stream:
        async def whole() -> dict[str, Any]:
            async for content, think in _pieces(request, rm, run, up, reader):
                writer.add(think, content, [])
            calls = reader.tool_calls()
            writer.add("", "", calls)
            writer.close()
            return writer.message(*end(bool(calls)))

        try:
            return JSONResponse(await _unless_gone(request, whole(), up.aclose))
        finally:
            await up.aclose()
            run.finish("abort")

    async def events() -> AsyncIterator[dict[str, Any]]:
        for ev in writer.start():
            yield ev
        try:
            async for content, think in _pieces(request, rm, run, up, reader):
                for ev in writer.add(think, content, []):
                    yield ev
            calls = reader.tool_calls()
            for ev in writer.add("", "", calls) + writer.finish(*end(bool(calls))):
                yield ev
        except APIError as e:
            yield anthropic_error(e.status, e.message)

    return streamed(ANTHROPIC_SSE, events(), _closer(up, run))
