"""The prepare step of the four generation endpoints and of embeddings: validate → render the template →
tokenize → fit to the window → sampling params. Plain synchronous functions that the handlers run in the worker
pool (never on the event loop); each returns a `Prepared` that the handler submits and streams."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..engine.params import SamplingParams
from ..models import LoadedModel
from . import prompting
from .errors import APIError
from .generation import check_num_ctx, fit_to_context, sampling_params
from .schemas import ChatCompletionRequest, ChatRequest, CompletionRequest, GenerateRequest


@dataclass
class Prepared:
    """Everything the engine and the reply parser need: the rendered prompt, its ids, the window and params."""

    text: str  # the rendered prompt (for events under EVENFLOW_LOG_CONTENT and the think splitter)
    prompt_ids: list[int]
    params: SamplingParams  # num_predict already capped to the window; what engine.submit receives
    window: int  # this request's context length
    think: bool | str | None = None
    tools: list[dict[str, Any]] | None = None


def check_format(fmt: Any) -> None:
    """Structured outputs (a JSON grammar) are not implemented: say so rather than ignore the request."""
    if fmt is None or fmt == "":
        return
    if fmt == "json" or isinstance(fmt, dict):
        raise APIError(400, "structured outputs are not supported yet (format \"json\" or a JSON schema)")
    raise APIError(400, f"invalid format: {json.dumps(fmt)[:200]}; expected \"json\" or a valid JSON Schema object")


def _finish(model: LoadedModel, text: str, ids: list[int], params: SamplingParams, window: int,
            think: bool | str | None = None, tools: list[dict[str, Any]] | None = None) -> Prepared:
    fit_to_context(ids, params, window, model)
    return Prepared(text, ids, params, window, think, tools)


def generate(model: LoadedModel, req: GenerateRequest, num_ctx: int | None) -> Prepared:
    """/api/generate: the request's template (or the model's), raw mode, `context` ids prepended."""
    check_format(req.format)
    window = check_num_ctx(model, num_ctx)
    think = prompting.resolve_think(model, req.think)
    if req.raw:
        text, add_special = req.prompt or "", True
    else:
        text, add_special = prompting.render_generate(model, req.prompt or "", system=req.system,
                                                      suffix=req.suffix or "", template=req.template, think=think)
    ids = list(req.context or []) + prompting.encode(model, text, add_special=add_special and not req.context)
    params = sampling_params(req.options, model.record.params)
    return _finish(model, text, ids, params, window, think)


def _chat_prompt(model: LoadedModel, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                 think: bool | str | None) -> tuple[str, list[int]]:
    if tools and not prompting.supports_tools(model):
        raise APIError(400, f"{prompting.full_name(model)} does not support tools")
    text, add_special = prompting.render_chat(model, messages, tools=tools, think=think)
    return text, prompting.encode(model, text, add_special=add_special)


def chat(model: LoadedModel, req: ChatRequest, num_ctx: int | None) -> Prepared:
    """/api/chat: the model's chat template over the request's messages and tools."""
    check_format(req.format)
    window = check_num_ctx(model, num_ctx)
    think = prompting.resolve_think(model, req.think)
    tools = req.tools or None
    text, ids = _chat_prompt(model, [m.as_template_dict() for m in req.messages or []], tools, think)
    params = sampling_params(req.options, model.record.params)
    return _finish(model, text, ids, params, window, think, tools)


def openai_params(req: ChatCompletionRequest | CompletionRequest, model: LoadedModel) -> SamplingParams:
    """Ollama's /v1 mapping: max_tokens, stop, seed, penalties; temperature and top_p 1.0 when absent."""
    stop = [req.stop] if isinstance(req.stop, str) else req.stop
    max_tokens = req.max_tokens if req.max_tokens is not None else req.max_completion_tokens
    if max_tokens is not None and max_tokens < 0:
        raise APIError(400, f"max_tokens must be >= 0, got {max_tokens}", param="max_tokens")
    if req.n not in (None, 1):
        raise APIError(400, f"n={req.n} is not supported; only n=1", param="n")
    return sampling_params(None, model.record.params, num_predict=max_tokens, stop=stop, seed=req.seed,
                           temperature=1.0 if req.temperature is None else req.temperature,
                           top_p=1.0 if req.top_p is None else req.top_p,
                           frequency_penalty=req.frequency_penalty, presence_penalty=req.presence_penalty)


def chat_completion(model: LoadedModel, req: ChatCompletionRequest, messages: list[dict[str, Any]],
                    think: bool | str | None) -> Prepared:
    """/v1/chat/completions: `messages` already converted to the template's shape, `think` from reasoning_effort."""
    rf = req.response_format or {}
    if rf.get("type") in ("json_object", "json_schema"):
        check_format("json")
    think = prompting.resolve_think(model, think)
    tools = req.tools or None
    text, ids = _chat_prompt(model, messages, tools, think)
    return _finish(model, text, ids, openai_params(req, model), check_num_ctx(model, None), think, tools)


def completion(model: LoadedModel, req: CompletionRequest) -> Prepared:
    """/v1/completions: the prompt as written (Ollama sends it raw), or the template when there is a suffix."""
    if req.suffix:
        text, add = prompting.render_generate(model, req.prompt, system=None, suffix=req.suffix, template=None,
                                              think=None)
    else:
        text, add = req.prompt, True
    ids = prompting.encode(model, text, add_special=add)
    return _finish(model, text, ids, openai_params(req, model), check_num_ctx(model, None))


def embed_input(model: LoadedModel, text: str, truncate: bool) -> list[int]:
    """One embedding input's ids, cut to the window when `truncate`; 400 otherwise or when nothing is left."""
    ids = list(model.runner.tokenizer.encode(text, add_special=True, parse_special=True))
    ctx = model.context_length
    if len(ids) > ctx:
        if not truncate:
            raise APIError(400, "the input length exceeds the context length")
        ids = ids[:ctx]
    if not ids:
        raise APIError(400, "cannot embed an input that tokenises to nothing")
    return ids
