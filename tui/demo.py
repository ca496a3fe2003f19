"""`evenflow demo`: a daemon (the running one, or one started here), a scripted workload, and the monitor on it."""
from __future__ import annotations

import asyncio
import ipaddress
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import httpx

from ..link.connect import auth_headers
from .feed import DaemonError

if TYPE_CHECKING:
    from .app import EvenflowApp

START_TIMEOUT_S = 300.0  # a first start writes the synthetic demo model
CHATS = 3
CHAT_PROMPTS = ["Tell me about the sea.", "Write a haiku about autumn.", "Explain recursion to a child.",
                "List three uses for a paperclip.", "What makes bread rise?", "Describe a busy train station."]
DOC_EVERY_S = 30.0  # a new long document arrives this often
_PARAGRAPH = ("The committee met on the {n}th day to review the quarterly report on river levels, rainfall, "
              "the state of the northern bridges and the budget for the coming season. ")


class DemoError(Exception):
    """The demo cannot run (nothing answers and no daemon can be started here); the message says why."""


def document(paragraphs: int = 56) -> str:
    """A long synthetic document (deterministic): ~3.6k tokens for the demo model (its window: 16384)."""
    return "".join(_PARAGRAPH.format(n=i + 1) for i in range(paragraphs))


def _answers(url: str) -> bool:
    try:
        # 401: a daemon that wants a key we lack; it is there all the same (the monitor then says what to do)
        return httpx.get(url + "/api/version", timeout=2.0, headers=auth_headers()).status_code in (200, 401)
    except httpx.HTTPError:
        return False


def _is_local(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def start_daemon(url: str, log_content: bool = True) -> tuple[subprocess.Popen, Path]:
    """`evenflow serve` at `url` with content logging on (the demo shows the text); waits until it answers."""
    if not _is_local(url):
        raise DemoError(f"nothing answers at {url}, and the demo only starts a daemon on a loopback address")
    parts = urlsplit(url)
    log_path = Path(tempfile.mkstemp(prefix="evenflow-demo-", suffix=".log")[1])
    env = {**os.environ, "EVENFLOW_LOG_CONTENT": "1" if log_content else "0"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "evenflow.clients.cli", "serve", "--host",
                                 f"{parts.hostname}:{parts.port}"], stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not _answers(url):
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise DemoError(f"the daemon exited with status {proc.returncode}:\n{tail}")
        if time.monotonic() > deadline:
            stop_daemon(proc)
            raise DemoError(f"the daemon did not answer at {url} within {START_TIMEOUT_S:.0f} s (log: {log_path})")
        time.sleep(0.2)
    return proc, log_path


def stop_daemon(proc: subprocess.Popen) -> None:
    """SIGINT (the daemon's graceful stop), then SIGKILL if it hangs."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


async def pick_model(app: "EvenflowApp") -> str:
    names = await app.feed.tags()
    if not names:
        raise DaemonError("the daemon has no models: start it on an empty store to get the synthetic `demo` model")
    return "demo:latest" if "demo:latest" in names else names[0]


async def workload(app: "EvenflowApp", rounds: int | None = None, paragraphs: int = 56,
                   num_predict: int = 128) -> None:
    """A few chats streaming in a loop, and a long document arriving every DOC_EVERY_S while they run."""
    try:
        model = await pick_model(app)
    except (DaemonError, httpx.HTTPError) as e:
        app.notify(f"demo workload: {e}", severity="error")
        return

    async def chat(i: int) -> None:
        n = 0
        while rounds is None or n < rounds:
            prompt = CHAT_PROMPTS[(i + n) % len(CHAT_PROMPTS)]
            try:
                async for _ in app.feed.stream("/api/chat", {"model": model, "options": {"num_predict": num_predict},
                                                             "messages": [{"role": "user", "content": prompt}]}):
                    pass
            except (DaemonError, httpx.HTTPError):
                await asyncio.sleep(1.0)  # the monitor says what happened to the daemon; try again
            n += 1
            await asyncio.sleep(0.5 + i * 0.3)

    async def documents() -> None:
        n = 0
        await asyncio.sleep(3.0)
        while rounds is None or n < rounds:
            app.ingest(document(paragraphs), model)
            n += 1
            await asyncio.sleep(DOC_EVERY_S)

    app.notify(f"demo: {CHATS} chats streaming on {model}, a long document every {DOC_EVERY_S:.0f} s")
    await asyncio.gather(documents(), *(chat(i) for i in range(CHATS)))


def run_demo(url: str) -> None:
    """Use the daemon at `url`, or start one there; then the monitor with the workload until the user quits."""
    from .app import EvenflowApp  # noqa: PLC0415 - textual loads only when the TUI runs

    proc = None
    if not _answers(url):
        print(f"starting evenflow on {url} (first start creates the synthetic demo model)...", file=sys.stderr)
        proc, log_path = start_daemon(url)
        print(f"daemon log: {log_path}", file=sys.stderr)
    try:
        EvenflowApp(url, workload=workload).run()
    finally:
        if proc is not None:
            stop_daemon(proc)
