"""One question to a daemon through each API's official client (ollama, openai, anthropic), streamed or whole,
read back as (thinking, content, tool calls, finish): what an app using that client would get. A conversation may
hold a tool call and its result, sent in each API's own shape."""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from typing import Any, Callable

import anthropic
import ollama
import openai

# Every generation API a chat app uses; `ollama_generate` takes one prompt (no tools, no history).
APIS = ("ollama_chat", "ollama_generate", "openai_chat", "responses", "anthropic")
# The finish each API reports for a reply that ended by itself, with and without tool calls.
FINISH = {"ollama_chat": ("stop", "stop"), "ollama_generate": ("stop", "stop"), "openai_chat": ("stop", "tool_calls"),
          "responses": ("completed", "completed"), "anthropic": ("end_turn", "tool_use")}


@dataclass
class Answer:
    thinking: str = ""
    content: str = ""
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (name, arguments)
    finish: str | None = None


@dataclass(frozen=True)
class Ask:
    """One request: `messages` in Ollama's shape (user/assistant text; an assistant turn's `tool_calls` and the
    `tool` messages answering them, in order); tools in Ollama's shape."""

    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    think: bool | str | None = None  # None: the request says nothing (the model's default); a str: a level
    stream: bool = False
    max_tokens: int = 512
    schema: dict[str, Any] | None = None  # structured output (a JSON schema)


def _calls_json(calls: list[tuple[str, str]]) -> list[tuple[str, dict[str, Any]]]:
    return [(name, json.loads(args) if args else {}) for name, args in calls]


# One client per API and daemon, shared by every request (the clients are thread-safe): a client's creation
# costs an SSL context, more than a tiny model's reply.
@functools.lru_cache(maxsize=32)
def _ollama(url: str) -> ollama.Client:
    return ollama.Client(host=url, timeout=600)


@functools.lru_cache(maxsize=32)
def _openai(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)


@functools.lru_cache(maxsize=32)
def _anthropic(url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=600)


def _call_ids(messages: list[dict[str, Any]]) -> list[str]:
    """An id for each tool call of the conversation, in order (tool results answer them in that order)."""
    n = sum(len(m.get("tool_calls") or []) for m in messages)
    return [f"call_{i}" for i in range(n)]


def _openai_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    ids, answered, out = iter(_call_ids(messages)), iter(_call_ids(messages)), []
    for m in messages:
        if m.get("tool_calls"):
            out.append({"role": "assistant", "content": m.get("content") or None, "tool_calls": [
                {"id": next(ids), "type": "function", "function": {
                    "name": c["function"]["name"], "arguments": json.dumps(c["function"]["arguments"])}}
                for c in m["tool_calls"]]})
        elif m["role"] == "tool":
            out.append({"role": "tool", "tool_call_id": next(answered), "content": m["content"]})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    return out


def _responses_input(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    ids, answered, out = iter(_call_ids(messages)), iter(_call_ids(messages)), []
    for m in messages:
        if m.get("tool_calls"):
            if m.get("content"):
                out.append({"role": "assistant", "content": m["content"]})
            out += [{"type": "function_call", "call_id": next(ids), "name": c["function"]["name"],
                     "arguments": json.dumps(c["function"]["arguments"])} for c in m["tool_calls"]]
        elif m["role"] == "tool":
            out.append({"type": "function_call_output", "call_id": next(answered), "output": m["content"]})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    return out


def _anthropic_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    ids, answered, out = iter(_call_ids(messages)), iter(_call_ids(messages)), []
    for m in messages:
        if m.get("tool_calls"):
            text = [{"type": "text", "text": m["content"]}] if m.get("content") else []
            out.append({"role": "assistant", "content": text + [
                {"type": "tool_use", "id": next(ids), "name": c["function"]["name"],
                 "input": c["function"]["arguments"]} for c in m["tool_calls"]]})
        elif m["role"] == "tool":
            result = {"type": "tool_result", "tool_use_id": next(answered), "content": m["content"]}
            if out and out[-1]["role"] == "user" and isinstance(out[-1]["content"], list):
                out[-1]["content"].append(result)  # results of one turn's calls share one user message
            else:
                out.append({"role": "user", "content": [result]})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    return out


def ollama_chat(url: str, q: Ask) -> Answer:
    c = _ollama(url)
    kw: dict[str, Any] = dict(model=q.model, messages=q.messages, tools=q.tools, think=q.think, format=q.schema,
                              options={"temperature": 0, "num_predict": q.max_tokens})
    a = Answer()
    parts = c.chat(**kw, stream=True) if q.stream else [c.chat(**kw)]
    for p in parts:
        a.thinking += p.message.thinking or ""
        a.content += p.message.content or ""
        a.calls += [(t.function.name, dict(t.function.arguments)) for t in p.message.tool_calls or []]
        a.finish = p.done_reason or a.finish
    return a


def ollama_generate(url: str, q: Ask) -> Answer:
    assert len(q.messages) == 1 and not q.tools, "/api/generate takes one prompt and no tools"
    c = _ollama(url)
    kw: dict[str, Any] = dict(model=q.model, prompt=q.messages[0]["content"], think=q.think, format=q.schema,
                              options={"temperature": 0, "num_predict": q.max_tokens})
    a = Answer()
    for p in (c.generate(**kw, stream=True) if q.stream else [c.generate(**kw)]):
        a.thinking += p.thinking or ""
        a.content += p.response or ""
        a.finish = p.done_reason or a.finish
    return a


def _effort(think: bool | str | None) -> Any:
    """OpenAI's reasoning effort for a think value: a level as it is, true as medium, false as none."""
    if isinstance(think, str):
        return think
    return {None: openai.NOT_GIVEN, True: "medium", False: "none"}[think]


def openai_chat(url: str, q: Ask) -> Answer:
    c = _openai(url)
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": q.schema}} if q.schema else openai.NOT_GIVEN
    kw: dict[str, Any] = dict(model=q.model, messages=_openai_messages(q.messages), tools=q.tools or openai.NOT_GIVEN,
                              reasoning_effort=_effort(q.think), temperature=0, max_tokens=q.max_tokens,
                              response_format=fmt)
    a = Answer()
    if not q.stream:
        ch = c.chat.completions.create(**kw).choices[0]
        a.thinking = (ch.message.model_extra or {}).get("reasoning") or ""
        a.content = ch.message.content or ""
        a.calls = [(t.function.name, json.loads(t.function.arguments)) for t in ch.message.tool_calls or []]
        a.finish = ch.finish_reason
        return a
    calls: dict[int, list[str]] = {}
    for chunk in c.chat.completions.create(**kw, stream=True):
        for ch in chunk.choices:
            a.thinking += (ch.delta.model_extra or {}).get("reasoning") or ""
            a.content += ch.delta.content or ""
            for t in ch.delta.tool_calls or []:
                name_args = calls.setdefault(t.index, ["", ""])
                name_args[0] += (t.function and t.function.name) or ""
                name_args[1] += (t.function and t.function.arguments) or ""
            a.finish = ch.finish_reason or a.finish
    a.calls = _calls_json([(n, args) for _, (n, args) in sorted(calls.items())])
    return a


def responses(url: str, q: Ask) -> Answer:
    c = _openai(url)
    tools = [{"type": "function", "name": t["function"]["name"], "description": t["function"].get("description", ""),
              "parameters": t["function"]["parameters"]} for t in q.tools or []]
    effort = openai.NOT_GIVEN if q.think is None else {"effort": _effort(q.think)}
    text = {"format": {"type": "json_schema", "name": "answer", "schema": q.schema}} if q.schema else openai.NOT_GIVEN
    kw: dict[str, Any] = dict(model=q.model, input=_responses_input(q.messages), tools=tools or openai.NOT_GIVEN,
                              reasoning=effort, temperature=0, max_output_tokens=q.max_tokens, text=text)
    a = Answer()
    if not q.stream:
        r = c.responses.create(**kw)
        for item in r.output:
            if item.type == "reasoning":
                a.thinking += "".join(p.text for p in item.content or [])
            elif item.type == "message":
                a.content += "".join(p.text for p in item.content if p.type == "output_text")
            elif item.type == "function_call":
                a.calls.append((item.name, json.loads(item.arguments)))
        a.finish = r.status
        return a
    for ev in c.responses.create(**kw, stream=True):
        if ev.type == "response.reasoning_text.delta":
            a.thinking += ev.delta
        elif ev.type == "response.output_text.delta":
            a.content += ev.delta
        elif ev.type == "response.output_item.done" and ev.item.type == "function_call":
            a.calls.append((ev.item.name, json.loads(ev.item.arguments)))
        elif ev.type in ("response.completed", "response.incomplete", "response.failed"):
            a.finish = ev.response.status
    return a


def anthropic_messages(url: str, q: Ask) -> Answer:
    c = _anthropic(url)
    tools = [{"name": t["function"]["name"], "description": t["function"].get("description", ""),
              "input_schema": t["function"]["parameters"]} for t in q.tools or []]
    # no levels here: a budget says how much
    thinking = (anthropic.NOT_GIVEN if q.think is None else {"type": "disabled"} if q.think is False
                else {"type": "enabled", "budget_tokens": 1024})
    output = {"format": {"type": "json_schema", "schema": q.schema}} if q.schema else anthropic.NOT_GIVEN
    # the client no longer types sampling fields; the API still takes them
    kw: dict[str, Any] = dict(model=q.model, messages=_anthropic_messages(q.messages),
                              tools=tools or anthropic.NOT_GIVEN, thinking=thinking, max_tokens=q.max_tokens,
                              output_config=output, extra_body={"temperature": 0})
    a = Answer()
    if not q.stream:
        m = c.messages.create(**kw)
        for b in m.content:
            if b.type == "thinking":
                a.thinking += b.thinking
            elif b.type == "text":
                a.content += b.text
            elif b.type == "tool_use":
                a.calls.append((b.name, dict(b.input)))
        a.finish = m.stop_reason
        return a
    blocks: dict[int, list[str]] = {}
    for ev in c.messages.create(**kw, stream=True):
        if ev.type == "content_block_start" and ev.content_block.type == "tool_use":
            blocks[ev.index] = [ev.content_block.name, ""]
        elif ev.type == "content_block_delta":
            d = ev.delta
            if d.type == "thinking_delta":
                a.thinking += d.thinking
            elif d.type == "text_delta":
                a.content += d.text
            elif d.type == "input_json_delta":
                blocks[ev.index][1] += d.partial_json
        elif ev.type == "message_delta":
            a.finish = ev.delta.stop_reason
    a.calls = _calls_json([(n, args) for _, (n, args) in sorted(blocks.items())])
    return a


DRIVERS: dict[str, Callable[[str, Ask], Answer]] = {
    "ollama_chat": ollama_chat, "ollama_generate": ollama_generate, "openai_chat": openai_chat,
    "responses": responses, "anthropic": anthropic_messages}


def ask(api: str, url: str, q: Ask) -> Answer:
    """`q` through `api`'s official client against the daemon at `url`."""
    return DRIVERS[api](url, q)
