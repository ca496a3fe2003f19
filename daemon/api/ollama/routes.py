"""Ollama's inference endpoints: /api/generate, /api/chat, /api/embed, /api/embeddings, and the root/version.
Each handler parses its body and hands it to the request skeleton (pipeline/generation.py) with its endpoint's steps."""
from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from .... import __version__
from ..http.errors import APIError, not_found, parse_body
from ..http.wire import NDJSON
from ..pipeline import generation
from ..pipeline.generation import Embed, Generate
from . import plan, prepare
from .reply import ChatReply, GenerateReply, embed_reply, embeddings_reply
from .request import ChatRequest, EmbeddingsRequest, EmbedRequest, GenerateRequest

router = APIRouter()

VERSION = "0.13.0"  # the Ollama API version we answer /api/version with (clients gate features on it)

GENERATE = Generate("/api/generate", plan.generate, prepare.generate, GenerateReply, NDJSON, GenerateReply.loaded,
                    prepare.upstream_generate)
CHAT = Generate("/api/chat", plan.chat, prepare.chat, ChatReply, NDJSON, ChatReply.loaded, prepare.upstream_chat)
EMBED = Embed("/api/embed", plan.embed, embed_reply)
EMBEDDINGS = Embed("/api/embeddings", plan.embeddings, embeddings_reply)


@router.api_route("/", methods=["GET", "HEAD"])
async def root() -> PlainTextResponse:
    return PlainTextResponse("Ollama is running")


@router.api_route("/api/version", methods=["GET", "HEAD"])
async def version() -> JSONResponse:
    return JSONResponse({"version": VERSION, "evenflow": __version__})


@router.post("/api/generate")
async def generate(request: Request) -> Response:
    t0 = time.perf_counter_ns()
    req = await parse_body(request, GenerateRequest)
    if not req.model:
        raise not_found("")
    return await generation.generate(request, GENERATE, req, t0)


@router.post("/api/chat")
async def chat(request: Request) -> Response:
    t0 = time.perf_counter_ns()
    req = await parse_body(request, ChatRequest)
    if not req.model:
        raise APIError(400, "model is required")
    return await generation.generate(request, CHAT, req, t0)


@router.post("/api/embed")
async def embed(request: Request) -> JSONResponse:
    t0 = time.perf_counter_ns()
    req = await parse_body(request, EmbedRequest)
    if not req.model:
        raise APIError(400, "model is required")
    return await generation.embed(request, EMBED, req, t0)


@router.post("/api/embeddings")
async def embeddings(request: Request) -> JSONResponse:
    t0 = time.perf_counter_ns()
    req = await parse_body(request, EmbeddingsRequest)
    if not req.model:
        raise APIError(400, "model is required")
    return await generation.embed(request, EMBEDDINGS, req, t0)
