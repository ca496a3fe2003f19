"""HTTP errors in Ollama's shape `{"error": "..."}` (and OpenAI's under /v1), plus strict body parsing."""
from __future__ import annotations

import json
import logging
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)

SERVER_BUSY = "server busy, please try again.  maximum pending requests exceeded"  # two spaces, as Ollama


class APIError(Exception):
    """An error answered with `status` and a message (Ollama shape, or OpenAI shape under /v1)."""

    def __init__(self, status: int, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


def not_found(name: str) -> APIError:
    return APIError(404, f"model '{name}' not found")


def openai_error_type(status: int) -> str:
    if status == 400:
        return "invalid_request_error"
    if status == 404:
        return "not_found_error"
    return "api_error"


def error_body(path: str, status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """Ollama's `{"error": msg}`, or OpenAI's `{"error": {message, type, param, code}}` under /v1."""
    if path.startswith("/v1/") or path == "/v1":
        return {"error": {"message": message, "type": openai_error_type(status), "param": param, "code": None}}
    return {"error": message}


def error_response(request: Request, status: int, message: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(request.url.path, status, message, param), status_code=status)


def install_handlers(app: FastAPI) -> None:
    """Route every failure through one shape; unknown paths stay Ollama's text/plain 404."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return error_response(request, exc.status, exc.message, exc.param)

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
        return error_response(request, 500, f"internal error: {type(exc).__name__}: {exc}")


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


async def read_json(request: Request) -> Any:
    """The request's JSON body; 400 with Ollama's messages for a missing body or bad JSON."""
    raw = await request.body()
    if not raw.strip():
        raise APIError(400, "missing request body")
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise APIError(400, f"invalid JSON in request body: {e}") from None


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
