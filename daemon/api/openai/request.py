"""Pydantic request models of OpenAI's /v1/chat/completions, /v1/completions and /v1/embeddings."""
from __future__ import annotations

from typing import Any, Optional, Union

from pydantic import StrictBool, StrictInt, StrictStr

from ..http.body import Number, RequestModel


class StreamOptions(RequestModel):
    include_usage: Optional[StrictBool] = False


class _OAICommon(RequestModel):
    model: StrictStr
    stream: Optional[StrictBool] = False
    stream_options: Optional[StreamOptions] = None
    max_tokens: Optional[StrictInt] = None
    max_completion_tokens: Optional[StrictInt] = None
    seed: Optional[StrictInt] = None
    stop: Optional[Union[StrictStr, list[StrictStr]]] = None
    temperature: Optional[Number] = None
    top_p: Optional[Number] = None
    frequency_penalty: Optional[Number] = None
    presence_penalty: Optional[Number] = None
    n: Optional[StrictInt] = None
    response_format: Any = None
    logprobs: Any = None  # chat: bool; completions: int (the number of top logprobs)
    top_logprobs: Optional[StrictInt] = None
    ignore_eos: Optional[StrictBool] = None  # vLLM's and llama-server's extension
    priority: Any = None  # vLLM's extension: lower is scheduled sooner (prepare.request_priority)
    truncation: Any = None  # the Responses API's "auto" | "disabled": a prompt too long for the window is cut or a 400
    return_progress: Optional[StrictBool] = None  # llama-server's: prompt_progress chunks while the prompt goes in
    draft_model: Any = None  # evenflow's: a draft model for this request (Ollama's options.draft_model)
    draft_num_predict: Any = None  # draft tokens per step (Ollama's option): -1 adaptive, 0 none, N


class OAIFunctionCall(RequestModel):
    name: StrictStr = ""
    arguments: Optional[Union[StrictStr, dict[str, Any]]] = None  # a JSON string (OpenAI) or an object


class OAIToolCall(RequestModel):
    id: Optional[StrictStr] = None
    type: Optional[StrictStr] = None
    function: Optional[OAIFunctionCall] = None


class OAIMessage(RequestModel):
    role: StrictStr
    content: Any = None  # a string or a list of parts: checked where it is read (the parts have their own rules)
    name: Optional[StrictStr] = None
    tool_calls: Optional[list[OAIToolCall]] = None
    tool_call_id: Optional[StrictStr] = None
    reasoning: Optional[StrictStr] = None


class ChatCompletionRequest(_OAICommon):
    messages: list[OAIMessage]
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Any = None
    reasoning_effort: Optional[StrictStr] = None


class CompletionRequest(_OAICommon):
    prompt: StrictStr
    suffix: Optional[StrictStr] = None


class EmbeddingRequest(RequestModel):
    model: StrictStr
    input: Any = None
    encoding_format: Optional[StrictStr] = "float"
    dimensions: Optional[StrictInt] = None
