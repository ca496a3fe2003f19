"""A real evenflow daemon (uvicorn) on a free loopback port in a background thread, for the API tests."""
from __future__ import annotations

import hashlib
import importlib.util
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from evenflow.backends.registry import backend_spec
from evenflow.daemon.settings import Settings, load_settings
from evenflow.daemon.context import AppContext
from evenflow.daemon.server import bind_socket, create_app

# Every installed backend serves the API tests (the official clients end to end through each);
# EVENFLOW_TEST_BACKENDS=torch narrows it.
BACKENDS = [b.strip() for b in os.environ.get("EVENFLOW_TEST_BACKENDS", "torch,llamacpp,mlx").split(",")
            if b.strip() and importlib.util.find_spec(backend_spec(b.strip()).package) is not None]


@dataclass
class Daemon:
    url: str
    ctx: AppContext
    server: uvicorn.Server
    thread: threading.Thread

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def start_daemon(tmp: Path, **overrides: Any) -> Daemon:
    """Start on 127.0.0.1:<free port> with a store under `tmp`; `overrides` are Settings fields (strings parsed)."""
    values = {"host": "127.0.0.1:0", "models": str(tmp / "models"), "no_demo": True, "ollama_store": None,
              "keep_alive": "5m", "kv_cache_dir": str(tmp / "kv-cache"), **overrides}
    settings: Settings = load_settings({}, {k: v for k, v in values.items() if k != "ollama_store"})
    settings.ollama_store = values["ollama_store"]
    sock = bind_socket(settings)
    port = sock.getsockname()[1]
    app = create_app(settings)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test daemon did not start")
        time.sleep(0.02)
    return Daemon(f"http://127.0.0.1:{port}", app.state.ctx, server, thread)


def upload_model(url: str, gguf: Path, name: str, headers: dict[str, str] | None = None) -> None:
    """POST the GGUF as a blob and create `name` from it (the blob form of /api/create)."""
    data = gguf.read_bytes()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    with httpx.Client(base_url=url, timeout=120, headers=headers) as c:
        r = c.post(f"/api/blobs/{digest}", content=data)
        assert r.status_code in (200, 201), r.text
        r = c.post("/api/create", json={"model": name, "files": {gguf.name: digest}, "stream": False})
        assert r.status_code == 200, r.text


def add_model(daemon: Daemon, gguf: Path, name: str) -> None:
    """Create `name` from a local GGUF through the in-process daemon's store (a copy, no 100 MB HTTP upload), then
    /api/create as a client would."""
    digest = daemon.ctx.store.store.add_blob_file(gguf)  # ctx.store is the API's adapter around the ModelStore
    r = httpx.post(daemon.url + "/api/create", json={"model": name, "files": {gguf.name: digest}, "stream": False},
                   timeout=300)
    assert r.status_code == 200, r.text


def kv_used(daemon: Daemon, name: str) -> int:
    m = daemon.ctx.manager.models.get(name)
    return m.engine.stats().kv_blocks_used if m is not None else 0


class StepGate:
    """Holds a loaded model's forward passes so a test sets the pace: `allow(n)` lets n steps through, `open()`
    lets all through. A stream is then still running when the test acts on it, however fast the machine is
    (the tiny model decodes 1500 tokens in well under a second). `parked` says the engine is held at the gate with
    no step granted (everything its earlier steps publish is out); `step_if_parked()` grants exactly one step then,
    so a test that looks between steps never lets the engine run ahead. `close()` puts the runner back."""

    def __init__(self, daemon: Daemon, name: str) -> None:
        with httpx.Client(base_url=daemon.url, timeout=120) as c:  # load it (an empty generate only loads)
            assert c.post("/api/generate", json={"model": name}).status_code == 200
        model = daemon.ctx.manager.models[name if ":" in name else name + ":latest"]
        self.runner, self._step = model.engine.runner, model.engine.runner.step
        self._cv = threading.Condition()
        self._permits = 0
        self._waiting = False
        self._open = False
        self.runner.step = self._gated  # the engine calls self.runner.step(batch) each iteration

    def _gated(self, batch: Any) -> Any:
        with self._cv:
            self._waiting = True
            self._cv.notify_all()
            self._cv.wait_for(lambda: self._open or self._permits > 0)
            self._waiting = False
            if not self._open:
                self._permits -= 1
        return self._step(batch)

    @property
    def parked(self) -> bool:
        with self._cv:
            return self._waiting and self._permits == 0 and not self._open

    def step_if_parked(self) -> bool:
        with self._cv:
            if not (self._waiting and self._permits == 0):
                return False
            self._permits = 1
            self._cv.notify_all()
            return True

    def allow(self, n: int = 1) -> None:
        with self._cv:
            self._permits += n
            self._cv.notify_all()

    def open(self) -> None:
        with self._cv:
            self._open = True
            self._cv.notify_all()

    def close(self) -> None:
        self.open()
        self.runner.step = self._step


@dataclass
class ServedDaemon:
    """`evenflow serve` in a child process: what a crash would kill is that process, never the test run."""

    url: str
    proc: Any  # subprocess.Popen
    log_path: Path

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except Exception:  # noqa: BLE001 - a stuck child is killed
                self.proc.kill()
                self.proc.wait()


def serve_daemon(tmp: Path, *args: str, **env: str) -> ServedDaemon:
    """Run `evenflow serve` on a free loopback port with its store under `tmp`; `env` adds EVENFLOW_* settings.
    Its stdout and stderr go to tmp/daemon.log."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    full_env = {**os.environ, "EVENFLOW_HOST": f"127.0.0.1:{port}", "EVENFLOW_NO_DEMO": "1",
                "EVENFLOW_MODELS": str(tmp / "models"), "EVENFLOW_OLLAMA_STORE": str(tmp / "no-ollama"),
                "EVENFLOW_KV_CACHE_DIR": str(tmp / "kv-cache"), **env}
    log_path = tmp / "daemon.log"
    with open(log_path, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "evenflow.clients.cli", "serve", *args], env=full_env,
                                stdout=out, stderr=subprocess.STDOUT)
    d = ServedDaemon(f"http://127.0.0.1:{port}", proc, log_path)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and d.alive():
        try:
            if httpx.get(d.url + "/", timeout=1).status_code == 200:
                return d
        except httpx.TransportError:
            time.sleep(0.1)
    d.stop()
    raise RuntimeError(f"evenflow serve did not start:\n{d.log()[-3000:]}")
