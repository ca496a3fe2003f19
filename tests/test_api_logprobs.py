"""Logprobs and n > 1 over HTTP through the official `ollama` and `openai` clients, on every backend: the values
parse into the clients' typed objects, greedy picks the most likely token, streaming carries the same logprobs as
the whole reply, n choices reproduce n seeded single requests while the prompt is computed once."""
from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import ollama
import openai
import pytest

from api_harness import BACKENDS, Daemon, kv_used, start_daemon, upload_model

MSGS = [{"role": "user", "content": "Count to ten."}]
GREEDY = {"temperature": 0, "num_predict": 8}


@pytest.fixture(scope="module", params=BACKENDS)
def daemon(request, tmp_path_factory, synthetic_model) -> Iterator[Daemon]:
    gguf = Path(synthetic_model("tiny", formats=("gguf",))["gguf"])
    d = start_daemon(tmp_path_factory.mktemp("logprobs-api"), backend=request.param, context_length="1024")
    upload_model(d.url, gguf, "tiny")
    yield d
    d.stop()


@pytest.fixture()
def client(daemon: Daemon) -> ollama.Client:
    return ollama.Client(host=daemon.url)


@pytest.fixture()
def oai(daemon: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0)


first_backend_only = pytest.mark.parametrize("daemon", BACKENDS[:1], indirect=True)


def _check_greedy(entries: list[Any], k: int) -> None:
    """Each entry (typed or dict): a log-probability, k alternatives best first, the chosen one the best."""
    for e in entries:
        top = e["top_logprobs"] if isinstance(e, dict) else e.top_logprobs
        vals = [t["logprob"] if isinstance(t, dict) else t.logprob for t in top]
        lp = e["logprob"] if isinstance(e, dict) else e.logprob
        assert len(vals) == k and vals == sorted(vals, reverse=True)
        assert lp <= 0 and lp == pytest.approx(vals[0], abs=1e-6)
        assert sum(math.exp(v) for v in vals) <= 1 + 1e-6


def _joined(entries: list[dict]) -> str:
    """The reply rebuilt from the tokens' bytes; each `token` is its bytes as text (a split character replaced)."""
    for e in entries:
        assert e["token"] == bytes(e.get("bytes") or []).decode("utf-8", errors="replace")
    return b"".join(bytes(e.get("bytes") or []) for e in entries).decode("utf-8", errors="replace")


def test_ollama_generate_and_chat_logprobs(client: ollama.Client, daemon: Daemon) -> None:
    full = client.generate(model="tiny", prompt="Once upon", options=GREEDY, logprobs=True, top_logprobs=3,
                           raw=True)
    assert full.logprobs and len(full.logprobs) <= 8
    _check_greedy(full.logprobs, 3)
    parts = list(client.generate(model="tiny", prompt="Once upon", options=GREEDY, logprobs=True, top_logprobs=3,
                                 raw=True, stream=True))
    streamed = [lp for p in parts for lp in (p.logprobs or [])]
    assert [(lp.token, lp.logprob) for lp in streamed] == [(lp.token, pytest.approx(lp.logprob)) for lp in full.logprobs]
    # `bytes` (not in the client's model) holds the token's raw bytes, as Ollama sends them
    body = httpx.post(daemon.url + "/api/generate", json={"model": "tiny", "prompt": "Once upon", "raw": True,
                                                           "options": GREEDY, "logprobs": True, "stream": False},
                      timeout=60).json()
    assert all("top_logprobs" not in e for e in body["logprobs"])  # top_logprobs 0: omitted, as Go's omitempty
    assert _joined(body["logprobs"]) == body["response"] == full.response
    plain = client.generate(model="tiny", prompt="Once upon", options=GREEDY, raw=True)
    assert plain.logprobs is None and plain.response == full.response

    chat = client.chat(model="tiny", messages=MSGS, options=GREEDY, logprobs=True, top_logprobs=2)
    _check_greedy(chat.logprobs, 2)
    parts = list(client.chat(model="tiny", messages=MSGS, options=GREEDY, logprobs=True, top_logprobs=2, stream=True))
    assert [lp.token for p in parts for lp in (p.logprobs or [])] == [lp.token for lp in chat.logprobs]
    assert "".join(p.message.content for p in parts) == chat.message.content


def test_openai_chat_logprobs(oai: openai.OpenAI) -> None:
    full = oai.chat.completions.create(model="tiny", messages=MSGS, max_tokens=8, temperature=0, logprobs=True,
                                       top_logprobs=4)
    content = full.choices[0].logprobs.content
    assert content and all(isinstance(e, openai.types.chat.ChatCompletionTokenLogprob) for e in content)
    _check_greedy(content, 4)
    assert _joined([e.model_dump() for e in content]) == full.choices[0].message.content
    chunks = list(oai.chat.completions.create(model="tiny", messages=MSGS, max_tokens=8, temperature=0,
                                              logprobs=True, top_logprobs=4, stream=True))
    streamed = [e for c in chunks for e in ((c.choices[0].logprobs and c.choices[0].logprobs.content) or [])]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, pytest.approx(e.logprob)) for e in content]
    assert oai.chat.completions.create(model="tiny", messages=MSGS, max_tokens=2).choices[0].logprobs is None


def test_openai_completions_logprobs(oai: openai.OpenAI) -> None:
    full = oai.completions.create(model="tiny", prompt="def main():", max_tokens=8, temperature=0, logprobs=2)
    c = full.choices[0]
    lp = c.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) > 0
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    for tok, off, value, top in zip(lp.tokens, lp.text_offset, lp.token_logprobs, lp.top_logprobs):
        if tok.isascii():  # a split multi-byte character is one character of the text but two tokens' replacements
            assert c.text[off:off + len(tok)] == tok
        assert value == pytest.approx(max(top.values())) and len(top) <= 2  # equal texts share a key
    chunks = list(oai.completions.create(model="tiny", prompt="def main():", max_tokens=8, temperature=0,
                                         logprobs=2, stream=True))
    got = [(t, o) for ch in chunks if ch.choices and ch.choices[0].logprobs
           for t, o in zip(ch.choices[0].logprobs.tokens, ch.choices[0].logprobs.text_offset)]
    assert got == list(zip(lp.tokens, lp.text_offset))


def _n_vs_single(oai: openai.OpenAI, **kw: Any) -> None:
    many = oai.chat.completions.create(model="tiny", messages=MSGS, n=3, seed=5, **kw)
    singles = [oai.chat.completions.create(model="tiny", messages=MSGS, seed=5 + i, **kw) for i in range(3)]
    assert [c.index for c in many.choices] == [0, 1, 2]
    assert [c.message.content for c in many.choices] == [s.choices[0].message.content for s in singles]
    assert [c.finish_reason for c in many.choices] == [s.choices[0].finish_reason for s in singles]
    assert many.usage.prompt_tokens == singles[0].usage.prompt_tokens
    assert many.usage.completion_tokens == sum(s.usage.completion_tokens for s in singles)
    assert many.usage.total_tokens == many.usage.prompt_tokens + many.usage.completion_tokens


def test_n_choices_are_n_seeded_requests_and_stream_by_index(oai: openai.OpenAI, daemon: Daemon) -> None:
    _n_vs_single(oai, max_tokens=8, temperature=1.0)
    full = oai.chat.completions.create(model="tiny", messages=MSGS, n=3, seed=9, max_tokens=8, temperature=1.0,
                                       logprobs=True)
    chunks = list(oai.chat.completions.create(model="tiny", messages=MSGS, n=3, seed=9, max_tokens=8,
                                              temperature=1.0, logprobs=True, stream=True,
                                              stream_options={"include_usage": True}))
    for i, choice in enumerate(full.choices):
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == i]
        assert mine[0].delta.role == "assistant"
        assert "".join(m.delta.content or "" for m in mine) == choice.message.content
        assert [m.finish_reason for m in mine if m.finish_reason] == [choice.finish_reason]
        assert [e.token for m in mine for e in ((m.logprobs and m.logprobs.content) or [])] == \
            [e.token for e in choice.logprobs.content]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    legacy = oai.completions.create(model="tiny", prompt="abc", n=2, seed=3, max_tokens=6, temperature=1.0)
    solo = [oai.completions.create(model="tiny", prompt="abc", seed=3 + i, max_tokens=6, temperature=1.0)
            for i in range(2)]
    assert [c.text for c in legacy.choices] == [s.choices[0].text for s in solo]
    assert [c.index for c in legacy.choices] == [0, 1]
    streamed = list(oai.completions.create(model="tiny", prompt="abc", n=2, seed=3, max_tokens=6, temperature=1.0,
                                           stream=True))
    for i in range(2):
        assert "".join(c.choices[0].text for c in streamed if c.choices[0].index == i) == legacy.choices[i].text


def test_n_choices_share_one_prompt_computation(oai: openai.OpenAI, daemon: Daemon) -> None:
    oai.completions.create(model="tiny", prompt="x", max_tokens=1)  # load the model
    engine = daemon.ctx.manager.models["tiny:latest"].engine
    steps: list[dict] = []
    unsubscribe = engine.subscribe(lambda e: steps.append(e) if e["type"] == "step" else None)
    try:
        prompt = " ".join(f"w{i}" for i in range(150)) + " unique"
        r = oai.completions.create(model="tiny", prompt=prompt, n=4, max_tokens=2, temperature=1.0)
    finally:
        unsubscribe()
    assert len(r.choices) == 4
    computed = sum(e["prefill_tokens"] for e in steps)
    # the first choice computes the prompt; the others only what follows its last full cached block
    assert r.usage.prompt_tokens > 4 * engine.block_size
    assert computed <= r.usage.prompt_tokens + 3 * engine.block_size


def test_n_with_response_format_constrains_every_choice(oai: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {"k": {"enum": ["a", "bb", "ccc"]}}, "required": ["k"],
              "additionalProperties": False}
    r = oai.chat.completions.create(model="tiny", messages=MSGS, n=3, seed=1, temperature=1.0, max_tokens=40,
                                    response_format={"type": "json_schema",
                                                     "json_schema": {"name": "k", "schema": schema}})
    for c in r.choices:
        assert c.finish_reason == "stop" and json.loads(c.message.content)["k"] in ("a", "bb", "ccc")


@first_backend_only
def test_disconnect_aborts_every_choice(daemon: Daemon) -> None:
    with httpx.Client(base_url=daemon.url, timeout=60) as c:
        body = {"model": "tiny", "prompt": "a long story", "n": 3, "max_tokens": 100000, "temperature": 1.0,
                "stream": True, "ignore_eos": True}  # no choice may end on its own before the disconnect
        with c.stream("POST", "/v1/completions", json=body) as r:
            lines = (ln for ln in r.iter_lines() if ln.startswith("data: "))
            seen: set[int] = set()
            while len(seen) < 3:
                seen.add(json.loads(next(lines)[6:])["choices"][0]["index"])
            s = daemon.ctx.manager.models["tiny:latest"].engine.stats()
            # all three are alive; one may be waiting to recompute after a context shift (1024-token window)
            assert s.running + s.waiting == 3
    engine = daemon.ctx.manager.models["tiny:latest"].engine
    deadline = time.monotonic() + 20
    while (kv_used(daemon, "tiny:latest") or not engine.idle) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert kv_used(daemon, "tiny:latest") == 0 and engine.stats().running == 0 and engine.idle


@first_backend_only
def test_bad_logprobs_and_n_are_clear_400s(oai: openai.OpenAI, daemon: Daemon) -> None:
    cases = [
        (dict(logprobs=True, top_logprobs=21), "top_logprobs must be between 0 and 20"),
        (dict(top_logprobs=2), "top_logprobs needs logprobs: true"),
        (dict(n=0), "n must be between 1 and"),
        (dict(n=9), "n must be between 1 and"),
    ]
    for kw, msg in cases:
        with pytest.raises(openai.BadRequestError) as exc:
            oai.chat.completions.create(model="tiny", messages=MSGS, max_tokens=2, **kw)
        assert msg in exc.value.message
    for v in (21, -1, True):
        with pytest.raises(openai.BadRequestError) as exc:
            oai.completions.create(model="tiny", prompt="x", max_tokens=2, logprobs=v)
        assert "logprobs must be an integer between 0 and 20" in exc.value.message
    for path, extra in (("/api/generate", {"prompt": "x"}), ("/api/chat", {"messages": MSGS})):
        r = httpx.post(daemon.url + path, json={"model": "tiny", "logprobs": True, "top_logprobs": 21, **extra})
        assert r.status_code == 400 and r.json() == {"error": "top_logprobs must be between 0 and 20, got 21"}
