"""What the daemon keeps for remote models: the upstream connection pools, health checks (shown in /api/ps and
/api/show), a resolved record as a `RemoteModel`, the requests' /api/events."""
from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from ....backends.remote import RemoteEndpoint, Upstream, UpstreamError, UpstreamPool
from ...context import context
from ..http.errors import APIError
from ..http.wire import rfc3339

log = logging.getLogger(__name__)

HEALTH_TTL_S = 30.0  # a healthy upstream is checked again after this long; a failed call re-checks at once
PS_CHECK_S = 3.0  # /api/ps waits this long for an upstream's model list before showing it as not loaded
PS_FAILED_TTL_S = 10.0  # /api/ps and /api/show reuse a failed check this long


@dataclass
class Health:
    ok: bool
    checked: float  # monotonic
    engine: str = ""  # the model list's owned_by: vllm, sglang, llamacpp, ...
    context_length: int | None = None
    error: UpstreamError | None = None


@dataclass
class RemoteModel:
    """A remote model as one request sees it: our name, its endpoint and its Modelfile defaults."""

    name: str
    endpoint: RemoteEndpoint
    params: dict[str, Any] = field(default_factory=dict)
    system: str | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)
    digest: str = ""
    details: dict[str, Any] = field(default_factory=dict)


def _context_length(entry: dict[str, Any]) -> int | None:
    """vLLM and SGLang report max_model_len; llama-server its per-slot n_ctx (else the trained n_ctx_train)."""
    meta = entry.get("meta") if isinstance(entry.get("meta"), dict) else {}
    for v in (entry.get("max_model_len"), entry.get("context_length"), meta.get("n_ctx"), meta.get("n_ctx_train")):
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


class RemoteHub:
    """Shared by all requests (AppContext.remote): pools per upstream host, health per endpoint, stream ids."""

    def __init__(self) -> None:
        self.pool = UpstreamPool()
        self._health: dict[tuple[str, str], Health] = {}
        self._ids = itertools.count(1)
        self.announced: set[str] = set()

    def next_id(self) -> int:
        return next(self._ids)

    def upstream(self, ep: RemoteEndpoint) -> Upstream:
        return Upstream(self.pool, ep)

    def cached(self, ep: RemoteEndpoint) -> Health | None:
        return self._health.get((ep.base_url, ep.model))

    def forget(self, ep: RemoteEndpoint) -> None:
        """A call failed: the next one checks the upstream again before using it."""
        self._health.pop((ep.base_url, ep.model), None)

    async def check(self, ep: RemoteEndpoint, failed_ttl: float = 0.0) -> Health:
        """The upstream's model list (cached while healthy): is it up, does it serve our model, what window.
        A failure is reused for `failed_ttl` seconds (/api/ps and /api/show: a monitor polling them must not pay
        the retries each time); before a request it is not."""
        h = self.cached(ep)
        if h is not None and time.monotonic() - h.checked < (HEALTH_TTL_S if h.ok else failed_ttl):
            return h
        try:
            models = await self.upstream(ep).list_models()
            entry = next((m for m in models if m.get("id") == ep.model or ep.model in (m.get("aliases") or [])), None)
            if entry is None:
                served = ", ".join(str(m.get("id")) for m in models[:8]) or "none"
                raise UpstreamError(502, f"the upstream engine at {ep.base_url} does not serve model '{ep.model}' "
                                         f"(it serves: {served})")
            h = Health(True, time.monotonic(), str(entry.get("owned_by") or ""), _context_length(entry))
        except UpstreamError as e:
            h = Health(False, time.monotonic(), error=e)
        self._health[(ep.base_url, ep.model)] = h
        return h

    async def ensure(self, request: Request, rm: RemoteModel) -> Health:
        """Health check before use: APIError 502/504 naming the model when its upstream cannot serve it."""
        h = await self.check(rm.endpoint)
        if not h.ok:
            assert h.error is not None
            raise APIError(h.error.status, f"remote model '{rm.name}': {h.error.message}")
        if rm.name not in self.announced:  # the monitor lists it like a loaded model
            self.announced.add(rm.name)
            publish(request, {"type": "model", "event": "loaded", "time": time.time(), "model": rm.name,
                              "backend": "remote", "context_length": h.context_length or 0, "load_ms": 0.0,
                              "size": 0, "slots": None, "engine": h.engine, "endpoint": rm.endpoint.base_url})
        return h

    async def aclose(self) -> None:
        await self.pool.aclose()


async def ensure(request: Request, rm: RemoteModel) -> Health:
    """`rm`'s upstream checked before use (RemoteHub.ensure)."""
    return await hub_of(request).ensure(request, rm)


def hub_of(request: Request) -> RemoteHub:
    ctx = context(request)
    if ctx.remote is None:
        ctx.remote = RemoteHub()
    assert isinstance(ctx.remote, RemoteHub)
    return ctx.remote


def publish(request: Request, ev: dict[str, Any]) -> None:
    """To /api/events and /metrics, like the engines' events."""
    ctx = context(request)
    ctx.events.publish(ev)
    ctx.metrics.observe_event(ev)


def remote_model(record: Any) -> RemoteModel:
    """The remote model a resolved record (manager.ModelRecord, its `remote` set) names; 400 for a broken config."""
    try:
        ep = RemoteEndpoint.from_json(record.remote)
    except ValueError as e:
        raise APIError(400, f"model '{record.name}' has a broken remote config: {e}") from None
    return RemoteModel(record.name, ep, dict(record.params), record.system, list(record.messages), record.digest,
                       dict(record.details))


class RemoteRun:
    """One request to an upstream, published on /api/events in the engines' request-event shape."""

    def __init__(self, request: Request, rm: RemoteModel, endpoint: str, prompt: str | None = None) -> None:
        self.request, self.model = request, rm.name
        self.seq_id = hub_of(request).next_id()
        self.user: dict[str, Any] = {"model": rm.name, "endpoint": endpoint, "remote": rm.endpoint.base_url}
        if prompt is not None and context(request).settings.log_content:
            self.user["prompt"] = prompt
        self.prompt_tokens = self.output_tokens = 0
        self.done = False

    def emit(self, event: str, **extra: Any) -> None:
        publish(self.request, {"type": "request", "event": event, "time": time.time(), "model": self.model,
                               "seq_id": self.seq_id, "user": self.user, "prompt_tokens": self.prompt_tokens,
                               "output_tokens": self.output_tokens, **extra})

    def token(self, text: str) -> None:
        self.output_tokens += 1
        if self.output_tokens == 1:
            self.emit("first_token")
        self.emit("token", text=text)

    def finish(self, reason: str, prompt_tokens: int | None = None, output_tokens: int | None = None) -> None:
        if self.done:
            return
        self.done = True
        self.prompt_tokens = prompt_tokens or self.prompt_tokens
        self.output_tokens = output_tokens or self.output_tokens
        self.emit("finished", done_reason=reason)


async def ps_rows(request: Request) -> list[dict[str, Any]]:
    """/api/ps rows for the remote models whose upstream answers now (a short check, cached while healthy)."""
    ctx, hub = context(request), hub_of(request)
    models = [m for m in await asyncio.to_thread(ctx.store.list_models) if m["details"].get("format") == "remote"]

    async def row(m: dict[str, Any]) -> dict[str, Any] | None:
        try:
            record = await asyncio.to_thread(ctx.manager.resolve, m["name"])
            if record.remote is None:
                return None
            h = await asyncio.wait_for(hub.check(RemoteEndpoint.from_json(record.remote), PS_FAILED_TTL_S),
                                       PS_CHECK_S)
        except (asyncio.TimeoutError, ValueError, APIError):  # slow, broken, or deleted meanwhile
            return None
        if not h.ok:
            return None
        return {"name": m["name"], "model": m["name"], "size": 0, "digest": m["digest"],
                "details": {**m["details"], "parent_model": ""}, "expires_at": rfc3339(float("inf")),
                "size_vram": 0, "context_length": h.context_length or 0}

    return [r for r in await asyncio.gather(*(row(m) for m in models)) if r is not None]


async def show_info(request: Request, name: str, info: dict[str, Any]) -> None:
    """Live facts for /api/show of a remote model: reachable now, the engine, the context length it reports."""
    record = await asyncio.to_thread(context(request).manager.resolve, name)
    if record.remote is None:
        return
    rm = remote_model(record)
    try:
        h = await asyncio.wait_for(hub_of(request).check(rm.endpoint, PS_FAILED_TTL_S), PS_CHECK_S)
    except asyncio.TimeoutError:
        h = None
    mi = info.setdefault("model_info", {})
    mi["remote.reachable"] = bool(h and h.ok)
    if h is not None and h.ok:
        mi["remote.engine"] = h.engine
        if h.context_length:
            mi["remote.context_length"] = h.context_length
    elif h is not None and h.error is not None:
        mi["remote.error"] = h.error.message
