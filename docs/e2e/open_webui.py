#!/usr/bin/env python3
"""End to end: Open WebUI (from PyPI) on an evenflow daemon, offline, driven by a headless Chromium.

Not run in CI: it installs open-webui into a virtual environment (a few GB, ~10 minutes the first time) and
takes minutes. Each check is a row of the table it prints (and exits 1 if one fails):

  hello     a first "hello" to `demo` at Open WebUI's default settings gets an answer (Open WebUI sends its
            built-in tools with the chat; the daemon answers 200)
  stop      Stop pressed during a long reply: the daemon aborts the sequence and frees its KV (/metrics)
  document  a text file uploaded to a chat is embedded through the daemon's /api/embed (Open WebUI's embedding
            engine set to `ollama`, model `demo`: its default sentence-transformers model would be downloaded
            from a hub, which an offline install cannot) and the retrieved text reaches the model's prompt

Between Open WebUI and the daemon sits a small recording proxy, so the table can say what Open WebUI sent
(tools, think, the retrieved context) and what the daemon answered. Screenshots go to --out.

    python3 docs/e2e/open_webui.py --venv /tmp/owui/venv --out /tmp/owui-shots   # evenflow importable

`--default-embedding` leaves Open WebUI's own embedding model configured instead, to see what an offline
install makes of it.

Needs: Debian's `chromium` (apt-get install chromium) or --chromium PATH; Playwright for Python is installed
into the venv without `playwright install` (the system Chromium is used).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import httpx

TORCH = "torch==2.13.0"  # installed first, so open-webui's dependencies take it instead of a CUDA build
SECRET = "The launch code of the blue heron project is 4711-KESTREL."
QUESTION = "What is the launch code of the blue heron project?"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what: str, pred: Callable[[], Any], timeout: float, every: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = pred()
        except (httpx.HTTPError, OSError):
            value = None
        if value:
            return value
        time.sleep(every)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


# ------------------------------------------------------------------------------------------ setup

def ensure_venv(venv: Path) -> Path:
    """A venv with open-webui and playwright; created and installed unless it has them already."""
    py = venv / "bin" / "python"
    if (venv / "bin" / "open-webui").exists() and subprocess.run([py, "-c", "import playwright"]).returncode == 0:
        return py
    log(f"creating {venv} and installing {TORCH}, open-webui and playwright (minutes)")
    subprocess.run(["python3", "-m", "venv", str(venv)], check=True)
    subprocess.run([py, "-m", "pip", "install", TORCH], check=True)
    subprocess.run([py, "-m", "pip", "install", "open-webui", "playwright"], check=True)
    return py


class Proc:
    """A child process with its output in a log file; stopped with SIGTERM, then SIGKILL."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], cwd: Path, logs: Path):
        self.name, self.log_path = name, logs / f"{name}.log"
        self.file = open(self.log_path, "w")
        self.p = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=self.file, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(30)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.file.close()


def start_daemon(work: Path, logs: Path) -> tuple[Proc, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "evenflow.clients.cli", "serve", "--host", f"127.0.0.1:{port}",
           "--models", str(work / "models")]
    env = {**os.environ, "EVENFLOW_API_KEY_FILE": str(work / "no-key")}
    proc = Proc("daemon", cmd, env, work, logs)
    url = f"http://127.0.0.1:{port}"
    wait_for("the daemon and its demo model", lambda: any(
        m["name"] == "demo:latest" for m in httpx.get(url + "/api/tags", timeout=5).json()["models"]), 300)
    # Stop needs a reply that lasts: demo's num_predict 128 is over in a blink on most machines
    r = httpx.post(url + "/api/create", json={"model": "demo-long", "from": "demo", "stream": False,
                                              "parameters": {"num_predict": 100000}}, timeout=120)
    r.raise_for_status()
    return proc, url


class Recorder:
    """A pass-through proxy in front of the daemon that records each request (path, JSON body, status)."""

    def __init__(self, upstream: str):
        self.upstream, self.calls, self.lock = upstream, [], threading.Lock()

    def calls_to(self, path: str, model: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            return [c for c in self.calls if c["path"] == path and (model is None or c["model"] == model)]

    def serve(self) -> str:
        import anyio
        import uvicorn
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import StreamingResponse
        from starlette.routing import Route

        async def forward(request: Request) -> StreamingResponse:
            raw = await request.body()
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = None
            call = {"path": request.url.path, "method": request.method, "body": body, "status": None,
                    "model": body.get("model") if isinstance(body, dict) else None, "t": time.time()}
            with self.lock:
                self.calls.append(call)
            client = httpx.AsyncClient(base_url=self.upstream, timeout=None)
            headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
            upstream = await client.send(client.build_request(request.method, request.url.path,
                                                              params=request.query_params, content=raw,
                                                              headers=headers), stream=True)
            call["status"] = upstream.status_code

            async def relay():
                try:
                    async for chunk in upstream.aiter_raw():
                        yield chunk
                finally:  # Open WebUI went away (Stop) or the reply ended: close the daemon's stream too
                    with anyio.CancelScope(shield=True):
                        await upstream.aclose()
                        await client.aclose()

            keep = {k: v for k, v in upstream.headers.items() if k.lower() in ("content-type",)}
            return StreamingResponse(relay(), status_code=upstream.status_code, headers=keep)

        app = Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST", "DELETE", "HEAD", "PUT"])])
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        threading.Thread(target=server.run, daemon=True).start()
        wait_for("the recording proxy", lambda: server.started, 30, 0.05)
        return f"http://127.0.0.1:{port}"


def start_open_webui(py: Path, work: Path, logs: Path, ollama: str, daemon_embeddings: bool) -> tuple[Proc, str]:
    port = free_port()
    rag = {"RAG_EMBEDDING_ENGINE": "ollama", "RAG_EMBEDDING_MODEL": "demo", "RAG_OLLAMA_BASE_URL": ollama}
    env = {**os.environ, **(rag if daemon_embeddings else {}),
           "DATA_DIR": str(work / "open-webui-data"), "WEBUI_SECRET_KEY": "evenflow-e2e", "WEBUI_AUTH": "False",
           "OLLAMA_BASE_URL": ollama, "ENABLE_OLLAMA_API": "true", "ENABLE_OPENAI_API": "false",
           "OFFLINE_MODE": "true", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "ENABLE_VERSION_UPDATE_CHECK": "false", "ANONYMIZED_TELEMETRY": "false", "DO_NOT_TRACK": "true",
           "SCARF_NO_ANALYTICS": "true"}
    env.pop("PYTHONPATH", None)  # Open WebUI runs on its own venv's packages
    proc = Proc("open-webui", [str(py.parent / "open-webui"), "serve", "--host", "127.0.0.1", "--port", str(port)],
                env, work, logs)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if proc.p.poll() is not None:
            raise RuntimeError(f"Open WebUI exited with {proc.p.returncode}; see {proc.log_path}")
        return httpx.get(url + "/health", timeout=5).status_code == 200

    wait_for("Open WebUI", up, 600, 1)
    return proc, url


# ------------------------------------------------------------------------------------------ the checks

def metric(daemon: str, name: str, **labels: str) -> float:
    """A sample of the daemon's /metrics (0 when absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in httpx.get(daemon + "/metrics", timeout=10).text.splitlines():
        if line.startswith(f"{name}{{{want}}} ") or (not want and line.startswith(name + " ")):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


class Browser:
    def __init__(self, chromium: str, base: str, shots: Path):
        from playwright.sync_api import sync_playwright

        self.pw = sync_playwright().start()
        self.browser = self.pw.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
        self.page = self.browser.new_page(viewport={"width": 1280, "height": 900})
        self.base, self.shots, self.n = base, shots, 0

    def shot(self, name: str) -> str:
        self.n += 1
        path = self.shots / f"{self.n:02d}-{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return str(path)

    def new_chat(self, model: str) -> None:
        self.page.goto(f"{self.base}/?models={model}")
        self.page.wait_for_selector("#chat-input", timeout=120_000)
        time.sleep(1)
        ok = self.page.get_by_role("button", name="Okay, Let's Go!")  # the release notes, on a first visit
        if ok.count():
            ok.click()
        self.page.keyboard.press("Escape")

    def send(self, text: str) -> None:
        self.page.locator("#chat-input").click()
        self.page.keyboard.type(text)
        self.page.keyboard.press("Enter")

    def generating(self) -> bool:
        return self.page.locator("#message-input-container button[aria-label='Stop']").count() > 0

    def last_reply(self) -> str:
        replies = self.page.locator("#response-content-container")
        return replies.last.inner_text() if replies.count() else ""

    def close(self) -> None:
        self.browser.close()
        self.pw.stop()


def asked(rec: Recorder, model: str, text: str, since: int) -> list[dict[str, Any]]:
    """/api/chat calls whose last user message contains `text`: the user's own turn, not Open WebUI's background
    tasks (title, tags, follow-ups), which quote the chat inside a prompt of their own."""
    out = []
    for c in rec.calls_to("/api/chat", model)[since:]:
        users = [m for m in (c["body"] or {}).get("messages", []) if m.get("role") == "user"]
        content = users[-1].get("content") if users else None
        if isinstance(content, str) and text in content and "<chat_history>" not in content:
            out.append(c)
    return out


def check_hello(b: Browser, rec: Recorder, daemon: str) -> tuple[bool, str]:
    before = len(rec.calls_to("/api/chat", "demo:latest"))
    b.new_chat("demo:latest")
    b.send("hello")
    wait_for("the reply to hello to start", lambda: b.generating() or b.last_reply(), 120, 0.2)
    wait_for("the reply to hello to end", lambda: not b.generating(), 600)
    time.sleep(1)
    reply = b.last_reply().strip()
    shot = b.shot("hello")
    chats = asked(rec, "demo:latest", "hello", before)
    first = chats[0] if chats else {}
    body = first.get("body") or {}
    tools = [t.get("function", {}).get("name") for t in body.get("tools") or []]
    detail = (f"/api/chat {first.get('status')} with {len(tools)} tools ({', '.join(tools[:4])}{', ...' if len(tools) > 4 else ''})"
              f", think={body.get('think')!r}; reply {len(reply)} chars: {reply[:60]!r}; {shot}")
    refused = re.search(r"does not support|context length", reply)  # the daemon's 400s, as Open WebUI shows them
    return bool(first.get("status") == 200 and reply and not refused), detail


def check_stop(b: Browser, rec: Recorder, daemon: str) -> tuple[bool, str]:
    model = "demo-long:latest"
    aborted = metric(daemon, "evenflow_sequences_finished_total", model=model, reason="abort")
    b.new_chat(model)
    b.send("Tell me a very long story about a heron.")
    wait_for("KV in use for the long reply", lambda: metric(daemon, "evenflow_kv_blocks_used", model=model) > 0, 300,
             0.2)
    wait_for("streamed text on the page", lambda: len(b.last_reply()) > 40, 300, 0.2)
    used = metric(daemon, "evenflow_kv_blocks_used", model=model)
    shot1 = b.shot("stop-streaming")
    b.page.locator("#message-input-container button[aria-label='Stop']").click()
    t0 = time.monotonic()
    wait_for("the daemon to free the reply's KV", lambda: metric(daemon, "evenflow_kv_blocks_used", model=model) == 0
             and metric(daemon, "evenflow_running_sequences", model=model) == 0, 120, 0.2)
    freed_s = time.monotonic() - t0
    after = metric(daemon, "evenflow_sequences_finished_total", model=model, reason="abort")
    time.sleep(1)
    shot2 = b.shot("stop-stopped")
    ok = after == aborted + 1
    return ok, (f"{used:.0f} KV blocks in use while streaming; after Stop: 0 blocks, 0 running in {freed_s:.1f}s, "
                f"aborted sequences {aborted:.0f} -> {after:.0f}; {shot1}, {shot2}")


def check_document(b: Browser, rec: Recorder, daemon: str, work: Path) -> tuple[bool, str]:
    doc = work / "blue-heron.txt"
    doc.write_text("Project notes\n\nThe blue heron project builds a small weather station for the lake.\n"
                   f"{SECRET}\nThe station reports wind speed every ten minutes.\n", encoding="utf-8")
    embeds_before = len(rec.calls_to("/api/embed"))
    chats_before = len(rec.calls_to("/api/chat", "demo:latest"))
    b.new_chat("demo:latest")
    b.page.locator("#input-menu-button").click()  # "+" then "Upload Files", as a user attaches a file
    with b.page.expect_file_chooser() as chooser:
        b.page.get_by_text("Upload Files", exact=True).click()
    chooser.value.set_files(str(doc))
    wait_for("the document to be embedded", lambda: any(c["status"] == 200 for c in rec.calls_to("/api/embed")
                                                        [embeds_before:]), 300)
    time.sleep(3)  # Open WebUI marks the file processed after storing the vectors
    b.shot("document-attached")
    b.send(QUESTION)
    wait_for("the answer's request", lambda: asked(rec, "demo:latest", QUESTION, chats_before), 300)
    wait_for("the answer to end", lambda: not b.generating(), 600)
    time.sleep(1)
    shot = b.shot("document-answer")
    embeds = rec.calls_to("/api/embed")[embeds_before:]
    chats = asked(rec, "demo:latest", QUESTION, chats_before)
    where = [m.get("role") for m in (chats[0]["body"].get("messages", []) if chats else [])
             if "4711-KESTREL" in str(m.get("content"))]
    in_prompt = bool(where)
    statuses = sorted({c["status"] for c in embeds})
    detail = (f"{len(embeds)} /api/embed calls (model {sorted({c['model'] for c in embeds})}, status {statuses}); "
              f"the document's sentence {'is' if in_prompt else 'is NOT'} in the /api/chat prompt {where} "
              f"(status {chats[0]['status'] if chats else None}); {shot}")
    return bool(embeds) and statuses == [200] and in_prompt and chats[0]["status"] == 200, detail


# ------------------------------------------------------------------------------------------ main

def clip(value: Any, n: int = 400) -> Any:
    """A request body for requests.json: long strings cut, long lists shortened."""
    if isinstance(value, str):
        return value if len(value) <= n else f"{value[:n]}... ({len(value)} chars)"
    if isinstance(value, list):
        return [clip(v, n) for v in value[:20]] + ([f"... ({len(value)} items)"] if len(value) > 20 else [])
    if isinstance(value, dict):
        return {k: clip(v, n) for k, v in value.items()}
    return value


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--venv", type=Path, default=Path(tempfile.gettempdir()) / "owui" / "venv",
                    help="virtual environment for open-webui (created and installed if it lacks it)")
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "owui-shots",
                    help="screenshots and logs")
    ap.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser"),
                    help="the Chromium binary (default: chromium on PATH)")
    ap.add_argument("--default-embedding", action="store_true",
                    help="leave Open WebUI's own embedding model (sentence-transformers, a hub download) in place, to "
                         "see what an offline install does with it; by default it embeds through the daemon")
    args = ap.parse_args()
    if not args.chromium:
        sys.exit("no Chromium found: apt-get install chromium, or pass --chromium PATH")
    args.out.mkdir(parents=True, exist_ok=True)
    py = ensure_venv(args.venv)
    work = Path(tempfile.mkdtemp(prefix="evenflow-owui-"))
    procs: list[Proc] = []
    results: list[tuple[str, bool, str]] = []
    try:
        daemon, daemon_url = start_daemon(work, args.out)
        procs.append(daemon)
        log(f"daemon at {daemon_url} (store {work / 'models'})")
        rec = Recorder(daemon_url)
        proxy = rec.serve()
        owui, owui_url = start_open_webui(py, work, args.out, proxy, not args.default_embedding)
        procs.append(owui)
        log(f"Open WebUI at {owui_url}, talking to the daemon through {proxy}")
        # Playwright is installed in the Open WebUI venv; this interpreter's own packages still come first
        sys.path.append(str(next((args.venv / "lib").glob("python3*/site-packages"))))
        b = Browser(args.chromium, owui_url, args.out)
        try:
            for name, check in (("hello", lambda: check_hello(b, rec, daemon_url)),
                                ("stop", lambda: check_stop(b, rec, daemon_url)),
                                ("document", lambda: check_document(b, rec, daemon_url, work))):
                log(f"check: {name}")
                try:
                    ok, detail = check()
                except Exception as e:  # noqa: BLE001 - a failed check is a row of the table, the rest still run
                    ok, detail = False, f"{type(e).__name__}: {e}; {b.shot(name + '-failed')}"
                results.append((name, ok, detail))
        finally:
            b.close()
        (args.out / "requests.json").write_text(json.dumps([{**c, "body": clip(c["body"])} for c in rec.calls],
                                                           indent=1))
    finally:
        for p in reversed(procs):
            p.stop()
    print("\n| check | result | what happened |\n|---|---|---|")
    for name, ok, detail in results:
        print(f"| {name} | {'PASS' if ok else 'FAIL'} | {detail} |")
    print(f"\nlogs and screenshots: {args.out}")
    return 0 if results and all(ok for _, ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
