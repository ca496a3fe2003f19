"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens), so Anthropic's clients (and Claude Code) run
on local and remote models. A request is translated to /api/chat's terms (request.py) and runs the one request
skeleton (pipeline/generation.py) with its plan (plan.py), prepare step (prepare.py) and reply (reply.py)."""
from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ..http.errors import parse_body
from ..pipeline import generation
from ..pipeline.generation import Generate
from . import plan, prepare
from .reply import ANTHROPIC_SSE, AnthropicReply
from .request import CountTokensRequest, MessagesRequest

router = APIRouter(prefix="/v1")

MESSAGES = Generate("/v1/messages", plan.messages, prepare.messages, AnthropicReply, ANTHROPIC_SSE,
                    upstream=prepare.upstream)


@router.post("/messages")
async def messages(request: Request) -> Response:
    t0 = time.perf_counter_ns()
    return await generation.generate(request, MESSAGES, await parse_body(request, MessagesRequest), t0)


@router.post("/messages/count_tokens")
async def count_tokens(request: Request) -> JSONResponse:
    """The prompt's tokens: what the same request's usage reports as input_tokens + cache_read_input_tokens."""
    req = await parse_body(request, CountTokensRequest)
    n = await generation.on_local(request, "count_tokens", req.model, prepare.count, plan.count_tokens(req))
    return JSONResponse({"input_tokens": n})
