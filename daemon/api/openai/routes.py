"""OpenAI-compatible endpoints (/v1): chat completions, completions, embeddings and models. Each inference handler
parses its body and hands it to the request skeleton (pipeline/generation.py) with its endpoint's steps."""
from __future__ import annotations

import asyncio
import time
from datetime import datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ...context import context
from ..http.errors import APIError, parse_body
from ..http.wire import SSE
from ..pipeline import generation
from ..pipeline.generation import Embed, Generate
from . import plan, prepare
from .reply import ChatCompletionReply, CompletionReply, embedding_reply
from .request import ChatCompletionRequest, CompletionRequest, EmbeddingRequest

router = APIRouter(prefix="/v1")

# a remote model's /v1 request is relayed as it came: the upstream speaks this dialect (remote/relay.py)
CHAT_COMPLETIONS = Generate("/v1/chat/completions", plan.chat_completion, prepare.chat_completion,
                            ChatCompletionReply, SSE, relay=True)
COMPLETIONS = Generate("/v1/completions", plan.completion, prepare.completion, CompletionReply, SSE, relay=True)
EMBEDDINGS = Embed("/v1/embeddings", plan.embedding, embedding_reply, relay=True)


@router.post("/chat/completions")
async def chat_completions(request: Request) -> Response:
    t0 = time.perf_counter_ns()
    req = await parse_body(request, ChatCompletionRequest)
    return await generation.generate(request, CHAT_COMPLETIONS, req, t0)


@router.post("/completions")
async def completions(request: Request) -> Response:
    t0 = time.perf_counter_ns()
    req = await parse_body(request, CompletionRequest)
    return await generation.generate(request, COMPLETIONS, req, t0)


@router.post("/embeddings")
async def embeddings(request: Request) -> Response:
    t0 = time.perf_counter_ns()
    req = await parse_body(request, EmbeddingRequest)
    return await generation.embed(request, EMBEDDINGS, req, t0)


def _model_obj(m: dict[str, Any]) -> dict[str, Any]:
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
    models = await asyncio.to_thread(context(request).store.list_models)
    return JSONResponse({"object": "list", "data": [_model_obj(m) for m in models]})


@router.get("/models/{model:path}")
async def retrieve_model(request: Request, model: str) -> JSONResponse:
    models = await asyncio.to_thread(context(request).store.list_models)
    record = context(request).manager.resolve(model)  # 404 in OpenAI shape for unknown names
    for m in models:
        if m["model"] == record.name:
            return JSONResponse(_model_obj(m))
    raise APIError(404, f"model '{model}' not found")
