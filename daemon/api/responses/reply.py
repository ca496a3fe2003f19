"""OpenAI's Responses wire format: the response object (output items: reasoning, message, function calls; usage;
the request's settings echoed back) and its typed SSE events. `ResponseBuilder` makes both from (thinking, content,
tool calls) parts, so a local model's output and a remote upstream's give the same events, and a whole answer is
the object its stream would end with."""
from __future__ import annotations

import copy
import json
import secrets
import time
from typing import Any, AsyncIterator

from ..http.errors import APIError
from ..http.wire import Wire
from ..pipeline.deltas import Delta, Facts, Generation
from .request import ResponsesRequest


def _frame(event: dict[str, Any]) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n".encode()


def _error(message: str) -> bytes:
    # only for an error the reply did not turn into response.failed itself
    return _frame({"type": "error", "code": "server_error", "message": message, "param": None, "sequence_number": 0})


RESPONSES_SSE = Wire("text/event-stream", _frame, _error)


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def _tool_echo(tool: dict[str, Any]) -> dict[str, Any]:
    if tool.get("type") == "namespace":
        return {"type": "namespace", "name": tool.get("name"), "description": tool.get("description") or "",
                "tools": [_tool_echo(t) for t in tool.get("tools") or []]}
    return {"type": "function", "name": tool.get("name"), "description": tool.get("description"),
            "parameters": tool.get("parameters"), "strict": tool.get("strict")}


def settings_echo(body: ResponsesRequest) -> dict[str, Any]:
    """The request's settings as the response object repeats them (defaults where the request had none)."""
    reasoning = body.reasoning or {}
    text: dict[str, Any] = {"format": (body.text or {}).get("format") or {"type": "text"}}
    if (body.text or {}).get("verbosity") is not None:
        text["verbosity"] = body.text["verbosity"]  # type: ignore[index]
    return {"instructions": body.instructions, "tools": [_tool_echo(t) for t in body.tools or []],
            "tool_choice": "auto" if body.tool_choice is None else body.tool_choice,
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "temperature": 1.0 if body.temperature is None else body.temperature,
            "top_p": 1.0 if body.top_p is None else body.top_p, "max_output_tokens": body.max_output_tokens,
            "max_tool_calls": None, "previous_response_id": None,
            "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
            "text": text, "truncation": body.truncation or "disabled", "store": False, "background": False,
            "metadata": body.metadata or {}, "user": body.user, "service_tier": "default", "top_logprobs": 0}


def usage(input_tokens: int, output_tokens: int, reasoning_tokens: int = 0) -> dict[str, Any]:
    return {"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": input_tokens + output_tokens}


class ResponseBuilder:
    """One response's output items and events, in order: each `feed` continues the open reasoning or message
    item or starts the next; `finish` closes the last and ends with response.completed or response.incomplete."""

    def __init__(self, body: ResponsesRequest) -> None:
        self.base = {"id": new_id("resp"), "object": "response", "created_at": int(time.time()), "model": body.model,
                     "error": None, "incomplete_details": None, "completed_at": None, **settings_echo(body)}
        self.seq = 0
        self.items: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None  # the reasoning or message item being streamed (last in items)
        self.thinking = ""  # all reasoning text so far (for usage's reasoning_tokens)
        self.namespaces = {t.get("name"): ns.get("name") for ns in body.tools or [] if ns.get("type") == "namespace"
                           for t in ns.get("tools") or []}  # a grouped function's calls name its namespace

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return event

    def response(self, status: str, **fields: Any) -> dict[str, Any]:
        return {**self.base, "status": status, "output": copy.deepcopy(self.items), "usage": None, **fields}

    def start(self) -> list[dict[str, Any]]:
        return [self._event("response.created", response=self.response("in_progress")),
                self._event("response.in_progress", response=self.response("in_progress"))]

    def feed(self, thinking: str, content: str, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The events for one parsed piece of output (Ollama-shaped tool calls: arguments an object)."""
        events: list[dict[str, Any]] = []
        if thinking:
            self.thinking += thinking
            events += self._text("reasoning", thinking)
        if content:
            events += self._text("message", content)
        for call in calls:
            events += self._call(call["function"]["name"], json.dumps(call["function"].get("arguments") or {}))
        return events

    def _text(self, kind: str, delta: str) -> list[dict[str, Any]]:
        events = [] if self.open is not None and self.open["type"] == kind else self._close() + self._start(kind)
        item = self.open
        assert item is not None
        item["content"][0]["text"] += delta
        delta_type = "response.output_text.delta" if kind == "message" else "response.reasoning_text.delta"
        extra = {"logprobs": []} if kind == "message" else {}
        return events + [self._event(delta_type, item_id=item["id"], output_index=len(self.items) - 1,
                                     content_index=0, delta=delta, **extra)]

    def _start(self, kind: str) -> list[dict[str, Any]]:
        if kind == "message":
            item = {"id": new_id("msg"), "type": "message", "role": "assistant", "status": "in_progress",
                    "content": []}
            part = {"type": "output_text", "text": "", "annotations": []}
        else:
            item = {"id": new_id("rs"), "type": "reasoning", "status": "in_progress", "summary": [], "content": []}
            part = {"type": "reasoning_text", "text": ""}
        self.items.append(item)
        index = len(self.items) - 1
        events = [self._event("response.output_item.added", output_index=index, item=copy.deepcopy(item)),
                  self._event("response.content_part.added", item_id=item["id"], output_index=index,
                              content_index=0, part=dict(part))]
        item["content"].append(part)
        self.open = item
        return events

    def _close(self, status: str = "completed") -> list[dict[str, Any]]:
        item, self.open = self.open, None
        if item is None:
            return []
        index, part = len(self.items) - 1, item["content"][0]
        item["status"] = status
        done = "response.output_text.done" if item["type"] == "message" else "response.reasoning_text.done"
        extra = {"logprobs": []} if item["type"] == "message" else {}
        return [self._event(done, item_id=item["id"], output_index=index, content_index=0, text=part["text"], **extra),
                self._event("response.content_part.done", item_id=item["id"], output_index=index, content_index=0,
                            part=dict(part)),
                self._event("response.output_item.done", output_index=index, item=copy.deepcopy(item))]

    def _call(self, name: str, arguments: str) -> list[dict[str, Any]]:
        events = self._close()
        item = {"id": new_id("fc"), "type": "function_call", "status": "in_progress", "call_id": new_id("call"),
                "name": name, "arguments": ""}
        if self.namespaces.get(name):
            item["namespace"] = self.namespaces[name]
        self.items.append(item)
        index = len(self.items) - 1
        events += [self._event("response.output_item.added", output_index=index, item=dict(item)),
                   self._event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                               delta=arguments),
                   self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                               arguments=arguments)]
        item.update(arguments=arguments, status="completed")
        return events + [self._event("response.output_item.done", output_index=index, item=dict(item))]

    def progress(self, report: dict[str, Any]) -> dict[str, Any]:
        """A prompt progress report (the request asked: return_progress) as a response.in_progress event."""
        return {**self._event("response.in_progress", response=self.response("in_progress")),
                "prompt_progress": report}

    def finish(self, done_reason: str | None, use: dict[str, Any],
               truncated: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Close the last item and end the response: cut short by the token limit (or the window) it is
        `incomplete` with reason max_output_tokens. `truncated`: evenflow's report of what the input lost."""
        events: list[dict[str, Any]] = []
        cut = done_reason == "length"
        if not cut and not any(i["type"] in ("message", "function_call") for i in self.items):
            events += self._close() + self._start("message")  # an empty answer is still a message
        events += self._close("incomplete" if cut else "completed")
        done = {"completed_at": int(time.time()), "usage": use, **({"truncated": truncated} if truncated else {})}
        if cut:
            return events + [self._event("response.incomplete", response=self.response(
                "incomplete", incomplete_details={"reason": "max_output_tokens"}, **done))]
        return events + [self._event("response.completed", response=self.response("completed", **done))]

    def fail(self, message: str) -> list[dict[str, Any]]:
        """An error after the stream began: the items so far, then response.failed with the error."""
        return self._close("incomplete") + [self._event("response.failed", response=self.response(
            "failed", error={"code": "server_error", "message": message}))]


class ResponsesReply:
    """/v1/responses: the output's thinking, content and tool calls as one response object or its events."""

    def __init__(self, req: ResponsesRequest, facts: Facts) -> None:
        self.tokenizer = facts.tokenizer
        self.builder = ResponseBuilder(req)

    def _usage(self, metrics: dict[str, Any], reasoning_tokens: int | None) -> dict[str, Any]:
        out = metrics.get("eval_count", 0)
        thought = reasoning_tokens
        if thought is None:  # counted again from its text (our engine does not split the output's tokens)
            thought = len(self.tokenizer.encode(self.builder.thinking, add_special=False, parse_special=False)) \
                if self.builder.thinking and self.tokenizer is not None else 0
        return usage(metrics.get("prompt_eval_count", 0), out, min(thought, out))

    def whole(self, gens: list[Generation]) -> dict[str, Any]:
        g = gens[0]
        self.builder.feed(g.thinking, g.content, g.calls)
        return self.builder.finish(g.done_reason, self._usage(g.metrics, g.reasoning_tokens),
                                   g.truncated)[-1]["response"]

    async def stream(self, deltas: AsyncIterator[Delta]) -> AsyncIterator[dict[str, Any]]:
        b = self.builder
        for event in b.start():
            yield event
        try:
            async for p in deltas:
                if p.progress is not None:
                    yield b.progress(p.progress)
                    continue
                for event in b.feed(p.thinking, p.content, p.calls):
                    yield event
                if p.final is not None:
                    for event in b.finish(p.final["done_reason"], self._usage(p.final, p.reasoning_tokens),
                                          p.truncated):
                        yield event
        except APIError as e:
            for event in b.fail(e.message):
                yield event
