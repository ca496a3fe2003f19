"""The prepare step of /v1/chat/completions and /v1/completions (in the worker pool): OpenAI's sampling mapping,
response_format, n, logprobs, truncation, on the pipeline's shared steps (pipeline/prepare.py)."""
from __future__ import annotations

import json
from typing import Any

from ...engine.logprobs import MAX_TOP_LOGPROBS
from ...engine.params import SamplingParams
from ...model_types import LoadedModel
from ..http.errors import APIError
from ..pipeline import overflow, prompt_size, prompting
from ..pipeline.options import request_priority, sampling_params
from ..pipeline.prepare import Prepared, chat_prompt, check_format, finish, message_images
from ..pipeline.prompt_size import ContextOverflow
from .request import ChatCompletionRequest, CompletionRequest

OPENAI_HINT = " Send \"truncation\": \"auto\" to drop the oldest messages instead."
OPENAI_PROMPT_HINT = " Send \"truncation\": \"auto\" to keep the prompt's start and end instead."


def response_format_grammar(rf: Any) -> str | None:
    """OpenAI's response_format: text | json_object ("json") | json_schema (its `schema`)."""
    if rf is None:
        return None
    if not isinstance(rf, dict) or rf.get("type") not in ("text", "json_object", "json_schema"):
        raise APIError(400, f"invalid response_format: {json.dumps(rf)[:200]}; expected type \"text\", "
                            f"\"json_object\" or \"json_schema\"", param="response_format")
    if rf["type"] == "json_object":
        return check_format("json")
    if rf["type"] == "json_schema":
        js = rf.get("json_schema")
        schema = js.get("schema") if isinstance(js, dict) else None
        if not isinstance(schema, dict):
            raise APIError(400, "response_format json_schema needs json_schema.schema (an object)",
                           param="response_format")
        return check_format(schema)
    return None


def openai_truncation(value: Any, param: str = "truncation") -> bool:
    """`truncation` (the Responses API's, also taken on chat and legacy completions): "auto" cuts a prompt too long
    for the window, "disabled" (the default) refuses it with context_length_exceeded."""
    if value in (None, "disabled"):
        return False
    if value == "auto":
        return True
    raise APIError(400, f"invalid truncation {value!r}: expected \"auto\" or \"disabled\"", param=param)


def openai_params(req: ChatCompletionRequest | CompletionRequest, model: LoadedModel) -> SamplingParams:
    """Ollama's /v1 mapping: max_tokens, stop, seed, penalties; temperature and top_p 1.0 when absent."""
    stop = [req.stop] if isinstance(req.stop, str) else req.stop
    max_tokens = req.max_tokens if req.max_tokens is not None else req.max_completion_tokens
    if max_tokens is not None and max_tokens < 0:
        raise APIError(400, f"max_tokens must be >= 0, got {max_tokens}", param="max_tokens")
    return sampling_params(None, model.record.params, num_predict=max_tokens, stop=stop, seed=req.seed,
                           temperature=1.0 if req.temperature is None else req.temperature,
                           top_p=1.0 if req.top_p is None else req.top_p,
                           frequency_penalty=req.frequency_penalty, presence_penalty=req.presence_penalty,
                           ignore_eos=req.ignore_eos, draft_num_predict=req.draft_num_predict)


MAX_CHOICES = 8


def openai_choices(req: ChatCompletionRequest | CompletionRequest, model: LoadedModel) -> int:
    """`n`: 1..8 and at most the model's slots, so every choice runs at once; 400 otherwise."""
    n = 1 if req.n is None else req.n
    limit = min(MAX_CHOICES, model.engine.scheduler.config.max_num_seqs)
    if not 1 <= n <= limit:
        raise APIError(400, f"n must be between 1 and {limit} for model '{model.name}', got {n}", param="n")
    return n


def chat_logprobs(req: ChatCompletionRequest) -> int | None:
    """/v1/chat/completions: `logprobs` (bool) and `top_logprobs` (0..20, only with logprobs) as the engine's k."""
    if req.logprobs is not None and not isinstance(req.logprobs, bool):
        raise APIError(400, f"logprobs must be a boolean, got {req.logprobs!r}", param="logprobs")
    top = req.top_logprobs
    if top is not None and not 0 <= top <= MAX_TOP_LOGPROBS:
        raise APIError(400, f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {top}", param="top_logprobs")
    if top and not req.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    return (top or 0) if req.logprobs else None


def completion_logprobs(req: CompletionRequest) -> int | None:
    """/v1/completions: the legacy `logprobs` integer (0..20 alternatives per token; 0 = the chosen token only)."""
    v = req.logprobs
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_TOP_LOGPROBS:
        raise APIError(400, f"logprobs must be an integer between 0 and {MAX_TOP_LOGPROBS}, got {v!r}",
                       param="logprobs")
    return v


def chat_completion(model: LoadedModel, req: ChatCompletionRequest, window: int, messages: list[dict[str, Any]],
                    think: bool | str | None, what: str = "messages") -> Prepared:
    """/v1/chat/completions: `messages` already converted to the template's shape, `think` from reasoning_effort.
    A chat too long for the window is OpenAI's context_length_exceeded (`what`: the param it names), unless the
    request asks for `truncation: "auto"`."""
    grammar = response_format_grammar(req.response_format)
    think = prompting.resolve_think(model, think)
    tools = req.tools or None
    truncate = openai_truncation(req.truncation)
    given = [m.get("images") or [] for m in messages]
    messages = [{k: v for k, v in m.items() if k != "images"} for m in messages]
    messages, images = message_images(model, req.model, messages, given)
    try:
        cp = chat_prompt(model, messages, tools, think, window, images, fit=truncate)
    except ContextOverflow as e:
        raise e.as_openai(what, "" if truncate or e.minimal else OPENAI_HINT) from None
    prep = finish(model, cp.text, cp.ids, openai_params(req, model), window, think, tools, grammar)
    prep.embeds, prep.truncation = cp.embeds, cp.truncation
    prep.logprobs, prep.n = chat_logprobs(req), openai_choices(req, model)
    prep.priority = request_priority(req.priority, param="priority")
    prep.progress = bool(req.return_progress)
    return prep


def completion(model: LoadedModel, req: CompletionRequest, window: int) -> Prepared:
    """/v1/completions: the prompt as written (Ollama sends it raw), or the template when there is a suffix; too long
    for the window: context_length_exceeded, or with `truncation: "auto"` its start and end (as /api/generate)."""
    truncate = openai_truncation(req.truncation)
    limit = prompt_size.char_limit(model, window, len(req.prompt) + len(req.suffix or ""))
    params = openai_params(req, model)
    try:
        if req.suffix:
            text, add = prompting.render_generate(model, req.prompt, system=None, suffix=req.suffix, template=None,
                                                  think=None, window=window, max_chars=None if truncate else limit)
        else:
            text, add = req.prompt, True
        ids, cut = overflow.fit_prompt(model, text, add, [], window, limit, params.num_keep, truncate)
    except ContextOverflow as e:
        raise e.as_openai("prompt", "" if truncate else OPENAI_PROMPT_HINT) from None
    prep = finish(model, text, ids, params, window, grammar=response_format_grammar(req.response_format))
    prep.truncation = cut
    prep.params.preserved_tokens = {}  # no reply parser here: structure tokens stay hidden, as with llama-server
    prep.parse = False  # the text as the model wrote it
    prep.logprobs, prep.n = completion_logprobs(req), openai_choices(req, model)
    prep.priority = request_priority(req.priority, param="priority")
    prep.progress = bool(req.return_progress)
    return prep
