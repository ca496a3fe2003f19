"""OpenAI's wire format for model replies: chat.completion(.chunk) and text_completion objects for n choices,
streamed (SSE) or whole, with usage, and the embedding list."""
from __future__ import annotations

import base64
import json
import random
import struct
import time
from typing import Any, AsyncIterator

from ..pipeline import logprobs as lp_format
from ..pipeline.deltas import Delta, Facts, Generation
from ..pipeline.embedding import normalise
from .request import ChatCompletionRequest, CompletionRequest, EmbeddingRequest

FINGERPRINT = "fp_ollama"


def _usage(metrics: list[dict[str, int]]) -> dict[str, int]:
    """The prompt counted once (n choices share it), the completion tokens of every choice summed."""
    p = metrics[0].get("prompt_eval_count", 0) if metrics else 0
    c = sum(m.get("eval_count", 0) for m in metrics)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def _finish(reason: str | None, calls: bool) -> str:
    if calls and reason == "stop":
        return "tool_calls"
    return "length" if reason == "length" else "stop"


def _tool_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"id": f"call_{''.join(random.choices('abcdefghijklmnopqrstuvwxyz0123456789', k=8))}",
             "index": c["function"].get("index", i), "type": "function",
             "function": {"name": c["function"]["name"], "arguments": json.dumps(c["function"]["arguments"])}}
            for i, c in enumerate(calls)]


class ChatCompletionReply:
    """/v1/chat/completions: each choice's reasoning, content and tool calls as `message` or `delta`."""

    def __init__(self, req: ChatCompletionRequest, facts: Facts) -> None:
        self.n = facts.n
        self.tokenizer = facts.tokenizer
        self.want_lp = facts.logprobs is not None
        self.base = {"id": f"chatcmpl-{random.randint(0, 998)}", "created": int(time.time()), "model": req.model,
                     "system_fingerprint": FINGERPRINT}
        self.include_usage = bool(req.stream_options and req.stream_options.include_usage)

    def whole(self, gens: list[Generation]) -> dict[str, Any]:
        choices = []
        for i, g in enumerate(gens):
            thinking, content, calls = g.thinking, g.content, g.calls
            msg: dict[str, Any] = {"role": "assistant", "content": content}
            if thinking:
                msg["reasoning"] = thinking
            if calls:
                msg["tool_calls"] = _tool_calls(calls)
            choices.append({"index": i, "message": msg, "finish_reason": _finish(g.done_reason, bool(calls)),
                            "logprobs": lp_format.openai_chat(self.tokenizer, g.logprobs) if self.want_lp else None})
        out = {**self.base, "object": "chat.completion", "choices": choices, "usage": _usage([g.metrics for g in gens])}
        return _with_truncated(out, gens)

    async def stream(self, deltas: AsyncIterator[Delta]) -> AsyncIterator[dict[str, Any]]:
        first = [True] * self.n
        any_calls = [False] * self.n
        pending: list[list[Any]] = [[] for _ in range(self.n)]  # logprobs not yet sent (text held back)
        finals: list[dict[str, Any]] = []

        def ch(i: int, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            if first[i]:
                delta = {"role": "assistant", **delta}
                first[i] = False
            choice: dict[str, Any] = {"index": i, "delta": delta, "finish_reason": finish}
            if self.want_lp:
                choice["logprobs"] = lp_format.openai_chat(self.tokenizer, pending[i]) if pending[i] else None
                pending[i] = []
            obj = {**self.base, "object": "chat.completion.chunk", "choices": [choice]}
            if self.include_usage:
                obj["usage"] = None  # as OpenAI: null on content chunks, the real usage on the last one
            return obj

        async for p in deltas:
            i = p.index
            if p.progress is not None:  # llama-server's return_progress chunk (only when asked)
                obj = {**self.base, "object": "chat.completion.chunk", "prompt_progress": p.progress, "choices": [
                    {"index": i, "delta": {"role": "assistant", "content": None}, "finish_reason": None}]}
                yield {**obj, "usage": None} if self.include_usage else obj
                continue
            pending[i].extend(p.logprobs or [])
            thinking, content, calls = p.thinking, p.content, p.calls
            if thinking:
                yield ch(i, {"content": "", "reasoning": thinking})
            if content:
                yield ch(i, {"content": content})
            if calls:
                any_calls[i] = True
                yield ch(i, {"tool_calls": _tool_calls(calls)})
            if p.final is not None:
                last = ch(i, {} if not first[i] else {"content": ""}, _finish(p.final["done_reason"], any_calls[i]))
                yield {**last, "truncated": p.truncated} if p.truncated else last
                finals.append(p.final)
                if self.include_usage and len(finals) == self.n:
                    yield {**self.base, "object": "chat.completion.chunk", "choices": [], "usage": _usage(finals)}


class CompletionReply:
    """/v1/completions: each choice's text, with legacy logprobs (text offsets counted per choice)."""

    def __init__(self, req: CompletionRequest, facts: Facts) -> None:
        self.n = facts.n
        self.tokenizer = facts.tokenizer
        self.want_lp = facts.logprobs is not None
        self.base = {"id": f"cmpl-{random.randint(0, 998)}", "object": "text_completion", "created": int(time.time()),
                     "model": req.model, "system_fingerprint": FINGERPRINT}
        self.include_usage = bool(req.stream_options and req.stream_options.include_usage)

    def whole(self, gens: list[Generation]) -> dict[str, Any]:
        return _with_truncated({**self.base, "choices": [
            {"text": g.text, "index": i,
             "logprobs": lp_format.legacy(self.tokenizer, g.logprobs, g.offsets, g.text) if self.want_lp else None,
             "finish_reason": _finish(g.done_reason, False)} for i, g in enumerate(gens)],
            "usage": _usage([g.metrics for g in gens])}, gens)

    async def stream(self, deltas: AsyncIterator[Delta]) -> AsyncIterator[dict[str, Any]]:
        sizes = [0] * self.n  # characters streamed per choice: the base of text_offset
        pending: list[list[Any]] = [[] for _ in range(self.n)]
        finals: list[dict[str, Any]] = []
        async for p in deltas:
            i = p.index
            if p.progress is not None:  # llama-server's return_progress chunk (only when asked)
                obj = {**self.base, "prompt_progress": p.progress,
                       "choices": [{"text": "", "index": i, "logprobs": None, "finish_reason": None}]}
                yield {**obj, "usage": None} if self.include_usage else obj
                continue
            pending[i].extend(p.logprobs or [])
            if p.final is None and not p.text:
                continue  # a partial character: its logprobs go with the chunk that completes it
            lp = None
            if self.want_lp:
                lp = lp_format.legacy(self.tokenizer, pending[i], [sizes[i]] * len(pending[i]), p.text, sizes[i])
                pending[i] = []
            sizes[i] += len(p.text)
            finish = None if p.final is None else _finish(p.final["done_reason"], False)
            obj = {**self.base, "choices": [{"text": p.text, "index": i, "logprobs": lp, "finish_reason": finish}]}
            if p.truncated:
                obj["truncated"] = p.truncated
            if self.include_usage:
                obj["usage"] = None  # as OpenAI: null on content chunks, the real usage on the last one
            yield obj
            if p.final is not None:
                finals.append(p.final)
                if self.include_usage and len(finals) == self.n:
                    yield {**self.base, "choices": [], "usage": _usage(finals)}


def _with_truncated(body: dict[str, Any], gens: list[Generation]) -> dict[str, Any]:
    """The body with evenflow's `truncated` report (what the prompt lost, the context shifts), when there is one."""
    report = next((g.truncated for g in gens if g.truncated), None)
    return {**body, "truncated": report} if report else body


def embedding_reply(req: EmbeddingRequest, vectors: list[Any], tokens: int, load_duration_ns: int,
                    t0: int) -> dict[str, Any]:
    """/v1/embeddings: L2-normalised vectors cut to `dimensions`, as floats or base64 float32."""
    data = []
    for i, vec in enumerate(vectors):
        v = normalise(vec, req.dimensions)
        emb: Any = base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode() if req.encoding_format == "base64" else v
        data.append({"object": "embedding", "embedding": emb, "index": i})
    return {"object": "list", "data": data, "model": req.model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
