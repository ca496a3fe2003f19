"""The upstream client: pooled httpx connections to an OpenAI-compatible engine (vLLM, SGLang, llama-server).

Every failure becomes an UpstreamError with the status the daemon should answer: 502 for an engine that is
unreachable, closes the connection or fails (5xx, with its own message), 504 for one that stays silent past
the timeout. Only the model listing (a GET) is retried; generation and embedding requests never are.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
from typing import Any, AsyncIterator

import httpx

from .endpoint import RemoteEndpoint

log = logging.getLogger(__name__)

LIST_RETRIES = 3
_RETRY_DELAYS = (0.25, 0.75)
_PASS_STATUSES = {400, 404, 413, 429}  # the client's own fault: answered with the same status


class UpstreamError(Exception):
    """What went wrong upstream, as the status and message the daemon answers with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def _scrubbed(message: str, ep: RemoteEndpoint) -> str:
    """An engine that echoes the key in its error text must not make us show or log it."""
    key = os.environ.get(ep.api_key_env) if ep.api_key_env else None
    return message.replace(key, "<api key>") if key else message


def _upstream_message(resp: httpx.Response) -> str:
    """The engine's own error text: OpenAI's {"error": {"message"}}, {"error": "..."}, vLLM's {"message"}."""
    try:
        body = resp.json()
    except ValueError:
        return resp.text.strip()[:500] or resp.reason_phrase
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            err = err.get("message") or err.get("detail") or body.get("message") or body.get("detail")
        if err:
            return str(err)[:500]
    return json.dumps(body)[:500]


def status_error(resp: httpx.Response, ep: RemoteEndpoint, message: str | None = None) -> UpstreamError:
    """An HTTP error from the engine -> the status we answer (its 5xx become 502, its auth failures too)."""
    msg = _scrubbed(message if message is not None else _upstream_message(resp), ep)
    code = resp.status_code
    where = f"the upstream engine at {ep.base_url} answered {code}: {msg}"
    if code in (401, 403):
        key = f"${ep.api_key_env}" if ep.api_key_env else "no key (set PARAMETER api_key_env)"
        return UpstreamError(502, f"{where} (the key sent was {key})")
    if code >= 500 or code < 400:
        return UpstreamError(502, where)
    return UpstreamError(code if code in _PASS_STATUSES else 400, where)


def transport_error(e: httpx.HTTPError, ep: RemoteEndpoint) -> UpstreamError:
    if isinstance(e, httpx.ConnectTimeout):
        return UpstreamError(504, f"could not connect to the upstream engine at {ep.base_url} within "
                                  f"{ep.connect_timeout:g} s (connect_timeout)")
    if isinstance(e, httpx.TimeoutException):
        return UpstreamError(504, f"the upstream engine at {ep.base_url} sent nothing for {ep.timeout:g} s "
                                  f"(timeout)")
    if isinstance(e, httpx.ConnectError):
        return UpstreamError(502, f"cannot reach the upstream engine at {ep.base_url}: {e or 'connection failed'}")
    return UpstreamError(502, f"the upstream engine at {ep.base_url} failed: {type(e).__name__}: {e}")


class UpstreamPool:
    """One httpx.AsyncClient (a connection pool) per upstream host, shared by the models served there."""

    def __init__(self) -> None:
        self._clients: dict[str, httpx.AsyncClient] = {}

    def client(self, ep: RemoteEndpoint) -> httpx.AsyncClient:
        key = httpx.URL(ep.base_url).copy_with(path="/").__str__()
        c = self._clients.get(key)
        if c is None or c.is_closed:
            c = self._clients[key] = httpx.AsyncClient(limits=httpx.Limits(max_connections=256,
                                                                           max_keepalive_connections=32))
        return c

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            await c.aclose()


class Upstream:
    """Calls to one remote model's engine; the key is read from its environment variable at each call."""

    def __init__(self, pool: UpstreamPool, ep: RemoteEndpoint) -> None:
        self.pool, self.ep = pool, ep

    def _headers(self) -> dict[str, str]:
        if not self.ep.api_key_env:
            return {}
        key = os.environ.get(self.ep.api_key_env)
        if not key:
            raise UpstreamError(500, f"the API key variable ${self.ep.api_key_env} named by this remote model is not "
                                     f"set in the daemon's environment")
        return {"Authorization": f"Bearer {key}"}

    def _timeout(self) -> httpx.Timeout:
        return httpx.Timeout(self.ep.timeout, connect=self.ep.connect_timeout, pool=self.ep.connect_timeout)

    def _request(self, method: str, path: str, body: Any = None, extra: dict[str, str] | None = None) -> httpx.Request:
        headers = {**self._headers(), **(extra or {})}
        return self.pool.client(self.ep).build_request(method, self.ep.base_url + path, json=body, headers=headers,
                                                       timeout=self._timeout())

    async def list_models(self) -> list[dict[str, Any]]:
        """GET /models (idempotent: retried on connection trouble and 5xx)."""
        last: UpstreamError | None = None
        for attempt in range(LIST_RETRIES):
            if attempt:
                await asyncio.sleep(_RETRY_DELAYS[min(attempt - 1, len(_RETRY_DELAYS) - 1)])
            try:
                resp = await self.pool.client(self.ep).send(self._request("GET", "/models"))
            except httpx.TimeoutException as e:
                raise transport_error(e, self.ep) from None  # a silent engine: waiting again only doubles it
            except httpx.HTTPError as e:
                last = transport_error(e, self.ep)
                continue
            if resp.status_code >= 500:
                last = status_error(resp, self.ep)
                continue
            if resp.status_code != 200:
                raise status_error(resp, self.ep)
            try:
                data = resp.json().get("data")
            except (ValueError, AttributeError):
                data = None
            if not isinstance(data, list):
                raise UpstreamError(502, f"the upstream engine at {self.ep.base_url} answered GET /models with "
                                         f"something that is not an OpenAI model list")
            return [m for m in data if isinstance(m, dict)]
        assert last is not None
        raise last

    async def post_json(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """One POST, not retried (generation is not idempotent); the JSON answer or UpstreamError."""
        try:
            resp = await self.pool.client(self.ep).send(self._request("POST", path, body))
        except httpx.HTTPError as e:
            raise transport_error(e, self.ep) from None
        if resp.status_code != 200:
            raise status_error(resp, self.ep)
        try:
            out = resp.json()
        except ValueError:
            raise UpstreamError(502, f"the upstream engine at {self.ep.base_url} answered {path} with non-JSON") from None
        if not isinstance(out, dict):
            raise UpstreamError(502, f"the upstream engine at {self.ep.base_url} answered {path} with {type(out).__name__}")
        return out

    async def open_stream(self, path: str, body: dict[str, Any]) -> "UpstreamStream":
        """POST a streaming request and wait for the response head, so a refusal is a status, not a cut stream."""
        # llama-server (xllamacpp) may drop a keep-alive connection reused after a streamed response, and a
        # reused connection that drops cannot be retried for a POST: streams get a connection of their own.
        req = self._request("POST", path, body, {"Accept": "text/event-stream", "Connection": "close"})
        try:
            resp = await self.pool.client(self.ep).send(req, stream=True)
        except httpx.HTTPError as e:
            raise transport_error(e, self.ep) from None
        if resp.status_code != 200:
            try:
                await resp.aread()
                err = status_error(resp, self.ep)
            except httpx.HTTPError as e:
                err = transport_error(e, self.ep)
            finally:
                await resp.aclose()
            raise err
        return UpstreamStream(resp, self.ep)


class UpstreamStream:
    """An open SSE response; `events()` yields its JSON chunks, `aclose()` drops the connection (upstream sees
    the client leave and stops generating)."""

    def __init__(self, resp: httpx.Response, ep: RemoteEndpoint) -> None:
        self.resp, self.ep = resp, ep

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        try:
            async for line in self.resp.aiter_lines():
                if not line.startswith("data:"):
                    continue  # blank separators, comments (": ping"), event: lines
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                try:
                    obj = json.loads(data)
                except ValueError:
                    raise UpstreamError(502, f"the upstream engine at {self.ep.base_url} sent a malformed event: "
                                             f"{data[:200]}") from None
                if isinstance(obj, dict) and obj.get("error") and not obj.get("choices"):
                    err = obj["error"]
                    msg = _scrubbed(str(err.get("message", err) if isinstance(err, dict) else err), self.ep)
                    raise UpstreamError(502, f"the upstream engine at {self.ep.base_url} failed mid-stream: {msg}")
                if isinstance(obj, dict):
                    yield obj
        except httpx.HTTPError as e:
            raise transport_error(e, self.ep) from None

    async def aclose(self) -> None:
        await self.resp.aclose()
