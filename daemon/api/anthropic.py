"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens), so Anthropic's clients (and Claude Code) run
on local models. A request is translated to /api/chat's terms (anthropic_request.py) and runs the one request
skeleton (generation.py) with its own plan, prepare step and reply (anthropic_reply.py)."""
from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ..engine.grammar import GrammarError, grammar_for_tool_call
from ..engine.params import SamplingParams
from ..manager import LoadedModel
from ..prompt.tools import tool_format_for
from . import generation, prepare, prompting, remote
from .anthropic_reply import ANTHROPIC_SSE, AnthropicReply
from .anthropic_request import (Conversation, CountTokensRequest, MessagesRequest, check_sampling, conversation)
from .errors import APIError, parse_body
from .generation import Generate
from .options import check_num_ctx, sampling_params
from .plan import Plan
from .prepare import Prepared
from .prompt_size import ContextOverflow

router = APIRouter(prefix="/v1")

# Where a forced tool call's JSON goes, per tool-call format: (text before, text after, the arguments' key).
FORCED_FORMATS = {"hermes": ("<tool_call>\n", "\n</tool_call>", "arguments"), "llama3": ("", "", "parameters")}


def plan(req: MessagesRequest) -> Plan:
    """Every check that needs no model: the numbers, the messages, the tools and their choice."""
    if not req.model:
        raise APIError(400, "model: a model name is required")
    check_sampling(req)
    return Plan(bool(req.stream), args=(conversation(req),))


def _render(model: LoadedModel, conv: Conversation,
            fit: bool | None = None) -> tuple[prepare.ChatPrompt, bool | str | None, int]:
    """The chat prompt as /api/chat renders it (`fit` False: a ContextOverflow when it does not fit the window;
    None: as it is, to count it), the think setting and the window."""
    think = conv.think
    if think is None and conv.effort and prompting.thinking_tags(model):
        think = conv.effort  # output_config.effort: a level for a model that thinks, nothing for one that does not
    think = prompting.resolve_think(model, think)
    window = check_num_ctx(model, None)
    given = [m.get("images") or [] for m in conv.messages]
    messages = [{k: v for k, v in m.items() if k != "images"} for m in conv.messages]
    messages, images = prepare._message_images(model, model.name, messages, given)
    return prepare._chat_prompt(model, messages, conv.tools, think, window, images, fit), think, window


def tool_grammar(model: LoadedModel, tools: list[dict[str, Any]]) -> str:
    """tool_choice any/tool: the reply is one call of one of `tools`, in the model's tool-call format."""
    fmt = tool_format_for(prompting.template_of(model))
    if fmt not in FORCED_FORMATS:
        raise APIError(400, f"tool_choice \"any\" or \"tool\" is not supported for {prompting.full_name(model)}: its "
                            f"tool-call format ({fmt or 'unknown'}) cannot be constrained (supported: "
                            f"{', '.join(FORCED_FORMATS)}); use \"auto\"")
    before, after, key = FORCED_FORMATS[fmt]
    calls = [{"type": "object", "properties": {"name": {"const": t["function"]["name"]},
                                               key: t["function"]["parameters"]},
              "required": ["name", key]} for t in tools]
    try:
        return grammar_for_tool_call(calls[0] if len(calls) == 1 else {"anyOf": calls}, before, after)
    except GrammarError as e:
        raise APIError(400, str(e)[:2000]) from None


def params(model: LoadedModel, req: MessagesRequest) -> SamplingParams:
    """max_tokens, stop_sequences, temperature, top_p, top_k; what the request leaves out is the model's default."""
    return sampling_params(None, model.record.params, num_predict=req.max_tokens, stop=req.stop_sequences or None,
                           temperature=req.temperature, top_p=req.top_p, top_k=req.top_k)


def prepare_messages(model: LoadedModel, req: MessagesRequest, conv: Conversation) -> Prepared:
    """/v1/messages: the conversation rendered as /api/chat would, its sampling, a forced tool call's grammar. Too
    long for the window: Anthropic's `prompt is too long: N tokens > M maximum` (nothing is dropped)."""
    try:
        cp, think, window = _render(model, conv, fit=False)
    except ContextOverflow as e:
        raise e.as_anthropic() from None
    grammar = tool_grammar(model, conv.forced) if conv.forced else prepare.check_format(conv.schema)
    prep = prepare._finish(model, cp.text, cp.ids, params(model, req), window, think, conv.tools, grammar)
    prep.embeds = cp.embeds
    prep.progress = bool(req.return_progress)
    return prep


MESSAGES = Generate("/v1/messages", plan, prepare_messages, AnthropicReply, ANTHROPIC_SSE)


@router.post("/messages")
async def messages(request: Request) -> Response:
    t0 = time.perf_counter_ns()
    req = await parse_body(request, MessagesRequest)
    return await generation.generate(request, MESSAGES, req, t0)


def _count(model: LoadedModel, conv: Conversation) -> int:
    return len(_render(model, conv)[0].ids)


@router.post("/messages/count_tokens")
async def count_tokens(request: Request) -> JSONResponse:
    """The prompt's tokens: what the same request's usage reports as input_tokens + cache_read_input_tokens."""
    req = await parse_body(request, CountTokensRequest)
    if not req.model:
        raise APIError(400, "model: a model name is required")
    conv = conversation(req)
    if await remote.lookup(request, req.model) is not None:
        raise APIError(400, f"count_tokens is not supported for remote models yet ('{req.model}' is served by "
                            f"another engine, which renders and counts the prompt itself)")
    ctx = request.app.state.ctx
    lease = await ctx.manager.acquire(req.model)
    try:
        n = await ctx.workers.run(request, _count, lease.model, conv)
    finally:
        lease.release()
    return JSONResponse({"input_tokens": n})
