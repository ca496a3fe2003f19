"""A remote model's upstream engine as a source of deltas, beside engine_stream.py: the upstream request a dialect's
prepare step made is sent (streamed, usage included), and its chunks come back as the same `Delta`s our engine's
output gives (content, thinking, tool calls at the end, usage and the done reason), published on /api/events as our
engine's requests are. Upstream failures are APIErrors with their status; the upstream response is closed however
ours ends, so a client that leaves stops the upstream generation too."""
from __future__ import annotations

from typing import Any, AsyncIterator

from fastapi import Request

from ....backends.remote import UpstreamError, UpstreamStream
from ..remote.calls import failed, open_stream, unless_gone
from ..remote.convert import Reader, UpstreamRequest
from ..remote.hub import RemoteModel, RemoteRun
from .deltas import Delta, Facts, Generation, collect


async def upstream_stream(request: Request, rm: RemoteModel, endpoint: str, call: UpstreamRequest,
                          t_start: int) -> "UpstreamOutput":
    """Send `call` upstream; its output comes from the returned UpstreamOutput. The upstream's status is read before
    anything is yielded, so its refusals are real HTTP statuses."""
    run = RemoteRun(request, rm, endpoint, call.prompt)
    reader = Reader(t_start)
    up = await open_stream(request, rm, run, call.path, call.body, reader)
    return UpstreamOutput(request, rm, run, up, reader)


class UpstreamOutput:
    """The upstream's `Output` (deltas.py): one choice, no prompt ids (its size comes with the usage), no logprobs."""

    def __init__(self, request: Request, rm: RemoteModel, run: RemoteRun, up: UpstreamStream, reader: Reader) -> None:
        self.request, self.rm, self.run, self.up, self.reader = request, rm, run, up, reader
        self.facts = Facts()

    async def deltas(self) -> AsyncIterator[Delta]:
        reader, run = self.reader, self.run
        try:
            async for obj in self.up.events():
                content, thinking = reader.feed(obj)
                if content or thinking:
                    run.token(content or thinking)
                    yield Delta(text=content, thinking=thinking, content=content)
        except UpstreamError as e:
            run.finish("error")
            raise failed(self.request, self.rm, e, always=True) from None
        run.finish(reader.done_reason, reader.prompt_tokens, reader.output_tokens)
        details = reader.usage.get("completion_tokens_details")
        thought = details.get("reasoning_tokens") if isinstance(details, dict) else None
        yield Delta(calls=reader.tool_calls(), final={"done_reason": reader.done_reason, **reader.metrics()},
                    reasoning_tokens=int(thought or 0))

    async def whole(self) -> list[Generation]:
        """The whole answer, unless the client leaves first (then the upstream response is closed: a 499)."""
        try:
            return await unless_gone(self.request, collect(self.deltas(), 1), self.up.aclose)
        finally:
            await self.close()

    async def close(self) -> Any:
        await self.up.aclose()
        self.run.finish("abort")  # a no-op when the stream finished
