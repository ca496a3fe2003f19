"""Pydantic request models for the Ollama and OpenAI endpoints (responses are plain dicts, Ollama's field names)."""
from __future__ import annotations

from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, field_validator

Number = Union[StrictInt, StrictFloat]
KeepAlive = Optional[Union[StrictInt, StrictFloat, StrictStr]]


class _Req(BaseModel):
    # Unknown fields are ignored (Go's decoder does the same); types are strict so "5" is not a bool.
    model_config = ConfigDict(extra="ignore", populate_by_name=True, protected_namespaces=())


# ---------------------------------------------------------------------------------------------------------
# Ollama


class ToolCallFunction(_Req):
    index: Optional[StrictInt] = None
    name: StrictStr
    arguments: dict[str, Any] = Field(default_factory=dict)


class ToolCall(_Req):
    id: Optional[StrictStr] = None
    function: ToolCallFunction


class Message(_Req):
    role: StrictStr
    content: Optional[StrictStr] = ""
    thinking: Optional[StrictStr] = None
    images: Optional[list[StrictStr]] = None
    tool_calls: Optional[list[ToolCall]] = None
    tool_name: Optional[StrictStr] = None
    tool_call_id: Optional[StrictStr] = None

    @field_validator("role")
    @classmethod
    def _lower(cls, v: str) -> str:
        return v.lower()

    def as_template_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"role": self.role, "content": self.content or ""}
        if self.thinking:
            d["thinking"] = self.thinking
        if self.tool_calls:
            d["tool_calls"] = [
                {"function": {"name": c.function.name, "arguments": c.function.arguments}} for c in self.tool_calls
            ]
        if self.tool_name:
            d["tool_name"] = self.tool_name
        if self.tool_call_id:
            d["tool_call_id"] = self.tool_call_id
        return d


class _Common(_Req):
    model: StrictStr = ""
    stream: Optional[StrictBool] = None  # absent means stream (Ollama's default)
    keep_alive: KeepAlive = None
    options: Optional[dict[str, Any]] = None
    format: Any = None
    think: Optional[Union[StrictBool, StrictStr]] = None
    truncate: Optional[StrictBool] = None
    shift: Optional[StrictBool] = None
    logprobs: Optional[StrictBool] = None
    top_logprobs: Optional[StrictInt] = None
    return_progress: Optional[StrictBool] = None  # evenflow's: prompt progress lines in the stream (llama-server's name)


class GenerateRequest(_Common):
    prompt: Optional[StrictStr] = ""
    suffix: Optional[StrictStr] = ""
    system: Optional[StrictStr] = None
    template: Optional[StrictStr] = None
    context: Optional[list[StrictInt]] = None
    raw: Optional[StrictBool] = False
    images: Optional[list[StrictStr]] = None


class ChatRequest(_Common):
    messages: Optional[list[Message]] = None
    tools: Optional[list[dict[str, Any]]] = None


class EmbedRequest(_Req):
    model: StrictStr = ""
    input: Any = None  # string or list of strings, checked by the handler (Ollama: "invalid input type")
    truncate: Optional[StrictBool] = True
    dimensions: Optional[StrictInt] = None
    keep_alive: KeepAlive = None
    options: Optional[dict[str, Any]] = None


class EmbeddingsRequest(_Req):
    model: StrictStr = ""
    prompt: Optional[StrictStr] = ""
    keep_alive: KeepAlive = None
    options: Optional[dict[str, Any]] = None


class ShowRequest(_Req):
    model: Optional[StrictStr] = None
    name: Optional[StrictStr] = None
    verbose: Optional[StrictBool] = False
    system: Optional[StrictStr] = None
    options: Optional[dict[str, Any]] = None


class CreateRequest(_Req):
    model: Optional[StrictStr] = None
    name: Optional[StrictStr] = None
    from_: Optional[StrictStr] = Field(default=None, alias="from")
    files: Optional[dict[StrictStr, StrictStr]] = None
    adapters: Optional[dict[StrictStr, StrictStr]] = None
    template: Optional[StrictStr] = None
    system: Optional[StrictStr] = None
    license: Optional[Union[StrictStr, list[StrictStr]]] = None
    parameters: Optional[dict[str, Any]] = None
    messages: Optional[list[Message]] = None
    quantize: Optional[StrictStr] = None
    quantization: Optional[StrictStr] = None
    stream: Optional[StrictBool] = None


class CopyRequest(_Req):
    source: StrictStr
    destination: StrictStr


class DeleteRequest(_Req):
    model: Optional[StrictStr] = None
    name: Optional[StrictStr] = None


class PullRequest(_Req):
    model: Optional[StrictStr] = None
    name: Optional[StrictStr] = None
    insecure: Optional[StrictBool] = None
    stream: Optional[StrictBool] = None


# ---------------------------------------------------------------------------------------------------------
# OpenAI


class StreamOptions(_Req):
    include_usage: Optional[StrictBool] = False


class _OAICommon(_Req):
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


class OAIFunctionCall(_Req):
    name: StrictStr = ""
    arguments: Optional[Union[StrictStr, dict[str, Any]]] = None  # a JSON string (OpenAI) or an object


class OAIToolCall(_Req):
    id: Optional[StrictStr] = None
    type: Optional[StrictStr] = None
    function: Optional[OAIFunctionCall] = None


class OAIMessage(_Req):
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


class EmbeddingRequest(_Req):
    model: StrictStr
    input: Any = None
    encoding_format: Optional[StrictStr] = "float"
    dimensions: Optional[StrictInt] = None


class ResponsesRequest(_Req):
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
