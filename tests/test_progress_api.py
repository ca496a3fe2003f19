"""Prompt progress in every API's stream, for the requests that ask (`return_progress: true`, llama-server's name):
NDJSON lines on /api/*, llama-server's `prompt_progress` chunks on /v1/chat/completions and /v1/completions,
response.in_progress events on /v1/responses, `ping` events on /v1/messages (the anthropic SDK skips them). The
official clients read these streams unchanged, and a request that does not ask gets exactly Ollama's wire shape."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import anthropic
import httpx
import openai
import pytest

from api_harness import BACKENDS, Daemon, StepGate, start_daemon, upload_model

GREEDY = {"temperature": 0, "num_predict": 4}
PROMPT = " ".join(f"line {i} of a document that takes a while to read." for i in range(12))
CHUNK_KEYS = {"model", "created_at", "message", "done"}
FINAL_KEYS = CHUNK_KEYS | {"done_reason", "total_duration", "load_duration", "prompt_eval_count",
                           "prompt_eval_duration", "eval_count", "eval_duration"}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, synthetic_model) -> Iterator[Daemon]:
    gguf = Path(synthetic_model("tiny", formats=("gguf",))["gguf"])
    backend = "llamacpp" if "llamacpp" in BACKENDS else BACKENDS[0]
    # one slot, so that a second request waits; a small fixed budget, so that a prompt takes several chunks
    d = start_daemon(tmp_path_factory.mktemp("progress"), backend=backend, context_length="1024", num_parallel="1",
                     max_batched_tokens="32", target_itl_ms="0")
    upload_model(d.url, gguf, "tiny")
    yield d
    d.stop()


def ndjson(url: str, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.stream("POST", url + path, json=body, timeout=300) as r:
        assert r.status_code == 200
        return [json.loads(x) for x in r.iter_lines() if x]


def check_reports(reports: list[dict[str, Any]], total: int) -> None:
    """The first report comes before anything is computed, the last when the prompt is; they only go forward."""
    assert len(reports) >= 2
    assert reports[0]["processed"] == 0 and reports[-1]["processed"] == total
    assert all(r["total"] == total and 0 <= r["cache"] <= r["processed"] for r in reports[1:])
    assert [r["processed"] for r in reports] == sorted(r["processed"] for r in reports)
    assert [r["time_ms"] for r in reports] == sorted(r["time_ms"] for r in reports)


@pytest.mark.parametrize("path,text", [("/api/chat", lambda x: x["message"]["content"]),
                                       ("/api/generate", lambda x: x["response"])])
def test_ollama_progress_lines_only_when_asked(daemon: Daemon, path: str, text) -> None:
    body = {"model": "tiny", "options": GREEDY,
            **({"messages": [{"role": "user", "content": PROMPT}]} if path == "/api/chat" else {"prompt": PROMPT})}
    plain = ndjson(daemon.url, path, body)
    asked = ndjson(daemon.url, path, {**body, "return_progress": True})
    progress = [x for x in asked if "prompt_progress" in x]
    rest = [x for x in asked if "prompt_progress" not in x]
    first_text = next(i for i, x in enumerate(asked) if text(x) or x["done"])
    assert asked[:len(progress)] == progress and len(progress) <= first_text  # all before the reply
    for x in progress:  # shaped as an empty chunk: a client that does not look for them skips them
        assert not x["done"] and text(x) == "" and set(x) == (CHUNK_KEYS if path == "/api/chat" else
                                                              {"model", "created_at", "response", "done"}) | \
            {"prompt_progress"}
    check_reports([x["prompt_progress"] for x in progress], asked[-1]["prompt_eval_count"])
    assert "".join(text(x) for x in rest) == "".join(text(x) for x in plain)
    # not asked: exactly Ollama's keys, line by line
    for x in plain[:-1]:
        assert set(x) == (CHUNK_KEYS if path == "/api/chat" else {"model", "created_at", "response", "done"})
    last = FINAL_KEYS if path == "/api/chat" else (FINAL_KEYS - {"message"}) | {"response", "context"}
    assert set(plain[-1]) == last
    # and a whole answer (stream false) has none
    whole = httpx.post(daemon.url + path, json={**body, "stream": False, "return_progress": True}, timeout=300)
    assert "prompt_progress" not in whole.text


def test_openai_chunks_carry_llama_servers_prompt_progress(daemon: Daemon) -> None:
    client = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0)
    msgs = [{"role": "user", "content": PROMPT}]
    plain = list(client.chat.completions.create(model="tiny", messages=msgs, max_tokens=4, temperature=0,
                                                stream=True, stream_options={"include_usage": True}))
    asked = list(client.chat.completions.create(model="tiny", messages=msgs, max_tokens=4, temperature=0,
                                                stream=True, stream_options={"include_usage": True},
                                                extra_body={"return_progress": True}))
    assert all(not (c.model_extra or {}).get("prompt_progress") for c in plain)
    progress = [c for c in asked if (c.model_extra or {}).get("prompt_progress")]
    for c in progress:
        assert c.object == "chat.completion.chunk" and c.choices[0].delta.role == "assistant"
        assert c.choices[0].delta.content is None and c.choices[0].finish_reason is None and c.usage is None
    check_reports([c.model_extra["prompt_progress"] for c in progress], asked[-1].usage.prompt_tokens)

    def text(chunks) -> str:
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    assert text(asked) == text(plain)
    # the SDK's stream helper reads the same message
    with client.chat.completions.stream(model="tiny", messages=msgs, max_tokens=4, temperature=0,
                                        extra_body={"return_progress": True}) as s:
        assert "".join(e.delta for e in s if e.type == "content.delta") == text(plain)
    comps = list(client.completions.create(model="tiny", prompt=PROMPT, max_tokens=4, temperature=0, stream=True,
                                           extra_body={"return_progress": True}))
    reports = [c.model_extra["prompt_progress"] for c in comps if (c.model_extra or {}).get("prompt_progress")]
    assert reports and reports[0]["processed"] == 0 and reports[-1]["processed"] == reports[-1]["total"]


def test_responses_tell_progress_in_in_progress_events(daemon: Daemon) -> None:
    client = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0)
    kw = dict(model="tiny", input=PROMPT, max_output_tokens=4, temperature=0)
    plain = list(client.responses.create(stream=True, **kw))
    asked = list(client.responses.create(stream=True, extra_body={"return_progress": True}, **kw))
    progress = [e for e in asked if (e.model_extra or {}).get("prompt_progress")]
    assert progress and all(e.type == "response.in_progress" for e in progress)
    assert not any((e.model_extra or {}).get("prompt_progress") for e in plain)
    assert [e.type for e in asked if e not in progress] == [e.type for e in plain]
    check_reports([e.model_extra["prompt_progress"] for e in progress], asked[-1].response.usage.input_tokens)
    with client.responses.stream(extra_body={"return_progress": True}, **kw) as s:  # the SDK's helper reads it too
        assert "".join(e.delta for e in s if e.type == "response.output_text.delta") == \
            plain[-1].response.output_text


def test_anthropic_progress_rides_on_pings_the_sdk_skips(daemon: Daemon) -> None:
    client = anthropic.Anthropic(base_url=daemon.url, api_key="unused", max_retries=0)
    kw = dict(model="tiny", max_tokens=4, messages=[{"role": "user", "content": PROMPT}])
    greedy = {"temperature": 0}  # the SDK no longer types sampling fields; the API still takes them
    plain = list(client.messages.create(stream=True, extra_body=greedy, **kw))
    asked = list(client.messages.create(stream=True, extra_body={**greedy, "return_progress": True}, **kw))
    assert [e.type for e in asked] == [e.type for e in plain]
    with client.messages.stream(extra_body={**greedy, "return_progress": True}, **kw) as s:
        final = s.get_final_message()
    assert [b.text for b in final.content] == [b.text for b in client.messages.create(extra_body=greedy, **kw).content]
    with httpx.stream("POST", daemon.url + "/v1/messages", timeout=300,
                      json={**kw, **greedy, "stream": True, "return_progress": True}) as r:
        lines = list(r.iter_lines())
    pings = [json.loads(lines[i + 1][6:]) for i, x in enumerate(lines) if x == "event: ping"]
    reports = [p["prompt_progress"] for p in pings if "prompt_progress" in p]
    check_reports(reports, final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0))
    assert lines.index("event: message_start") < next(i for i, x in enumerate(lines) if "prompt_progress" in x)


def test_a_waiting_request_is_told_its_place(daemon: Daemon) -> None:
    gate = StepGate(daemon, "tiny")  # the engine runs one step at a time, when this test says
    engine = daemon.ctx.manager.models["tiny:latest"].engine
    busy: list[dict[str, Any]] = []
    lines: list[dict[str, Any]] = []

    def run(body: dict[str, Any], out: list[dict[str, Any]]) -> None:
        with httpx.stream("POST", daemon.url + "/api/generate", json=body, timeout=300) as r:
            for x in r.iter_lines():
                out.append(json.loads(x))

    threads = [threading.Thread(target=run, daemon=True, args=(
        {"model": "tiny", "prompt": "a stream", "options": {"num_predict": 100_000, "ignore_eos": True}}, busy))]
    holder = None
    try:
        threads[0].start()
        deadline = time.monotonic() + 120
        while not engine.scheduler.running and time.monotonic() < deadline:  # it takes the only slot
            gate.step_if_parked()
            time.sleep(0.01)
        holder = engine.scheduler.running[0].seq_id
        threads.append(threading.Thread(target=run, daemon=True, args=(
            {"model": "tiny", "prompt": "a question", "return_progress": True, "options": GREEDY}, lines)))
        threads[1].start()
        while not engine._inbox and time.monotonic() < deadline:  # no step until the question reaches the engine
            time.sleep(0.01)
        while not any(x.get("prompt_progress", {}).get("reason") for x in lines) and time.monotonic() < deadline:
            gate.step_if_parked()  # one step at a time until the waiting request has been told why it waits
            time.sleep(0.01)
        told = next(x["prompt_progress"] for x in lines if x.get("prompt_progress", {}).get("reason"))
        assert (told["position"], told["reason"], told["processed"]) == (1, "slot", 0)
        assert lines[0]["prompt_progress"]["processed"] == 0 and "reason" not in lines[0]["prompt_progress"]
    finally:
        if holder is not None:
            engine.abort(holder)  # the slot frees: the question goes in
        gate.close()
        for t in threads:
            t.join(120)
    assert lines[-1]["done"]
    check_reports([x["prompt_progress"] for x in lines if "prompt_progress" in x], lines[-1]["prompt_eval_count"])
