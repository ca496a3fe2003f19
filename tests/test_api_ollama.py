"""The Ollama API driven by the official `ollama` client (sync and async) against a real daemon on loopback."""
from __future__ import annotations

import asyncio
import json
import math
import time
from pathlib import Path
from typing import Iterator

import httpx
import ollama
import pytest

from api_harness import BACKENDS, Daemon, start_daemon, upload_model

GREEDY = {"temperature": 0, "num_predict": 12}


@pytest.fixture(scope="module", params=BACKENDS)
def daemon(request, tmp_path_factory, synthetic_model) -> Iterator[Daemon]:
    gguf = Path(synthetic_model("tiny", formats=("gguf",))["gguf"])
    d = start_daemon(tmp_path_factory.mktemp("ollama-api"), backend=request.param, context_length="1024")
    upload_model(d.url, gguf, "tiny")
    d.gguf = gguf  # type: ignore[attr-defined]
    yield d
    d.stop()


@pytest.fixture()
def client(daemon: Daemon) -> ollama.Client:
    return ollama.Client(host=daemon.url)


def test_root_version_and_head(daemon: Daemon) -> None:
    r = httpx.get(daemon.url + "/")
    assert r.status_code == 200 and r.text == "Ollama is running"
    assert httpx.head(daemon.url + "/").status_code == 200
    assert httpx.get(daemon.url + "/api/version").json()["version"].count(".") == 2
    assert httpx.get(daemon.url + "/api/nowhere").status_code == 404


def test_list_and_show(client: ollama.Client) -> None:
    names = [m.model for m in client.list().models]
    assert "tiny:latest" in names
    entry = next(m for m in client.list().models if m.model == "tiny:latest")
    assert entry.size > 0 and len(entry.digest) == 64 and entry.details.format == "gguf"
    info = client.show("tiny")
    assert info.modelinfo is not None and info.details.family == "llama"
    assert "completion" in (info.capabilities or [])
    assert info.template  # the chat template from the GGUF


def test_create_copy_delete(client: ollama.Client, daemon: Daemon) -> None:
    digest = client.create_blob(daemon.gguf)  # type: ignore[attr-defined]
    statuses = [p.status for p in client.create(model="made", files={"m.gguf": digest}, system="be brief",
                                                parameters={"temperature": 0.1}, stream=True)]
    assert statuses[-1] == "success"
    assert "be brief" in (client.show("made").modelfile or "")
    assert client.copy("made", "made-copy").status == "success"
    names = {m.model for m in client.list().models}
    assert {"made:latest", "made-copy:latest"} <= names
    assert client.delete("made-copy").status == "success"
    assert client.delete("made").status == "success"
    with pytest.raises(ollama.ResponseError) as exc:
        client.show("made")
    assert exc.value.status_code == 404 and "not found" in exc.value.error
    assert "tiny:latest" in {m.model for m in client.list().models}  # its blob is shared and must survive


def test_generate_streamed_equals_unstreamed(client: ollama.Client) -> None:
    full = client.generate("tiny", "The quick brown fox", options=GREEDY)
    parts = list(client.generate("tiny", "The quick brown fox", options=GREEDY, stream=True))
    assert all(not p.done for p in parts[:-1]) and parts[-1].done
    assert "".join(p.response for p in parts) == full.response
    final = parts[-1]
    assert final.done_reason in ("stop", "length")
    assert final.eval_count and final.eval_count <= 12 and final.prompt_eval_count
    assert final.total_duration >= final.eval_duration > 0
    assert all(p.eval_count is None for p in parts[:-1])  # metrics only on the final chunk
    assert final.context and len(final.context) == final.prompt_eval_count + final.eval_count - (
        1 if final.done_reason == "stop" else 0)


def test_ignore_eos_runs_past_the_end_token(client: ollama.Client, daemon: Daemon) -> None:
    """`ignore_eos` (llama-server's and vLLM's extension): a greedy run that ended on EOS goes on to num_predict,
    with the same tokens up to where the EOS was."""
    opts = {"temperature": 0, "num_predict": 200}
    ended = [(p, r) for p in (f"story {i}" for i in range(8))
             if (r := client.generate("tiny", p, options=opts)).done_reason == "stop"]
    if not ended:
        pytest.skip("no greedy run of these prompts ends on EOS with this model on this machine")
    prompt, short = ended[0]
    full = client.generate("tiny", prompt, options={**opts, "ignore_eos": True})
    assert full.done_reason == "length" and full.eval_count == 200 > short.eval_count
    assert full.response.startswith(short.response)
    oai = httpx.post(f"{daemon.url}/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": 200,
                                                            "temperature": 0, "ignore_eos": True}, timeout=120)
    assert oai.status_code == 200 and oai.json()["usage"]["completion_tokens"] == 200, oai.text
    with pytest.raises(ollama.ResponseError, match="ignore_eos") as e:
        client.generate("tiny", prompt, options={"ignore_eos": "yes"})
    assert e.value.status_code == 400


def test_generate_context_continues(client: ollama.Client) -> None:
    first = client.generate("tiny", "Once upon a time", options=GREEDY)
    second = client.generate("tiny", "and then", context=first.context, options=GREEDY)
    assert second.prompt_eval_count > len(first.context)
    raw = client.generate("tiny", "raw text", raw=True, options=GREEDY)
    assert raw.context is None and raw.done


def test_chat_streamed_and_not(client: ollama.Client) -> None:
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hello"}]
    full = client.chat("tiny", messages=msgs, options=GREEDY)
    assert full.message.role == "assistant" and full.done
    parts = list(client.chat("tiny", messages=msgs, options=GREEDY, stream=True))
    assert "".join(p.message.content or "" for p in parts) == full.message.content
    assert parts[-1].done and parts[-1].done_reason == full.done_reason
    assert all(p.message.role == "assistant" for p in parts)


def test_load_unload_and_ps(client: ollama.Client, daemon: Daemon) -> None:
    r = httpx.post(daemon.url + "/api/generate", json={"model": "tiny", "stream": False}, timeout=120).json()
    assert r["done_reason"] == "load" and r["response"] == ""
    ps = client.ps().models
    assert [m.model for m in ps] == ["tiny:latest"]
    assert ps[0].context_length == 1024 and ps[0].size > 0 and ps[0].expires_at is not None
    r = httpx.post(daemon.url + "/api/chat", json={"model": "tiny", "messages": [], "keep_alive": 0}, timeout=120).json()
    assert r["done_reason"] == "unload" and r["message"]["role"] == "assistant"
    assert client.ps().models == []
    client.generate("tiny", "hi", options={"num_predict": 1}, keep_alive=0)  # 0 unloads after the request
    deadline = time.monotonic() + 60  # the unload runs after the reply: wait for it, not for a margin
    while client.ps().models and time.monotonic() < deadline:
        time.sleep(0.05)
    assert client.ps().models == []
    client.generate("tiny", "hi", options={"num_predict": 1}, keep_alive=-1)
    assert client.ps().models[0].expires_at.year > 2100  # forever


def test_embed_normalised_and_legacy(client: ollama.Client) -> None:
    r = client.embed("tiny", input=["hello world", "something else"])
    assert len(r.embeddings) == 2 and len(r.embeddings[0]) == 64
    for v in r.embeddings:
        assert math.isclose(math.sqrt(sum(x * x for x in v)), 1.0, rel_tol=1e-4)
    assert r.embeddings[0] != r.embeddings[1]
    short = client.embed("tiny", input="hello world", dimensions=16).embeddings[0]
    assert len(short) == 16 and math.isclose(math.sqrt(sum(x * x for x in short)), 1.0, rel_tol=1e-4)
    legacy = client.embeddings("tiny", prompt="hello world").embedding
    norm = math.sqrt(sum(x * x for x in legacy))
    assert len(legacy) == 64 and not math.isclose(norm, 1.0, rel_tol=1e-3)
    assert all(math.isclose(a / norm, b, abs_tol=1e-4) for a, b in zip(legacy, r.embeddings[0]))


def test_async_client(daemon: Daemon) -> None:
    async def main() -> None:
        c = ollama.AsyncClient(host=daemon.url)
        assert "tiny:latest" in [m.model for m in (await c.list()).models]
        g = await c.generate("tiny", "async prompt", options=GREEDY)
        parts = [p async for p in await c.generate("tiny", "async prompt", options=GREEDY, stream=True)]
        assert "".join(p.response for p in parts) == g.response
        chat = await c.chat("tiny", messages=[{"role": "user", "content": "hey"}], options=GREEDY)
        assert chat.message.role == "assistant" and chat.eval_count
        assert (await c.ps()).models[0].model == "tiny:latest"
        assert len((await c.embed("tiny", input="x")).embeddings[0]) == 64
        assert (await c.show("tiny")).details.format == "gguf"

    asyncio.run(main())


def test_eight_concurrent_streams_match_solo_runs(daemon: Daemon) -> None:
    prompts = [f"Prompt number {i}: tell me about {w}" for i, w in enumerate(
        ["cats", "dogs", "trees", "rivers", "stars", "code", "music", "rain"])]
    opts = {"temperature": 0, "num_predict": 16}
    solo = [ollama.Client(host=daemon.url).chat("tiny", messages=[{"role": "user", "content": p}], options=opts)
            .message.content for p in prompts]

    async def one(c: ollama.AsyncClient, p: str) -> str:
        out = []
        async for part in await c.chat("tiny", messages=[{"role": "user", "content": p}], options=opts, stream=True):
            out.append(part.message.content or "")
        return "".join(out)

    async def main() -> list[str]:
        c = ollama.AsyncClient(host=daemon.url)
        return await asyncio.gather(*(one(c, p) for p in prompts))

    together = asyncio.run(main())
    assert together == solo
    assert len(set(together)) > 1  # independent outputs, not one stream copied eight times


def test_concurrent_first_requests_share_one_load(daemon: Daemon) -> None:
    def loads() -> float:
        for line in httpx.get(daemon.url + "/metrics").text.splitlines():
            if line.startswith("evenflow_model_loads_total{") and 'model="tiny:latest"' in line:
                return float(line.split()[-1])
        return 0.0

    httpx.post(daemon.url + "/api/generate", json={"model": "tiny", "keep_alive": 0})  # unload
    before = loads()

    async def main() -> list:
        c = ollama.AsyncClient(host=daemon.url)
        return await asyncio.gather(*(c.generate("tiny", f"p{i}", options={"num_predict": 2}) for i in range(4)))

    assert all(r.done for r in asyncio.run(main()))
    assert loads() == before + 1


def test_unsupported_features_are_clear_400s(client: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as exc:
        client.chat("tiny", messages=[{"role": "user", "content": "x"}], think=True)
    assert exc.value.status_code == 400 and 'does not support thinking' in exc.value.error
    with pytest.raises(ollama.ResponseError) as exc:
        client.generate("tiny", "x", format={"type": "nonsense"})
    assert exc.value.status_code == 400 and "Invalid type: nonsense" in exc.value.error
    tool = {"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object",
                                                                                            "properties": {}}}}
    with pytest.raises(ollama.ResponseError) as exc:
        client.chat("tiny", messages=[{"role": "user", "content": "x"}], tools=[tool])
    assert exc.value.status_code == 400 and "does not support tools" in exc.value.error
    with pytest.raises(ollama.ResponseError) as exc:
        client.pull("127.0.0.1:9/library/tiny", insecure=True)  # loopback: nothing listens on port 9
    assert "cannot reach the registry at 127.0.0.1:9" in exc.value.error


def test_metrics_and_events(daemon: Daemon, client: ollama.Client) -> None:
    with httpx.stream("GET", daemon.url + "/api/events", timeout=30) as ev:
        lines = ev.iter_lines()
        hello = json.loads(next(lines))
        assert hello["type"] == "hello" and hello["log_content"] is False
        client.generate("tiny", "count the events", options={"temperature": 0, "num_predict": 4})
        seen = []
        for line in lines:
            e = json.loads(line)
            seen.append(e)
            if e.get("event") == "finished":
                break
    kinds = [e.get("event") for e in seen if e["type"] == "request"]
    assert kinds[0] == "queued" and "first_token" in kinds and kinds[-1] == "finished"
    assert any(e["type"] == "step" and e["kv_total"] > 0 for e in seen)
    assert all("text" not in e and "prompt" not in e.get("user", {}) for e in seen)  # no content without the flag
    text = httpx.get(daemon.url + "/metrics").text
    assert 'evenflow_generated_tokens_total{model="tiny:latest"}' in text
    assert "evenflow_time_to_first_token_seconds_bucket" in text and "evenflow_kv_blocks_total" in text
    assert 'evenflow_http_requests_total{endpoint="/api/generate",status="200"}' in text


HERMES_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools:{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n"
    "Answer with <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\n{%- endif %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}")


def test_tools_and_thinking_templates(client: ollama.Client, daemon: Daemon) -> None:
    digest = client.create_blob(daemon.gguf)  # type: ignore[attr-defined]
    client.create(model="tooly", files={"m.gguf": digest}, template=HERMES_TEMPLATE)
    assert {"tools", "thinking"} <= set(client.show("tooly").capabilities or [])
    tool = {"type": "function", "function": {"name": "get_weather", "description": "weather for a city",
                                             "parameters": {"type": "object", "required": ["city"],
                                                            "properties": {"city": {"type": "string"}}}}}
    msgs = [{"role": "user", "content": "weather in Paris?"}]
    plain = client.chat("tooly", messages=msgs, options=GREEDY, think=False)
    with_tools = client.chat("tooly", messages=msgs, tools=[tool], options=GREEDY, think=True)
    assert with_tools.prompt_eval_count > plain.prompt_eval_count + 10  # the tool schema reached the prompt
    assert with_tools.message.role == "assistant"
    parts = list(client.chat("tooly", messages=msgs, tools=[tool], options=GREEDY, stream=True))
    assert "".join((p.message.thinking or "") + (p.message.content or "") for p in parts) == \
        (with_tools.message.thinking or "") + (with_tools.message.content or "")
    client.delete("tooly")


def test_lru_eviction_and_demo_model(tmp_path: Path, synthetic_model) -> None:
    d = start_daemon(tmp_path, backend=BACKENDS[0], max_loaded_models="1", no_demo=False)
    try:
        c = ollama.Client(host=d.url)
        assert [m.model for m in c.list().models] == ["demo:latest"]  # created on first start
        assert "synthetic" in (c.show("demo").license or "")
        upload_model(d.url, Path(synthetic_model("tiny", formats=("gguf",))["gguf"]), "tiny")
        c.generate("demo", "hello", options={"num_predict": 2})
        assert [m.model for m in c.ps().models] == ["demo:latest"]
        c.generate("tiny", "hello", options={"num_predict": 2})
        assert [m.model for m in c.ps().models] == ["tiny:latest"]  # the idle demo was evicted (limit 1)
    finally:
        d.stop()


def test_events_carry_content_with_log_content(tmp_path: Path, synthetic_model) -> None:
    d = start_daemon(tmp_path, backend=BACKENDS[0], log_content="1")
    try:
        upload_model(d.url, Path(synthetic_model("tiny", formats=("gguf",))["gguf"]), "tiny")
        c = ollama.Client(host=d.url)
        with httpx.stream("GET", d.url + "/api/events", timeout=30) as ev:
            lines = ev.iter_lines()
            assert json.loads(next(lines))["log_content"] is True
            out = c.generate("tiny", "secret prompt", options={"temperature": 0, "num_predict": 5})
            events = []
            for line in lines:
                events.append(json.loads(line))
                if events[-1].get("event") == "finished":
                    break
        loaded = [e for e in events if e["type"] == "model" and e["event"] == "loaded"]
        # no OLLAMA_NUM_PARALLEL: on a CPU the KV pool holds 8 full windows, so 8 slots
        assert loaded and loaded[0]["slots"] == 8 and loaded[0]["kv_tokens"] >= 8 * loaded[0]["context_length"]
        req = [e for e in events if e["type"] == "request"]
        assert req[0]["event"] == "queued" and "secret prompt" in req[0]["prompt"]
        # the prompt goes out once, on `queued`: token events carry only their new text
        assert [e["event"] for e in req if "prompt" in e] == ["queued"] and all("prompt" not in e["user"] for e in req)
        assert sum(e["event"] == "token" for e in req) >= 4
        assert "".join(e.get("text", "") for e in req if e["event"] in ("token", "finished")) == out.response
        with httpx.stream("GET", d.url + "/api/events", timeout=30) as ev:  # the /v1 endpoints log it too
            lines = ev.iter_lines()
            next(lines)
            r = httpx.post(d.url + "/v1/completions", json={"model": "tiny", "prompt": "another secret",
                                                             "max_tokens": 2}, timeout=30)
            assert r.status_code == 200
            queued = next(e for e in map(json.loads, lines) if e.get("event") == "queued")
        assert queued["user"] == {"model": "tiny:latest", "endpoint": "/v1/completions"}
        assert queued["prompt"] == "another secret"
    finally:
        d.stop()


def test_prefix_cache_hits_reported_over_http(daemon: Daemon, client: ollama.Client) -> None:
    """A second question about the same document: steps report cached tokens, /metrics counts them, and
    prompt_eval_count stays the whole prompt (as Ollama's runner reports it with a warm cache)."""
    doc = "Document: " + " ".join(f"line {i} of the shared report." for i in range(40))
    opts = {"temperature": 0, "num_predict": 3}
    first = client.generate("tiny", doc + "\nFirst question?", options=opts)
    with httpx.stream("GET", daemon.url + "/api/events", timeout=30) as ev:
        lines = ev.iter_lines()
        assert json.loads(next(lines))["type"] == "hello"
        second = client.generate("tiny", doc + "\nSecond question?", options=opts)
        cached = 0
        for line in lines:
            e = json.loads(line)
            cached += e.get("cached_tokens", 0) if e["type"] == "step" else 0
            if e.get("event") == "finished":
                break
    assert cached >= 64, "the shared document should have been served from the prefix cache"
    assert second.prompt_eval_count >= first.prompt_eval_count - 2 > cached  # the whole prompt, cached or not
    hits = [float(line.rsplit(" ", 1)[1]) for line in httpx.get(daemon.url + "/metrics").text.splitlines()
            if line.startswith('evenflow_prefix_cache_hit_tokens_total{model="tiny:latest"}')]
    assert hits and hits[0] >= cached
