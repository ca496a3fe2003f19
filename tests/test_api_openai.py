"""The OpenAI-compatible /v1 API driven by the official `openai` client against a real daemon on loopback."""
from __future__ import annotations

import base64
import math
import struct
from pathlib import Path
from typing import Iterator

import httpx
import openai
import pytest

from api_harness import BACKENDS, Daemon, start_daemon, upload_model


@pytest.fixture(scope="module", params=BACKENDS)
def daemon(request, tmp_path_factory, synthetic_model) -> Iterator[Daemon]:
    gguf = Path(synthetic_model("tiny", formats=("gguf",))["gguf"])
    d = start_daemon(tmp_path_factory.mktemp("openai-api"), backend=request.param, context_length="1024")
    upload_model(d.url, gguf, "tiny")
    yield d
    d.stop()


@pytest.fixture()
def client(daemon: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0)


MSGS = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Name a colour"}]


def test_chat_completion_and_stream_agree(client: openai.OpenAI) -> None:
    full = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=10, temperature=0, seed=1)
    assert full.object == "chat.completion" and full.id.startswith("chatcmpl-")
    choice = full.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
    assert full.usage.completion_tokens <= 10 and full.usage.prompt_tokens > 0
    assert full.usage.total_tokens == full.usage.prompt_tokens + full.usage.completion_tokens
    if choice.finish_reason == "length":
        assert full.usage.completion_tokens == 10
    chunks = list(client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=10, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == choice.finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_stop_and_sampling_options(client: openai.OpenAI) -> None:
    a = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=8, temperature=0.9, top_p=0.9,
                                       seed=42, frequency_penalty=0.5, presence_penalty=0.5)
    b = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=8, temperature=0.9, top_p=0.9,
                                       seed=42, frequency_penalty=0.5, presence_penalty=0.5)
    assert a.choices[0].message.content == b.choices[0].message.content  # a seed reproduces the sample
    base = client.completions.create(model="tiny", prompt="abc", max_tokens=12, temperature=0).choices[0].text
    if len(base) > 3:
        stop = base[2:4]
        cut = client.completions.create(model="tiny", prompt="abc", max_tokens=12, temperature=0, stop=[stop])
        assert cut.choices[0].text == base[: base.index(stop)] and cut.choices[0].finish_reason == "stop"


def test_completions(client: openai.OpenAI) -> None:
    full = client.completions.create(model="tiny", prompt="def main():", max_tokens=8, temperature=0)
    assert full.object == "text_completion" and full.usage.completion_tokens <= 8
    chunks = list(client.completions.create(model="tiny", prompt="def main():", max_tokens=8, temperature=0,
                                            stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full.choices[0].text
    assert chunks[-1].choices[0].finish_reason == full.choices[0].finish_reason


def test_models(client: openai.OpenAI) -> None:
    ids = [m.id for m in client.models.list()]
    assert "tiny:latest" in ids
    m = client.models.retrieve("tiny:latest")
    assert m.id == "tiny:latest" and m.object == "model" and m.owned_by == "library" and m.created > 0
    with pytest.raises(openai.NotFoundError) as exc:
        client.models.retrieve("missing-model")
    assert "not found" in exc.value.message


def test_embeddings(client: openai.OpenAI) -> None:
    r = client.embeddings.create(model="tiny", input=["one", "two"])
    assert [d.index for d in r.data] == [0, 1] and r.usage.prompt_tokens > 0
    v = r.data[0].embedding
    assert len(v) == 64 and math.isclose(math.sqrt(sum(x * x for x in v)), 1.0, rel_tol=1e-4)
    b64 = client.embeddings.create(model="tiny", input="one", encoding_format="base64", dimensions=8)
    raw = b64.data[0].embedding
    vec = list(struct.unpack("<8f", base64.b64decode(raw))) if isinstance(raw, str) else raw
    assert len(vec) == 8 and math.isclose(math.sqrt(sum(x * x for x in vec)), 1.0, rel_tol=1e-4)


def test_openai_error_shape(client: openai.OpenAI, daemon: Daemon) -> None:
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=MSGS)
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model="tiny", messages=[])
    assert "too short" in exc.value.message
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model="tiny", messages=MSGS, response_format={"type": "xml"})
    assert "invalid response_format" in exc.value.message
    r = httpx.post(daemon.url + "/v1/chat/completions", content=b"{not json")
    body = r.json()
    assert r.status_code == 400 and body["error"]["type"] == "invalid_request_error"
    assert set(body["error"]) == {"message", "type", "param", "code"}
    r = httpx.post(daemon.url + "/v1/embeddings", json={"model": "tiny", "input": []})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"
