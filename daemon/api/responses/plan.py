"""The plan step of /v1/responses: the request translated to the chat completion it means (request.py: every
refusal a 400 before any model is held), then that chat's own plan (openai/plan.py)."""
from __future__ import annotations

from ..openai import plan as chat_plan
from ..pipeline.plan import Plan
from .request import ResponsesRequest, translate


def response(req: ResponsesRequest) -> Plan:
    """The prepare step gets the chat request, then what the chat's plan gives it (its messages, `think`)."""
    chat = translate(req)
    planned = chat_plan.chat_completion(chat)
    return Plan(planned.stream, args=(chat, *planned.args))
