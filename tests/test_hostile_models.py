"""Hostile model files, templates and sizes (issue 27 part 4): each is a 400 naming the problem, at /api/create where
it can be, and never a 500 or a dead daemon."""
from __future__ import annotations

import hashlib
import importlib.util
import struct
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from api_harness import BACKENDS, Daemon, serve_daemon, start_daemon, upload_model
from gguf_edit import F32, STRING, U32, edit_gguf, nested_arrays, pack_infos, tensor_infos, typed

HAS_LLAMACPP = importlib.util.find_spec("llama_cpp") is not None


@pytest.fixture(scope="module")
def tiny(synthetic_model) -> dict[str, Path]:
    return synthetic_model("tiny", formats=("gguf", "hf"))


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, tiny) -> Iterator[Daemon]:
    d = start_daemon(tmp_path_factory.mktemp("hostile"), backend=BACKENDS[0], context_length="256")
    upload_model(d.url, Path(tiny["gguf"]), "tiny")
    yield d
    d.stop()


@pytest.fixture()
def http(daemon: Daemon) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=daemon.url, timeout=120) as c:
        yield c
    assert httpx.get(daemon.url + "/api/version").status_code == 200  # still serving


def _blob(c: httpx.Client, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    r = c.post(f"/api/blobs/{digest}", content=data)
    assert r.status_code in (200, 201), r.text
    return digest


def _err(r: httpx.Response, fragment: str, status: int = 400) -> str:
    assert r.status_code == status, r.text[:500]
    body = r.json()
    assert set(body) == {"error"} and fragment in body["error"], body
    return body["error"]


def _create_gguf(c: httpx.Client, path: Path, name: str = "bad") -> httpx.Response:
    return c.post("/api/create", json={"model": name, "files": {path.name: _blob(c, path.read_bytes())},
                                       "stream": False})


def _bad_gguf_cases(src: Path, tmp: Path) -> list[tuple[Path, str]]:
    """(file, fragment of its 400): headers llama.cpp aborts or divides by zero on, and tables it refuses."""
    infos = tensor_infos(src)
    data_end = max(off for _, _, _, off in infos) + 1 << 20
    past_end = [(n, d, q, off + data_end if i == len(infos) - 1 else off) for i, (n, d, q, off) in enumerate(infos)]
    cases = [
        ({"llama.block_count": typed(U32, 0)}, "'llama.block_count' is 0; allowed: 1..512", {}),
        ({"llama.block_count": typed(U32, 1000)}, "'llama.block_count' is 1000; allowed: 1..512", {}),
        ({"llama.block_count": typed(STRING, "two")}, "'llama.block_count' is 'two'", {}),
        ({"llama.attention.head_count_kv": typed(STRING, "2")}, "'llama.attention.head_count_kv' is '2'", {}),
        ({"llama.expert_count": typed(U32, 4), "llama.expert_used_count": typed(U32, 9)}, "expert_used_count is 9", {}),
        ({"llama.embedding_length": typed(F32, 64.0)}, "'llama.embedding_length' is 64.0", {}),
        ({"evenflow.nested": nested_arrays(20_000)}, "nests arrays deeper than 4 levels", {}),
        ({"general.alignment": typed(U32, 24)}, "general.alignment 24; expected a power of two", {}),
        ({}, "has data offset", {"tensor_infos": pack_infos(past_end)}),
        ({}, "duplicate tensor", {"tensor_infos": pack_infos(infos + infos[-1:]), "n_tensors": len(infos) + 1}),
        ({}, "has 5 dims; at most 4",
         {"tensor_infos": pack_infos(infos[:-1] + [(infos[-1][0], [1, 1, 1, 1, 1], infos[-1][2], infos[-1][3])])}),
        ({}, "truncated GGUF", {"cut_data": 100}),
    ]
    out = []
    for i, (kv, fragment, extra) in enumerate(cases):
        out.append((edit_gguf(src, tmp / f"bad{i}.gguf", kv, **extra), fragment))
    return out


def test_gguf_headers_llama_cpp_would_abort_on_are_refused_at_create(http: httpx.Client, daemon: Daemon, tiny,
                                                                     tmp_path: Path) -> None:
    # issue 27: a block count of 0 or 1000 was accepted here, then aborted the daemon (llama.cpp's GGML_ASSERT) at
    # the first generate, and again after every restart
    root = str(daemon.ctx.settings.models)
    for path, fragment in _bad_gguf_cases(Path(tiny["gguf"]), tmp_path):
        msg = _err(_create_gguf(http, path), fragment)
        digest = "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
        assert f"{path.name} ({digest})" in msg and root not in msg and "/blobs/" not in msg, msg
    assert http.post("/api/show", json={"model": "bad"}).status_code == 404  # nothing was created


def test_deep_nesting_is_a_400(http: httpx.Client, tiny, tmp_path: Path) -> None:
    # issue 27: each of these was a 500 (RecursionError, IndentationError) where docs/api.md promises a 400
    gen = {"model": "tiny", "prompt": "x", "stream": False, "options": {"num_predict": 1}}
    _err(http.post("/api/generate", json={**gen, "template": "{{" * 40}), "nesting too deep")
    _err(http.post("/api/create", json={"model": "t", "from": "tiny", "template": "{% if 1 %}" * 100 + "x" +
                                        "{% endif %}" * 100}), "nesting too deep")
    ranges = "{{ range .Messages }}" * 500 + "x" + "{{ end }}" * 500
    _err(http.post("/api/create", json={"model": "t", "from": "tiny", "template": ranges}), "nesting deeper than 100")
    _err(http.post("/api/generate", json={**gen, "template": ranges}), "nesting deeper than 100")
    parens = "{{ .Prompt }}{{ " + "(" * 300 + "1" + ")" * 300 + " }}"
    _err(http.post("/api/generate", json={**gen, "template": parens}), "nesting deeper than 100")
    ok = "{{ range .Messages }}" * 20 + "{{ .Content }}" + "{{ end }}" * 20  # real nesting still renders
    assert http.post("/api/generate", json={**gen, "template": ok}).status_code == 200
    nest = edit_gguf(Path(tiny["gguf"]), tmp_path / "nest.gguf", {"evenflow.nested": nested_arrays(20_000)})
    _err(_create_gguf(http, nest), "nests arrays deeper")
    files = {f.name: _blob(http, f.read_bytes()) for f in Path(tiny["hf"]).iterdir() if f.is_file()}
    files["config.json"] = _blob(http, b"[" * 100_000 + b"]" * 100_000)
    _err(http.post("/api/create", json={"model": "t", "files": files}), "config.json is not readable JSON: nested")


def _hf_files(c: httpx.Client, hf: Path, rename: dict[str, str] | None = None) -> dict[str, str]:
    return {(rename or {}).get(f.name, f.name): _blob(c, f.read_bytes()) for f in hf.iterdir() if f.is_file()}


def test_safetensors_files_are_checked_at_create(http: httpx.Client, tiny) -> None:
    hf = Path(tiny["hf"])
    st = next(f for f in hf.iterdir() if f.suffix == ".safetensors")
    long_name = "a" * 290 + ".safetensors"
    # issue 27: created, then every generate was a 500 (the link name is too long for the file system)
    _err(http.post("/api/create", json={"model": "t", "files": _hf_files(http, hf, {st.name: long_name})}),
         "at most 255 bytes")
    raw = st.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = raw[8 : 8 + n].decode().replace('"shape":[', '"shape":["x",', 1).encode()
    bad = struct.pack("<Q", len(header)) + header + raw[8 + n :]
    files = _hf_files(http, hf)
    files[st.name] = _blob(http, bad)
    _err(http.post("/api/create", json={"model": "t", "files": files}), f"{st.name}: tensor")
    files = _hf_files(http, hf)
    files["config.json"] = _blob(http, b'{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 0}')
    _err(http.post("/api/create", json={"model": "t", "files": files}), "config.json: ")
    # the unchanged files create fine
    r = http.post("/api/create", json={"model": "hf-ok", "files": _hf_files(http, hf), "stream": False})
    assert r.status_code == 200, r.text


def test_a_chat_too_long_for_the_window_is_refused_by_its_size(http: httpx.Client) -> None:
    # issue 27: 50,000 messages took 48 s of a worker (render, then llama.cpp tokenizing megabytes) before the 400;
    # the render now stops once the prompt is longer than the window could hold in any tokenization
    msgs = [{"role": "user", "content": "hello there"}] * 50_000
    _err(http.post("/api/chat", json={"model": "tiny", "messages": msgs, "stream": False, "truncate": False}),
         "is longer than the context length of model 'tiny:latest' (256 tokens) can hold")
    _err(http.post("/api/generate", json={"model": "tiny", "prompt": "hello " * 200_000, "raw": True, "stream": False,
                                          "truncate": False}), "can hold: over")
    r = http.post("/v1/completions", json={"model": "tiny", "prompt": "hello " * 200_000})
    assert r.status_code == 400 and "tokens (over" in r.json()["error"]["message"]
    # issue 38: with Ollama's `truncate` (the default) the oldest messages go, found in a few bounded renders
    r = http.post("/api/chat", json={"model": "tiny", "messages": msgs, "stream": False,
                                     "options": {"num_predict": 1}})
    assert r.status_code == 200 and r.json()["truncated"]["messages"] > 49_000, r.text
    short = [{"role": "user", "content": "hello there"}] * 5
    r = http.post("/api/chat", json={"model": "tiny", "messages": short, "stream": False,
                                     "options": {"num_predict": 1}})
    assert r.status_code == 200, r.text
    # a prompt the bound lets through still gets the exact token count's answer
    _err(http.post("/api/generate", json={"model": "tiny", "prompt": "hello " * 300, "raw": True, "stream": False,
                                          "truncate": False}), "tokens but the context length")


def _write_model(store, name: str, layers: list) -> None:
    """A model written straight into the store, as an older evenflow (without today's checks) could have."""
    from evenflow.daemon.store.manifest import CONFIG_MEDIA_TYPE, Layer, Manifest, ModelConfig

    cfg = ModelConfig(model_format="gguf", model_family="llama", model_families=["llama"]).to_bytes()
    store.write_manifest(name, Manifest(Layer(CONFIG_MEDIA_TYPE, store.add_blob_bytes(cfg), len(cfg)), layers))


@pytest.mark.skipif(not HAS_LLAMACPP, reason="llama-cpp-python is not installed")
def test_models_llama_cpp_would_abort_on_are_400s_and_the_daemon_lives(tmp_path: Path, synthetic_model, tiny) -> None:
    from evenflow.daemon.store import ModelStore
    from evenflow.daemon.store.manifest import MT_FILE, MT_MODEL, Layer

    gguf = Path(tiny["gguf"])
    store = ModelStore(tmp_path / "models")
    # an old store already holding models today's /api/create refuses
    for name, n in (("zero-layers", 0), ("many-layers", 1000)):
        bad = edit_gguf(gguf, tmp_path / f"{name}.gguf", {"llama.block_count": typed(U32, n)})
        _write_model(store, name, [Layer(MT_MODEL, store.add_blob_file(bad), bad.stat().st_size)])
    hf = Path(tiny["hf"])
    _write_model(store, "long-name", [Layer(MT_FILE, store.add_blob_file(f), f.stat().st_size,
                                            name=("b" * 300 + ".safetensors") if f.suffix == ".safetensors" else f.name)
                                      for f in hf.iterdir() if f.is_file()])
    d = serve_daemon(tmp_path, EVENFLOW_BACKEND="llamacpp", EVENFLOW_CONTEXT_LENGTH="256")
    try:
        with httpx.Client(base_url=d.url, timeout=120) as c:
            # a header only llama.cpp knows is wrong (qwen2 needs its rope to span the whole head): the child-process
            # load probe refuses it with llama.cpp's own assert instead of the daemon aborting
            qwen2 = Path(synthetic_model("tiny", "qwen2", formats=("gguf",))["gguf"])
            rot = edit_gguf(qwen2, tmp_path / "qwen2-rot.gguf", {"qwen2.rope.dimension_count": typed(U32, 8)})
            assert _create_gguf(c, rot, "rot").status_code == 200
            upload_model(d.url, gguf, "tiny")
            for model, fragment in (("zero-layers", "'llama.block_count' is 0"),
                                    ("many-layers", "'llama.block_count' is 1000"),
                                    ("rot", "llama.cpp crashes loading this model (SIGABRT): n_embd_head == n_rot"),
                                    ("long-name", "at most 255 bytes")):
                for path, body in (("/api/generate", {"prompt": "hi"}),
                                   ("/api/chat", {"messages": [{"role": "user", "content": "hi"}]}),
                                   ("/api/embed", {"input": "hi"})):
                    msg = _err(c.post(path, json={"model": model, "stream": False, **body}), fragment)
                    assert str(tmp_path) not in msg, msg
                    assert d.alive(), d.log()[-3000:]
            r = c.post("/api/generate", json={"model": "tiny", "prompt": "hi", "stream": False,
                                              "options": {"num_predict": 2}})
            assert r.status_code == 200, r.text
    finally:
        d.stop()
    assert "GGML_ASSERT" not in d.log()  # the probe's abort stayed in the probe
