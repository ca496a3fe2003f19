"""The one skeleton of a model request, written once for every endpoint and every model, local or remote: plan (the
checks that need no model), resolve the name (once: it says local or remote), prepare (for our engine, in the worker
pool; for an upstream engine, its request), run (engine_stream.py or upstream_stream.py: both give deltas), and
answer in the endpoint's wire format with a reply that does not know which ran. An endpoint is a `Generate` or an
`Embed`: what differs between endpoints, and nothing else."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Protocol

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from ...context import AppContext, context
from ...model_types import ModelRecord
from .. import remote
from ..http.errors import APIError
from ..http.wire import Wire, streamed
from . import overflow, prepare
from .deltas import Delta, Facts, Generation, Output
from .embedding import embed_ids
from .engine_stream import engine_stream
from .options import requested_draft, requested_gpu
from .plan import EmbedPlan, Plan
from .prepare import Prepared
from .upstream_stream import upstream_stream


class Reply(Protocol):
    """An endpoint's wire format for one request's output, from our engine or an upstream one alike."""

    def whole(self, gens: list[Generation]) -> dict[str, Any]:
        """The body of a `stream: false` answer (one Generation per choice)."""

    def stream(self, deltas: AsyncIterator[Delta]) -> AsyncIterator[dict[str, Any]]:
        """The streamed objects, from the output's deltas."""


@dataclass(frozen=True)
class Generate:
    """A generation endpoint: its path (events, the relayed route), its plan and prepare steps, its reply.

    `upstream` is the prepare step for a remote model: (remote model, request, *plan.args) -> the upstream request;
    with `relay` the upstream speaks the endpoint's own dialect and gets the request as it came instead."""

    endpoint: str
    plan: Callable[[Any], Plan]
    prepare: Callable[..., Prepared]  # (model, request, window, *plan.args), run in the worker pool
    reply: Callable[[Any, Facts], Reply]
    wire: Wire
    loaded: Callable[[str, str], dict[str, Any]] | None = None  # (name, "load"/"unload"): an empty request's answer
    upstream: Callable[..., remote.UpstreamRequest] | None = None
    relay: bool = False


@dataclass(frozen=True)
class Embed:
    """An embedding endpoint: its path, its plan, and its body from (request, vectors, tokens, load_ns, t0);
    `relay`: a remote model's request goes upstream as it came."""

    endpoint: str
    plan: Callable[[Any], EmbedPlan]
    reply: Callable[[Any, list[Any], int, int, int], dict[str, Any]]
    relay: bool = False


async def resolve(ctx: AppContext, name: str) -> ModelRecord:
    """The request's model, resolved once (off the loop: the store reads its manifest); the record says whether
    an upstream engine serves it (`record.remote`)."""
    return await asyncio.to_thread(ctx.manager.resolve, name)


async def generate(request: Request, kind: Generate, req: Any, t0: int) -> Response:
    """A generation request: plan, resolve, prepare, run (our engine or the upstream one), answer in `kind`'s format."""
    plan = kind.plan(req)
    gpu = requested_gpu(getattr(req, "options", None))  # Ollama's load-time num_gpu / main_gpu (a 400 before loading)
    draft = requested_draft(req)  # a draft model loaded beside the model for this request (a 400 before loading)
    ctx = context(request)
    record = await resolve(ctx, req.model)
    if record.remote is not None:
        return await _remote(request, kind, req, plan, remote.remote_model(record), t0)
    if plan.load_only:
        return JSONResponse(await _load_only(ctx, kind, record, req.model, plan.keep_alive, gpu))
    lease = await ctx.manager.acquire(record, keep_alive=plan.keep_alive, num_ctx=plan.num_ctx, gpu=gpu,
                                      draft=draft)
    try:
        prep = await ctx.workers.run(request, kind.prepare, lease.model, req, lease.num_ctx, *plan.args)
        prep.params.draft_model = lease.draft_model  # the engine knows the draft model by its store name
        prep.progress = prep.progress and plan.stream  # progress is for streams only
        out = await engine_stream(request, lease, prep, kind.endpoint, t0)
    except BaseException:
        lease.release()
        raise
    headers = {overflow.HEADER: prep.truncation.header()} if prep.truncation is not None else None
    return await _answer(kind, req, plan, out, headers)


async def _remote(request: Request, kind: Generate, req: Any, plan: Plan, rm: remote.RemoteModel,
                  t0: int) -> Response:
    """A remote model's request past its plan: its upstream request (the dialect's prepare step), then the same
    answer as a local one's; or the request relayed as it came."""
    if kind.relay:
        return await remote.relay(request, rm, kind.endpoint)
    if plan.load_only:  # nothing is held here: "load" checks the upstream, keep_alive 0 answers "unload"
        assert kind.loaded is not None
        if plan.keep_alive != 0:
            await remote.ensure(request, rm)
        return JSONResponse(kind.loaded(req.model, "unload" if plan.keep_alive == 0 else "load"))
    assert kind.upstream is not None, f"{kind.endpoint} has no upstream step"
    out = await upstream_stream(request, rm, kind.endpoint, kind.upstream(rm, req, *plan.args), t0)
    return await _answer(kind, req, plan, out, None)


async def _answer(kind: Generate, req: Any, plan: Plan, out: Output, headers: dict[str, str] | None) -> Response:
    """The output in `kind`'s wire format: one body (`stream: false`), or streamed; `out` closed however it ends."""
    try:
        reply = kind.reply(req, out.facts)
    except BaseException:
        await _close(out)
        raise
    if not plan.stream:
        return JSONResponse(reply.whole(await out.whole()), headers=headers)
    return streamed(kind.wire, reply.stream(out.deltas()), out.close, headers)


async def _close(out: Output) -> None:
    closing = out.close()
    if asyncio.iscoroutine(closing):
        await closing


async def _load_only(ctx: AppContext, kind: Generate, record: ModelRecord, name: str, keep_alive: float | None,
                     gpu: Any = None) -> dict[str, Any]:
    """Empty prompt/messages: load the model (done_reason "load"), or unload it with keep_alive 0."""
    assert kind.loaded is not None  # only Ollama's plans ask for it, and its endpoints say how to answer
    if keep_alive == 0:
        await ctx.manager.unload(record.name)
        return kind.loaded(name, "unload")
    lease = await ctx.manager.acquire(record, keep_alive=keep_alive, gpu=gpu)
    lease.release()
    return kind.loaded(name, "load")


async def on_local(request: Request, endpoint: str, name: str, work: Callable[..., Any], *args: Any) -> Any:
    """`work(model, *args, window)` in the worker pool, the local model `name` (resolved once) held meanwhile; 400
    for a remote model, whose upstream engine renders and counts its prompts itself."""
    ctx = context(request)
    record = await resolve(ctx, name)
    if record.remote is not None:
        raise APIError(400, f"{endpoint} is not supported for remote models yet ('{name}' is served by another "
                            f"engine, which renders and counts the prompt itself)")
    lease = await ctx.manager.acquire(record)
    try:
        return await ctx.workers.run(request, work, lease.model, *args, lease.num_ctx)
    finally:
        lease.release()


async def embed(request: Request, kind: Embed, req: Any, t0: int) -> Response:
    """An embedding request: plan, resolve, embed each input (our model, or the upstream's /embeddings), answer in
    `kind`'s body."""
    plan = kind.plan(req)
    ctx = context(request)
    gpu = requested_gpu(getattr(req, "options", None))
    record = await resolve(ctx, req.model)
    if record.remote is not None:
        rm = remote.remote_model(record)
        if kind.relay:
            return await remote.relay(request, rm, kind.endpoint)
        vectors, count = await remote.embeddings(request, rm, plan.inputs) if plan.inputs else ([], 0)
        return JSONResponse(kind.reply(req, vectors, count, 0, t0))
    lease = await ctx.manager.acquire(record, keep_alive=plan.keep_alive, num_ctx=plan.num_ctx, gpu=gpu)
    vectors, tokens = [], 0
    try:
        for text in plan.inputs:
            ids = await ctx.workers.run(request, prepare.embed_input, lease.model, text, plan.truncate,
                                        lease.num_ctx)
            vectors.append(await embed_ids(lease, ids))
            tokens += len(ids)
    finally:
        lease.release()
    return JSONResponse(kind.reply(req, vectors, tokens, lease.load_duration_ns, t0))
