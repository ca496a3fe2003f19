"""Remote models: an OpenAI-compatible engine elsewhere (vLLM, SGLang, llama-server) serves them, never our
engine. serve.py answers each endpoint through the upstream (messages.py Anthropic's /v1/messages), hub.py keeps
the connection pools, health and the lookup of a name, convert.py maps Ollama's requests to the upstream's and its
replies back. The upstream client itself is backends/remote."""
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from . import serve as _serve
from .hub import RemoteModel, lookup, ps_rows, show_info
from .messages import messages


async def serve(request: Request, rm: RemoteModel, endpoint: str, req: Any, t0: int) -> Response:
    """`endpoint`'s request for the remote model `rm`, answered by its upstream engine."""
    if endpoint == "/v1/messages":  # its own translation: Anthropic's wire is not relayed as /v1's is
        return await messages(request, rm, req, t0)
    return await _serve.serve(request, rm, endpoint, req, t0)


__all__ = ["lookup", "ps_rows", "serve", "show_info"]
