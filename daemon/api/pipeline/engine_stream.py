"""Our engine as a source of deltas: submit the prepared prompt (n choices), read the choices back as pieces with
Ollama's final metrics and then, through the model's reply parser, as `Delta`s (deltas.py); abort them when the
client goes away, and free them and the model lease however the request ends."""
from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator

from fastapi import Request

from ...context import context
from ...engine.engine import EngineStopped, PromptTooLong, QueueFull
from ...manager import Lease
from ...prompt.reply import ReplyParser
from ..http.errors import CLIENT_GONE, SERVER_BUSY, APIError
from . import overflow
from .deltas import Delta, Facts, Generation
from .prepare import Prepared


@dataclass
class Piece:
    """One streamed delta of choice `index`; `final` (Ollama metrics + done_reason) only on its last piece."""

    index: int
    text: str
    token_ids: list[int]
    logprobs: list[Any] | None
    final: dict[str, Any] | None
    cached_tokens: int = 0  # with `final`: prompt tokens served from the prefix cache
    truncated: dict[str, Any] | None = None  # with `final`: the `truncated` report (overflow.report), if any
    progress: dict[str, Any] | None = None  # a prompt progress report (no text): the request asked for them


async def _watch_disconnect(request: Request, on_gone) -> None:
    """Waits for the client to go away (http.disconnect) and calls `on_gone` once."""
    try:
        while True:
            msg = await request.receive()
            if msg.get("type") == "http.disconnect":
                on_gone()
                return
    except (asyncio.CancelledError, RuntimeError):
        return


async def engine_stream(request: Request, lease: Lease, prep: Prepared, endpoint: str,
                        t_start: int) -> "EngineOutput":
    """Submit a prepared request; its output comes from the returned EngineOutput.

    Submits before yielding anything, so PromptTooLong / QueueFull become real HTTP statuses. The request's
    events name the model and endpoint, and carry the prompt text when the daemon logs content.
    """
    model = lease.model
    user = {"model": model.name, "endpoint": endpoint}
    if context(request).settings.log_content:
        user["prompt"] = prep.text
    engine = model.engine
    # n > 1: a seeded request gives choice i the seed + i, so the choices differ yet reproduce
    params = [prep.params] + [dataclasses.replace(prep.params, seed=prep.params.seed + i if prep.params.seed >= 0
                                                  else -1) for i in range(1, prep.n)]
    try:
        streams = engine.submit_group(prep.prompt_ids, params, user=user, constraint=prep.constraint,
                                      logprobs=prep.logprobs, priority=prep.priority, embeds=prep.embeds,
                                      progress=prep.progress, context_length=prep.window)
    except PromptTooLong as e:
        raise APIError(400, str(e)) from None
    except QueueFull:
        raise APIError(503, SERVER_BUSY) from None
    except EngineStopped:
        raise APIError(503, "the model is being unloaded or the server is shutting down; retry") from None
    except ValueError as e:
        raise APIError(400, str(e)) from None
    if prep.truncation is not None:
        overflow.announce(context(request).events, endpoint, model.name, streams[0].seq_id,
                          len(prep.prompt_ids), prep.window, prep.truncation)
    return EngineOutput(EngineChunks(request, engine, streams, lease, t_start, prep.truncation), prep,
                        model.runner.tokenizer)


async def _merged(streams: list[Any]) -> AsyncIterator[tuple[int, Any]]:
    """(index, delta) from several engine streams as they arrive, until every one is done."""
    if len(streams) == 1:
        async for d in streams[0]:
            yield 0, d
        return
    q: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()

    async def pump(i: int, stream: Any) -> None:
        async for d in stream:
            q.put_nowait((i, d))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        left = len(streams)
        while left:
            i, d = await q.get()
            left -= d.done
            yield i, d
    finally:
        for t in tasks:
            t.cancel()


class EngineChunks:
    """One request's engine output (n choices), iterated as `pieces()`; `final` (Ollama metrics + done_reason)
    comes with a choice's last piece. It owns the sequences and the model lease: `close()` aborts the sequences
    that did not finish (their KV freed at the next engine step) and releases the lease. `collect_all()` and the
    streamed responses call it however they end: done, failed, client gone, even before iterating."""

    def __init__(self, request: Request, engine: Any, streams: list[Any], lease: Lease, t_start: int,
                 truncation: overflow.Truncation | None = None) -> None:
        self.request, self.engine, self.streams, self.lease, self.t_start = request, engine, streams, lease, t_start
        self.truncation = truncation
        self.done: set[int] = set()
        self.client_gone = False  # the watcher saw http.disconnect: an abort after it is our client's, not overload

    @property
    def finished(self) -> bool:
        return len(self.done) == len(self.streams)

    def _abort_rest(self) -> None:
        for i, s in enumerate(self.streams):
            if i not in self.done:
                self.engine.abort(s.seq_id)

    def _client_left(self) -> None:
        self.client_gone = True
        self._abort_rest()

    def close(self) -> None:
        self._abort_rest()
        self.lease.release()

    async def pieces(self) -> AsyncIterator[Piece]:
        watcher = asyncio.create_task(_watch_disconnect(self.request, self._client_left))
        try:
            async for i, d in _merged(self.streams):
                if d.progress is not None:
                    yield Piece(i, "", [], None, None, progress=d.progress)
                    continue
                if not d.done:
                    yield Piece(i, d.text, list(d.token_ids), d.logprobs, None)
                    continue
                self.done.add(i)
                if d.done_reason == "error":
                    # the engine logged the cause; its text (an exception's) is not for clients
                    raise APIError(500, "internal error: generation failed (see the daemon log)")
                if d.done_reason == "abort" and self.client_gone:  # 499 in the logs and /metrics, not overload
                    raise APIError(CLIENT_GONE, "the client disconnected")
                if d.done_reason == "abort":  # not our client (it would not be reading): shutdown or unload
                    raise APIError(503, "the request was aborted: the server is shutting down or the model "
                                        "was unloaded; retry")
                m = d.metrics.as_ollama() if d.metrics is not None else {}
                m["load_duration"] = self.lease.load_duration_ns
                m["total_duration"] = time.perf_counter_ns() - self.t_start
                yield Piece(i, d.text, list(d.token_ids), d.logprobs, {"done_reason": d.done_reason or "stop", **m},
                            d.metrics.cached_tokens if d.metrics is not None else 0,
                            overflow.report(self.truncation, d.metrics))
        finally:
            watcher.cancel()
            self._abort_rest()  # consumer gone (disconnect, error): free the slots and KV


async def collect_all(chunks: EngineChunks) -> list[Generation]:
    """Every choice's whole output (stream: false, n >= 1); closes `chunks`."""
    gens = [Generation() for _ in chunks.streams]
    parts: list[list[str]] = [[] for _ in chunks.streams]
    sizes = [0] * len(gens)
    try:
        async for p in chunks.pieces():
            if p.progress is not None:
                continue
            g = gens[p.index]
            if p.logprobs:
                g.logprobs.extend(p.logprobs)
                g.offsets.extend([sizes[p.index]] * len(p.logprobs))
            parts[p.index].append(p.text)
            sizes[p.index] += len(p.text)
            g.token_ids.extend(p.token_ids)
            if p.final is not None:
                g.done_reason = p.final.pop("done_reason")
                g.metrics = p.final
                g.cached_tokens = p.cached_tokens
                g.truncated = p.truncated
    finally:
        chunks.close()
    for g, ps in zip(gens, parts):
        g.text = "".join(ps)
    return gens


class EngineOutput:
    """The engine's `Output` (deltas.py): its pieces read back through the model's reply parser, one per choice
    (thinking, content and tool calls in the model family's format); `/v1/completions` shows the text as it is."""

    def __init__(self, chunks: EngineChunks, prep: Prepared, tokenizer: Any) -> None:
        self.chunks, self.prep = chunks, prep
        self.facts = Facts(prep.n, prep.prompt_ids, prep.logprobs, tokenizer, list(prep.params.stop or []))

    def _parser(self) -> ReplyParser | None:
        p = self.prep
        return ReplyParser(p.template, p.text, p.think, p.tools, p.arch) if p.parse else None

    async def deltas(self) -> AsyncIterator[Delta]:
        parsers = [self._parser() for _ in self.chunks.streams]
        async for p in self.chunks.pieces():
            if p.progress is not None:
                yield Delta(p.index, progress=p.progress)
                continue
            parser = parsers[p.index]
            thinking, content, calls = parser.feed(p.text, p.final is not None) if parser else ("", p.text, [])
            yield Delta(p.index, p.text, thinking, content, calls, p.token_ids, p.logprobs, p.final,
                        p.cached_tokens, p.truncated)

    async def whole(self) -> list[Generation]:
        gens = await collect_all(self.chunks)
        for g in gens:  # read back whole, as the model wrote it
            parser = self._parser()
            g.thinking, g.content, g.calls = parser.parse_all(g.text) if parser else ("", g.text, [])
        return gens

    def close(self) -> None:
        self.chunks.close()
