"""The prepare step of /v1/messages: for our engine (in the worker pool) the conversation rendered as /api/chat
would, its sampling and a forced tool call's grammar, on the pipeline's shared steps (pipeline/prepare.py); for a
remote model the upstream /chat/completions request (`upstream`, in remote/convert.py's terms: the upstream need
not speak Anthropic). Also the count of /v1/messages/count_tokens."""
from __future__ import annotations

from typing import Any

from ...engine.grammar import GrammarError, grammar_for_tool_call
from ...engine.params import SamplingParams
from ...model_types import LoadedModel
from ...prompt.tools import tool_format_for
from ..http.errors import APIError
from ..pipeline import prepare, prompting
from ..pipeline.options import sampling_params
from ..pipeline.prepare import Prepared
from ..pipeline.prompt_size import ContextOverflow
from ..remote.convert import UpstreamRequest, chat_body, chat_messages, chat_request
from ..remote.hub import RemoteModel
from .request import Conversation, MessagesRequest

# Where a forced tool call's JSON goes, per tool-call format: (text before, text after, the arguments' key).
FORCED_FORMATS = {"hermes": ("<tool_call>\n", "\n</tool_call>", "arguments"), "llama3": ("", "", "parameters")}


def _render(model: LoadedModel, conv: Conversation,
            window: int, fit: bool | None = None) -> tuple[prepare.ChatPrompt, bool | str | None]:
    """The chat prompt as /api/chat renders it for a `window`-token context (`fit` False: a ContextOverflow when it
    does not fit; None: as it is, to count it) and the think setting."""
    think = conv.think
    if think is None and conv.effort and prompting.thinking_tags(model):
        think = conv.effort  # output_config.effort: a level for a model that thinks, nothing for one that does not
    think = prompting.resolve_think(model, think)
    given = [m.get("images") or [] for m in conv.messages]
    messages = [{k: v for k, v in m.items() if k != "images"} for m in conv.messages]
    messages, images = prepare.message_images(model, model.name, messages, given)
    return prepare.chat_prompt(model, messages, conv.tools, think, window, images, fit), think


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


def messages(model: LoadedModel, req: MessagesRequest, window: int, conv: Conversation) -> Prepared:
    """/v1/messages: the conversation rendered as /api/chat would, its sampling, a forced tool call's grammar. Too
    long for the window: Anthropic's `prompt is too long: N tokens > M maximum` (nothing is dropped)."""
    try:
        cp, think = _render(model, conv, window, fit=False)
    except ContextOverflow as e:
        raise e.as_anthropic() from None
    grammar = tool_grammar(model, conv.forced) if conv.forced else prepare.check_format(conv.schema)
    prep = prepare.finish(model, cp.text, cp.ids, params(model, req), window, think, conv.tools, grammar)
    prep.embeds = cp.embeds
    prep.progress = bool(req.return_progress)
    return prep


def count(model: LoadedModel, conv: Conversation, window: int) -> int:
    """The prompt's tokens: what the same request's usage reports as input_tokens + cache_read_input_tokens."""
    return len(_render(model, conv, window)[0].ids)


def upstream(rm: RemoteModel, req: MessagesRequest, conv: Conversation) -> UpstreamRequest:
    """/v1/messages for a remote model -> its upstream's /chat/completions. Stop sequences are sent upstream; which
    one matched is not reported back (stop_reason end_turn)."""
    body = chat_body(rm.endpoint.model, None, rm.params, chat_messages(conv.messages, rm.system, rm.messages),
                     conv.think, conv.schema)
    body["max_tokens"] = req.max_tokens
    for key, value in (("temperature", req.temperature), ("top_p", req.top_p), ("top_k", req.top_k),
                       ("stop", req.stop_sequences or None)):
        if value is not None:
            body[key] = value
    if conv.tools:
        body["tools"] = conv.tools
    if conv.forced:  # OpenAI's tool_choice: one named function, or "required" (any of them)
        body["tool_choice"] = ({"type": "function", "function": {"name": conv.forced[0]["function"]["name"]}}
                               if len(conv.forced) == 1 and len(conv.tools or []) > 1 else "required")
    return chat_request(body)
