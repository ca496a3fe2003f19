"""A bounded bad-input fuzzer (issue 14): hypothesis draws an endpoint and bodies with wrong types, extreme numbers,
odd unicode, nesting and sizes. Any 5xx, a non-JSON error body, a hang or a daemon that stops answering fails."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api_harness import BACKENDS, Daemon, start_daemon, upload_model

CASES = 300  # about a minute on a loaded 2-core machine

# Endpoint -> a valid base body (generation kept short) and the fields worth breaking.
ENDPOINTS: dict[str, tuple[dict[str, Any], list[str]]] = {
    "/api/generate": ({"model": "tiny", "prompt": "hi", "stream": False, "options": {"num_predict": 2}},
                      ["model", "prompt", "system", "template", "suffix", "context", "raw", "format", "options",
                       "keep_alive", "think", "images", "stream"]),
    "/api/chat": ({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": False,
                   "options": {"num_predict": 2}},
                  ["model", "messages", "tools", "format", "options", "keep_alive", "think", "stream"]),
    "/api/embed": ({"model": "tiny", "input": "hi"}, ["model", "input", "truncate", "dimensions", "keep_alive",
                                                      "options"]),
    "/api/embeddings": ({"model": "tiny", "prompt": "hi"}, ["model", "prompt", "keep_alive", "options"]),
    "/api/show": ({"model": "tiny"}, ["model", "name", "verbose", "system", "options"]),
    "/api/create": ({"model": "fuzzed", "from": "tiny"}, ["model", "from", "files", "template", "system",
                                                          "parameters", "messages", "license", "quantize"]),
    "/api/copy": ({"source": "tiny", "destination": "fuzzcopy"}, ["source", "destination"]),
    "/v1/chat/completions": ({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
                             ["model", "messages", "temperature", "top_p", "frequency_penalty", "presence_penalty",
                              "max_tokens", "stop", "seed", "tools", "response_format", "reasoning_effort", "n",
                              "stream", "stream_options"]),
    "/v1/completions": ({"model": "tiny", "prompt": "hi", "max_tokens": 2},
                        ["model", "prompt", "suffix", "temperature", "top_p", "max_tokens", "stop", "seed",
                         "stream"]),
    "/v1/embeddings": ({"model": "tiny", "input": "hi"}, ["model", "input", "encoding_format", "dimensions"]),
}

text = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["", " ", "\x00", "\ud800", "\udfff", "../../etc/passwd", "a" * 300 + "/x/y:z", "{{ . }}",
                     "{{ range 100000 }}x{{ end }}", "{% for i in range(99999) %}{% endfor %}", "{{ .Foo.Bar }}",
                     "{{ end }}", "{%", "é" * 1000, "\u202e\ufeff", "tiny", "tiny:latest", "sha256:" + "0" * 64]),
    st.text(alphabet=st.characters(codec="utf-8"), min_size=1000, max_size=5000),
)
number = st.one_of(st.integers(-(2**70), 2**70), st.floats(allow_nan=False, allow_infinity=False),
                   st.sampled_from([0, -1, -2, 2**63, 2**64, 1e308, -1e308, 1e-320, 0.5]))
scalar = st.one_of(st.none(), st.booleans(), number, text)
nested = st.recursive(scalar, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                      st.dictionaries(st.text(max_size=10), inner, max_size=4)),
                      max_leaves=12)
value = st.one_of(scalar, nested)


@st.composite
def raw_json(draw) -> bytes:
    """Bodies json.dumps cannot make: deep nesting, numbers past float range, lone surrogates, garbage."""
    kind = draw(st.sampled_from(["deep", "bignum", "surrogate", "garbage", "notobject", "bomb"]))
    if kind == "bomb":  # a request template that would build a huge value in one step (issue 14)
        n = draw(st.integers(10**8, 10**10))
        shape = draw(st.sampled_from(['{{ "x" * N }}{# #}', '{{ "x"|center(N) }}{# #}', '{{ "%Ns"|format("x") }}{# #}',
                                      '{{ "x"|indent(N) }}{# #}', '{{ "{:>N}".format("x") }}{# #}',
                                      '{{ printf "%Ns" "x" }}', '{{ "ab"|replace("", "y") * N }}{# #}']))
        return json.dumps({"model": "tiny", "prompt": "x", "template": shape.replace("N", str(n))}).encode()
    if kind == "deep":
        n = draw(st.integers(100, 20000))
        return b'{"model": "tiny", "options": ' + b"[" * n + b"]" * n + b"}"
    if kind == "bignum":
        digits = draw(st.integers(20, 6000))
        field = draw(st.sampled_from(["keep_alive", "temperature", "max_tokens", "seed", "num_ctx", "dimensions"]))
        return f'{{"model": "tiny", "prompt": "x", "{field}": 1{"0" * digits}}}'.encode()
    if kind == "surrogate":
        field = draw(st.sampled_from(["prompt", "system", "template", "input", "model"]))
        return f'{{"model": "tiny", "{field}": "a\\ud800b", "messages": [{{"role": "user", "content": "\\udc00"}}]}}'.encode()
    if kind == "garbage":
        return draw(st.binary(max_size=200))
    return json.dumps(draw(st.one_of(st.lists(scalar, max_size=3), scalar))).encode()


@st.composite
def case(draw) -> tuple[str, bytes]:
    path = draw(st.sampled_from(sorted(ENDPOINTS)))
    if draw(st.integers(0, 4)) == 0:
        return path, draw(raw_json())
    base, fields = ENDPOINTS[path]
    body = json.loads(json.dumps(base))
    for f in draw(st.lists(st.sampled_from(fields), min_size=1, max_size=3, unique=True)):
        body[f] = draw(value)
    if isinstance(body.get("options"), dict):
        body["options"].setdefault("num_predict", 2)  # a valid request still finishes quickly
    return path, json.dumps(body, allow_nan=False).encode("utf-8", "surrogatepass")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, synthetic_model) -> Iterator[Daemon]:
    gguf = Path(synthetic_model("tiny", formats=("gguf",))["gguf"])
    d = start_daemon(tmp_path_factory.mktemp("fuzz"), backend=BACKENDS[0], context_length="256")
    upload_model(d.url, gguf, "tiny")
    yield d
    d.stop()


def _check(r: httpx.Response, path: str) -> None:
    assert r.status_code < 500, f"{path} -> {r.status_code}: {r.text[:300]}"
    if r.status_code >= 400:
        body = r.json()  # raises on a non-JSON error body
        err = body.get("error")
        assert isinstance(err, dict if path.startswith("/v1/") else str) and err, body
        return
    for line in r.text.split("\n"):  # a 200: one JSON object, NDJSON lines or SSE events, none an error
        # (split on "\n" only: splitlines would also cut at U+0085 inside a JSON string)
        line = line.removeprefix("data: ").strip()
        if line and line != "[DONE]":
            assert "error" not in json.loads(line), line[:300]


def test_fuzzed_bad_input_never_breaks_the_daemon(daemon: Daemon) -> None:
    with httpx.Client(base_url=daemon.url, timeout=60) as c:

        @settings(max_examples=CASES, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(case())
        def one(pc: tuple[str, bytes]) -> None:
            path, body = pc
            r = c.post(path, content=body, headers={"Content-Type": "application/json"})  # a hang: ReadTimeout
            _check(r, path)
            assert c.get("/api/version").status_code == 200  # still answering

        one()
