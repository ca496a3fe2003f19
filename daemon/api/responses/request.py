"""The pydantic request model of OpenAI's Responses API (/v1/responses)."""
from __future__ import annotations

from typing import Any, Optional

from pydantic import StrictBool, StrictInt, StrictStr

from ..http.body import Number, RequestModel


class ResponsesRequest(RequestModel):
    """/v1/responses (stateless): what is not supported is refused where it is read (responses.py)."""

    model: StrictStr
    input: Any = None  # a string or a list of items, read by responses.chat_request
    instructions: Optional[StrictStr] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Any = None
    parallel_tool_calls: Optional[StrictBool] = None
    reasoning: Optional[dict[str, Any]] = None
    text: Optional[dict[str, Any]] = None
    max_output_tokens: Optional[StrictInt] = None
    temperature: Optional[Number] = None
    top_p: Optional[Number] = None
    seed: Optional[StrictInt] = None  # not OpenAI's: as /v1/chat/completions' seed
    ignore_eos: Optional[StrictBool] = None  # not OpenAI's: as /v1/chat/completions' (vLLM's extension)
    stream: Optional[StrictBool] = False
    store: Optional[StrictBool] = None
    previous_response_id: Optional[StrictStr] = None
    conversation: Any = None
    background: Optional[StrictBool] = None
    prompt: Any = None
    include: Optional[list[StrictStr]] = None
    truncation: Optional[StrictStr] = None
    top_logprobs: Optional[StrictInt] = None
    return_progress: Optional[StrictBool] = None  # as on /v1/chat/completions: response.in_progress with progress
    metadata: Optional[dict[StrictStr, StrictStr]] = None
    user: Optional[StrictStr] = None
