"""Issue 40's hostile-input findings, against a real daemon: a body cut short and a client that leaves a
non-streamed generation are 499s (one access-log line, counted as 499, never a 500 with a traceback nor an
overload 503/529), a schema too big to compile fast is a 400 naming the limit on every API that takes one, and a
5 MB embedding input costs what its window's worth does."""
from __future__ import annotations

import json
import logging
import socket
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from api_harness import BACKENDS, Daemon, StepGate, kv_used, start_daemon, upload_model

MODEL = "tiny:latest"
CTX = 1024
BLOB = "sha256:" + "ab" * 32


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, synthetic_model) -> Iterator[Daemon]:
    gguf = Path(synthetic_model("tiny", formats=("gguf",), text_only_output=True)["gguf"])
    backend = "llamacpp" if "llamacpp" in BACKENDS else BACKENDS[0]
    d = start_daemon(tmp_path_factory.mktemp("hostile"), backend=backend, context_length=str(CTX))
    upload_model(d.url, gguf, "tiny")
    d.backend = backend  # type: ignore[attr-defined]
    yield d
    d.stop()


def _counter(daemon: Daemon, endpoint: str, status: int) -> float:
    prefix = f'evenflow_http_requests_total{{endpoint="{endpoint}",status="{status}"}}'
    for line in httpx.get(daemon.url + "/metrics").text.splitlines():
        if line.startswith(prefix):
            return float(line.split()[-1])
    return 0.0


def _wait_counter(daemon: Daemon, endpoint: str, status: int, value: float) -> None:
    deadline = time.monotonic() + 60
    while _counter(daemon, endpoint, status) < value and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _counter(daemon, endpoint, status) == value, (endpoint, status)


def _address(daemon: Daemon) -> tuple[str, int]:
    host, port = daemon.url.removeprefix("http://").split(":")
    return host, int(port)


# ---- 1: a body cut short ----

BODY_ROUTES = [("POST", "/api/generate"), ("POST", "/api/chat"), ("POST", "/api/embed"), ("POST", "/api/embeddings"),
               ("POST", "/api/show"), ("POST", "/api/create"), ("POST", "/api/copy"), ("DELETE", "/api/delete"),
               ("POST", "/api/pull"), ("POST", "/api/push"), ("POST", "/v1/chat/completions"),
               ("POST", "/v1/completions"), ("POST", "/v1/embeddings"), ("POST", "/v1/messages"),
               ("POST", "/v1/messages/count_tokens"), ("POST", "/v1/responses"), ("POST", f"/api/blobs/{BLOB}")]


def _send_cut(daemon: Daemon, method: str, path: str, chunked: bool) -> None:
    """Half a body, then the connection closed: without the last chunk, or short of its Content-Length."""
    payload = json.dumps({"model": "tiny", "prompt": "x", "messages": [], "input": "x"}).encode()
    with socket.create_connection(_address(daemon)) as s:
        head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        if chunked:
            s.sendall(head.encode() + b"Transfer-Encoding: chunked\r\n\r\n" + f"{len(payload):x}\r\n".encode()
                      + payload + b"\r\n")
        else:
            s.sendall(head.encode() + f"Content-Length: {len(payload) + 100}\r\n\r\n".encode() + payload)


@pytest.mark.parametrize("method,path", BODY_ROUTES, ids=[p for _, p in BODY_ROUTES])
def test_a_body_cut_short_is_499_not_a_500(daemon: Daemon, method: str, path: str, caplog) -> None:
    label = "/api/blobs/{digest}" if path.startswith("/api/blobs/") else path
    before = _counter(daemon, label, 499)
    with caplog.at_level(logging.INFO):
        _send_cut(daemon, method, path, chunked=True)
        _wait_counter(daemon, label, 499, before + 1)
        _send_cut(daemon, method, path, chunked=False)
        _wait_counter(daemon, label, 499, before + 2)
    assert _counter(daemon, label, 500) == 0
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]
    access = [r.getMessage() for r in caplog.records if r.name == "evenflow.access" and json.dumps(path) in
              r.getMessage()]
    assert len(access) == 2 and all(line.startswith("499 |") for line in access), access  # one line each
    if path.startswith("/api/blobs/"):
        assert httpx.head(daemon.url + path).status_code == 404  # nothing half-written kept as the blob


# ---- 2: a client that leaves a non-streamed generation ----

LEAVERS = {
    "/api/chat": {"model": "tiny", "stream": False, "messages": [{"role": "user", "content": "a long story"}],
                  "options": {"temperature": 0, "num_predict": 100000, "ignore_eos": True}},
    "/api/generate": {"model": "tiny", "stream": False, "prompt": "a long story",
                      "options": {"temperature": 0, "num_predict": 100000, "ignore_eos": True}},
    "/v1/chat/completions": {"model": "tiny", "messages": [{"role": "user", "content": "a long story"}],
                             "temperature": 0, "max_tokens": 100000, "ignore_eos": True},
    "/v1/messages": {"model": "tiny", "messages": [{"role": "user", "content": "a long story"}],
                     "temperature": 0, "max_tokens": 100000},
    "/v1/responses": {"model": "tiny", "input": "a long story", "temperature": 0, "max_output_tokens": 100000},
}


@pytest.mark.parametrize("path", list(LEAVERS))
def test_a_client_leaving_a_whole_answer_is_499_and_frees_its_kv(daemon: Daemon, path: str) -> None:
    gate = StepGate(daemon, "tiny")  # the answer cannot end before the client has left
    engine = daemon.ctx.manager.models[MODEL].engine
    overload = 529 if path == "/v1/messages" else 503
    before, busy = _counter(daemon, path, 499), _counter(daemon, path, overload)
    try:
        gate.allow(2)  # its prompt and a token: then the engine waits, the sequence holding its KV
        payload = json.dumps(LEAVERS[path]).encode()
        with socket.create_connection(_address(daemon)) as s:
            s.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
            deadline = time.monotonic() + 60
            while not (engine.stats().running and gate.parked) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert engine.stats().running and kv_used(daemon, MODEL) > 0
        deadline = time.monotonic() + 60  # the abort reaches the engine's inbox once the server sees the close
        while not engine._inbox and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine._inbox, "the server did not abort the sequence of a client that left"
    finally:
        gate.close()
    _wait_counter(daemon, path, 499, before + 1)
    assert _counter(daemon, path, overload) == busy  # an ordinary disconnect is not overload
    deadline = time.monotonic() + 60
    while (kv_used(daemon, MODEL) or engine.stats().running) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert kv_used(daemon, MODEL) == 0 and engine.stats().running == 0


# ---- 3: a schema too big to compile fast ----

def _props(n: int, prefix: str = "f") -> dict[str, Any]:
    return {"type": "object", "properties": {f"{prefix}{i:05d}": {"type": "string"} for i in range(n)}}


WIDE = _props(10_000)  # ~250 KB: minutes of llguidance's time before the limit
MANY = {"type": "object", "properties": {f"o{j}": _props(900, f"o{j}_") for j in range(6)}}  # 5,400 in all
USER = [{"role": "user", "content": "hi"}]


def _schema_requests(schema: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every way a request hands the engine a schema to compile."""
    return [
        ("/api/generate", {"model": "tiny", "prompt": "hi", "stream": False, "format": schema}),
        ("/api/chat", {"model": "tiny", "messages": USER, "stream": False, "format": schema}),
        ("/v1/chat/completions", {"model": "tiny", "messages": USER, "response_format": {
            "type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}),
        ("/v1/completions", {"model": "tiny", "prompt": "hi", "response_format": {
            "type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}),
        ("/v1/responses", {"model": "tiny", "input": "hi", "text": {"format": {
            "type": "json_schema", "name": "s", "schema": schema}}}),
        ("/v1/messages", {"model": "tiny", "messages": USER, "max_tokens": 8, "output_config": {
            "format": {"type": "json_schema", "schema": schema}}}),
    ]


def _message(r: httpx.Response) -> str:
    body = r.json()
    err = body["error"]
    return err if isinstance(err, str) else err["message"]


@pytest.mark.parametrize("schema,fragment", [(WIDE, "an object has 10000 properties, the limit is 1000 in one object"),
                                             (MANY, "over 5000 properties in all")], ids=["wide", "many"])
def test_a_schema_too_big_to_compile_is_400_naming_the_limit(daemon: Daemon, schema, fragment: str) -> None:
    with httpx.Client(base_url=daemon.url, timeout=300) as c:
        for path, body in _schema_requests(schema):
            r = c.post(path, json=body)
            assert r.status_code == 400, (path, r.text[:300])
            assert "schema too large" in _message(r) and fragment in _message(r), (path, _message(r))


def test_a_schema_at_the_limit_still_constrains(daemon: Daemon) -> None:
    schema = {**_props(1000), "required": ["f00000"]}
    r = httpx.post(daemon.url + "/api/generate", timeout=300, json={
        "model": "tiny", "prompt": "hi", "stream": False, "format": schema,
        "options": {"temperature": 0, "num_predict": 16}})
    assert r.status_code == 200, r.text[:300]
    assert r.json()["response"].startswith('{"f00000": "')  # the grammar ran: required properties come first


def test_a_forced_tool_with_a_huge_input_schema_is_refused() -> None:
    from evenflow.daemon.engine.grammar import GrammarError, grammar_for_tool_call

    with pytest.raises(GrammarError, match="invalid tool input_schema: schema too large: an object has 10000"):
        grammar_for_tool_call(WIDE, "<tool_call>\n", "\n</tool_call>")
    merged = {"allOf": [_props(600, "a"), _props(600, "b")]}  # two parts in bounds, one object of 1,200 merged
    with pytest.raises(GrammarError, match="an object has 1200 properties"):
        grammar_for_tool_call(merged)


# ---- 4: 5 MB on the embedding routes ----

TEXT = ("The quick brown fox jumps over the lazy dog. " * 120_000)[:5_000_000]


def test_a_5mb_embedding_input_costs_a_window(daemon: Daemon) -> None:
    """Truncated to the window as Ollama does, from a few windows' worth of text tokenized, not 5 MB; refused
    at once with truncate: false, as the generation routes refuse it."""
    httpx.post(daemon.url + "/api/generate", json={"model": "tiny"}, timeout=120)  # loaded
    runner = daemon.ctx.manager.models[MODEL].runner
    tokenizer = runner.tokenizer
    seen: list[int] = []
    encode = tokenizer.encode

    def spy(text: str, *args: Any, **kwargs: Any) -> Any:
        seen.append(len(text))
        return encode(text, *args, **kwargs)

    tokenizer.encode = spy
    try:
        with httpx.Client(base_url=daemon.url, timeout=600) as c:
            r = c.post("/api/embed", json={"model": "tiny", "input": TEXT, "truncate": False})
            assert r.status_code == 400 and "exceeds the context length" in r.json()["error"]
            whole = c.post("/api/embed", json={"model": "tiny", "input": TEXT})
            assert whole.status_code == 200 and whole.json()["prompt_eval_count"] == CTX
            legacy = c.post("/api/embeddings", json={"model": "tiny", "prompt": TEXT})
            openai = c.post("/v1/embeddings", json={"model": "tiny", "input": TEXT})
            assert legacy.status_code == 200 and openai.status_code == 200
            assert openai.json()["usage"]["prompt_tokens"] == CTX
            head = c.post("/api/embed", json={"model": "tiny", "input": TEXT[:64 * CTX]})  # the same first window
    finally:
        tokenizer.encode = encode
    assert whole.json()["embeddings"] == head.json()["embeddings"]
    raw = legacy.json()["embedding"]  # the legacy route does not normalise
    norm = sum(v * v for v in raw) ** 0.5
    assert [v / norm for v in raw] == pytest.approx(whole.json()["embeddings"][0], rel=1e-4, abs=1e-6)
    assert max(seen) <= 64 * CTX, max(seen)  # characters tokenized at once: a few windows' worth, never 5 MB
    embedder = getattr(runner, "_embedder", None)
    if embedder is not None:  # llama.cpp: a long input's context (every token's logits) is not kept
        assert embedder._n_ctx <= 512


def test_a_huge_request_template_is_not_kept_after_its_request() -> None:
    """A request's own template is cached by its text; one of megabytes is not (64 held ~3 GB for good)."""
    from evenflow.daemon.prompt.gotemplate import parser
    from evenflow.daemon.prompt.gotemplate.render_budget import MAX_CACHED_CHARS

    small, big = "{{ .Prompt }} small", "{{ .Prompt }}" + "x" * (MAX_CACHED_CHARS + 1)
    before = parser.parse.cache_info().currsize
    assert parser.parse(big) and parser.parse.cache_info().currsize == before
    parser.parse(small)
    assert parser.parse(small) is parser.parse(small)  # small ones stay cached
    assert parser.parse.cache_info().currsize <= before + 1


# ---- 5: the event feed still carries every token ----

def test_the_feed_still_carries_every_token(daemon: Daemon) -> None:
    with httpx.stream("GET", daemon.url + "/api/events", timeout=60) as ev:
        lines = ev.iter_lines()
        assert json.loads(next(lines))["type"] == "hello"
        r = httpx.post(daemon.url + "/api/generate", timeout=120, json={
            "model": "tiny", "prompt": "count", "stream": False,
            "options": {"temperature": 0, "num_predict": 30, "ignore_eos": True}})
        assert r.status_code == 200
        seen = []
        for line in lines:
            e = json.loads(line)
            seen.append(e)
            if e.get("event") == "finished":
                break
    seq = seen[-1]["seq_id"]
    mine = [e for e in seen if e["type"] == "request" and e["seq_id"] == seq]
    assert [e["event"] for e in mine if e["event"] != "token"] == ["queued", "scheduled", "first_token", "finished"]
    tokens = [e for e in mine if e["event"] == "token"]
    assert len(tokens) == r.json()["eval_count"] == 30
    assert [e["output_tokens"] for e in tokens] == list(range(1, 31))  # in order, none lost
    steps = [e for e in seen if e["type"] == "step"]
    # the first token comes from the prompt's step, the last one's step is published after `finished`
    assert sum(e["decodes"] for e in steps) == 28


def test_a_burst_of_events_reaches_the_loop_in_one_flush() -> None:
    """The engine thread hands events over in batches: a burst published while the loop is busy is one flush,
    every event in order."""
    import asyncio
    import threading

    from evenflow.daemon.events import EventHub

    async def go() -> None:
        hub = EventHub(False)
        hub.bind(asyncio.get_running_loop())
        sub = hub.subscribe()
        flushes = []
        flush = hub._flush
        hub._flush = lambda: (flushes.append(1), flush())  # type: ignore[method-assign]
        t = threading.Thread(target=lambda: [hub.publish({"type": "request", "n": i}) for i in range(500)])
        t.start()
        t.join()  # the loop is held here: all 500 are published before it can flush
        await asyncio.wait_for(sub.ready.wait(), 30)
        assert [e["n"] for e in sub.take()] == list(range(500))
        assert flushes == [1]

    asyncio.run(go())
