"""The prepare step's shared parts: validate, render the template, tokenize, fit to the window, and a `Prepared`
to submit. Each dialect's prepare (ollama/, openai/, anthropic/, responses/ prepare.py) composes these plain
synchronous functions; the request skeleton (generation.py) runs it in the worker pool, never on the event loop.
Also one embedding input's ids."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ....backends.base import EmbedSpan
from ... import cancel
from ...engine.grammar import Constraint, GrammarError, grammar_for_format
from ...engine.params import SamplingParams
from ...model_types import LoadedModel
from ..http.errors import APIError
from . import images as image_input
from . import overflow, prompt_size, prompting
from .options import fit_to_context
from .overflow import Truncation
from .prompt_size import ContextOverflow

IMAGE_TOKENS = 768  # an image's positions as estimated while a chat is cut to fit (Ollama's heuristic), until built


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
    parse: bool = True  # the output is read back as thinking, content and tool calls (not /v1/completions')


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


def finish(model: LoadedModel, text: str, ids: list[int], params: SamplingParams, window: int,
            think: bool | str | None = None, tools: list[dict[str, Any]] | None = None,
            grammar: str | None = None) -> Prepared:
    """The last step of every prepare: fit to the window, compile the grammar, a `Prepared` to submit."""
    cancel.checkpoint()  # before compiling the grammar, the last long step
    fit_to_context(ids, params, window, model)
    params.preserved_tokens = prompting.preserved_tokens(model)
    return Prepared(text, ids, params, window, think, tools, constraint_for(model, grammar, think),
                    template=prompting.template_of(model), arch=prompting.architecture(model))


def encode_prompt(model: LoadedModel, text: str, add_special: bool, images: list[bytes],
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


def message_images(model: LoadedModel, name: str, messages: list[dict[str, Any]],
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


def chat_prompt(model: LoadedModel, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
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
        return ChatPrompt(text, *encode_prompt(model, text, True, images)) if images else ChatPrompt(text, ids)
    if not images:
        fitted = overflow.fit_chat(messages, measure, window, fit, refuse)
        return ChatPrompt(fitted.text, fitted.ids, None, fitted.truncation)
    # with images the whole chat is built first (its images encoded, as when it fits), so their size is known
    per_image, whole = IMAGE_TOKENS, None
    try:
        text, _, _ = measure(messages)
        ids, embeds = encode_prompt(model, text, True, images)
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
    ids, embeds = encode_prompt(model, fitted.text, True, images)
    if len(ids) >= window:
        raise refuse(len(ids), True)
    cut = fitted.truncation
    if cut is not None and whole is not None:
        cut.tokens, cut.approximate = whole - len(ids), False
    return ChatPrompt(fitted.text, ids, embeds, cut)


def embed_input(model: LoadedModel, text: str, truncate: bool, window: int) -> list[int]:
    """One embedding input's ids, cut to the window when `truncate`; 400 otherwise or when nothing is left."""
    cancel.checkpoint()
    ctx = min(window, model.context_length)  # the runner's embedding context is the window it loaded with
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
