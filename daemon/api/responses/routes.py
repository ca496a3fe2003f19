"""OpenAI's Responses API (POST /v1/responses), stateless as Ollama serves it: the request (request.py) runs as the
/v1/chat/completions request it translates to, through the one request skeleton (pipeline/generation.py) with its
plan (plan.py) and prepare step (prepare.py); reply.py writes the Responses wire format."""
from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import Response

from ..http.errors import parse_body
from ..pipeline import generation
from ..pipeline.generation import Generate
from . import plan, prepare
from .reply import RESPONSES_SSE, ResponsesReply
from .request import ResponsesRequest

router = APIRouter(prefix="/v1")

RESPONSES = Generate("/v1/responses", plan.response, prepare.response, ResponsesReply, RESPONSES_SSE,
                     upstream=prepare.upstream)


@router.post("/responses")
async def responses(request: Request) -> Response:
    t0 = time.perf_counter_ns()
    return await generation.generate(request, RESPONSES, await parse_body(request, ResponsesRequest), t0)
