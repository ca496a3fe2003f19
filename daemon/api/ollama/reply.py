"""Ollama's wire format for model replies: /api/generate and /api/chat objects (streamed pieces, the final object
with the metrics, the whole answer with `stream: false`, the load/unload answer) and the embedding bodies."""
from __future__ import annotations

import time
from typing import Any, AsyncIterator

from ..http.wire import now_rfc3339
from ..pipeline import logprobs as lp_format
from ..pipeline.deltas import Delta, Facts, Generation
from ..pipeline.embedding import normalise
from .request import ChatRequest, EmbeddingsRequest, EmbedRequest, GenerateRequest


class GenerateReply:
    """/api/generate: `response` pieces, then the final object with the metrics and `context` (unless raw)."""

    @staticmethod
    def loaded(name: str, reason: str) -> dict[str, Any]:
        """The answer to an empty prompt: the model was loaded ("load") or unloaded ("unload")."""
        return {"model": name, "created_at": now_rfc3339(), "response": "", "done": True, "done_reason": reason}

    def __init__(self, req: GenerateRequest, facts: Facts) -> None:
        self.req, self.prompt_ids = req, facts.prompt_ids
        self.tokenizer = facts.tokenizer

    def _final(self, output_ids: list[int], final: dict[str, Any], truncated: dict[str, Any] | None) -> dict[str, Any]:
        out = {"model": self.req.model, "created_at": now_rfc3339(), "response": "", "done": True, **final}
        if not self.req.raw and self.prompt_ids is not None:  # an upstream engine keeps its tokens to itself
            out["context"] = [t for t in self.prompt_ids if t >= 0] + output_ids  # image placeholders left out
        if truncated:
            out["truncated"] = truncated
        return out

    def whole(self, gens: list[Generation]) -> dict[str, Any]:
        g = gens[0]
        body = self._final(g.token_ids, {"done_reason": g.done_reason, **g.metrics}, g.truncated)
        body["response"] = g.content
        if g.thinking:
            body["thinking"] = g.thinking
        if g.logprobs:
            body["logprobs"] = lp_format.ollama(self.tokenizer, g.logprobs)
        return body

    async def stream(self, deltas: AsyncIterator[Delta]) -> AsyncIterator[dict[str, Any]]:
        out_ids: list[int] = []
        async for p in deltas:
            if p.progress is not None:  # only when the request asked (return_progress)
                yield {"model": self.req.model, "created_at": now_rfc3339(), "response": "", "done": False,
                       "prompt_progress": p.progress}
                continue
            out_ids.extend(p.token_ids)
            thinking, content = p.thinking, p.content
            if content or thinking or p.logprobs:  # logprobs go out even while the parser holds text back
                obj = {"model": self.req.model, "created_at": now_rfc3339(), "response": content, "done": False}
                if thinking:
                    obj["thinking"] = thinking
                if p.logprobs:
                    obj["logprobs"] = lp_format.ollama(self.tokenizer, p.logprobs)
                yield obj
            if p.final is not None:
                yield self._final(out_ids, p.final, p.truncated)


class ChatReply:
    """/api/chat: assistant `message` pieces (thinking, content and tool calls apart), then the final object."""

    @staticmethod
    def loaded(name: str, reason: str) -> dict[str, Any]:
        """The answer to an empty message list: the model was loaded ("load") or unloaded ("unload")."""
        return {"model": name, "created_at": now_rfc3339(), "message": {"role": "assistant", "content": ""},
                "done": True, "done_reason": reason}

    def __init__(self, req: ChatRequest, facts: Facts) -> None:
        self.model = req.model
        self.tokenizer = facts.tokenizer

    def _chunk(self, content: str = "", thinking: str = "", tool_calls: list | None = None) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": content}
        if thinking:
            msg["thinking"] = thinking
        if tool_calls:
            msg["tool_calls"] = tool_calls
        return {"model": self.model, "created_at": now_rfc3339(), "message": msg, "done": False}

    def whole(self, gens: list[Generation]) -> dict[str, Any]:
        g = gens[0]
        body = self._chunk(g.content, g.thinking, g.calls)
        body.update(done=True, done_reason=g.done_reason, **g.metrics)
        if g.truncated:
            body["truncated"] = g.truncated
        if g.logprobs:
            body["logprobs"] = lp_format.ollama(self.tokenizer, g.logprobs)
        return body

    async def stream(self, deltas: AsyncIterator[Delta]) -> AsyncIterator[dict[str, Any]]:
        async for p in deltas:
            if p.progress is not None:  # only when the request asked (return_progress)
                yield {**self._chunk(), "prompt_progress": p.progress}
                continue
            final = p.final
            thinking, content, calls = p.thinking, p.content, p.calls
            out = ([self._chunk("", thinking)] if thinking else []) + ([self._chunk(content)] if content else []) \
                + ([self._chunk("", "", calls)] if calls else [])
            if p.logprobs:  # on the piece's first chunk, or their own while the parser holds text back
                out = out or [self._chunk()]
                out[0]["logprobs"] = lp_format.ollama(self.tokenizer, p.logprobs)
            for obj in out:
                yield obj
            if final is not None:
                done = self._chunk()
                done.update(done=True, **final)
                if p.truncated:
                    done["truncated"] = p.truncated
                yield done


def embed_reply(req: EmbedRequest, vectors: list[Any], tokens: int, load_duration_ns: int, t0: int) -> dict[str, Any]:
    """/api/embed: L2-normalised vectors cut to `dimensions`, with the durations and the prompt's token count."""
    if not vectors:
        return {"model": req.model, "embeddings": []}
    return {"model": req.model, "embeddings": [normalise(v, req.dimensions) for v in vectors],
            "total_duration": time.perf_counter_ns() - t0, "load_duration": load_duration_ns,
            "prompt_eval_count": tokens}


def embeddings_reply(req: EmbeddingsRequest, vectors: list[Any], tokens: int, load_duration_ns: int,
                     t0: int) -> dict[str, Any]:
    """Legacy /api/embeddings: the one vector as the model pooled it (not normalised)."""
    if not vectors:
        return {"embedding": []}
    return {"embedding": [float(x) for x in vectors[0].astype("float64")]}
