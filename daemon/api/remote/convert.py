"""The terms a dialect's prepare step builds an upstream request in (`UpstreamRequest`, `chat_body`: Ollama's
options, format, think and messages as an OpenAI chat completion), and `Reader`, which reads the upstream's streamed
chunks back (content, thinking, tool calls, usage, the finish reason)."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from ..http.errors import APIError

# Ollama option -> OpenAI field (top_k, min_p and repetition_penalty are the vLLM/SGLang/llama-server extras).
_OPTIONS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p", "seed": "seed",
            "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
            "repeat_penalty": "repetition_penalty", "stop": "stop", "ignore_eos": "ignore_eos"}


@dataclass
class UpstreamRequest:
    """What a dialect's prepare step makes of a request for a remote model: the upstream path and body, and the
    prompt the request's events show (under EVENFLOW_LOG_CONTENT)."""

    path: str  # "/chat/completions" or "/completions", below the endpoint's /v1
    body: dict[str, Any]
    prompt: str | None = None


def chat_body(model: str, options: Any, params: dict[str, Any], messages: list[dict[str, Any]] | None = None,
              think: Any = None, fmt: Any = None) -> dict[str, Any]:
    """A streamed upstream body (usage included) for upstream `model`: the Modelfile's PARAMETERs `params` under
    Ollama's `options`, `messages`, `think`, `format` (None: not sent)."""
    body: dict[str, Any] = {"model": model, "stream": True, "stream_options": {"include_usage": True},
                            **sampling(options, params)}
    if messages is not None:
        body["messages"] = messages
    body.update(thinking(think))
    if (rf := response_format(fmt)) is not None:
        body["response_format"] = rf
    return body


def chat_request(body: dict[str, Any]) -> UpstreamRequest:
    """`body` (with its messages) to the upstream's /chat/completions."""
    return UpstreamRequest("/chat/completions", body, json.dumps(body["messages"], ensure_ascii=False))


def sampling(options: Any, defaults: dict[str, Any]) -> dict[str, Any]:
    """Model PARAMETERs < request options, as OpenAI fields. num_ctx, num_thread and the other runner options
    belong to the upstream engine's own launch settings and are not sent."""
    if options is not None and not isinstance(options, dict):
        raise APIError(400, f"options must be an object, got {type(options).__name__}")
    out: dict[str, Any] = {}
    for key, value in {**defaults, **(options or {})}.items():
        if value is None:
            continue
        if key == "num_predict":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < -2:
                raise APIError(400, f"option 'num_predict' must be -1, -2 or >= 0, got {value!r}")
            if value >= 0:  # -1 / -2: until the model stops or its window is full
                out["max_tokens"] = int(value)
        elif key in _OPTIONS:
            out[_OPTIONS[key]] = value
    return out


def response_format(fmt: Any) -> dict[str, Any] | None:
    """Ollama's `format` ("json" or a JSON schema) as OpenAI's response_format."""
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return {"type": "json_object"}
    if isinstance(fmt, dict):
        return {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt, "strict": True}}
    raise APIError(400, f"invalid format {fmt!r}: expected \"json\" or a JSON schema object")


def thinking(think: Any) -> dict[str, Any]:
    """`think`: a bool toggles the chat template's enable_thinking (Qwen3, DeepSeek on vLLM/SGLang/llama-server);
    a level ("low", "medium", "high") is OpenAI's reasoning_effort."""
    if think is None:
        return {}
    if isinstance(think, bool):
        return {"chat_template_kwargs": {"enable_thinking": think}}
    if think in ("low", "medium", "high"):
        return {"reasoning_effort": think}
    raise APIError(400, f"invalid think value {think!r}: expected true, false, \"low\", \"medium\" or \"high\"")


def chat_messages(messages: list[Any], system: str | None, preset: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ollama messages (with the model's SYSTEM and MESSAGEs first) -> OpenAI messages; tool calls get ids so
    the tool results that follow can name them."""
    dicts = [m.as_template_dict() if hasattr(m, "as_template_dict") else dict(m) for m in messages]
    if any(getattr(m, "images", None) for m in messages):
        raise APIError(400, "images are not supported for remote models yet")
    head = [] if not system or any(d.get("role") == "system" for d in dicts) else [{"role": "system",
                                                                                     "content": system}]
    out: list[dict[str, Any]] = []
    ids_by_name: dict[str, str] = {}
    for d in [*head, *preset, *dicts]:
        msg: dict[str, Any] = {"role": d.get("role", "user"), "content": d.get("content", "")}
        if d.get("tool_calls"):
            calls = []
            for c in d["tool_calls"]:
                fn = c.get("function", {})
                cid = c.get("id") or f"call_{len(ids_by_name)}_{fn.get('name', '')}"
                ids_by_name[fn.get("name", "")] = cid
                calls.append({"id": cid, "type": "function", "function": {
                    "name": fn.get("name", ""), "arguments": json.dumps(fn.get("arguments") or {})}})
            msg["tool_calls"] = calls
        if msg["role"] == "tool":
            name = d.get("tool_name") or ""
            msg["tool_call_id"] = d.get("tool_call_id") or ids_by_name.get(name, f"call_{name}")
            if name:
                msg["name"] = name
        out.append(msg)
    return out


@dataclass
class Reader:
    """Accumulates one upstream stream: text pieces out, tool-call fragments joined, finish reason and usage kept,
    our own clock for Ollama's durations."""

    t_start: int  # perf_counter_ns when our request arrived
    t_sent: int = field(default_factory=time.perf_counter_ns)
    t_first: int | None = None
    t_last: int | None = None
    chunks: int = 0  # chunks that carried text: one token each on vLLM, SGLang and llama-server
    finish: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    _calls: dict[int, dict[str, Any]] = field(default_factory=dict)

    def feed(self, obj: dict[str, Any]) -> tuple[str, str]:
        """One chunk -> (content, thinking) it adds."""
        if isinstance(obj.get("usage"), dict):
            self.usage = obj["usage"]
        content = think = ""
        for choice in obj.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or choice.get("message") or {}
            content += str(choice.get("text") or delta.get("content") or "")
            think += str(delta.get("reasoning_content") or delta.get("reasoning") or "")
            for tc in delta.get("tool_calls") or []:
                slot = self._calls.setdefault(int(tc.get("index", len(self._calls))), {"name": "", "arguments": ""})
                fn = tc.get("function") or {}
                slot["name"] += fn.get("name") or ""
                args = fn.get("arguments")
                slot["arguments"] += json.dumps(args) if isinstance(args, dict) else (args or "")
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]
        if content or think or self._calls:
            now = time.perf_counter_ns()
            if self.t_first is None:
                self.t_first = now
            self.t_last = now
            if content or think:
                self.chunks += 1
        return content, think

    def tool_calls(self) -> list[dict[str, Any]]:
        """The finished calls in Ollama's shape (arguments an object)."""
        out = []
        for i, c in sorted(self._calls.items()):
            try:
                args = json.loads(c["arguments"]) if c["arguments"].strip() else {}
            except ValueError:
                raise APIError(502, f"the upstream engine returned tool call arguments that are not JSON: "
                                    f"{c['arguments'][:200]}") from None
            out.append({"function": {"index": i, "name": c["name"], "arguments": args}})
        return out

    @property
    def done_reason(self) -> str:
        return "length" if self.finish == "length" else "stop"

    @property
    def output_tokens(self) -> int:
        return int(self.usage.get("completion_tokens") or self.chunks)

    @property
    def prompt_tokens(self) -> int:
        return int(self.usage.get("prompt_tokens") or 0)

    def metrics(self) -> dict[str, int]:
        """Ollama's final fields: counts from the engine's usage (chunks when it sends none), times from our clock."""
        now = time.perf_counter_ns()
        first = self.t_first or now
        return {"total_duration": now - self.t_start, "load_duration": 0, "prompt_eval_count": self.prompt_tokens,
                "prompt_eval_duration": max(first - self.t_sent, 0), "eval_count": self.output_tokens,
                "eval_duration": max((self.t_last or first) - first, 1)}
