"""One pipeline for local and remote models (docs/architecture.md): every request resolves its model's name once;
a remote model's request passes the endpoint's own plan step (a 400 there sends nothing upstream), is answered by
the dialect's reply code from the upstream's deltas, and closes the upstream response when its client leaves,
streamed or not, on every dialect. The upstream is the scripted OpenAI-compatible server of remote_upstream.py."""
from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any, Iterator

import anthropic
import httpx
import ollama
import openai
import pytest

from api_harness import Daemon, start_daemon, upload_model
from remote_upstream import SCRIPTED_MODEL, start_scripted

MSGS = [{"role": "user", "content": "go"}]


@pytest.fixture(scope="module")
def setup(tmp_path_factory, synthetic_model) -> Iterator[tuple[Daemon, Any]]:
    scripted = start_scripted()
    d = start_daemon(tmp_path_factory.mktemp("one-pipeline"))
    gguf = Path(synthetic_model("tiny", formats=("gguf",), text_only_output=True)["gguf"])
    upload_model(d.url, gguf, "local")
    r = httpx.post(d.url + "/api/create", timeout=60, json={
        "model": "script", "from": f"openai+{scripted.url}/v1/models/{SCRIPTED_MODEL}", "stream": False})
    assert r.status_code == 200, r.text
    yield d, scripted.script
    d.stop()
    scripted.stop()


@pytest.fixture()
def daemon(setup) -> Daemon:
    return setup[0]


@pytest.fixture()
def script(setup) -> Any:
    setup[1].reset()
    return setup[1]


def _count_lookups(daemon: Daemon, monkeypatch) -> list[str]:
    """The names the model store looks up (each resolution of a name reads its manifest once)."""
    store = daemon.ctx.store.store  # StoreAdapter -> ModelStore
    seen: list[str] = []
    original = store._require

    def counted(name: Any) -> Any:
        seen.append(str(name))
        return original(name)

    monkeypatch.setattr(store, "_require", counted)
    return seen


GENERATIONS = [
    ("/api/chat", {"messages": MSGS, "stream": False, "options": {"num_predict": 2}}),
    ("/api/generate", {"prompt": "go", "stream": False, "options": {"num_predict": 2}}),
    ("/api/embed", {"input": ["go"]}),
    ("/v1/messages", {"messages": MSGS, "max_tokens": 2}),
    ("/v1/responses", {"input": "go", "max_output_tokens": 2}),
]


@pytest.mark.parametrize("model", ["local", "script"])
@pytest.mark.parametrize("path, body", GENERATIONS, ids=[p for p, _ in GENERATIONS])
def test_a_request_resolves_its_model_once(daemon, script, monkeypatch, model, path, body):
    seen = _count_lookups(daemon, monkeypatch)
    r = httpx.post(daemon.url + path, json={"model": model, **body}, timeout=120)
    assert r.status_code == 200, r.text
    assert seen == [model], seen


def test_a_remote_request_passes_the_endpoints_plan_first(daemon, script):
    """The checks that need no model are the dialect's plan step, the same for a remote model: nothing goes
    upstream."""
    c = ollama.Client(host=daemon.url)
    with pytest.raises(ollama.ResponseError) as e:
        c.chat("script", messages=MSGS, logprobs=True, top_logprobs=99)
    assert e.value.status_code == 400 and "top_logprobs" in str(e.value)
    with pytest.raises(ollama.ResponseError) as e:
        c.chat("script", messages=MSGS, keep_alive="soon")
    assert e.value.status_code == 400
    with pytest.raises(anthropic.BadRequestError):
        anthropic.Anthropic(base_url=daemon.url, api_key="x", max_retries=0).messages.create(
            model="script", max_tokens=-1, messages=MSGS)
    with pytest.raises(openai.BadRequestError) as e2:
        openai.OpenAI(base_url=daemon.url + "/v1", api_key="x", max_retries=0).responses.create(
            model="script", input="q", previous_response_id="resp_1")
    assert "previous_response_id" in str(e2.value)
    assert script.requests == []


def test_an_empty_chat_checks_the_upstream_and_holds_nothing(daemon, script):
    c = ollama.Client(host=daemon.url)
    assert c.chat("script", messages=[]).done_reason == "load"
    assert c.generate("script", prompt="", keep_alive=0).done_reason == "unload"
    assert script.requests == []  # only the model list was asked


def test_remote_thinking_and_content_come_apart_as_a_local_models_do(daemon, script):
    """ChatReply writes one message per kind for either source: thinking, then content, never both in one."""
    script.mode = "think"
    parts = list(ollama.Client(host=daemon.url).chat("script", messages=MSGS, think=True, stream=True))
    assert not any(p.message.thinking and p.message.content for p in parts)
    assert [bool(p.message.thinking) for p in parts if p.message.thinking or p.message.content][:4] == \
        [True, True, True, False]
    whole = ollama.Client(host=daemon.url).chat("script", messages=MSGS, think=True)
    assert (whole.message.thinking, whole.message.content) == ("let me think", "Hello, remote world!")
    assert whole.eval_count == 5 and whole.prompt_eval_count == 3


def test_remote_embeddings_on_every_route(daemon, script):
    legacy = httpx.post(daemon.url + "/api/embeddings", json={"model": "script", "prompt": "a"}).json()
    assert legacy == {"embedding": [3.0, 4.0, 0.0, 0.0]}  # the upstream's vector as it comes
    relayed = openai.OpenAI(base_url=daemon.url + "/v1", api_key="x").embeddings.create(model="script", input=["a"])
    assert relayed.model == "script" and relayed.data[0].embedding == [3.0, 4.0, 0.0, 0.0]
    assert [r["path"] for r in script.requests] == ["/v1/embeddings", "/v1/embeddings"]


def _http_post(daemon: Daemon, path: str, body: dict[str, Any]) -> socket.socket:
    """A raw POST whose connection the caller closes to leave."""
    host, port = daemon.url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)))
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return sock


def _client_gone(daemon: Daemon, path: str) -> float:
    for line in httpx.get(daemon.url + "/metrics").text.splitlines():
        if line.startswith(f'evenflow_http_requests_total{{endpoint="{path}",status="499"}}'):
            return float(line.split()[-1])
    return 0.0


DIALECTS = [("/api/chat", {"messages": MSGS}), ("/v1/messages", {"messages": MSGS, "max_tokens": 100000}),
            ("/v1/responses", {"input": "go"}), ("/api/generate", {"prompt": "go"})]


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
@pytest.mark.parametrize("path, body", DIALECTS, ids=[p for p, _ in DIALECTS])
def test_a_client_that_leaves_closes_the_upstream_response(daemon, script, path, body, stream):
    script.mode = "endless"
    before = _client_gone(daemon, path)
    with _http_post(daemon, path, {"model": "script", "stream": stream, **body}) as sock:
        assert script.started.wait(30)
        seen = b""
        while stream and b"tick" not in seen:  # the reply's first text
            chunk = sock.recv(65536)
            assert chunk, seen
            seen += chunk
    assert script.cancelled.wait(30), "the upstream never saw the client leave"
    if not stream:  # logged as the client's disconnect, not as an error or overload
        deadline = time.monotonic() + 30
        while _client_gone(daemon, path) == before and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _client_gone(daemon, path) == before + 1


def test_an_upstream_failure_is_a_502_on_every_dialect(daemon, script):
    """The upstream's 500 before the first byte is a 502 status on every dialect, its message quoted."""
    script.mode = "error500"
    for path, body in DIALECTS:
        r = httpx.post(daemon.url + path, json={"model": "script", "stream": True, **body}, timeout=60)
        assert r.status_code == 502 and "out of memory" in r.text, (path, r.text)
