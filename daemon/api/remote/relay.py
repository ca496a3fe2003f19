"""The plain relay of /v1/{chat/completions,completions,embeddings} for a remote model: the upstream speaks OpenAI's
dialect, so the request goes as it came (the model renamed, the model's PARAMETERs and SYSTEM as defaults) and its
answer comes back as it is, SSE chunk by chunk, the model renamed back. Whichever way the response ends, the
upstream response is closed, so a client that leaves stops the upstream generation too."""
from __future__ import annotations

import json
import time
from typing import Any, AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from ....backends.remote import UpstreamError, UpstreamStream
from ..http.wire import SSE, streamed
from .calls import failed, open_stream, post_json
from .convert import Reader, sampling
from .hub import RemoteModel, RemoteRun


async def relay(request: Request, rm: RemoteModel, endpoint: str) -> Response:
    """`endpoint`'s request (/v1/...) for the remote model `rm`, relayed to its upstream."""
    path = endpoint[len("/v1"):]
    body = json.loads(await request.body())  # the handler has validated it
    asked, body["model"] = body.get("model"), rm.endpoint.model
    if path == "/embeddings":
        return JSONResponse({**await post_json(request, rm, path, body), "model": asked})
    for key, value in sampling(None, rm.params).items():
        body.setdefault(key, value)
    if path == "/chat/completions" and rm.system and not any(
            isinstance(m, dict) and m.get("role") in ("system", "developer") for m in body.get("messages") or []):
        body["messages"] = [{"role": "system", "content": rm.system}, *body.get("messages", [])]
    run = RemoteRun(request, rm, endpoint, json.dumps(body.get("messages") or body.get("prompt"), ensure_ascii=False))
    if body.get("stream") is not True:
        return JSONResponse({**await post_json(request, rm, path, body, run), "model": asked})
    reader = Reader(time.perf_counter_ns())
    up = await open_stream(request, rm, run, path, body, reader)

    async def objs() -> AsyncIterator[dict[str, Any]]:
        try:
            async for obj in up.events():
                text, think = reader.feed(obj)
                if text or think:
                    run.token(text or think)
                yield {**obj, "model": asked}
            run.finish(reader.done_reason, reader.prompt_tokens, reader.output_tokens)
        except UpstreamError as e:
            run.finish("error")
            raise failed(request, rm, e, always=True) from None

    return streamed(SSE, objs(), closer(up, run))


def closer(up: UpstreamStream, run: RemoteRun) -> Any:
    """Closes the upstream response however ours ends (done, error, client gone), and records the end."""

    async def close() -> None:
        await up.aclose()
        run.finish("abort")  # a no-op when the stream finished

    return close
