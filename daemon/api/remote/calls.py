"""One call to a remote model's upstream engine: its health checked first, its failures as APIErrors that name the
model (a 502 or 504 also makes the next call check the upstream again), and a non-streamed call dropped when our
client leaves first. Used by the upstream source of deltas (pipeline/upstream_stream.py) and the relay."""
from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable

import numpy as np
from fastapi import Request

from ....backends.remote import UpstreamError, UpstreamStream
from ..http.errors import CLIENT_GONE, APIError
from .convert import Reader
from .hub import RemoteModel, RemoteRun, hub_of


def upstream_error(rm: RemoteModel, e: UpstreamError) -> APIError:
    """The upstream's failure, with its status (502, 504, 4xx), naming our model."""
    return APIError(e.status, f"remote model '{rm.name}': {e.message}")


def failed(request: Request, rm: RemoteModel, e: UpstreamError, always: bool = False) -> APIError:
    """A failed call: the upstream is checked again before the next one (`always`, or when it is down or slow)."""
    if always or e.status in (502, 504):
        hub_of(request).forget(rm.endpoint)
    return upstream_error(rm, e)


async def open_stream(request: Request, rm: RemoteModel, run: RemoteRun, path: str, body: dict[str, Any],
                      reader: Reader) -> UpstreamStream:
    """The upstream's streamed response to `body` at `path` (its status checked: errors before the first byte)."""
    hub = hub_of(request)
    await hub.ensure(request, rm)
    run.emit("queued")
    reader.t_sent = time.perf_counter_ns()  # prompt_eval_duration: from here to the first token
    try:
        up = await hub.upstream(rm.endpoint).open_stream(path, body)
    except UpstreamError as e:
        run.finish("error")
        raise failed(request, rm, e) from None
    run.emit("scheduled")
    return up


async def _disconnected(request: Request) -> None:
    while (await request.receive()).get("type") != "http.disconnect":
        pass


async def unless_gone(request: Request, work: Awaitable[Any], on_gone: Callable[[], Awaitable[Any]]) -> Any:
    """Await `work` (a non-streamed answer) unless the client leaves first: then cancel it, call `on_gone` and
    raise the 499 the logs and /metrics count as a client's disconnect."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        task.cancel()
        await on_gone()
        raise APIError(CLIENT_GONE, "the client disconnected")
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()


async def _nothing() -> None:
    return None


async def post_json(request: Request, rm: RemoteModel, path: str, body: dict[str, Any],
                    run: RemoteRun | None = None) -> dict[str, Any]:
    """A non-streamed upstream call; dropped if our client leaves first. `run`: published as a request."""
    hub = hub_of(request)
    await hub.ensure(request, rm)
    if run is not None:
        run.emit("queued")
    try:
        out = await unless_gone(request, hub.upstream(rm.endpoint).post_json(path, body), _nothing)
    except UpstreamError as e:
        if run is not None:
            run.finish("error")
        raise failed(request, rm, e) from None
    except BaseException:
        if run is not None:
            run.finish("abort")
        raise
    if run is not None:
        usage = out.get("usage") if isinstance(out.get("usage"), dict) else {}
        choices = out.get("choices") or [{}]
        reason = "length" if isinstance(choices[0], dict) and choices[0].get("finish_reason") == "length" else "stop"
        run.finish(reason, usage.get("prompt_tokens"), usage.get("completion_tokens"))
    return out


async def embeddings(request: Request, rm: RemoteModel, inputs: list[str]) -> tuple[list[np.ndarray], int]:
    """The upstream's vectors for `inputs` (/embeddings, in order) and the prompt tokens it counted."""
    out = await post_json(request, rm, "/embeddings", {"model": rm.endpoint.model, "input": inputs})
    data = sorted((d for d in out.get("data") or [] if isinstance(d, dict)), key=lambda d: d.get("index", 0))
    if len(data) != len(inputs) or not all(isinstance(d.get("embedding"), list) for d in data):
        raise APIError(502, f"remote model '{rm.name}': the upstream engine answered /embeddings with "
                            f"{len(data)} vectors for {len(inputs)} inputs (or not as float lists)")
    usage = out.get("usage") if isinstance(out.get("usage"), dict) else {}
    return [np.asarray(d["embedding"], dtype=np.float32) for d in data], int(usage.get("prompt_tokens") or 0)
