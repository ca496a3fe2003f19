"""HTTP errors in Ollama's shape `{"error": "..."}` (OpenAI's under /v1, Anthropic's under /v1/messages), plus strict
body parsing."""
from __future__ import annotations

import json
import logging
import math
import re
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from ...context import context
from ...model_types import Busy, LoadFailed, ManagerError, NotFound, ShuttingDown

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)

INTERNAL_ERROR = "internal error (see the daemon log)"  # never the exception's text: it can hold server paths
SERVER_BUSY = "server busy, please try again.  maximum pending requests exceeded"  # two spaces, as Ollama
CLIENT_GONE = 499  # nginx's "client closed request": nobody reads it, but logs and metrics say what happened


class APIError(Exception):
    """An error answered with `status` and a message (Ollama shape, or OpenAI shape under /v1)."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code  # OpenAI's error `code` (e.g. "context_length_exceeded"), under /v1


def from_manager(exc: ManagerError) -> APIError:
    """The HTTP answer to the model manager's refusal."""
    if isinstance(exc, Busy):
        return APIError(503, SERVER_BUSY)
    if isinstance(exc, ShuttingDown):
        return APIError(503, str(exc))
    if isinstance(exc, NotFound):
        return APIError(404, str(exc))
    if isinstance(exc, LoadFailed):
        return APIError(400 if exc.model_fault else 500, str(exc))
    return APIError(400, str(exc))


def not_found(name: str) -> APIError:
    return APIError(404, f"model '{name}' not found")


def openai_error_type(status: int) -> str:
    if status == 400:
        return "invalid_request_error"
    if status == 404:
        return "not_found_error"
    return "api_error"


ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error",
                   529: "overloaded_error"}


def is_anthropic(path: str) -> bool:
    """The Messages API (/v1/messages, /v1/messages/count_tokens): Anthropic's error shape and headers."""
    return path == "/v1/messages" or path.startswith("/v1/messages/")


def anthropic_error(status: int, message: str) -> dict[str, Any]:
    """Anthropic's `{"type": "error", "error": {type, message}}` (also the body of a stream's `error` event)."""
    kind = ANTHROPIC_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_body(path: str, status: int, message: str, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """Ollama's `{"error": msg}`, OpenAI's `{"error": {message, type, param, code}}` under /v1, Anthropic's under
    /v1/messages."""
    if is_anthropic(path):
        return anthropic_error(status, message)
    if path.startswith("/v1/") or path == "/v1":
        return {"error": {"message": message, "type": openai_error_type(status), "param": param, "code": code}}
    return {"error": message}


def error_response(request: Request, status: int, message: str, param: str | None = None,
                   code: str | None = None) -> JSONResponse:
    path = request.url.path
    if status == 503 and is_anthropic(path):
        status = 529  # Anthropic's "overloaded": what its clients expect (and retry) for a busy server
    return JSONResponse(error_body(path, status, message, param, code), status_code=status)


def install_handlers(app: FastAPI) -> None:
    """Route every failure through one shape; unknown paths stay Ollama's text/plain 404."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return error_response(request, exc.status, exc.message, exc.param, exc.code)

    @app.exception_handler(ManagerError)
    async def _manager_error(request: Request, exc: ManagerError) -> JSONResponse:
        e = from_manager(exc)
        return error_response(request, e.status, e.message)

    @app.exception_handler(ClientDisconnect)
    async def _client_gone(request: Request, exc: ClientDisconnect) -> Response:
        # a body cut short (the client closed before its last chunk or its Content-Length): not a server fault,
        # so no traceback; the access log's line and /metrics say 499
        log.debug("client left before its request body was complete: %s %s", request.method, request.url.path)
        return Response(status_code=CLIENT_GONE)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(request, 400, describe_validation(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        if exc.status_code == 404 and not request.url.path.startswith("/v1"):
            return PlainTextResponse("404 page not found", status_code=404)
        if exc.status_code == 405 and not request.url.path.startswith("/v1"):
            return PlainTextResponse("405 method not allowed", status_code=405)
        return error_response(request, exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(request, 500, INTERNAL_ERROR)


def describe_validation(errors: list[dict[str, Any]]) -> str:
    """Pydantic errors as one line naming each bad field: `field 'options.temperature': ...`."""
    parts = []
    for e in errors[:5]:
        loc = ".".join(str(p) for p in e.get("loc", ()) if p != "body")
        msg = e.get("msg", "invalid value")
        got = e.get("input")
        got_s = f", got {json.dumps(got)[:80]}" if got is not None and not isinstance(got, dict) else ""
        parts.append(f"invalid value for field {loc!r}: {msg}{got_s}" if loc else f"invalid request: {msg}{got_s}")
    return "; ".join(parts) or "invalid request body"


MAX_JSON_DEPTH = 128  # deeper bodies are refused (no real request nests past ~20; Python recursion is finite)
_OFFLOAD_BYTES = 256 * 1024  # bodies above this are decoded in the worker pool
_MAX_INT = 2**64  # Go decodes numbers into int64/uint64/float64: anything wider is an error there too
_SURROGATE = re.compile("[\ud800-\udfff]")


class _BadNumber(ValueError):
    pass


def _parse_float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise _BadNumber(f"number {text[:40]} is out of range")
    return v


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > 20 or abs(v := int(text)) >= _MAX_INT:
        raise _BadNumber(f"number {text[:40]}{'...' if len(text) > 40 else ''} is out of range (at most 64 bits)")
    return v


def _parse_constant(text: str) -> Any:
    raise _BadNumber(f"{text} is not valid JSON")


def _check(obj: Any, depth: int = 0) -> None:
    """Too deep nesting and lone surrogates (`"\\ud800"`, not Unicode text: tokenizers and UTF-8 reject it) are
    400s here, before any handler sees them."""
    if depth > MAX_JSON_DEPTH:
        raise APIError(400, f"invalid JSON in request body: nested deeper than {MAX_JSON_DEPTH} levels")
    if isinstance(obj, str):
        m = _SURROGATE.search(obj)
        if m:
            raise APIError(400, f"invalid JSON in request body: a lone surrogate \\u{ord(m.group()):04x} at "
                                f"character {m.start()} of a string is not valid Unicode text")
    elif isinstance(obj, list):
        for v in obj:
            _check(v, depth + 1)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _check(k, depth + 1)
            _check(v, depth + 1)


def decode_json(raw: bytes) -> Any:
    """Bytes -> JSON value with Go's limits: finite numbers, 64-bit integers, bounded depth, valid UTF-8 text."""
    try:
        data = json.loads(raw, parse_float=_parse_float, parse_int=_parse_int, parse_constant=_parse_constant)
    except _BadNumber as e:
        raise APIError(400, f"invalid JSON in request body: {e}") from None
    except RecursionError:
        raise APIError(400, f"invalid JSON in request body: nested deeper than {MAX_JSON_DEPTH} levels") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise APIError(400, f"invalid JSON in request body: {e}") from None
    except ValueError as e:  # e.g. an integer of thousands of digits
        raise APIError(400, f"invalid JSON in request body: {str(e)[:200]}") from None
    _check(data)
    return data


async def read_json(request: Request) -> Any:
    """The request's JSON body; 400 with Ollama's messages for a missing body or bad JSON. Large bodies are
    decoded in the worker pool, so a 30 MB prompt does not hold the event loop."""
    raw = await request.body()
    if not raw.strip():
        raise APIError(400, "missing request body")
    if len(raw) > _OFFLOAD_BYTES:
        return await context(request).workers.run(request, decode_json, raw)
    return decode_json(raw)


async def parse_body(request: Request, model: type[M], *, allow_empty: bool = False) -> M:
    """Read and validate the body into `model`; any problem is a 400 naming the bad field."""
    if allow_empty and not (await request.body()).strip():
        data: Any = {}
    else:
        data = await read_json(request)
    if not isinstance(data, dict):
        raise APIError(400, f"request body must be a JSON object, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise APIError(400, describe_validation(e.errors())) from None
