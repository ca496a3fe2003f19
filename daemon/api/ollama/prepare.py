"""The prepare step of /api/generate and /api/chat: for our engine (in the worker pool) Ollama's template, raw mode,
`context`, images, truncation and `shift`, on the pipeline's shared steps (pipeline/prepare.py); for a remote
model the upstream request (`upstream_generate`, `upstream_chat`, in remote/convert.py's terms)."""
from __future__ import annotations

from ...engine.params import SamplingParams
from ...model_types import LoadedModel
from ..http.errors import APIError
from ..pipeline import images as image_input
from ..pipeline import overflow, prompt_size, prompting
from ..pipeline.options import options_priority, sampling_params
from ..pipeline.prepare import Prepared, chat_prompt, check_format, encode_prompt, finish, message_images
from ..pipeline.prompt_size import ContextOverflow
from ..remote.convert import UpstreamRequest, chat_body, chat_messages, chat_request
from ..remote.hub import RemoteModel
from .plan import ollama_logprobs
from .request import ChatRequest, GenerateRequest

OPEN_ENDED_WINDOWS = 10  # with `shift`, num_predict -1 stops after this many windows (Ollama's bound)
NOT_TRUNCATED = "; `truncate` is false: nothing was dropped to fit"


def generate(model: LoadedModel, req: GenerateRequest, window: int) -> Prepared:
    """/api/generate: the request's template (or the model's), raw mode, `context` ids prepended; a prompt too long
    for the window keeps its start and end (`truncate`, on by default), as Ollama's runner does. `window`: the
    request's context length (its num_ctx or the model's default, as the model manager settled it)."""
    grammar = check_format(req.format)
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
            ids, embeds = encode_prompt(model, text, add, images, list(req.context or []))
            cut = None
            if len(ids) >= window:
                raise overflow.refusal(model, window, len(ids), hint="; a prompt with images is not truncated")
        else:
            ids, cut = overflow.fit_prompt(model, text, add, list(req.context or []), window, limit,
                                           params.num_keep, truncate)
            embeds = None
    except ContextOverflow as e:
        raise e if truncate else e.with_hint(NOT_TRUNCATED) from None
    shift(params, req.shift, window)
    prep = finish(model, text, ids, params, window, think, grammar=grammar)
    prep.embeds, prep.truncation = embeds, cut
    prep.logprobs = ollama_logprobs(req)
    prep.priority = options_priority(req.options)
    prep.progress = bool(req.return_progress)
    return prep


def shift(params: SamplingParams, shift: bool | None, window: int) -> None:
    """Ollama's `shift` (on unless false): a full window drops its middle and generation goes on, up to
    OPEN_ENDED_WINDOWS windows when num_predict is -1."""
    params.shift = shift is not False
    if params.shift and params.num_predict == -1:
        params.num_predict = OPEN_ENDED_WINDOWS * window


def chat(model: LoadedModel, req: ChatRequest, window: int) -> Prepared:
    """/api/chat: the model's chat template over the request's messages and tools; a chat too long for the window
    loses its oldest turns (`truncate`, on by default)."""
    grammar = check_format(req.format)
    think = prompting.resolve_think(model, req.think)
    tools = req.tools or None
    msgs, images = message_images(model, req.model, [m.as_template_dict() for m in req.messages or []],
                                   [m.images or [] for m in req.messages or []])
    truncate = req.truncate is not False
    try:
        cp = chat_prompt(model, msgs, tools, think, window, images, fit=truncate)
    except ContextOverflow as e:
        raise e if truncate or e.minimal else e.with_hint(NOT_TRUNCATED) from None
    params = sampling_params(req.options, model.record.params)
    shift(params, req.shift, window)
    prep = finish(model, cp.text, cp.ids, params, window, think, tools, grammar)
    prep.embeds, prep.truncation = cp.embeds, cp.truncation
    prep.logprobs = ollama_logprobs(req)
    prep.priority = options_priority(req.options)
    prep.progress = bool(req.return_progress)
    return prep


def _no_logprobs(req: GenerateRequest | ChatRequest) -> None:
    if req.logprobs or req.top_logprobs:
        raise APIError(400, "logprobs are not supported for remote models yet")


def upstream_generate(rm: RemoteModel, req: GenerateRequest) -> UpstreamRequest:
    """/api/generate for a remote model: a raw prompt or a suffix (FIM) -> upstream /completions; a templated one
    -> /chat/completions (the upstream applies its own template)."""
    _no_logprobs(req)
    if req.images:
        raise APIError(400, "images are not supported for remote models yet")
    if req.template or req.context:
        raise APIError(400, "template and context do not apply to a remote model (the upstream engine applies its "
                            "own template; send the conversation to /api/chat)")
    if req.raw or req.suffix:
        body = chat_body(rm.endpoint.model, req.options, rm.params, fmt=req.format)
        body["prompt"] = req.prompt or ""
        if req.suffix:
            body["suffix"] = req.suffix
        return UpstreamRequest("/completions", body, req.prompt)
    messages = chat_messages([{"role": "user", "content": req.prompt}], req.system or rm.system, [])
    return UpstreamRequest("/chat/completions", chat_body(rm.endpoint.model, req.options, rm.params, messages,
                                                          req.think, req.format), req.prompt)


def upstream_chat(rm: RemoteModel, req: ChatRequest) -> UpstreamRequest:
    """/api/chat for a remote model -> upstream /chat/completions (the model's SYSTEM and MESSAGEs first)."""
    _no_logprobs(req)
    body = chat_body(rm.endpoint.model, req.options, rm.params, chat_messages(req.messages, rm.system, rm.messages),
                     req.think, req.format)
    if req.tools:
        body["tools"] = req.tools
    return chat_request(body)
