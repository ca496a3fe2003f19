"""The checks of Anthropic's requests that need no model (a 400 here costs no load): the pipeline's plan step for
/v1/messages (the numbers, the messages, the tools and their choice, in /api/chat's terms: request.py) and what
/v1/messages/count_tokens counts."""
from __future__ import annotations

from ..http.errors import APIError
from ..pipeline.plan import Plan
from .request import Conversation, CountTokensRequest, MessagesRequest, check_sampling, conversation


def _model(req: CountTokensRequest) -> None:
    if not req.model:
        raise APIError(400, "model: a model name is required")


def messages(req: MessagesRequest) -> Plan:
    """/v1/messages: the prepare step gets the request as a Conversation."""
    _model(req)
    check_sampling(req)
    return Plan(bool(req.stream), args=(conversation(req),))


def count_tokens(req: CountTokensRequest) -> Conversation:
    """/v1/messages/count_tokens: the conversation whose prompt is counted."""
    _model(req)
    return conversation(req)
