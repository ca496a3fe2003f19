"""Pure-ASGI middleware (streaming-safe): CORS with Ollama's origin rules, the loopback Host-header guard against
DNS rebinding, the API key, 503 while shutting down, and per-endpoint request counting for /metrics."""
from __future__ import annotations

import hmac
import ipaddress
import json
import re
import socket
from typing import Any, Awaitable, Callable

from .errors import anthropic_error, is_anthropic

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

ALLOW_METHODS = "GET, POST, PUT, PATCH, DELETE, HEAD, OPTIONS"
ALLOW_HEADERS = ("Authorization, Content-Type, User-Agent, Accept, X-Requested-With, OpenAI-Beta, "
                 "x-stainless-arch, x-stainless-async, x-stainless-custom-poll-interval, x-stainless-helper-method, "
                 "x-stainless-lang, x-stainless-os, x-stainless-package-version, x-stainless-poll-helper, "
                 "x-stainless-retry-count, x-stainless-runtime, x-stainless-runtime-version, x-stainless-timeout, "
                 "x-api-key, anthropic-version, anthropic-beta, anthropic-dangerous-direct-browser-access")
_EXTENSION_SCHEMES = ("chrome-extension://", "safari-extension://", "moz-extension://", "ms-browser-extension://")
KNOWN_ENDPOINTS = {
    "/", "/api/version", "/api/generate", "/api/chat", "/api/embed", "/api/embeddings", "/api/tags", "/api/show",
    "/api/create", "/api/copy", "/api/delete", "/api/pull", "/api/push", "/api/ps", "/api/events", "/metrics",
    "/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/embeddings", "/v1/messages",
    "/v1/messages/count_tokens", "/v1/responses",
}


def default_origins(extra: list[str]) -> list[str]:
    """OLLAMA_ORIGINS first, then Ollama's built-in local origins (envconfig.AllowedOrigins)."""
    out = list(extra)
    for host in ("localhost", "127.0.0.1", "0.0.0.0"):
        out += [f"http://{host}", f"https://{host}", f"http://{host}:*", f"https://{host}:*"]
    return out + ["app://*", "file://*", "tauri://*", "vscode-webview://*", "vscode-file://*"]


class OriginPolicy:
    def __init__(self, origins: list[str]) -> None:
        self.allow_all = "*" in origins
        pats = [re.escape(o).replace(r"\*", ".*") for o in origins if o != "*"]
        self._re = re.compile("^(?:" + "|".join(pats) + ")$", re.IGNORECASE) if pats else None

    def allowed(self, origin: str) -> bool:
        if self.allow_all or origin.startswith(_EXTENSION_SCHEMES):
            return True
        return bool(self._re and self._re.match(origin))


def endpoint_label(path: str) -> str:
    """A bounded label for metrics: known routes, parametrised ones folded, anything else 'other'."""
    if path in KNOWN_ENDPOINTS:
        return path
    if path.startswith("/api/blobs/"):
        return "/api/blobs/{digest}"
    if path.startswith("/v1/models/"):
        return "/v1/models/{model}"
    return "other"


def _local_host_ok(host: str) -> bool:
    """Ollama's allowedHostsMiddleware rules for a request Host when bound to loopback."""
    h = host.strip().lower()
    if h.startswith("["):  # [::1]:11434
        h = h[1:h.find("]")] if "]" in h else h
    elif h.count(":") == 1:
        h = h.split(":", 1)[0]
    if not h:
        return True
    try:
        ip = ipaddress.ip_address(h)
        return ip.is_loopback or ip.is_private or ip.is_unspecified or ip.is_link_local
    except ValueError:
        pass
    if h in ("localhost", socket.gethostname().lower()):
        return True
    return h.endswith((".localhost", ".local", ".internal"))


def _auth_failure(path: str, authorization: str | None, count: int = 1) -> bytes:
    """The 401 body: Ollama's `{"error"}`, OpenAI's shape (code invalid_api_key) under /v1, Anthropic's under
    /v1/messages (where `x-api-key` carries the key too)."""
    how = "`x-api-key: <key>` or `Authorization: Bearer <key>`" if is_anthropic(path) else "`Authorization: Bearer <key>`"
    msg = (f"unauthorized: this server requires an API key (send {how})" if not authorization
           else "unauthorized: more than one Authorization header (send exactly one)" if count > 1
           else "unauthorized: invalid API key")
    if is_anthropic(path):
        return json.dumps(anthropic_error(401, msg)).encode()
    if path == "/v1" or path.startswith("/v1/"):
        return json.dumps({"error": {"message": msg, "type": "invalid_request_error", "param": None,
                                     "code": "invalid_api_key"}}).encode()
    return json.dumps({"error": msg}).encode()


# RFC 6750: credentials = "Bearer" 1*SP b64token, the scheme case-insensitive (RFC 9110). Spaces around the whole
# value are not part of it (HTTP's OWS), so "Bearer  key" and "Bearer key " are the same credentials as
# "Bearer key"; a tab, a second word or an empty token is not.
_BEARER = re.compile(r"bearer +(\S+)", re.IGNORECASE)


def key_matches(authorization: str | None, key: bytes) -> bool:
    """`Bearer <key>` by RFC 6750's grammar, compared in constant time."""
    m = _BEARER.fullmatch((authorization or "").strip(" \t"))
    if m is None:
        return False
    return hmac.compare_digest(m.group(1).encode("utf-8", "surrogateescape"), key)


def authorization_header(raw_headers: list[tuple[bytes, bytes]],
                         name: bytes = b"authorization") -> tuple[str | None, int]:
    """(the Authorization value, how many Authorization fields the request has); `name` another header."""
    values = [v.decode("latin-1") for k, v in raw_headers if k.lower() == name]
    return (values[0] if values else None), len(values)


def _anthropic_key(raw_headers: list[tuple[bytes, bytes]], key: bytes) -> tuple[str | None, int, bool]:
    """Anthropic's clients send the key as `x-api-key`, or as `Authorization: Bearer` (an auth token): each one
    sent must be there once and hold the key. (the value given, the most fields of one name, whether it matches)"""
    authorization, count = authorization_header(raw_headers)
    api_key, api_count = authorization_header(raw_headers, b"x-api-key")
    ok = (count + api_count > 0 and count <= 1 and api_count <= 1
          and (count == 0 or key_matches(authorization, key))
          and (api_count == 0 or hmac.compare_digest((api_key or "").strip(" \t").encode("utf-8", "surrogateescape"),
                                                     key)))
    return authorization or api_key, max(count, api_count), ok


class GuardMiddleware:
    """CORS (gin-contrib/cors semantics), Host guard, API key, shutdown 503 and request counting, in that order.

    `on_complete(label, status)` runs once a response's last body chunk is sent (a create has then finished)."""

    def __init__(self, app: ASGIApp, *, origins: list[str], loopback: bool, is_closing: Callable[[], bool],
                 on_response: Callable[[str, int], None] | None = None, api_key: str | None = None,
                 on_complete: Callable[[str, int], None] | None = None) -> None:
        self.app = app
        self.policy = OriginPolicy(default_origins(origins))
        self.loopback = loopback
        self.is_closing = is_closing
        self.on_response = on_response
        self.key = api_key.encode() if api_key else None
        self.on_complete = on_complete

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")
        label = endpoint_label(path)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        method = scope.get("method", "GET")
        origin = headers.get("origin")
        host = headers.get("host", "")

        async def reply(status: int, body: bytes = b"", extra: list[tuple[bytes, bytes]] | None = None,
                        ctype: bytes = b"application/json; charset=utf-8") -> None:
            hdrs = list(extra or [])
            if body:
                hdrs += [(b"content-type", ctype), (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": status, "headers": hdrs})
            await send({"type": "http.response.body", "body": body})
            if self.on_response:
                self.on_response(label, status)

        cors_headers: list[tuple[bytes, bytes]] = []
        same_origin = origin is not None and origin.split("://", 1)[-1].lower() == host.lower()
        if origin is not None and not same_origin:
            if not self.policy.allowed(origin):
                await reply(403, json.dumps({"error": f"origin {origin!r} is not allowed (set OLLAMA_ORIGINS)"}).encode())
                return
            cors_headers = [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin")]
            if method == "OPTIONS" and "access-control-request-method" in headers:
                await reply(204, extra=cors_headers + [
                    (b"access-control-allow-methods", ALLOW_METHODS.encode()),
                    (b"access-control-allow-headers", ALLOW_HEADERS.encode()),
                    (b"access-control-max-age", b"43200"),
                ])
                return
        if self.loopback and not _local_host_ok(host):
            await reply(403, json.dumps({"error": f"host {host!r} is not allowed: the server is bound to "
                                                  "loopback (DNS-rebinding protection)"}).encode())
            return
        if method == "OPTIONS" and "access-control-request-method" not in headers:
            await reply(204, extra=cors_headers)  # Ollama answers a bare OPTIONS to an allowed host with 204
            return
        # GET / stays open: it is how clients (and `evenflow service status`) see that a server is there.
        # Two Authorization fields are refused, whatever they hold: which one counts would be a guess (RFC 9110:
        # a field that is not a list must appear once), and a proxy and the server could guess differently.
        if self.key is not None and not (path == "/" and method in ("GET", "HEAD")):
            if is_anthropic(path):
                authorization, count, ok = _anthropic_key(scope.get("headers", []), self.key)
            else:
                authorization, count = authorization_header(scope.get("headers", []))
                ok = count == 1 and key_matches(authorization, self.key)
            if not ok:
                await reply(401, _auth_failure(path, authorization, count),
                            cors_headers + [(b"www-authenticate", b'Bearer realm="evenflow"')])
                return
        if self.is_closing() and path not in ("/", "/api/version"):
            await reply(503, json.dumps({"error": "server is shutting down"}).encode(), cors_headers)
            return

        status = 0

        async def send_wrapped(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                if cors_headers:
                    message = dict(message)
                    message["headers"] = list(message.get("headers", [])) + cors_headers
                if self.on_response:
                    self.on_response(label, status)
            await send(message)
            if self.on_complete and message["type"] == "http.response.body" and not message.get("more_body"):
                self.on_complete(label, status)

        await self.app(scope, receive, send_wrapped)
