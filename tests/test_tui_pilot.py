"""The TUI driven headless (`App.run_test()` + Pilot) against a real daemon on a free loopback port, tiny model."""
from __future__ import annotations

import asyncio
import functools
import time
from pathlib import Path
from typing import Callable, Iterator

import httpx
import pytest
from textual.widgets import Input, Markdown

from api_harness import BACKENDS, Daemon, StepGate, kv_used, start_daemon, upload_model
from evenflow.tui.app import EvenflowApp
from evenflow.tui.chat import ChatScreen
from evenflow.tui.demo import workload
from evenflow.tui.widgets import StreamsTable

BACKEND = "llamacpp" if "llamacpp" in BACKENDS else BACKENDS[0]
# A small fixed budget: a long prompt goes in over many steps, so its progress can be watched.
SETTINGS = dict(backend=BACKEND, context_length="2048", log_content="1", target_itl_ms="0",
                max_batched_tokens="16")
WAIT_S = 120.0  # generous: events are awaited, never a margin of time


@pytest.fixture(scope="module")
def gguf(synthetic_model) -> Path:
    return Path(synthetic_model("tiny", formats=("gguf",))["gguf"])


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, gguf) -> Iterator[Daemon]:
    d = start_daemon(tmp_path_factory.mktemp("tui"), **SETTINGS)
    upload_model(d.url, gguf, "tiny")
    yield d
    d.stop()


async def until(pilot, cond: Callable[[], bool], what: "str | Callable[[], str]", timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what if isinstance(what, str) else what()}")
        await pilot.pause(0.05)


def table_rows(app: EvenflowApp) -> list[list[str]]:
    table = app.screen.query_one(StreamsTable)
    return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]


def test_streams_appear_and_ingest_progress_moves(daemon: Daemon) -> None:
    async def go() -> None:
        app = EvenflowApp(daemon.url)
        seen: list[tuple[str, int, int]] = []  # (kind, seq_id, value) in feed order
        apply = app.state.apply

        def record(ev: dict) -> None:
            apply(ev)
            if ev.get("type") == "step":
                seen.extend(("prefill", sid, c) for sid, c in ev.get("prefilled") or [])
            elif ev.get("event") == "token":
                seen.append(("token", ev["seq_id"], ev["output_tokens"]))

        app.state.apply = record  # type: ignore[method-assign]
        gate = StepGate(daemon, "tiny")  # one step per look until the document is queued behind both streams

        def step(cond: Callable[[], bool]) -> Callable[[], bool]:
            return lambda: gate.allow(1) or cond()

        try:
            async with app.run_test(size=(120, 36)) as pilot:
                await until(pilot, lambda: app.connected, "the feed")
                async with httpx.AsyncClient(base_url=daemon.url, timeout=WAIT_S) as c:
                    chats = [asyncio.create_task(c.post("/api/generate", json={
                        "model": "tiny", "prompt": f"story {i}", "stream": False,
                        "options": {"num_predict": 1000, "seed": i, "temperature": 0, "ignore_eos": True}}))
                        for i in range(2)]  # no EOS: 1000 tokens, and the document needs 50 steps
                    await until(pilot, step(lambda: sum(s.state == "decoding" for s in app.state.streams.values())
                                            == 2), "two streams decoding")
                    doc = asyncio.create_task(c.post("/api/generate", json={
                        "model": "tiny", "prompt": "word " * 800, "stream": False, "options": {"num_predict": 2}}))
                    long = lambda: [s for s in app.state.streams.values() if s.prompt_tokens > 500]  # noqa: E731
                    await until(pilot, step(lambda: bool(long())), "the document queued")
                    gate.open()
                    await until(pilot, lambda: long()[0].state in ("decoding", "done"), "the document")
                    seq = long()[0].seq_id
                    await until(pilot, lambda: any(r[3] == "decoding" for r in table_rows(app)), "rows on screen")
                    rows = table_rows(app)
                    assert {r[2] for r in rows} >= {"generate"} and any(r[1] == "tiny" for r in rows)
                    assert any(r[4].endswith(str(long()[0].prompt_tokens)) or r[4] == str(long()[0].prompt_tokens)
                               for r in rows), rows
                    for t in (*chats, doc):
                        assert (await t).status_code == 200
        finally:
            gate.close()
        prefills = [(i, v) for i, (k, sid, v) in enumerate(seen) if k == "prefill" and sid == seq]
        values = [v for _, v in prefills]
        assert len(values) >= 20 and values == sorted(values), values  # 800 tokens at 16 per step, in order
        first, last = prefills[0][0], prefills[-1][0]
        during = {sid for k, sid, _ in seen[first:last] if k == "token" and sid != seq}
        assert len(during) == 2, "both streams kept decoding while the document went in"

    asyncio.run(go())


def test_chat_streams_a_reply_and_esc_stops_it(daemon: Daemon) -> None:
    gate = StepGate(daemon, "tiny")  # steps go through as the test lets them: the reply is still streaming at Esc

    async def go() -> None:
        app = EvenflowApp(daemon.url)
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: app.connected, "the feed")
            await pilot.press("c")
            chat = app.screen
            assert isinstance(chat, ChatScreen)
            await until(pilot, lambda: chat.model == "tiny:latest", "the model list")
            chat.options = {"temperature": 0, "num_predict": 1500, "ignore_eos": True}  # runs to 1500 tokens
            chat.query_one("#prompt", Input).value = "Tell me a long story"
            await pilot.press("enter")
            reply = chat.query(Markdown).last()
            lengths: set[int] = set()

            def grown() -> bool:
                gate.allow(4)  # a few tokens per look: far fewer than 1500 go through before Esc
                lengths.add(len(reply.source))
                return len([n for n in lengths if n > 0]) >= 3

            await until(pilot, grown, lambda: f"a reply streaming in (lengths seen {sorted(lengths)})")
            streams = lambda: [s for s in app.state.streams.values() if s.endpoint == "/api/chat"]  # noqa: E731
            await until(pilot, lambda: bool(streams()) and streams()[-1].state == "decoding", "the stream's state")
            await pilot.press("escape")
            await until(pilot, lambda: not chat.replying, "the reply to stop")
            assert "(stopped)" in reply.source

            def finished() -> bool:
                gate.allow(1)  # one step per look: the abort lands long before 1500 tokens could
                return streams()[-1].state == "done"

            await until(pilot, finished, "the daemon to finish the sequence")
            assert streams()[-1].done_reason == "abort"
            await until(pilot, lambda: kv_used(daemon, "tiny:latest") == 0, "the KV to be freed")
            assert isinstance(app.screen, ChatScreen)  # Esc while streaming stops; it does not leave the chat
            await pilot.press("escape")
            assert not isinstance(app.screen, ChatScreen)

    try:
        asyncio.run(go())
    finally:
        gate.close()


def test_daemon_restart_is_survived(tmp_path: Path, gguf: Path) -> None:
    async def go() -> None:
        d1 = await asyncio.to_thread(start_daemon, tmp_path, **SETTINGS)
        await asyncio.to_thread(upload_model, d1.url, gguf, "tiny")
        port = d1.url.rsplit(":", 1)[1]
        app = EvenflowApp(d1.url)
        d2 = None
        try:
            async with app.run_test(size=(100, 30)) as pilot:
                await until(pilot, lambda: app.connected, "the feed")
                await asyncio.to_thread(d1.stop)
                await until(pilot, lambda: not app.connected and "unreachable" in app.status, "the loss noticed")
                d2 = await asyncio.to_thread(start_daemon, tmp_path, host=f"127.0.0.1:{port}", **SETTINGS)
                await until(pilot, lambda: app.connected, "the reconnection")
                assert app.reconnects == 1 and app.status.startswith("connected")
                async with httpx.AsyncClient(base_url=d2.url, timeout=WAIT_S) as c:
                    r = await c.post("/api/generate", json={"model": "tiny", "prompt": "again", "stream": False,
                                                            "options": {"num_predict": 3}})
                    assert r.status_code == 200
                await until(pilot, lambda: any(s.state == "done" and s.done_reason in ("stop", "length")
                                               for s in app.state.streams.values()), "a stream after the restart")
        finally:
            if d2 is not None:
                await asyncio.to_thread(d2.stop)

    asyncio.run(go())


def test_demo_workload_runs_chats_and_a_document(daemon: Daemon) -> None:
    async def go() -> None:
        app = EvenflowApp(daemon.url, workload=functools.partial(workload, rounds=1, paragraphs=25, num_predict=16))
        finished: list[tuple[str, int]] = []  # (endpoint, prompt tokens); finished rows fade from the screen
        apply = app.state.apply

        def record(ev: dict) -> None:
            apply(ev)
            if ev.get("event") == "finished":
                finished.append(((ev.get("user") or {}).get("endpoint", ""), ev.get("prompt_tokens", 0)))

        app.state.apply = record  # type: ignore[method-assign]
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: sum(e == "/api/chat" for e, _ in finished) >= 3
                        and any(n > 1000 for _, n in finished),
                        lambda: f"the demo's chats and document; finished {finished}, ingests {app.ingests}")
            await until(pilot, lambda: bool(app.ingests) and app.ingests[0]["state"] == "done", "the ingest")
            assert app.ingests[0]["tokens"] > 1000

    asyncio.run(go())
