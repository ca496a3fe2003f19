"""Anthropic's wire format for a model reply: a `message` whose content is thinking, text and tool_use blocks, whole
or as the Messages API's SSE events (message_start, ping, content_block_start/delta/stop per block, message_delta
with the stop reason and usage, message_stop; `error` when generation fails after the start)."""
from __future__ import annotations

import hashlib
import json
import secrets
from typing import Any, AsyncIterator

from ..http.errors import APIError, anthropic_error
from ..http.wire import Wire
from ..pipeline.deltas import Delta, Facts, Generation
from .request import MessagesRequest


def _frame(obj: dict[str, Any]) -> bytes:
    return f"event: {obj['type']}\ndata: {json.dumps(obj, ensure_ascii=False)}\n\n".encode()


# The reply catches its own errors (an `error` event with the right type); `error` here is the last resort.
ANTHROPIC_SSE = Wire("text/event-stream", _frame, lambda message: _frame(anthropic_error(500, message)))


def new_id(prefix: str) -> str:
    """msg_..., toolu_...: Anthropic's id shapes (24 random hex digits)."""
    return prefix + secrets.token_hex(12)


def signature(thinking: str) -> str:
    """A thinking block's `signature`: clients must pass it back untouched; nothing here verifies it."""
    return "evenflow-" + hashlib.sha256(thinking.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def usage(prompt_tokens: int, cached_tokens: int, output_tokens: int) -> dict[str, int]:
    """Anthropic counts cache reads apart: input_tokens + cache_read_input_tokens is the whole prompt."""
    return {"input_tokens": prompt_tokens - cached_tokens, "output_tokens": output_tokens,
            "cache_read_input_tokens": cached_tokens, "cache_creation_input_tokens": 0}


def stop_reason(done_reason: str | None, calls: bool, stop_sequence: str | None, output_tokens: int,
                max_tokens: int) -> str:
    if calls:
        return "tool_use"
    if done_reason == "length":  # max_tokens, or the context window full before it
        return "max_tokens" if output_tokens >= max_tokens else "model_context_window_exceeded"
    return "stop_sequence" if stop_sequence is not None else "end_turn"


class MessageWriter:
    """One assistant message built from (thinking, text, tool calls) increments: its content blocks, and the
    events that stream them. A block stays open while increments of its kind arrive."""

    def __init__(self, model: str, input_tokens: int) -> None:
        self.id, self.model, self.input_tokens = new_id("msg_"), model, input_tokens
        self.content: list[dict[str, Any]] = []
        self.open = False  # the last block still takes deltas

    def message(self, stop: str | None, stop_sequence: str | None, use: dict[str, int]) -> dict[str, Any]:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model,
                "content": [dict(b) for b in self.content], "stop_reason": stop, "stop_sequence": stop_sequence,
                "usage": use}

    def start(self) -> list[dict[str, Any]]:
        return [{"type": "message_start", "message": self.message(None, None, usage(self.input_tokens, 0, 0))},
                {"type": "ping"}]

    def close(self) -> list[dict[str, Any]]:
        """Ends the open block: a thinking block gets its signature (a signature_delta) first."""
        if not self.open:
            return []
        self.open = False
        i, block = len(self.content) - 1, self.content[-1]
        out = []
        if block["type"] == "thinking":
            block["signature"] = signature(block["thinking"])
            out.append(_delta(i, {"type": "signature_delta", "signature": block["signature"]}))
        return out + [{"type": "content_block_stop", "index": i}]

    def _extend(self, kind: str, text: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if not (self.open and self.content[-1]["type"] == kind):
            out += self.close()
            block: dict[str, Any] = {"type": kind, kind: ""}
            if kind == "thinking":
                block["signature"] = ""
            self.content.append(block)
            self.open = True
            out.append({"type": "content_block_start", "index": len(self.content) - 1, "content_block": dict(block)})
        self.content[-1][kind] += text
        out.append(_delta(len(self.content) - 1, {"type": f"{kind}_delta", kind: text}))
        return out

    def _tool_use(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        fn = call["function"]
        out = self.close()
        block = {"type": "tool_use", "id": new_id("toolu_"), "name": fn["name"], "input": fn.get("arguments") or {}}
        self.content.append(block)
        i = len(self.content) - 1
        return out + [{"type": "content_block_start", "index": i, "content_block": {**block, "input": {}}},
                      _delta(i, {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}),
                      {"type": "content_block_stop", "index": i}]

    def add(self, thinking: str, text: str, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = self._extend("thinking", thinking) if thinking else []
        if text:
            out += self._extend("text", text)
        for c in calls:
            out += self._tool_use(c)
        return out

    def finish(self, stop: str, stop_sequence: str | None, use: dict[str, int]) -> list[dict[str, Any]]:
        return self.close() + [{"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": stop_sequence},
                                "usage": use}, {"type": "message_stop"}]


def _delta(index: int, delta: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": delta}


class AnthropicReply:
    """/v1/messages: the output's thinking, text and tool calls as a message's blocks, whole or as events. An
    upstream engine tells the prompt's size only at the end, and not which stop sequence matched."""

    def __init__(self, req: MessagesRequest, facts: Facts) -> None:
        self.max_tokens = req.max_tokens
        self.token_bytes = facts.tokenizer.token_bytes if facts.tokenizer is not None else None
        self.stops = facts.stops
        self.writer = MessageWriter(req.model, facts.prompt_tokens)

    def _stop_sequence(self, text: str, ids: list[int]) -> str | None:
        """The stop sequence that ended the output, if one did. The engine emits the text before it and drops
        the rest; the output tokens, decoded whole, hold the stop right after what was emitted."""
        if not self.stops or self.token_bytes is None:
            return None
        rest = b"".join(self.token_bytes(t) for t in ids).decode("utf-8", errors="replace")[len(text):]
        return next((s for s in self.stops if rest.startswith(s)), None)

    def _end(self, text: str, ids: list[int], done_reason: str | None, metrics: dict[str, int], cached: int,
             calls: bool) -> tuple[str, str | None, dict[str, int]]:
        seq = self._stop_sequence(text, ids) if done_reason == "stop" and not calls else None
        out = metrics.get("eval_count", 0)
        return (stop_reason(done_reason, calls, seq, out, self.max_tokens), seq,
                usage(metrics.get("prompt_eval_count", 0), cached, out))

    def whole(self, gens: list[Generation]) -> dict[str, Any]:
        g = gens[0]
        self.writer.add(g.thinking, g.content, g.calls)
        self.writer.close()
        return self.writer.message(*self._end(g.text, g.token_ids, g.done_reason, g.metrics, g.cached_tokens,
                                              bool(g.calls)))

    async def stream(self, deltas: AsyncIterator[Delta]) -> AsyncIterator[dict[str, Any]]:
        for ev in self.writer.start():
            yield ev
        texts: list[str] = []
        ids: list[int] = []
        any_calls = False
        try:
            async for p in deltas:
                if p.progress is not None:  # a `ping` the SDK skips, carrying the report (return_progress)
                    yield {"type": "ping", "prompt_progress": p.progress}
                    continue
                texts.append(p.text)
                ids += p.token_ids
                thinking, text, calls = p.thinking, p.content, p.calls
                any_calls = any_calls or bool(calls)
                for ev in self.writer.add(thinking, text, calls):
                    yield ev
                if p.final is not None:
                    final = dict(p.final)
                    end = self._end("".join(texts), ids, final.pop("done_reason"), final, p.cached_tokens, any_calls)
                    for ev in self.writer.finish(*end):
                        yield ev
        except APIError as e:  # after the status line: Anthropic's `error` event ends the stream
            yield anthropic_error(e.status, e.message)
