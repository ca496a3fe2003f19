"""Pydantic request models of Ollama's endpoints, the model routes' included (replies are plain dicts, Ollama's field
names)."""
from __future__ import annotations

from typing import Any, Optional, Union

from pydantic import Field, StrictBool, StrictInt, StrictStr, field_validator

from ..http.body import KeepAlive, RequestModel


class ToolCallFunction(RequestModel):
    index: Optional[StrictInt] = None
    name: StrictStr
    arguments: dict[str, Any] = Field(default_factory=dict)


class ToolCall(RequestModel):
    id: Optional[StrictStr] = None
    function: ToolCallFunction


class Message(RequestModel):
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


class _Common(RequestModel):
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


class EmbedRequest(RequestModel):
    model: StrictStr = ""
    input: Any = None  # string or list of strings, checked by the handler (Ollama: "invalid input type")
    truncate: Optional[StrictBool] = True
    dimensions: Optional[StrictInt] = None
    keep_alive: KeepAlive = None
    options: Optional[dict[str, Any]] = None


class EmbeddingsRequest(RequestModel):
    model: StrictStr = ""
    prompt: Optional[StrictStr] = ""
    keep_alive: KeepAlive = None
    options: Optional[dict[str, Any]] = None


class ShowRequest(RequestModel):
    model: Optional[StrictStr] = None
    name: Optional[StrictStr] = None
    verbose: Optional[StrictBool] = False
    system: Optional[StrictStr] = None
    options: Optional[dict[str, Any]] = None


class CreateRequest(RequestModel):
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


class CopyRequest(RequestModel):
    source: StrictStr
    destination: StrictStr


class DeleteRequest(RequestModel):
    model: Optional[StrictStr] = None
    name: Optional[StrictStr] = None


class PullRequest(RequestModel):
    model: Optional[StrictStr] = None
    name: Optional[StrictStr] = None
    insecure: Optional[StrictBool] = None
    stream: Optional[StrictBool] = None
