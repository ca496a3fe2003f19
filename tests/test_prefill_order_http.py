"""Issue 26 through HTTP on a daemon at its default settings: while a document is being ingested beside a decoding
stream, a one-line question gets its first token before the document's prefill is complete, and `/api/events`
says where a waiting request stands. Steps are let through one at a time (StepGate) and the test waits on engine
events, never on a time margin."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from api_harness import Daemon, StepGate, start_daemon, upload_model


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, synthetic_model) -> Daemon:
    d = start_daemon(tmp_path_factory.mktemp("order"))
    upload_model(d.url, Path(synthetic_model("tiny", "llama", formats=("gguf",), gguf_dtype="q8_0")["gguf"]), "tiny")
    yield d
    d.stop()


class Events:
    """The engine's request events, gathered on its thread; `wait_for` blocks until one matches."""

    def __init__(self, engine: Any) -> None:
        self.seen: list[dict[str, Any]] = []
        self.cv = threading.Condition()
        self.unsubscribe = engine.subscribe(self._on)

    def _on(self, ev: dict[str, Any]) -> None:
        with self.cv:
            self.seen.append(ev)
            self.cv.notify_all()

    def find(self, **match: Any) -> dict[str, Any] | None:
        with self.cv:
            return next((e for e in self.seen if all(e.get(k) == v for k, v in match.items())), None)

    def wait_for(self, gate: StepGate | None = None, pred: Any = None, **match: Any) -> dict[str, Any]:
        """The first event matching. With a gate, one more step is let through each time the engine is held at it
        and nothing matches yet (never a step ahead: what the earlier steps published is all in by then)."""
        def found() -> dict[str, Any] | None:
            return next((e for e in self.seen if all(e.get(k) == v for k, v in match.items())
                         and (pred is None or pred(e))), None)

        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            with self.cv:
                if (got := found()) is not None:
                    return got
                if gate is None or not gate.parked:  # wait for an event, or poll for the gate to hold the engine
                    self.cv.wait(60 if gate is None else 0.01)
                    continue
            with self.cv:  # held at the gate: all its earlier steps published
                if (got := found()) is not None:
                    return got
            gate.step_if_parked()
        raise AssertionError(f"no event {match}")


def post_stream(url: str, body: dict[str, Any], out: list[dict[str, Any]]) -> threading.Thread:
    def run() -> None:
        with httpx.stream("POST", url + "/api/generate", json={**body, "stream": True}, timeout=300) as r:
            for line in r.iter_lines():
                if line:
                    out.append(json.loads(line))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_a_question_gets_its_first_token_before_a_document_finishes_ingesting(daemon: Daemon) -> None:
    gate = StepGate(daemon, "tiny")
    engine = daemon.ctx.manager.models["tiny:latest"].engine
    events = Events(engine)
    replies: dict[str, list[dict[str, Any]]] = {"stream": [], "doc": [], "chat": []}
    threads = []
    try:
        threads.append(post_stream(daemon.url, {"model": "tiny", "prompt": "Tell me a story.",
                                                "options": {"num_predict": 100_000}}, replies["stream"]))
        first = events.wait_for(gate, type="request", event="first_token")
        stream_id = first["seq_id"]
        doc_text = " ".join(f"paragraph {i} of the quarterly report, with numbers." for i in range(80))
        threads.append(post_stream(daemon.url, {"model": "tiny", "prompt": doc_text, "options": {"num_predict": 4}},
                                   replies["doc"]))
        doc = events.wait_for(gate, type="request", event="queued", pred=lambda e: e["seq_id"] != stream_id)
        assert doc["prompt_tokens"] > 1000
        events.wait_for(gate, type="request", event="scheduled", seq_id=doc["seq_id"])  # it is going in
        threads.append(post_stream(daemon.url, {"model": "tiny", "prompt": "Quick question: what is 2+2?",
                                                "options": {"num_predict": 4}}, replies["chat"]))
        # no step goes through until the question has reached the engine (on a loaded machine its HTTP request
        # can take longer than the document's whole prefill)
        deadline = time.monotonic() + 120
        while not engine._inbox and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine._inbox, "the question never reached the engine"
        chat = events.wait_for(gate, type="request", event="queued",
                               pred=lambda e: e["seq_id"] not in (stream_id, doc["seq_id"]))
        events.wait_for(gate, type="request", event="first_token", seq_id=chat["seq_id"])
        assert events.find(type="request", event="first_token", seq_id=doc["seq_id"]) is None, \
            "the question waited for the whole document"
        # the document was still ingesting when the question's first token came
        prefilled = [c for e in events.seen if e["type"] == "step" for s, c in e["prefilled"] if s == doc["seq_id"]]
        assert 0 < max(prefilled) < doc["prompt_tokens"]
        gate.open()
        events.wait_for(type="request", event="finished", seq_id=chat["seq_id"])
        events.wait_for(type="request", event="finished", seq_id=doc["seq_id"])
    finally:
        gate.close()
        engine.abort(stream_id)
        events.unsubscribe()
        for t in threads:
            t.join(60)
    assert replies["chat"][-1]["done"] and replies["doc"][-1]["done"]


def test_waiting_requests_are_told_on_the_event_feed_with_their_position(daemon: Daemon) -> None:
    gate = StepGate(daemon, "tiny")
    engine = daemon.ctx.manager.models["tiny:latest"].engine
    slots = engine.scheduler.config.max_num_seqs
    feed: list[dict[str, Any]] = []
    ready = threading.Event()

    def read_feed() -> None:
        with httpx.stream("GET", daemon.url + "/api/events", timeout=120) as r:
            ready.set()
            for line in r.iter_lines():
                if line:
                    feed.append(json.loads(line))
                    if feed[-1].get("event") == "waiting" and feed[-1].get("reason") == "slot":
                        return

    reader = threading.Thread(target=read_feed, daemon=True)
    reader.start()
    ready.wait(60)
    events = Events(engine)
    outs: list[list[dict[str, Any]]] = []
    threads = []
    try:
        for i in range(slots + 1):  # one more long stream than there are slots
            outs.append([])
            threads.append(post_stream(daemon.url, {"model": "tiny", "prompt": f"stream {i}",
                                                    "options": {"num_predict": 100_000}}, outs[-1]))
        waiting = events.wait_for(gate, type="request", event="waiting", reason="slot")
        queued = [e["seq_id"] for e in events.seen if e.get("event") == "queued"]
        assert waiting["seq_id"] == max(queued)  # the last to come waits; its place counts the prompts ahead of it
        assert 1 <= waiting["position"] <= slots
        reader.join(60)
        assert any(e.get("event") == "waiting" and e.get("reason") == "slot" and e.get("seq_id") == waiting["seq_id"]
                   and e.get("position") == waiting["position"] for e in feed)
        metrics = httpx.get(daemon.url + "/metrics", timeout=30).text
        assert 'evenflow_queue_wait_seconds_count{model="tiny:latest"}' in metrics
    finally:
        gate.close()
        for e in list(events.seen):
            if e.get("event") == "queued":
                engine.abort(e["seq_id"])
        events.unsubscribe()
        for t in threads:
            t.join(60)


@pytest.mark.parametrize("body,ok", [
    ({"options": {"priority": "background"}}, True), ({"options": {"priority": -3}}, True),
    ({"options": {"priority": "urgent"}}, False), ({"options": {"priority": 1.5}}, False),
    ({"options": {"priority": 10_000}}, False), ({"options": {"priority": True}}, False),
])
def test_priority_option_on_the_ollama_api(daemon: Daemon, body: dict[str, Any], ok: bool) -> None:
    r = httpx.post(daemon.url + "/api/generate", json={"model": "tiny", "prompt": "hi", "stream": False,
                                                         **body, "options": {"num_predict": 2, **body["options"]}},
                   timeout=120)
    assert r.status_code == (200 if ok else 400), r.text
    if not ok:
        assert "priority" in r.json()["error"]


def test_priority_on_the_openai_api_reaches_the_engine(daemon: Daemon) -> None:
    engine_events: list[dict[str, Any]] = []
    httpx.post(daemon.url + "/api/generate", json={"model": "tiny"}, timeout=120)  # loaded
    engine = daemon.ctx.manager.models["tiny:latest"].engine
    unsubscribe = engine.subscribe(lambda ev: ev.get("event") == "queued" and engine_events.append(ev))
    try:
        r = httpx.post(daemon.url + "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2,
                                                             "priority": "interactive"}, timeout=120)
        assert r.status_code == 200, r.text
        bad = httpx.post(daemon.url + "/v1/chat/completions", json={
            "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "priority": [1]}, timeout=120)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "priority"
    finally:
        unsubscribe()
    assert [e["priority"] for e in engine_events] == [-1]
