"""The prepare step of the four generation endpoints and of embeddings: validate → render the template →
tokenize → fit to the window → sampling params. Plain synchronous functions that the request skeleton
(generation.py) runs in the worker pool (never on the event loop); each returns a `Prepared` to submit."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .. import cancel
from ..engine.grammar import Constraint, GrammarError, grammar_for_format
from ..engine.logprobs import MAX_TOP_LOGPROBS
from ..engine.params import SamplingParams
from ..manager import LoadedModel
from ...backends.base import EmbedSpan
from . import images as image_input
from . import overflow, prompt_size, prompting
from .errors import APIError
from .options import (check_num_ctx, fit_to_context, ollama_logprobs, options_priority, request_priority,
                      sampling_params)
from .overflow import Truncation
from .prompt_size import ContextOverflow
from .schemas import ChatCompletionRequest, ChatRequest, CompletionRequest, GenerateRequest

IMAGE_TOKENS = 768  # an image's positions as estimated while a chat is cut to fit (Ollama's heuristic), until built
OPEN_ENDED_WINDOWS = 10  # with `shift`, num_predict -1 stops after this many windows (Ollama's bound)
NOT_TRUNCATED = "; `truncate` is false: nothing was dropped to fit"
OPENAI_HINT = " Send \"truncation\": \"auto\" to drop the oldest messages instead."
OPENAI_PROMPT_HINT = " Send \"truncation\": \"auto\" to keep the prompt's start and end instead."


@dataclass
class Prepared:
    """Everything the engine and the reply parser need: the rendered prompt, its ids, the window and params."""

    text: str  # the rendered prompt (for events under EVENFLOW_LOG_CONTENT and the think splitter)
    prompt_ids: list[int]
    params: SamplingParams  # num_predict already capped to the window; what engine.submit receives
    window: int  # this request's context length
    think: bool | str | None = None
    tools: list[dict[str, Any]] | None = None
    constraint: Constraint | None = None  # format / response_format, compiled for this model
    logprobs: int | None = None  # None: no logprobs; k: each token's logprob and its k most likely alternatives
    n: int = 1  # choices sampled from the one prompt (/v1 `n`)
    priority: int = 0  # lower is scheduled sooner (the engine's prompt order)
    template: str | None = None  # the model's template: the reply is read back in its tool-call format
    arch: str | None = None  # the model's architecture: with the template, it picks the reply format
    embeds: list[EmbedSpan] | None = None  # image spans of the prompt, encoded here (images.py)
    truncation: Truncation | None = None  # what the prompt lost to fit the window (overflow.py)
    progress: bool = False  # the stream carries prompt progress (the request asked: `return_progress`)


def check_format(fmt: Any) -> str | None:
    """`format` as a grammar (None when absent); 400 with the grammar engine's message when it cannot compile."""
    try:
        return grammar_for_format(fmt)
    except GrammarError as e:
        raise APIError(400, str(e)[:2000]) from None


def constraint_for(model: LoadedModel, grammar: str | None, think: bool | str | None) -> Constraint | None:
    """The grammar as this model's matcher. With thinking on, the thinking stays free and the answer after
    the closing tag is constrained (Ollama generates until thinking ends, then applies the grammar); so too for a
    model that thinks whatever `think` says (gpt-oss: the answer is its final channel)."""
    if grammar is None:
        return None
    tags = prompting.thinking_tags(model) if think or prompting.always_thinks(model) else None
    try:
        return model.engine.grammars.compile(grammar, start_after=tags[1] if tags else None)
    except GrammarError as e:
        raise APIError(400, str(e)[:2000]) from None


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


def _finish(model: LoadedModel, text: str, ids: list[int], params: SamplingParams, window: int,
            think: bool | str | None = None, tools: list[dict[str, Any]] | None = None,
            grammar: str | None = None) -> Prepared:
    cancel.checkpoint()  # before compiling the grammar, the last long step
    fit_to_context(ids, params, window, model)
    params.preserved_tokens = prompting.preserved_tokens(model)
    return Prepared(text, ids, params, window, think, tools, constraint_for(model, grammar, think),
                    template=prompting.template_of(model), arch=prompting.architecture(model))


def generate(model: LoadedModel, req: GenerateRequest, num_ctx: int | None) -> Prepared:
    """/api/generate: the request's template (or the model's), raw mode, `context` ids prepended; a prompt too long
    for the window keeps its start and end (`truncate`, on by default), as Ollama's runner does."""
    grammar = check_format(req.format)
    window = check_num_ctx(model, num_ctx)
    think = prompting.resolve_think(model, req.think)
    prompt = req.prompt or ""
    images: list[bytes] = []
    if req.images:
        image_input.check_vision(model, req.model)
        images = image_input.decode_images(req.images, "images")
        prompt = "".join(f"[img-{i}] " for i in range(len(images))) + prompt  # Ollama's tags before the prompt
    truncate = req.truncate is not False
    given = len(prompt) + len(req.system or "") + len(req.suffix or "")
    limit = prompt_size.char_limit(model, window, given)
    if req.raw:
        text, add_special = prompt, True
    else:  # rendered whole when it may be cut: its end is what stays
        text, add_special = prompting.render_generate(model, prompt, system=req.system,
                                                      suffix=req.suffix or "", template=req.template, think=think,
                                                      window=window, max_chars=None if truncate else limit)
    params = sampling_params(req.options, model.record.params)
    add = add_special and not req.context
    try:
        if images:
            prompt_size.check_text(model, text, window, limit)
            ids, embeds = _ids(model, text, add, images, list(req.context or []))
            cut = None
            if len(ids) >= window:
                raise overflow.refusal(model, window, len(ids), hint="; a prompt with images is not truncated")
        else:
            ids, cut = overflow.fit_prompt(model, text, add, list(req.context or []), window, limit,
                                           params.num_keep, truncate)
            embeds = None
    except ContextOverflow as e:
        raise e if truncate else e.with_hint(NOT_TRUNCATED) from None
    _ollama_shift(params, req.shift, window)
    prep = _finish(model, text, ids, params, window, think, grammar=grammar)
    prep.embeds, prep.truncation = embeds, cut
    prep.logprobs = ollama_logprobs(req)
    prep.priority = options_priority(req.options)
    prep.progress = bool(req.return_progress)
    return prep


def _ollama_shift(params: SamplingParams, shift: bool | None, window: int) -> None:
    """Ollama's `shift` (on unless false): a full window drops its middle and generation goes on, up to
    OPEN_ENDED_WINDOWS windows when num_predict is -1."""
    params.shift = shift is not False
    if params.shift and params.num_predict == -1:
        params.num_predict = OPEN_ENDED_WINDOWS * window


def _ids(model: LoadedModel, text: str, add_special: bool, images: list[bytes],
         context: list[int] | None = None) -> tuple[list[int], list[EmbedSpan] | None]:
    """The prompt's ids after `context`, and its image spans (encoded now, in this worker) when it has images."""
    context = context or []
    if not images:
        return context + prompting.encode(model, text, add_special=add_special), None
    cancel.checkpoint()
    if add_special and model.runner.tokenizer.add_bos:
        text = prompting.without_leading_bos(model, text)
    mm = image_input.build_prompt(model, text, images, add_special)
    return context + mm.token_ids, [EmbedSpan(e.start + len(context), e.rows, e.causal) for e in mm.embeds]


def _message_images(model: LoadedModel, name: str, messages: list[dict[str, Any]],
                    given: list[list[Any]]) -> tuple[list[dict[str, Any]], list[bytes]]:
    """Each message's images decoded and tagged `[img-N]` in its content (Ollama's chat prompt)."""
    if not any(given):
        return messages, []
    image_input.check_vision(model, name)
    decoded, count = [], 0
    for i, imgs in enumerate(given):
        decoded.append(image_input.decode_images(imgs, f"messages[{i}].images", count))
        count += len(imgs or ())
    return image_input.tag_messages(messages, decoded)


@dataclass
class ChatPrompt:
    """A chat's prompt: its text and ids, its image spans, and what was dropped to fit the window."""

    text: str
    ids: list[int]
    embeds: list[EmbedSpan] | None = None
    truncation: Truncation | None = None


def _chat_prompt(model: LoadedModel, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                 think: bool | str | None, window: int, images: list[bytes] = (),
                 fit: bool | None = None) -> ChatPrompt:
    """The chat rendered and tokenized. `fit` None: as it is (counting); False: a ContextOverflow when it does not
    fit the window; True: its oldest turns dropped until it does (overflow.fit_chat)."""
    if tools and not prompting.supports_tools(model):
        raise APIError(400, f"{prompting.full_name(model)} does not support tools")
    # a chat too long for the window stops rendering at the most a prompt that fits can hold (issue 27: 50,000
    # messages took 48 s of a worker before their 400)
    limit = prompt_size.char_limit(model, window, prompt_size.chat_chars(messages))
    images = list(images)

    def measure(msgs: list[dict[str, Any]], per_image: int = IMAGE_TOKENS) -> tuple[str, list[int], int]:
        text, add_special = prompting.render_chat(model, msgs, tools=tools, think=think, window=window,
                                                  max_chars=limit)
        prompt_size.check_text(model, text, window, limit)
        extra = per_image * image_input.count_tags(text, len(images)) if images else 0
        return text, prompting.encode(model, text, add_special=add_special), extra

    def refuse(tokens: int, minimal: bool) -> ContextOverflow:
        return overflow.refusal(model, window, tokens, minimal)

    if fit is None:
        text, ids, _ = measure(messages)
        return ChatPrompt(text, *_ids(model, text, True, images)) if images else ChatPrompt(text, ids)
    if not images:
        fitted = overflow.fit_chat(messages, measure, window, fit, refuse)
        return ChatPrompt(fitted.text, fitted.ids, None, fitted.truncation)
    # with images the whole chat is built first (its images encoded, as when it fits), so their size is known
    per_image, whole = IMAGE_TOKENS, None
    try:
        text, _, _ = measure(messages)
        ids, embeds = _ids(model, text, True, images)
        if len(ids) < window:
            return ChatPrompt(text, ids, embeds)
        whole = len(ids)
        per_image = -(-sum(len(e.rows) for e in embeds or ()) // max(len(embeds or ()), 1))
    except ContextOverflow:
        if not fit:
            raise
    if not fit:
        raise refuse(whole or 0, False)
    fitted = overflow.fit_chat(messages, lambda m: measure(m, per_image), window, True, refuse)
    ids, embeds = _ids(model, fitted.text, True, images)
    if len(ids) >= window:
        raise refuse(len(ids), True)
    cut = fitted.truncation
    if cut is not None and whole is not None:
        cut.tokens, cut.approximate = whole - len(ids), False
    return ChatPrompt(fitted.text, ids, embeds, cut)


def chat(model: LoadedModel, req: ChatRequest, num_ctx: int | None) -> Prepared:
    """/api/chat: the model's chat template over the request's messages and tools; a chat too long for the window
    loses its oldest turns (`truncate`, on by default)."""
    grammar = check_format(req.format)
    window = check_num_ctx(model, num_ctx)
    think = prompting.resolve_think(model, req.think)
    tools = req.tools or None
    msgs, images = _message_images(model, req.model, [m.as_template_dict() for m in req.messages or []],
                                   [m.images or [] for m in req.messages or []])
    truncate = req.truncate is not False
    try:
        cp = _chat_prompt(model, msgs, tools, think, window, images, fit=truncate)
    except ContextOverflow as e:
        raise e if truncate or e.minimal else e.with_hint(NOT_TRUNCATED) from None
    params = sampling_params(req.options, model.record.params)
    _ollama_shift(params, req.shift, window)
    prep = _finish(model, cp.text, cp.ids, params, window, think, tools, grammar)
    prep.embeds, prep.truncation = cp.embeds, cp.truncation
    prep.logprobs = ollama_logprobs(req)
    prep.priority = options_priority(req.options)
    prep.progress = bool(req.return_progress)
    return prep


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
                           ignore_eos=req.ignore_eos)


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


def chat_completion(model: LoadedModel, req: ChatCompletionRequest, messages: list[dict[str, Any]],
                    think: bool | str | None, what: str = "messages") -> Prepared:
    """/v1/chat/completions: `messages` already converted to the template's shape, `think` from reasoning_effort.
    A chat too long for the window is OpenAI's context_length_exceeded (`what`: the param it names), unless the
    request asks for `truncation: "auto"`."""
    grammar = response_format_grammar(req.response_format)
    think = prompting.resolve_think(model, think)
    tools = req.tools or None
    window = check_num_ctx(model, None)
    truncate = openai_truncation(req.truncation)
    given = [m.get("images") or [] for m in messages]
    messages = [{k: v for k, v in m.items() if k != "images"} for m in messages]
    messages, images = _message_images(model, req.model, messages, given)
    try:
        cp = _chat_prompt(model, messages, tools, think, window, images, fit=truncate)
    except ContextOverflow as e:
        raise e.as_openai(what, "" if truncate or e.minimal else OPENAI_HINT) from None
    prep = _finish(model, cp.text, cp.ids, openai_params(req, model), window, think, tools, grammar)
    prep.embeds, prep.truncation = cp.embeds, cp.truncation
    prep.logprobs, prep.n = chat_logprobs(req), openai_choices(req, model)
    prep.priority = request_priority(req.priority, param="priority")
    prep.progress = bool(req.return_progress)
    return prep


def completion(model: LoadedModel, req: CompletionRequest) -> Prepared:
    """/v1/completions: the prompt as written (Ollama sends it raw), or the template when there is a suffix; too long
    for the window: context_length_exceeded, or with `truncation: "auto"` its start and end (as /api/generate)."""
    window = check_num_ctx(model, None)
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
    prep = _finish(model, text, ids, params, window, grammar=response_format_grammar(req.response_format))
    prep.truncation = cut
    prep.params.preserved_tokens = {}  # no reply parser here: structure tokens stay hidden, as with llama-server
    prep.logprobs, prep.n = completion_logprobs(req), openai_choices(req, model)
    prep.priority = request_priority(req.priority, param="priority")
    prep.progress = bool(req.return_progress)
    return prep


def embed_input(model: LoadedModel, text: str, truncate: bool) -> list[int]:
    """One embedding input's ids, cut to the window when `truncate`; 400 otherwise or when nothing is left."""
    cancel.checkpoint()
    ctx = model.context_length
    limit = prompt_size.char_limit(model, ctx, len(text))
    if limit is not None and len(text) > limit and not truncate:
        raise APIError(400, "the input length exceeds the context length")
    ids = _head_ids(model, text, ctx, limit if truncate else None)
    if len(ids) > ctx:
        if not truncate:
            raise APIError(400, "the input length exceeds the context length")
        ids = ids[:ctx]
    if not ids:
        raise APIError(400, "cannot embed an input that tokenises to nothing")
    return ids


def _head_ids(model: LoadedModel, text: str, ctx: int, limit: int | None) -> list[int]:
    """The ids of `text`, or (`limit` given: truncating) of a start of it that holds its first `ctx` tokens twice
    over, found by doubling a prefix: 5 MB of text then costs what a window's worth does, as on the generation
    routes, which refuse it by `limit`. The margin keeps the cut far from where the kept tokens end, so they
    tokenize as in the whole text; the first `limit` characters always hold them."""
    def encode(t: str) -> list[int]:
        return list(model.runner.tokenizer.encode(t, add_special=True, parse_special=True))

    if limit is None:
        return encode(text)
    n = 8 * ctx  # characters: about two windows of ordinary text
    while n < len(text) and n < 2 * limit:
        ids = encode(text[:n])
        if len(ids) >= 2 * ctx:
            return ids
        cancel.checkpoint()
        n *= 2
    return encode(text[: 2 * limit])
