"""The first step of a local model request, before any model is held: the checks that need no model (a 400 here
costs no load), and how the request holds its model: keep_alive, num_ctx, streamed or not, and what the prepare
step gets besides the model and the request. Plain functions of the parsed request."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .errors import APIError
from .images import MAX_IMAGES
from .options import ollama_logprobs, parse_keep_alive, requested_num_ctx
from .schemas import (ChatCompletionRequest, ChatRequest, CompletionRequest, EmbeddingRequest, EmbeddingsRequest,
                      EmbedRequest, GenerateRequest, OAIMessage)


@dataclass
class Plan:
    """How a generation request holds its model and what its prepare step gets."""

    stream: bool
    keep_alive: float | None = None
    num_ctx: int | None = None  # the request's own window (Ollama's option); None: the model's default
    args: tuple[Any, ...] = ()  # the prepare step's arguments after the model, the request and the window
    load_only: bool = False  # Ollama's empty prompt or messages: load the model (unload it with keep_alive 0)


@dataclass
class EmbedPlan:
    """An embedding request's texts, and how it holds its model."""

    inputs: list[str]
    truncate: bool = True  # cut an input to the window (else a 400)
    keep_alive: float | None = None
    num_ctx: int | None = None


# ---------------------------------------------------------------------------------------------------------
# Ollama

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


# ---------------------------------------------------------------------------------------------------------
# OpenAI

EFFORTS: dict[str | None, bool | str | None] = {
    None: None, "none": False, "minimal": "low", "low": "low", "medium": "medium", "high": "high", "max": "max",
    "xhigh": "max", "ultra": "max"}


def chat_completion(req: ChatCompletionRequest) -> Plan:
    """The messages in the template's shape, and `think` from reasoning_effort."""
    messages = convert_messages(req.messages)
    effort = req.reasoning_effort
    if effort not in EFFORTS:
        raise APIError(400, f"invalid reasoning_effort {effort!r}: expected none, minimal, low, medium, high, max",
                       param="reasoning_effort")
    return Plan(bool(req.stream), args=(messages, EFFORTS[effort]))


def completion(req: CompletionRequest) -> Plan:
    return Plan(bool(req.stream))


def embedding(req: EmbeddingRequest) -> EmbedPlan:
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
    return EmbedPlan(inputs)


def _image_url(p: dict[str, Any]) -> str:
    """An image_url part's URL (checked and decoded in the prepare step, off the event loop)."""
    iu = p.get("image_url")
    url = iu.get("url") if isinstance(iu, dict) else iu
    if not isinstance(url, str) or not url:
        raise APIError(400, "invalid image_url part: expected image_url.url (a data URL)", param="messages")
    return url


def _content(content: Any) -> tuple[str, list[str]]:
    """A message's text (text parts joined) and its images (image_url parts, Ollama's order: after the text)."""
    if content is None or isinstance(content, str):
        return content or "", []
    if isinstance(content, list):
        parts, images = [], []
        for p in content:
            if not isinstance(p, dict):
                raise APIError(400, "invalid message content part: expected an object")
            if p.get("type") == "text":
                if not isinstance(p.get("text", ""), str):
                    raise APIError(400, "invalid message content part: 'text' must be a string", param="messages")
                parts.append(p.get("text", ""))
            elif p.get("type") == "image_url":
                images.append(_image_url(p))
            elif p.get("type") == "input_audio":
                raise APIError(400, "audio inputs are not supported", param="messages")
            else:
                raise APIError(400, f"invalid message content part type {p.get('type')!r}")
        return "\n".join(parts), images
    raise APIError(400, f"invalid message content: expected a string or a list of parts, got {type(content).__name__}")


def convert_messages(messages: list[OAIMessage]) -> list[dict[str, Any]]:
    """OpenAI messages -> the template's message dicts (tool_calls arguments parsed, tool names resolved)."""
    if not messages:
        raise APIError(400, "[] is too short - 'messages'", param="messages")
    out: list[dict[str, Any]] = []
    call_names: dict[str, str] = {}
    n_images = 0
    for m in messages:
        role = m.role.lower()
        if role not in ("system", "developer", "user", "assistant", "tool"):
            raise APIError(400, f"invalid message role {m.role!r}", param="messages")
        text, images = _content(m.content)
        msg: dict[str, Any] = {"role": "system" if role == "developer" else role, "content": text}
        if images:
            n_images += len(images)
            if n_images > MAX_IMAGES:
                raise APIError(400, f"too many images: at most {MAX_IMAGES} per request", param="messages")
            msg["images"] = images
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
