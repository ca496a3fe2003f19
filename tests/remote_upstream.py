"""Upstream engines for the remote-model tests, on loopback: llama-server (xllamacpp, in a subprocess) and a
scripted OpenAI-compatible server whose behaviour a test sets (tokens, 500, hang, endless stream, tools)."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from evenflow.daemon.server import bind_socket

SCRIPTED_MODEL = "org/scripted-model"

_LLAMA_SERVER = r"""
import signal, sys, xllamacpp
sys.path.insert(0, sys.argv[2])
from llama_server import make_params
p = make_params(sys.argv[1], slots=2, ctx_per_slot=512, port=0, threads=1, n_batch=512, n_ubatch=512)
p.model_alias = {"tiny-remote"}
p.cache_prompt = False  # every request computes its prompt alike: greedy outputs compare exactly
server = xllamacpp.Server(p)
print("URL", server.listening_address, flush=True)
signal.sigwait([signal.SIGTERM, signal.SIGINT])
"""


@dataclass
class LlamaServer:
    url: str  # http://127.0.0.1:PORT
    proc: subprocess.Popen

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def start_llama_server(gguf: Path) -> LlamaServer:
    """llama-server on 127.0.0.1:<free port> serving `gguf` as model `tiny-remote` (a subprocess)."""
    bench = Path(__file__).resolve().parents[1] / "docs" / "bench"
    proc = subprocess.Popen([sys.executable, "-c", _LLAMA_SERVER, str(gguf), str(bench)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout is not None
    for line in proc.stdout:  # the child prints its URL once listening, or exits
        if line.startswith("URL "):
            return LlamaServer(line.split()[1].rstrip("/"), proc)
    proc.wait(10)
    raise RuntimeError(f"llama-server did not start (exit status {proc.returncode})")


@dataclass
class Script:
    """What the scripted upstream does next, and what it saw."""

    mode: str = "ok"  # ok | think | reject_key | error500 | hang | endless | tools
    tokens: list[str] = field(default_factory=lambda: ["Hello", ",", " remote", " world", "!"])
    requests: list[dict[str, Any]] = field(default_factory=list)  # path, headers, body
    started: threading.Event = field(default_factory=threading.Event)  # an endless stream sent its first chunk
    cancelled: threading.Event = field(default_factory=threading.Event)  # ... and then saw its client leave

    def reset(self, mode: str = "ok") -> None:
        self.mode, self.requests = mode, []
        self.started, self.cancelled = threading.Event(), threading.Event()


def _chunk(path: str, text: str = "", finish: str | None = None, **delta: Any) -> dict[str, Any]:
    if path == "/v1/completions":
        choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": finish}
    else:
        choice = {"index": 0, "delta": {"content": text, **delta} if text or delta else {}, "finish_reason": finish}
    return {"id": "x-1", "object": "chunk", "created": 0, "model": SCRIPTED_MODEL, "choices": [choice]}


def scripted_app(script: Script) -> FastAPI:
    app = FastAPI()

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": SCRIPTED_MODEL, "object": "model",
                                                         "owned_by": "scripted", "max_model_len": 4096}]})

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> JSONResponse:
        body = await request.json()
        script.requests.append({"path": "/v1/embeddings", "headers": dict(request.headers), "body": body})
        vecs = [[3.0, 4.0, 0.0, float(i)] for i, _ in enumerate(body["input"])]
        return JSONResponse({"object": "list", "model": SCRIPTED_MODEL, "usage": {"prompt_tokens": 7, "total_tokens": 7},
                             "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vecs)]})

    async def generate(request: Request) -> Any:
        path = request.url.path
        body = await request.json()
        script.requests.append({"path": path, "headers": dict(request.headers), "body": body})
        if script.mode == "reject_key":  # an engine careless enough to echo the key it refused
            auth = request.headers.get("authorization", "")
            return JSONResponse({"error": {"message": f"invalid api key: {auth}"}}, 401)
        if script.mode == "error500":
            return JSONResponse({"error": {"message": "CUDA error: out of memory", "type": "server_error"}}, 500)
        if script.mode == "hang":  # until the daemon gives up on us and closes the connection
            while not await request.is_disconnected():
                await asyncio.sleep(0.05)
            return JSONResponse({"error": "client left"}, 499)
        if not body.get("stream"):
            text = "".join(script.tokens)
            choice = ({"index": 0, "text": text, "finish_reason": "stop"} if path == "/v1/completions" else
                      {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"})
            return JSONResponse({"id": "x-1", "object": "completion", "created": 0, "model": SCRIPTED_MODEL,
                                 "choices": [choice], "usage": {"prompt_tokens": 3, "completion_tokens": 5}})

        async def events() -> Any:
            try:
                if script.mode == "endless":
                    while True:
                        yield f"data: {json.dumps(_chunk(path, 'tick '))}\n\n"
                        script.started.set()
                        await asyncio.sleep(0.02)
                if script.mode == "tools":
                    frags = ['{"city": ', '"Paris"}']
                    yield f"data: {json.dumps(_chunk(path, tool_calls=[{'index': 0, 'id': 'c1', 'type': 'function', 'function': {'name': 'weather', 'arguments': ''}}]))}\n\n"
                    for f in frags:
                        yield f"data: {json.dumps(_chunk(path, tool_calls=[{'index': 0, 'function': {'arguments': f}}]))}\n\n"
                    yield f"data: {json.dumps(_chunk(path, finish='tool_calls'))}\n\n"
                else:
                    if script.mode == "think":  # vLLM/SGLang with a reasoning parser: reasoning_content first
                        for tok in ("let", " me", " think"):
                            yield f"data: {json.dumps(_chunk(path, reasoning_content=tok))}\n\n"
                    for tok in script.tokens:
                        yield f"data: {json.dumps(_chunk(path, tok))}\n\n"
                    yield f"data: {json.dumps(_chunk(path, finish='stop'))}\n\n"
                if (body.get("stream_options") or {}).get("include_usage"):
                    usage = {"prompt_tokens": 3, "completion_tokens": len(script.tokens), "total_tokens": 8}
                    yield f"data: {json.dumps({'id': 'x-1', 'choices': [], 'usage': usage})}\n\n"
                yield "data: [DONE]\n\n"
            finally:
                if script.started.is_set():
                    script.cancelled.set()

        return StreamingResponse(events(), media_type="text/event-stream")

    app.post("/v1/chat/completions")(generate)
    app.post("/v1/completions")(generate)
    return app


@dataclass
class Scripted:
    url: str
    script: Script
    server: uvicorn.Server
    thread: threading.Thread

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def start_scripted() -> Scripted:
    from evenflow.daemon.settings import load_settings

    settings = load_settings({}, {"host": "127.0.0.1:0"})
    sock = bind_socket(settings)
    script = Script()
    server = uvicorn.Server(uvicorn.Config(scripted_app(script), log_level="warning", timeout_graceful_shutdown=5))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the scripted upstream did not start")
        time.sleep(0.02)
    return Scripted(f"http://127.0.0.1:{sock.getsockname()[1]}", script, server, thread)
