"""The one skeleton of a model request, written once for every endpoint: a remote model's request goes to its
upstream (decided here only); a local one is planned (checks that need no model), holds its model, is prepared in
the worker pool, runs in the engine and is answered in the endpoint's wire format. An endpoint is a `Generate` or
an `Embed`: what differs between endpoints, and nothing else."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Protocol

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from ...context import context
from ...manager import LoadedModel
from .. import remote
from ..http.wire import Wire, streamed
from . import overflow, prepare
from .embedding import embed_ids
from .engine_stream import Generation, Piece, collect_all, engine_stream
from .options import requested_draft, requested_gpu
from .plan import EmbedPlan, Plan
from .prepare import Prepared


class Reply(Protocol):
    """An endpoint's wire format for one request's output."""

    def whole(self, gens: list[Generation]) -> dict[str, Any]:
        """The body of a `stream: false` answer (one Generation per choice)."""

    def stream(self, pieces: AsyncIterator[Piece]) -> AsyncIterator[dict[str, Any]]:
        """The streamed objects, from the engine's pieces."""


@dataclass(frozen=True)
class Generate:
    """A generation endpoint: its path (events, the remote route), its plan and prepare steps, its reply."""

    endpoint: str
    plan: Callable[[Any], Plan]
    prepare: Callable[..., Prepared]  # (model, request, window, *plan.args), run in the worker pool
    reply: Callable[[Any, LoadedModel, Prepared], Reply]
    wire: Wire
    loaded: Callable[[str, str], dict[str, Any]] | None = None  # (name, "load"/"unload"): an empty request's answer


@dataclass(frozen=True)
class Embed:
    """An embedding endpoint: its path, its plan, and its body from (request, vectors, tokens, load_ns, t0)."""

    endpoint: str
    plan: Callable[[Any], EmbedPlan]
    reply: Callable[[Any, list[Any], int, int, int], dict[str, Any]]


async def _upstream(request: Request, endpoint: str, req: Any, t0: int) -> Response | None:
    """A remote model's request answered by its upstream engine; None for a local model (or a name the local
    path answers 404/400 for). The one place that tells remote from local."""
    rm = await remote.lookup(request, req.model)
    return None if rm is None else await remote.serve(request, rm, endpoint, req, t0)


async def generate(request: Request, kind: Generate, req: Any, t0: int) -> Response:
    """A generation request: plan, hold the model, prepare, run in the engine, answer in `kind`'s format."""
    if (answer := await _upstream(request, kind.endpoint, req, t0)) is not None:
        return answer
    plan = kind.plan(req)
    gpu = requested_gpu(getattr(req, "options", None))  # Ollama's load-time num_gpu / main_gpu (a 400 before loading)
    draft = requested_draft(req)  # a draft model loaded beside the model for this request (a 400 before loading)
    ctx = context(request)
    if plan.load_only:
        return JSONResponse(await _load_only(ctx, kind, req.model, plan.keep_alive, gpu))
    lease = await ctx.manager.acquire(req.model, keep_alive=plan.keep_alive, num_ctx=plan.num_ctx, gpu=gpu,
                                      draft=draft)
    try:
        prep = await ctx.workers.run(request, kind.prepare, lease.model, req, lease.num_ctx, *plan.args)
        prep.params.draft_model = lease.draft_model  # the engine knows the draft model by its store name
        prep.progress = prep.progress and plan.stream  # progress is for streams only
        chunks = await engine_stream(request, lease, prep, kind.endpoint, t0)
    except BaseException:
        lease.release()
        raise
    reply = kind.reply(req, lease.model, prep)
    headers = {overflow.HEADER: prep.truncation.header()} if prep.truncation is not None else None
    if not plan.stream:
        return JSONResponse(reply.whole(await collect_all(chunks)), headers=headers)
    return streamed(kind.wire, reply.stream(chunks.pieces()), chunks.close, headers)


async def _load_only(ctx: Any, kind: Generate, name: str, keep_alive: float | None,
                     gpu: Any = None) -> dict[str, Any]:
    """Empty prompt/messages: load the model (done_reason "load"), or unload it with keep_alive 0."""
    assert kind.loaded is not None  # only Ollama's plans ask for it, and its endpoints say how to answer
    record = ctx.manager.resolve(name)
    if keep_alive == 0:
        await ctx.manager.unload(record.name)
        return kind.loaded(name, "unload")
    lease = await ctx.manager.acquire(name, keep_alive=keep_alive, gpu=gpu)
    lease.release()
    return kind.loaded(name, "load")


async def embed(request: Request, kind: Embed, req: Any, t0: int) -> Response:
    """An embedding request: plan, hold the model, prepare and embed each input, answer in `kind`'s body."""
    if (answer := await _upstream(request, kind.endpoint, req, t0)) is not None:
        return answer
    plan = kind.plan(req)
    ctx = context(request)
    gpu = requested_gpu(getattr(req, "options", None))
    lease = await ctx.manager.acquire(req.model, keep_alive=plan.keep_alive, num_ctx=plan.num_ctx, gpu=gpu)
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
