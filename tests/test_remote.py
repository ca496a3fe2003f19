"""Remote models end to end: the `ollama` and `openai` clients against evenflow, the upstream on loopback —
llama-server (xllamacpp) for real generation, a scripted server for errors, hangs, disconnects and keys."""
from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import ollama
import openai
import pytest

from api_harness import start_daemon, upload_model
from remote_upstream import SCRIPTED_MODEL, start_llama_server, start_scripted

pytest.importorskip("xllamacpp")
KEY_ENV, KEY = "EVENFLOW_TEST_UPSTREAM_KEY", "sk-upstream-7c1e0d6b9a2f4e88"


@pytest.fixture(scope="module")
def gguf(synthetic_model) -> Path:
    return Path(synthetic_model("tiny", formats=("gguf",), text_only_output=True)["gguf"])


@pytest.fixture(scope="module")
def llama(gguf):
    server = start_llama_server(gguf)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def scripted():
    s = start_scripted()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, llama, scripted, gguf):
    d = start_daemon(tmp_path_factory.mktemp("remote"))
    c = ollama.Client(host=d.url)
    c.create("tiny", from_=f"openai+http://{llama.url.split('//')[1]}/v1/models/tiny-remote",
             parameters={"temperature": 0, "seed": 1})
    c.create("script", from_=f"openai+{scripted.url}/v1/models/{SCRIPTED_MODEL}",
             parameters={"api_key_env": KEY_ENV, "timeout": "2s"})
    upload_model(d.url, gguf, "local")
    yield d
    d.stop()


@pytest.fixture()
def script(scripted, monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    scripted.script.reset()
    return scripted.script


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------------- llama-server upstream

def test_show_tags_ps_mark_the_model_remote(daemon, llama):
    c = ollama.Client(host=daemon.url)
    info = c.show("tiny")
    assert info.details.format == "remote"
    mi = info.modelinfo
    assert mi["general.architecture"] == "remote" and mi["remote.endpoint"] == llama.url + "/v1"
    assert mi["remote.engine"] == "llamacpp" and mi["remote.context_length"] == 512 and mi["remote.reachable"]
    assert "FROM openai+http://127.0.0.1:" in info.modelfile and "/v1/models/tiny-remote" in info.modelfile
    assert {m.model: m.details.format for m in c.list().models}["tiny:latest"] == "remote"
    ps = {m.model: m for m in c.ps().models}
    assert ps["tiny:latest"].context_length == 512 and ps["tiny:latest"].size_vram == 0


def test_chat_streams_the_upstream_tokens_in_order(daemon, llama):
    msgs = [{"role": "user", "content": "tell me a story"}]
    direct = openai.OpenAI(base_url=llama.url + "/v1", api_key="none", http_client=httpx.Client(
        headers={"Connection": "close"}))
    want = [ch.choices[0].delta.content for ch in direct.chat.completions.create(
        model="tiny-remote", messages=msgs, max_tokens=12, temperature=0, seed=1, stream=True)
        if ch.choices and ch.choices[0].delta.content]
    parts = list(ollama.Client(host=daemon.url).chat("tiny", messages=msgs, stream=True,
                                                     options={"num_predict": 12}))
    got = [p.message.content for p in parts if not p.done and p.message.content]
    assert got == want and len(want) == 12
    last = parts[-1]
    assert last.done and last.done_reason == "length" and last.eval_count == 12 and last.prompt_eval_count > 0
    assert last.total_duration >= last.eval_duration > 0


def test_generate_raw_and_templated(daemon, llama):
    direct = httpx.post(llama.url + "/v1/completions", headers={"Connection": "close"}, timeout=60, json={
        "model": "tiny-remote", "prompt": "once upon", "max_tokens": 8, "temperature": 0, "seed": 1}).json()
    c = ollama.Client(host=daemon.url)
    raw = c.generate("tiny", prompt="once upon", raw=True, options={"num_predict": 8})
    assert raw.response == direct["choices"][0]["text"] and raw.eval_count == 8 and raw.context is None
    pieces = [p.response for p in c.generate("tiny", prompt="hello", stream=True, options={"num_predict": 6})]
    assert len([p for p in pieces if p]) == 6
    with pytest.raises(ollama.ResponseError) as e:
        c.generate("tiny", prompt="x", context=[1, 2, 3])
    assert e.value.status_code == 400 and "remote model" in str(e.value)


def test_v1_passthrough_renames_the_model(daemon):
    o = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused")
    r = o.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=5)
    assert r.model == "tiny" and r.usage.completion_tokens == 5 and r.choices[0].message.content
    chunks = list(o.completions.create(model="tiny", prompt="hi", max_tokens=5, stream=True))
    assert {ch.model for ch in chunks} == {"tiny"} and "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert o.models.retrieve("tiny").id == "tiny:latest"


def test_cli_create_from_a_modelfile(daemon, llama, tmp_path):
    mf = tmp_path / "Modelfile"
    mf.write_text(f"FROM openai+{llama.url}/v1/models/tiny-remote\nPARAMETER api_key_env MY_CLUSTER_KEY\n"
                  "PARAMETER timeout 90s\nPARAMETER temperature 0.2\nSYSTEM be brief\n")
    env = {**os.environ, "OLLAMA_HOST": daemon.url.split("//")[1], "EVENFLOW_HOST": daemon.url.split("//")[1]}
    p = subprocess.run([sys.executable, "-m", "evenflow.clients.cli", "create", "viacli", "-f", str(mf)], env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    info = ollama.Client(host=daemon.url).show("viacli")
    assert "PARAMETER api_key_env MY_CLUSTER_KEY" in info.modelfile and "PARAMETER timeout 90" in info.modelfile
    assert "SYSTEM \"\"\"be brief\"\"\"" in info.modelfile and info.modelinfo["remote.api_key_env"] == "MY_CLUSTER_KEY"


def test_bad_remote_models_are_400(daemon):
    c = ollama.Client(host=daemon.url)
    for from_, params, words in (("openai+http://127.0.0.1:1/v1/chat", {}, "/models/"),
                                 ("openai+http://u:secret@127.0.0.1:1/v1/models/m", {}, "credentials"),
                                 ("openai+http://127.0.0.1:1/v1/models/m", {"api_key_env": "sk-123 4"}, "variable"),
                                 ("openai+http://127.0.0.1:1/v1/models/m", {"timeout": "soon"}, "timeout"),
                                 ("local", {"api_key_env": "X"}, "only to a remote model")):
        with pytest.raises(ollama.ResponseError) as e:
            c.create("bad", from_=from_, parameters=params)
        assert e.value.status_code == 400 and words in str(e.value), (from_, str(e.value))


# ----------------------------------------------------------------------------------- scripted upstream

def test_key_is_sent_upstream_and_never_shown(daemon, script, caplog):
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []
    ready = threading.Event()

    def watch() -> None:
        with httpx.stream("GET", daemon.url + "/api/events", timeout=60) as r:
            for line in r.iter_lines():
                seen.append(line)
                ready.set()
                ev = json.loads(line)
                if ev.get("type") == "request" and ev.get("event") == "finished" and ev["model"] == "script:latest":
                    return

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    assert ready.wait(30)
    r = ollama.Client(host=daemon.url).chat("script", messages=[{"role": "user", "content": "hi"}])
    t.join(30)
    assert r.message.content == "Hello, remote world!" and r.eval_count == 5 and r.prompt_eval_count == 3
    assert script.requests[-1]["headers"]["authorization"] == f"Bearer {KEY}"
    assert script.requests[-1]["body"]["model"] == SCRIPTED_MODEL
    show = httpx.post(daemon.url + "/api/show", json={"model": "script", "verbose": True}).text
    assert KEY_ENV in show and KEY not in show
    events = [json.loads(x) for x in seen]
    mine = [e["event"] for e in events if e.get("type") == "request" and e.get("model") == "script:latest"]
    assert mine[0] == "queued" and mine.count("token") == 5 and mine[-1] == "finished" and "first_token" in mine
    assert KEY not in "\n".join(seen) and KEY not in caplog.text
    from evenflow.tui.state import MonitorState  # the monitor reads remote streams like local ones

    state = MonitorState()
    for ev in events:
        state.apply(ev)
    (stream,) = [s for s in state.streams.values() if s.model == "script:latest"]
    assert stream.state == "done" and stream.output_tokens == 5 and stream.prompt_tokens == 3
    assert stream.ttft is not None and stream.tok_per_s is not None and stream.endpoint == "/api/chat"


def test_a_rejected_key_is_502_and_not_echoed(daemon, script):
    script.mode = "reject_key"
    with pytest.raises(ollama.ResponseError) as e:
        ollama.Client(host=daemon.url).chat("script", messages=[{"role": "user", "content": "hi"}])
    assert e.value.status_code == 502 and "401" in str(e.value) and KEY_ENV in str(e.value)
    assert KEY not in str(e.value) and "<api key>" in str(e.value)


def test_missing_key_variable_is_a_clear_error(daemon, script, monkeypatch):
    monkeypatch.delenv(KEY_ENV)
    with pytest.raises(ollama.ResponseError) as e:
        ollama.Client(host=daemon.url).chat("script", messages=[{"role": "user", "content": "hi"}])
    assert KEY_ENV in str(e.value) and "not set" in str(e.value) and not script.requests


def test_upstream_500_is_502_with_its_message(daemon, script):
    script.mode = "error500"
    with pytest.raises(ollama.ResponseError) as e:
        ollama.Client(host=daemon.url).chat("script", messages=[{"role": "user", "content": "hi"}])
    assert e.value.status_code == 502 and "CUDA error: out of memory" in str(e.value)
    with pytest.raises(openai.InternalServerError) as e2:
        openai.OpenAI(base_url=daemon.url + "/v1", api_key="x", max_retries=0).completions.create(
            model="script", prompt="hi")
    assert e2.value.status_code == 502 and "out of memory" in str(e2.value)


def test_slow_upstream_times_out_with_504(daemon, script):
    script.mode = "hang"
    with pytest.raises(ollama.ResponseError) as e:
        ollama.Client(host=daemon.url).generate("script", prompt="hi")
    assert e.value.status_code == 504 and "2 s" in str(e.value)


def test_disconnect_cancels_the_upstream_request(daemon, script):
    script.mode = "endless"
    with httpx.stream("POST", daemon.url + "/api/chat", timeout=60,
                      json={"model": "script", "messages": [{"role": "user", "content": "go"}]}) as r:
        lines = r.iter_lines()
        first = [json.loads(next(lines)) for _ in range(3)]
    assert all(x["message"]["content"] == "tick " for x in first)
    assert script.cancelled.wait(30), "the upstream never saw the client leave"
    script.reset("endless")
    stream = openai.OpenAI(base_url=daemon.url + "/v1", api_key="x").chat.completions.create(
        model="script", messages=[{"role": "user", "content": "go"}], stream=True)
    assert next(iter(stream)).choices[0].delta.content == "tick "
    stream.close()
    assert script.cancelled.wait(30)


def test_disconnect_of_a_non_streamed_request_cancels_upstream(daemon, script):
    script.mode = "endless"
    body = json.dumps({"model": "script", "prompt": "go", "stream": False}).encode()
    host, port = daemon.url.split("//")[1].split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /api/generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        assert script.started.wait(30)
    assert script.cancelled.wait(30), "the upstream never saw the client leave"


def test_thinking_comes_back_as_thinking(daemon, script):
    script.mode = "think"
    parts = list(ollama.Client(host=daemon.url).chat("script", messages=[{"role": "user", "content": "q"}],
                                                     think=True, stream=True))
    assert "".join(p.message.thinking or "" for p in parts) == "let me think"
    assert "".join(p.message.content for p in parts) == "Hello, remote world!"
    assert script.requests[-1]["body"]["chat_template_kwargs"] == {"enable_thinking": True}


def test_tool_calls_and_format_are_translated(daemon, script):
    script.mode = "tools"
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    r = ollama.Client(host=daemon.url).chat("script", messages=[{"role": "user", "content": "weather?"}], tools=tools,
                                            format={"type": "object"}, think=False)
    assert r.message.tool_calls[0].function.name == "weather"
    assert r.message.tool_calls[0].function.arguments == {"city": "Paris"}
    body = script.requests[-1]["body"]
    assert body["tools"] == tools and body["response_format"]["json_schema"]["schema"] == {"type": "object"}
    assert body["chat_template_kwargs"] == {"enable_thinking": False} and body["stream"] is True


def test_embed_goes_upstream_and_is_normalised(daemon, script):
    r = ollama.Client(host=daemon.url).embed("script", input=["a", "b"], dimensions=2)
    assert [pytest.approx(v, abs=1e-6) for v in ([0.6, 0.8], [0.6, 0.8])] == r.embeddings and r.prompt_eval_count == 7
    assert script.requests[-1]["body"] == {"model": SCRIPTED_MODEL, "input": ["a", "b"]}


def test_upstream_down_is_502_and_local_models_still_serve(daemon):
    c = ollama.Client(host=daemon.url)
    port = _free_port()
    c.create("gone", from_=f"openai+http://127.0.0.1:{port}/v1/models/m")
    with pytest.raises(ollama.ResponseError) as e:
        c.chat("gone", messages=[{"role": "user", "content": "hi"}])
    assert e.value.status_code == 502 and f"127.0.0.1:{port}" in str(e.value)
    assert "gone:latest" not in {m.model for m in c.ps().models}
    assert c.show("gone").modelinfo["remote.reachable"] is False
    r = c.generate("local", prompt="hello", options={"num_predict": 3})
    assert r.done and r.eval_count >= 1
