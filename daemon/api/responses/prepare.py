"""The prepare step of /v1/responses, on the chat completion the request translates to: for our engine
openai/prepare.py's (in the worker pool); for a remote model the upstream /chat/completions request (in
remote/convert.py's terms), whose engine also enforces a required tool call."""
from __future__ import annotations

from typing import Any

from ...model_types import LoadedModel
from ..http.errors import APIError
from ..openai import prepare as chat_prepare
from ..openai.request import ChatCompletionRequest
from ..pipeline.prepare import Prepared
from ..remote.convert import UpstreamRequest, chat_body, chat_request
from ..remote.hub import RemoteModel
from .request import ResponsesRequest


def response(model: LoadedModel, req: ResponsesRequest, window: int, chat: ChatCompletionRequest,
             messages: list[dict[str, Any]], think: bool | str | None) -> Prepared:
    """/v1/responses on our engine: the chat's prepare step (a prompt too long names `input`)."""
    if chat.tool_choice not in (None, "auto", "none"):
        raise APIError(400, "tool_choice \"required\" or a named function is not supported for local models (their "
                            "output is not constrained to a tool call); use \"auto\"", param="tool_choice")
    return chat_prepare.chat_completion(model, chat, window, messages, think, what="input")


def upstream(rm: RemoteModel, req: ResponsesRequest, chat: ChatCompletionRequest, messages: list[dict[str, Any]],
             think: bool | str | None) -> UpstreamRequest:
    """/v1/responses for a remote model: the chat it translates to -> the upstream's /chat/completions (the model's
    SYSTEM first when the request has none)."""
    sent = [m.model_dump(exclude_none=True, exclude={"reasoning"}) for m in chat.messages]
    if rm.system and not any(m["role"] in ("system", "developer") for m in sent):
        sent.insert(0, {"role": "system", "content": rm.system})
    body = chat_body(rm.endpoint.model, None, rm.params, sent)
    asked = {"max_tokens": chat.max_completion_tokens, "temperature": chat.temperature, "top_p": chat.top_p,
             "seed": chat.seed, "tools": chat.tools, "tool_choice": chat.tool_choice,
             "reasoning_effort": chat.reasoning_effort, "response_format": chat.response_format}
    body.update({k: v for k, v in asked.items() if v is not None})
    return chat_request(body)
