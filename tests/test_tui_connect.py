"""The monitor against real daemons: a pull from a scripted registry shows in Resources (and in a new reader's
hello), a daemon with an API key works with it (and without the key it says what to do), and
`evenflow monitor --discover` finds an advertised daemon over zeroconf on loopback (tmux)."""
from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest

from api_harness import BACKENDS, start_daemon, upload_model
from evenflow.link.discover import LanBrowser
from evenflow.tui.app import EvenflowApp
from evenflow.tui.widgets import Resources, fmt_size
from registry_server import Registry

BACKEND = "llamacpp" if "llamacpp" in BACKENDS else BACKENDS[0]
KEY = "ef-monitor-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
WAIT_S = 120.0
TMUX = shutil.which("tmux")


@pytest.fixture(scope="module")
def gguf(synthetic_model) -> Path:
    return Path(synthetic_model("tiny", formats=("gguf",))["gguf"])


async def until(pilot, cond: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.05)


def resources_text(app: EvenflowApp) -> str:
    return str(app.screen.query_one(Resources).content)


def pull(url: str, name: str) -> list[dict[str, Any]]:
    # the test registry is plain HTTP: named http://, which insecure then allows (https is never downgraded)
    with httpx.stream("POST", url + "/api/pull", json={"model": "http://" + name, "insecure": True},
                      timeout=WAIT_S) as r:
        assert r.status_code == 200
        return [json.loads(line) for line in r.iter_lines() if line]


def first_hello(url: str) -> dict[str, Any]:
    with httpx.stream("GET", url + "/api/events", timeout=30) as r:
        return json.loads(next(r.iter_lines()))


def test_pulls_in_progress_show_in_resources(tmp_path: Path, gguf: Path) -> None:
    reg = Registry()
    raw = reg.add_model("library", "tiny", "latest", gguf)
    reg.add_model("library", "other", "latest", gguf, params={"temperature": 0.5})  # one new blob
    manifest = json.loads(raw)
    total = sum(x["size"] for x in [*manifest["layers"], manifest["config"]])
    d = start_daemon(tmp_path)
    d.ctx.store.store.downloads.part_size = gguf.stat().st_size // 3 + 1  # ranged parts, held by the gate
    name, other = f"{reg.host}/library/tiny:latest", f"{reg.host}/library/other:latest"

    async def go() -> None:
        app = EvenflowApp(d.url)
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.connected, "the feed")
            reg.gate.clear()
            task = asyncio.create_task(asyncio.to_thread(pull, d.url, name))
            mine = lambda: [p for p in app.state.pulls.values() if p.model == name]  # noqa: E731
            # the whole pull's size (model + config) from the first layer on, so the percentage never steps back
            await until(pilot, lambda: bool(mine()) and mine()[0].total == total, "the pull's size")
            await until(pilot, lambda: name in resources_text(app) and "pulling " in resources_text(app),
                        "the pull on screen")
            lines = resources_text(app).splitlines()
            at = [line.strip() for line in lines].index(name)  # name, bar + percent, bytes, status
            assert lines[at + 1].strip() == "░" * 10 + "   0%", lines[at:]
            assert lines[at + 2].strip() == f"0 B/{fmt_size(total)}", lines[at:]
            assert lines[at + 3].strip().startswith("pulling "), lines[at:]
            hello = await asyncio.to_thread(first_hello, d.url)  # a reader arriving now learns of it
            assert [(p["model"], p["total"], p["completed"]) for p in hello["pulls"]] == [
                (name, total, 0)]
            reg.gate.set()
            done = await task
            assert done[-1] == {"status": "success"}
            await until(pilot, lambda: mine()[0].t_done is not None, "the pull to end")
            p = mine()[0]
            assert (p.error, p.completed, p.total, p.status) == (None, total, total, "success")
            await until(pilot, lambda: "done" in resources_text(app), "the finished pull on screen")
            assert (await asyncio.to_thread(first_hello, d.url))["pulls"] == []

            reg.unavailable = True  # every blob GET answers 503: the pull fails after its retries
            failed = await asyncio.to_thread(pull, d.url, other)
            assert "error" in failed[-1]
            gone = lambda: [p for p in app.state.pulls.values() if p.model == other]  # noqa: E731
            await until(pilot, lambda: bool(gone()) and gone()[0].error is not None, "the failed pull")
            assert gone()[0].error == failed[-1]["error"]
            await until(pilot, lambda: "failed:" in resources_text(app), "the failure on screen")

    try:
        asyncio.run(go())
    finally:
        reg.gate.set()
        reg.close()
        d.stop()


def test_monitor_with_an_api_key(tmp_path: Path, gguf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = start_daemon(tmp_path, backend=BACKEND, api_key=KEY)
    upload_model(d.url, gguf, "tiny", headers=AUTH)

    async def go() -> None:
        monkeypatch.delenv("EVENFLOW_API_KEY", raising=False)
        app = EvenflowApp(d.url)
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: "requires an API key" in app.status, "the missing key reported")
            assert not app.connected and "EVENFLOW_API_KEY" in app.status
        monkeypatch.setenv("EVENFLOW_API_KEY", KEY)
        app = EvenflowApp(d.url)
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: app.connected, "the feed with the key")
            async with httpx.AsyncClient(base_url=d.url, headers=AUTH, timeout=WAIT_S) as c:
                r = await c.post("/api/generate", json={"model": "tiny", "prompt": "hi", "stream": False,
                                                        "options": {"num_predict": 4}})
                assert r.status_code == 200
            await until(pilot, lambda: any(s.state == "done" for s in app.state.streams.values()), "the stream")
            # /api/ps and /metrics need the key too: the loaded model's size comes from /api/ps
            await until(pilot, lambda: app.state.models.get("tiny:latest") is not None
                        and app.state.models["tiny:latest"].size is not None, "the /api/ps poll")
            await until(pilot, lambda: app.state.metrics.get("evenflow_generated_tokens_total", 0) >= 4,
                        "the /metrics poll")

    try:
        asyncio.run(go())
    finally:
        d.stop()


@pytest.mark.skipif(TMUX is None, reason="tmux is not installed (apt-get install -y tmux; .ci/run installs it)")
def test_monitor_discover_finds_an_advertised_daemon(tmp_path: Path, gguf: Path) -> None:
    d = start_daemon(tmp_path, backend=BACKEND, api_key=KEY, advertise=True, advertise_interfaces="127.0.0.1",
                     log_content="1")
    upload_model(d.url, gguf, "tiny", headers=AUTH)
    tmux = [TMUX, "-L", f"evenflow-discover-{os.getpid()}"]
    env = {**os.environ, "TERM": "xterm-256color", "EVENFLOW_DISCOVER_INTERFACES": "127.0.0.1",
           "EVENFLOW_API_KEY": KEY}
    env.pop("EVENFLOW_HOST", None)

    def capture() -> str:
        return subprocess.run(tmux + ["capture-pane", "-p", "-t", "mon"], capture_output=True, text=True).stdout

    def wait_for(cond: Callable[[str], bool], what: str) -> str:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            if cond(screen := capture()):
                return screen
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}; screen:\n{capture()}")

    try:
        with LanBrowser(["127.0.0.1"]) as browser:
            browser.wait_for(lambda fs: any(f.url == d.url for f in fs), 30)  # advertised before the monitor looks
            subprocess.run(tmux + ["new-session", "-d", "-s", "mon", "-x", "120", "-y", "30",
                                   f"{sys.executable} -m evenflow.clients.cli monitor --discover"], check=True, env=env)
            screen = wait_for(lambda s: "connected to http" in s, "the monitor to find a daemon and connect")
            url = re.search(r"connected to (http://\S+)", screen).group(1)
            if url != d.url:  # another advertised daemon (another test run on this host) answered first
                assert url in {f.url for f in browser.snapshot()}, (url, browser.snapshot())
                return
        r = httpx.post(d.url + "/api/generate", headers=AUTH, timeout=WAIT_S, json={
            "model": "tiny", "prompt": "discovered", "stream": False, "options": {"num_predict": 40}})
        assert r.status_code == 200
        wait_for(lambda s: "tiny" in s and "done:" in s, "the request on the discovered daemon's monitor")
    finally:
        subprocess.run(tmux + ["kill-server"], capture_output=True)
        d.stop()


def test_dropped_events_are_shown_not_hidden() -> None:
    """A reader that fell behind: the daemon's own subscriber queue produces the notice; the monitor shows it."""
    from evenflow.daemon.events import QUEUE_SIZE, _Subscriber

    sub = _Subscriber()
    for i in range(QUEUE_SIZE + 6):
        sub.offer({"type": "heartbeat", "time": float(i)}, None)
    notice = sub.drop_notice()
    assert notice is not None and notice["count"] == 6 and sub.drop_notice() is None
    hello = {"type": "hello", "time": 0.0, "log_content": False, "models": []}

    async def go() -> None:
        app = EvenflowApp("http://127.0.0.1:9", replay=[hello, notice], clock=lambda: 1.0)
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: "feed dropped 6 events" in resources_text(app), "the notice in Resources")
            assert "missed 6 events" in app.status_text()

    asyncio.run(go())
