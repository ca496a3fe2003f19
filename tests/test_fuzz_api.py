"""A bounded bad-input fuzzer (issues 14 and 27), loopback only. Requests: hypothesis draws an endpoint and bodies with
wrong types, extreme numbers, odd unicode, nesting, sizes and `format` schemas. Model files: mutated GGUF headers and
tensor tables, safetensors configs, headers and index files, uploaded through /api/blobs and created, then used.
Any 5xx, a non-JSON error body, a hang or a daemon that stops answering (or dies) fails.
Sizes: EVENFLOW_FUZZ_CASES (requests, default 300) and EVENFLOW_FUZZ_MODEL_CASES (model files per backend, 60)."""
from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api_harness import BACKENDS, Daemon, start_daemon, upload_model

CASES = int(os.environ.get("EVENFLOW_FUZZ_CASES", "300"))  # about a minute on a loaded 2-core machine

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

# `format` / response_format: JSON schemas a grammar engine may choke on (bad types, huge bounds, bad regexes,
# reference loops, deep nesting), besides the generic bad values
_SCHEMA_LEAVES = [{"type": t} for t in ("string", "integer", "number", "boolean", "null", "object", "array", "wat")] + [
    {}, {"enum": []}, {"enum": [1, "a", None, {"x": [1]}]}, {"const": "x"}, {"pattern": "(a+)+$"}, {"pattern": "["},
    {"type": "string", "minLength": 10**9}, {"type": "string", "maxLength": -1}, {"type": "integer", "minimum": 1e308},
    {"type": "number", "multipleOf": 0}, {"$ref": "#"}, {"$ref": "#/$defs/nope"}, {"format": "email"},
    {"type": ["string", "null"]}, {"not": {}}, {"anyOf": []}, {"type": "array", "minItems": 10**9},
    {"type": "object", "additionalProperties": False, "required": ["a"]}, {"type": "string", "pattern": "x{99999}"}]
schema = st.recursive(st.sampled_from(_SCHEMA_LEAVES), lambda inner: st.one_of(
    st.builds(lambda props, req: {"type": "object", "properties": props, "required": req},
              st.dictionaries(st.text(max_size=8), inner, max_size=4), st.lists(st.text(max_size=8), max_size=3)),
    st.builds(lambda items: {"type": "array", "items": items}, inner),
    st.builds(lambda xs: {"anyOf": xs}, st.lists(inner, max_size=3)),
    st.builds(lambda xs: {"allOf": xs}, st.lists(inner, max_size=3)),
    st.builds(lambda d: {"$defs": {"a": d}, "$ref": "#/$defs/a"}, inner)), max_leaves=10)
format_value = st.one_of(st.sampled_from(["json", "", "JSON", "xml"]), schema, value)
response_format = st.one_of(value, st.builds(lambda sch: {"type": "json_schema", "json_schema": {"name": "x", "schema": sch}},
                                             st.one_of(schema, value)),
                            st.sampled_from([{"type": "json_object"}, {"type": "text"}, {"type": "json_schema"}]))


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
        body[f] = draw(format_value if f == "format" else response_format if f == "response_format" else value)
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
    statuses: Counter[int] = Counter()
    with httpx.Client(base_url=daemon.url, timeout=60) as c:

        @settings(max_examples=CASES, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(case())
        def one(pc: tuple[str, bytes]) -> None:
            path, body = pc
            r = c.post(path, content=body, headers={"Content-Type": "application/json"})  # a hang: ReadTimeout
            statuses[r.status_code] += 1
            _check(r, path)
            assert c.get("/api/version").status_code == 200  # still answering

        one()
    print(f"\nfuzz requests: {sum(statuses.values())} tried, statuses {dict(sorted(statuses.items()))}, "
          f"5xx {sum(n for k, n in statuses.items() if k >= 500)}")


# ---------------------------------------------------------------------------------------------- model files

MODEL_CASES = int(os.environ.get("EVENFLOW_FUZZ_MODEL_CASES", "60"))  # per backend; ~1-2 minutes each here
_GGUF_KEYS = ["general.architecture", "general.alignment", "general.file_type", "llama.block_count",
              "llama.context_length", "llama.embedding_length", "llama.feed_forward_length",
              "llama.attention.head_count", "llama.attention.head_count_kv", "llama.attention.key_length",
              "llama.attention.value_length", "llama.rope.dimension_count", "llama.rope.freq_base",
              "llama.attention.layer_norm_rms_epsilon", "llama.expert_count", "llama.expert_used_count",
              "llama.vocab_size", "llama.rope.scaling.type", "tokenizer.ggml.model", "tokenizer.ggml.pre",
              "tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges",
              "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.add_bos_token",
              "tokenizer.chat_template", "evenflow.synthetic", "fuzz.key"]
_COUNTS = st.one_of(st.sampled_from([0, 1, 2, 3, 4, 7, 16, 64, 511, 512, 513, 1000, 2047, 2048, 2049, 65535, 2**31 - 1,
                                     2**32 - 1]), st.integers(0, 2**32 - 1))


@st.composite
def gguf_value(draw) -> bytes:
    """A typed GGUF value (its type word, then its payload)."""
    import struct as _s

    from gguf_edit import ARRAY, BOOL, F32, F64, I32, I64, STRING, U8, U32, U64, nested_arrays, string, typed

    kind = draw(st.sampled_from(["u32", "u32", "i32", "u64", "i64", "f32", "f64", "u8", "bool", "str", "arr_u32",
                                 "arr_i32", "arr_str", "arr_f32", "nested", "bad_type"]))
    if kind == "u32":
        return typed(U32, draw(_COUNTS))
    if kind == "u8":
        return typed(U8, draw(st.integers(0, 255)))
    if kind in ("i32", "i64"):
        bits = 31 if kind == "i32" else 63
        return typed(I32 if kind == "i32" else I64, draw(st.integers(-(2**bits), 2**bits - 1)))
    if kind == "u64":
        return typed(U64, draw(st.integers(0, 2**64 - 1)))
    if kind in ("f32", "f64"):
        v = draw(st.one_of(st.floats(width=32 if kind == "f32" else 64), st.sampled_from([0.0, -1.0, 1e-30, 1e30])))
        return typed(F32 if kind == "f32" else F64, v)
    if kind == "bool":
        return typed(BOOL, draw(st.booleans()))
    if kind == "str":
        return typed(STRING, draw(st.one_of(text, st.sampled_from(["llama", "qwen2", "gpt2", "bert", "unknown", "",
                                                                   "linear", "yarn", "none"]))).encode("utf-8", "surrogatepass"))
    if kind == "nested":
        return nested_arrays(draw(st.integers(1, 12)))
    if kind == "bad_type":
        return _s.pack("<I", draw(st.sampled_from([13, 14, 255, 2**31])))
    n = draw(st.sampled_from([0, 1, 2, 3, 5, 2048, 600]))
    if kind == "arr_str":
        items = [draw(st.sampled_from(["a", "", "<s>", "\u0120", "<0x0A>"])) for _ in range(min(n, 8))] * (n // 8 + 1)
        return _s.pack("<IIQ", ARRAY, STRING, n) + b"".join(string(x) for x in items[:n])
    etype, fmt = {"arr_u32": (U32, "I"), "arr_i32": (I32, "i"), "arr_f32": (F32, "f")}[kind]
    fill = draw(st.sampled_from([0, 1, 4, 2**31 - 1])) if fmt != "f" else 1.0
    fill = fill if fmt != "i" else -fill
    return _s.pack("<IIQ", ARRAY, etype, n) + _s.pack(f"<{n}{fmt}", *([fill] * n))


@st.composite
def gguf_mutation(draw, infos: dict[str, list]) -> dict[str, Any]:
    """edit_gguf arguments for one hostile variant of one of the source models (`infos`: arch -> its tensor table),
    plus `arch` (which source) and `flips` (byte offsets to invert in the header)."""
    from gguf_edit import pack_infos

    kind = draw(st.sampled_from(["set", "set", "set", "drop", "tensor", "truncate", "flips"]))
    arch = draw(st.sampled_from(list(infos)))  # the source model: its keys are named after its architecture
    keys = [k.replace("llama.", arch + ".") for k in _GGUF_KEYS]
    if kind == "set":
        chosen = draw(st.lists(st.sampled_from(keys), min_size=1, max_size=3, unique=True))
        return {"arch": arch, "set_": {k: draw(gguf_value()) for k in chosen}}
    if kind == "drop":
        return {"arch": arch, "drop": tuple(draw(st.lists(st.sampled_from(keys), min_size=1, max_size=4, unique=True)))}
    if kind == "truncate":
        return {"arch": arch, "cut_data": draw(st.integers(0, 1_400_000))}
    if kind == "flips":
        return {"arch": arch, "flips": draw(st.lists(st.integers(0, 60_000), min_size=1, max_size=8))}
    infos = infos[arch]
    changed = [list(x) for x in infos]
    for _ in range(draw(st.integers(1, 3))):
        t = changed[draw(st.integers(0, len(changed) - 1))]
        field = draw(st.sampled_from(["dims", "type", "offset", "name", "ndims"]))
        if field == "dims":
            t[1] = [draw(_COUNTS) for _ in t[1]]
        elif field == "ndims":
            t[1] = [draw(st.integers(0, 64)) for _ in range(draw(st.integers(0, 6)))]
        elif field == "type":
            t[2] = draw(st.integers(0, 45))
        elif field == "offset":
            t[3] = draw(st.one_of(st.integers(0, 2**64 - 1), st.integers(-64, 64).map(lambda d: max(0, t[3] + d))))
        else:
            t[0] = draw(st.sampled_from(["", "x" * 64, "x" * 200, infos[0][0], "blk.99.attn_q.weight", "output.weight"]))
    extra: dict[str, Any] = {}
    if draw(st.booleans()):
        extra["n_tensors"] = draw(st.sampled_from([0, len(infos) - 1, len(infos) + 1]))
    return {"arch": arch, "tensor_infos": pack_infos([tuple(x) for x in changed]), **extra}


@st.composite
def hf_mutation(draw) -> tuple[str, Any]:
    """(file, how): what to break in a safetensors model folder."""
    which = draw(st.sampled_from(["config", "config", "config", "header", "tok_config", "tokenizer", "index", "extra"]))
    if which == "config":
        keys = ["hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
                "vocab_size", "head_dim", "rms_norm_eps", "rope_theta", "rope_scaling", "max_position_embeddings",
                "model_type", "architectures", "tie_word_embeddings", "torch_dtype", "eos_token_id", "bos_token_id",
                "quantization_config", "rope_parameters", "sliding_window"]
        ops = draw(st.lists(st.tuples(st.sampled_from(keys), st.one_of(st.none(), value, _COUNTS)), min_size=1,
                            max_size=3))
        return "config.json", ops
    if which == "header":
        return "model.safetensors", draw(st.tuples(st.sampled_from(["shape", "dtype", "data_offsets", "entry", "len",
                                                                    "cut"]), value))
    if which == "tok_config":
        return "tokenizer_config.json", draw(st.dictionaries(st.sampled_from(["chat_template", "bos_token",
                                                                             "eos_token", "add_bos_token"]), value,
                                                            min_size=1, max_size=3))
    if which == "tokenizer":
        return "tokenizer.json", draw(st.one_of(st.binary(max_size=50), value.map(lambda v: json.dumps(v).encode())))
    if which == "index":
        return "model.safetensors.index.json", draw(st.one_of(value, st.builds(
            lambda wm: {"metadata": {"total_size": 1}, "weight_map": wm},
            st.dictionaries(text, st.one_of(text, value), max_size=4))))
    return draw(st.sampled_from(["chat_template.jinja", "generation_config.json", "x/../y.safetensors",
                                 "a" * 250 + ".safetensors"])), draw(st.one_of(text, value))


def _apply_hf(files: dict[str, bytes], mutation: tuple[str, Any]) -> dict[str, bytes]:
    import struct as _s

    name, how = mutation
    out = dict(files)
    if name == "config.json":
        cfg = json.loads(out[name])
        for key, v in how:
            if v is None:
                cfg.pop(key, None)
            else:
                cfg[key] = v
        out[name] = json.dumps(cfg).encode()
    elif name == "model.safetensors":
        raw = out[name]
        (n,) = _s.unpack("<Q", raw[:8])
        header = json.loads(raw[8 : 8 + n])
        field, v = how
        if field == "len":
            out[name] = _s.pack("<Q", abs(hash(json.dumps(v))) % (2**64)) + raw[8:]
            return out
        if field == "cut":
            out[name] = raw[: len(json.dumps(v)) * 997 % len(raw)]
            return out
        tname = sorted(k for k in header if k != "__metadata__")[0]
        if field == "entry":
            header[tname] = v
        else:
            header[tname][field] = v
        blob = json.dumps(header).encode()
        out[name] = _s.pack("<Q", len(blob)) + blob + raw[8 + n :]
    elif name == "tokenizer_config.json":
        cfg = json.loads(out[name])
        cfg.update(how)
        out[name] = json.dumps(cfg).encode()
    else:
        out[name] = how if isinstance(how, bytes) else (how if isinstance(how, str) else json.dumps(how)).encode(
            "utf-8", "surrogatepass")
    return out


def _use(c: httpx.Client, model: str, statuses: Counter) -> None:
    """Every way a client uses a model; each answer checked like a fuzzed request's."""
    for path, body in (("/api/generate", {"prompt": "hi", "options": {"num_predict": 2}, "logprobs": True,
                                          "top_logprobs": 3}),
                       ("/api/chat", {"messages": [{"role": "user", "content": "hi"}], "options": {"num_predict": 2}}),
                       ("/api/embed", {"input": "hi"}), ("/api/show", {"verbose": True})):
        r = c.post(path, json={"model": model, "stream": False, "keep_alive": 0, **body})
        statuses[r.status_code] += 1
        _check(r, path)


@pytest.fixture(scope="module", params=[b for b in ("llamacpp", "torch") if b in BACKENDS])
def served(request, tmp_path_factory) -> Iterator[Any]:
    from api_harness import serve_daemon

    # a child process: a crash in a backend kills that daemon (and fails the test), not the test run
    d = serve_daemon(tmp_path_factory.mktemp("fuzz-models"), EVENFLOW_BACKEND=request.param,
                     EVENFLOW_CONTEXT_LENGTH="256", EVENFLOW_NO_ACCESS_LOG="1")
    d.backend = request.param
    yield d
    d.stop()


def test_fuzzed_model_files_never_break_the_daemon(served: Any, synthetic_model, tmp_path: Path) -> None:
    import hashlib

    from gguf_edit import edit_gguf, tensor_infos

    paths = synthetic_model("tiny", formats=("gguf", "hf"))
    # llama, and qwen2 (whose graph asserts what llama's loader checks: headers only the load probe refuses)
    ggufs = {"llama": Path(paths["gguf"]), "qwen2": Path(synthetic_model("tiny", "qwen2", formats=("gguf",))["gguf"])}
    infos = {arch: tensor_infos(g) for arch, g in ggufs.items()}
    hf_files = {f.name: f.read_bytes() for f in Path(paths["hf"]).iterdir() if f.is_file()}
    statuses: Counter[int] = Counter()
    created = Counter()

    def blob(c: httpx.Client, data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        r = c.post(f"/api/blobs/{digest}", content=data)
        statuses[r.status_code] += 1
        assert r.status_code in (200, 201), r.text
        return digest

    with httpx.Client(base_url=served.url, timeout=120) as c:

        @settings(max_examples=MODEL_CASES, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                         HealthCheck.function_scoped_fixture])
        @given(st.one_of(gguf_mutation(infos).map(lambda m: ("gguf", m)), hf_mutation().map(lambda m: ("hf", m))))
        def one(case: tuple[str, Any]) -> None:
            kind, mutation = case
            try:
                if kind == "gguf":
                    args = dict(mutation)
                    flips, src = args.pop("flips", []), ggufs[args.pop("arch")]
                    data = bytearray(edit_gguf(src, tmp_path / "fuzz.gguf", **args).read_bytes())
                    for i in flips:
                        if i < len(data):
                            data[i] ^= 0xFF
                    files = {"fuzz.gguf": blob(c, bytes(data))}
                else:
                    files = {name: blob(c, data) for name, data in _apply_hf(hf_files, mutation).items()}
                r = c.post("/api/create", json={"model": "fuzzed", "files": files, "stream": False})
                statuses[r.status_code] += 1
                _check(r, "/api/create")
                if r.status_code == 200:
                    created[kind] += 1
                    _use(c, "fuzzed", statuses)
                assert c.get("/api/version").status_code == 200
            except httpx.TransportError as e:
                raise AssertionError(f"the daemon stopped answering ({e!r}); alive: {served.alive()}; log tail:\n"
                                     f"{served.log()[-3000:]}") from None
            except AssertionError as e:
                raise AssertionError(f"{e}\ndaemon log tail:\n{served.log()[-3000:]}") from None
            assert served.alive(), served.log()[-3000:]

        one()
    print(f"\nfuzz model files [{served.backend}]: {MODEL_CASES} files, {dict(created)} created and used, "
          f"{sum(statuses.values())} requests, statuses {dict(sorted(statuses.items()))}, "
          f"5xx {sum(n for k, n in statuses.items() if k >= 500)}, daemon deaths {0 if served.alive() else 1}")
    assert "Traceback" not in served.log(), served.log()[-5000:]
