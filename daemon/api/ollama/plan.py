"""The checks of Ollama's requests that need no model (a 400 here costs no load), and how each holds its model
(keep_alive, num_ctx, streamed or not): the pipeline's plan step for /api/generate, /api/chat, /api/embed(dings)."""
from __future__ import annotations

from ...engine.logprobs import MAX_TOP_LOGPROBS
from ..http.errors import APIError
from ..pipeline.images import MAX_IMAGES
from ..pipeline.options import parse_keep_alive, requested_num_ctx
from ..pipeline.plan import EmbedPlan, Plan
from .request import ChatRequest, EmbeddingsRequest, EmbedRequest, GenerateRequest


def generate(req: GenerateRequest) -> Plan:
    ollama_logprobs(req)  # a bad top_logprobs is a 400 before the model loads
    if req.raw and (req.template or req.system or req.context):
        raise APIError(400, "raw mode does not support template, system, or context")
    if req.images and len(req.images) > MAX_IMAGES:
        raise APIError(400, f"too many images: at most {MAX_IMAGES} per request")
    keep_alive, num_ctx = parse_keep_alive(req.keep_alive), requested_num_ctx(req.options)
    return Plan(req.stream is not False, keep_alive, num_ctx, load_only=not req.prompt and not req.suffix)


def chat(req: ChatRequest) -> Plan:
    ollama_logprobs(req)
    keep_alive, num_ctx = parse_keep_alive(req.keep_alive), requested_num_ctx(req.options)
    if req.messages and sum(len(m.images or ()) for m in req.messages) > MAX_IMAGES:
        raise APIError(400, f"too many images: at most {MAX_IMAGES} per request")
    return Plan(req.stream is not False, keep_alive, num_ctx, load_only=not req.messages)


def embed_inputs(req: EmbedRequest) -> list[str]:
    """/api/embed's `input` as a list of texts (a string is one, an empty string none); 400 for anything else."""
    inputs = req.input
    if isinstance(inputs, str):
        inputs = [inputs] if inputs else []
    elif inputs is None:
        inputs = []
    elif not isinstance(inputs, list) or not all(isinstance(s, str) for s in inputs):
        raise APIError(400, "invalid input type")
    if req.dimensions is not None and req.dimensions < 1:
        raise APIError(400, f"dimensions must be a positive integer, got {req.dimensions}")
    return inputs


def embed(req: EmbedRequest) -> EmbedPlan:
    inputs = embed_inputs(req)
    return EmbedPlan(inputs, req.truncate is not False, parse_keep_alive(req.keep_alive),
                     requested_num_ctx(req.options))


def embeddings(req: EmbeddingsRequest) -> EmbedPlan:
    """Legacy /api/embeddings: one prompt; an empty one still loads the model."""
    return EmbedPlan([req.prompt] if req.prompt else [], True, parse_keep_alive(req.keep_alive),
                     requested_num_ctx(req.options))


def ollama_logprobs(req: GenerateRequest | ChatRequest) -> int | None:
    """Ollama's `logprobs` (bool) and `top_logprobs` (0..20 alternatives, read only when logprobs is on)."""
    top = req.top_logprobs
    if top is not None and not 0 <= top <= MAX_TOP_LOGPROBS:
        raise APIError(400, f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {top}")
    return (top or 0) if req.logprobs else None
