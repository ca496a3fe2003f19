"""Model store: names, blobs, create/list/show/copy/delete, atomicity, read-only Ollama stores, HF folders."""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from evenflow.daemon.store import (BlobNotFound, DigestMismatch, InvalidDigest, InvalidModel, InvalidName,
                                   ModelNotFound, ModelStore, NotSupported, ReadOnlyModel, create_model,
                                   ensure_demo_model, parse_digest, parse_modelfile, parse_name, show_model)
from evenflow.daemon.store.manifest import MT_FILE, MT_MODEL, MT_TEMPLATE, Manifest

LLAMA3_GO = ('{{ if .System }}<|start_header_id|>system<|end_header_id|>\n\n{{ .System }}<|eot_id|>{{ end }}'
             '{{ if .Prompt }}<|start_header_id|>user<|end_header_id|>\n\n{{ .Prompt }}<|eot_id|>{{ end }}'
             '<|start_header_id|>assistant<|end_header_id|>\n\n{{ .Response }}<|eot_id|>')


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@pytest.fixture
def store(tmp_path: Path) -> ModelStore:
    return ModelStore(tmp_path / "models")


@pytest.fixture(scope="session")
def tiny(synthetic_model):
    return synthetic_model("tiny", formats=("hf", "gguf"), gguf_dtype="q8_0")


def _create_gguf(store: ModelStore, name: str, gguf: Path, **kw) -> list[str]:
    digest = store.add_blob_file(gguf)
    return list(create_model(store, name, files={gguf.name: digest}, **kw))


def _snapshot(root: Path) -> dict[str, tuple[int, int, bytes]]:
    return {str(p): (p.stat().st_mtime_ns, p.stat().st_size, p.read_bytes())
            for p in sorted(root.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------------------------------------ names

@pytest.mark.parametrize("text,full,display", [
    ("demo", "registry.ollama.ai/library/demo:latest", "demo:latest"),
    ("llama3.2:3b-instruct-q4_K_M", "registry.ollama.ai/library/llama3.2:3b-instruct-q4_K_M",
     "llama3.2:3b-instruct-q4_K_M"),
    ("user/model:v1", "registry.ollama.ai/user/model:v1", "user/model:v1"),
    ("example.com:5000/ns/m", "example.com:5000/ns/m:latest", "example.com:5000/ns/m:latest"),
    ("https://example.com/ns/m:t", "example.com/ns/m:t", "example.com/ns/m:t"),
    ("_x/y_z:1.0", "registry.ollama.ai/_x/y_z:1.0", "_x/y_z:1.0"),
])
def test_valid_names(text: str, full: str, display: str) -> None:
    name = parse_name(text)
    assert name.full() == full
    assert name.display() == display


@pytest.mark.parametrize("text", [
    "", "../x", "a/../../b", "/etc/passwd", "..", "./x", "a//b", "a:", ":tag", "x:..", "ns.dot/m", "a/b/c/d",
    "m:" + "t" * 81, "m" * 81, "bad name", "a\\b", "C:\\x\\y", "a\x00b", "-lead", "m:-tag", "ftp://h/n/m", "m:t/x",
])
def test_hostile_or_invalid_names_raise(text: str) -> None:
    with pytest.raises(InvalidName):
        parse_name(text)


def test_digest_validation() -> None:
    good = "a" * 64
    assert parse_digest("sha256:" + good.upper()) == good
    assert parse_digest("sha256-" + good) == good
    for bad in ("sha256:" + "a" * 63, "sha256:../../etc/passwd", "md5:" + good, good, "sha256:" + "g" * 64):
        with pytest.raises(InvalidDigest):
            parse_digest(bad)


# ------------------------------------------------------------------------------------------------ blobs

def test_blob_digest_mismatch_leaves_nothing(store: ModelStore) -> None:
    data = b"hello world" * 1000
    wrong = _digest(b"something else")
    with pytest.raises(DigestMismatch, match="digest mismatch"):
        store.write_blob(wrong, [data[:5000], data[5000:]])
    assert not store.has_blob(wrong)
    assert list(store.layout.blobs.iterdir()) == []  # no temp file, no final file
    assert store.write_blob(_digest(data), iter([data[:7], data[7:]])) is True
    assert store.write_blob(_digest(data), iter([data])) is False  # already present
    assert store.read_blob(_digest(data)) == data


def test_async_blob_write_verifies(store: ModelStore) -> None:
    data = os.urandom(300_000)

    async def chunks(payload: bytes):
        for i in range(0, len(payload), 65536):
            yield payload[i:i + 65536]

    assert asyncio.run(store.write_blob_async(_digest(data), chunks(data))) is True
    assert store.read_blob(_digest(data)) == data
    with pytest.raises(DigestMismatch):
        asyncio.run(store.write_blob_async(_digest(b"x"), chunks(b"y" * 10)))
    assert sorted(p.name for p in store.layout.blobs.iterdir()) == ["sha256-" + hashlib.sha256(data).hexdigest()]


def test_blob_writer_killed_midway_leaves_no_blob(tmp_path: Path) -> None:
    root = tmp_path / "models"
    data = b"z" * (4 << 20)
    script = textwrap.dedent(f"""
        import sys, time
        from evenflow.daemon.store import ModelStore
        s = ModelStore({str(root)!r})
        def chunks():
            yield b"z" * (1 << 20)
            print("started", flush=True)
            time.sleep(60)
            yield b"z" * (3 << 20)
        s.write_blob({_digest(data)!r}, chunks())
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "started"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    blobs = root / "blobs"
    assert not (blobs / ("sha256-" + hashlib.sha256(data).hexdigest())).exists()
    assert any(p.name.startswith(".evenflow-tmp-") for p in blobs.iterdir())  # the crash left only a temp file
    store = ModelStore(root)  # reopening cleans leftovers
    assert list(store.layout.blobs.iterdir()) == []
    assert store.list() == []


# ------------------------------------------------------------------------------------------------ create/list/show

def test_create_list_show_copy_delete(store: ModelStore, tiny) -> None:
    gguf = tiny["gguf"]
    status = _create_gguf(store, "Tiny", gguf, system="You are terse.",
                          parameters={"temperature": "0.5", "stop": "<|eot_id|>", "num_ctx": 1024.0})
    assert status[0] == "parsing GGUF" and status[-2:] == ["writing manifest", "success"]
    assert any(s.startswith("using existing layer sha256:") for s in status)
    assert any(s.startswith("creating new layer sha256:") for s in status)

    [entry] = store.list()
    manifest_path = store.root / "manifests/registry.ollama.ai/library/Tiny/latest"
    raw = manifest_path.read_bytes()
    assert entry.name == entry.model == "Tiny:latest"
    assert entry.digest == hashlib.sha256(raw).hexdigest()
    obj = json.loads(raw)
    assert obj["schemaVersion"] == 2 and obj["mediaType"] == "application/vnd.docker.distribution.manifest.v2+json"
    assert obj["config"]["mediaType"] == "application/vnd.docker.container.image.v1+json"
    assert entry.size == obj["config"]["size"] + sum(layer["size"] for layer in obj["layers"])
    assert entry.details["format"] == "gguf" and entry.details["family"] == "llama"
    assert entry.details["quantization_level"] == "Q8_0"
    assert entry.details["parameter_size"].endswith("K") or entry.details["parameter_size"].endswith("M")
    assert entry.modified_at.endswith("Z") and "T" in entry.modified_at
    cfg = json.loads(store.read_blob(obj["config"]["digest"]))
    assert cfg["model_format"] == "gguf" and cfg["model_family"] == "llama" and cfg["file_type"] == "Q8_0"

    r = store.resolve("tiny")  # case-insensitive
    assert r.name == "Tiny:latest" and r.model_path.read_bytes()[:4] == b"GGUF"
    assert r.params == {"temperature": 0.5, "stop": ["<|eot_id|>"], "num_ctx": 1024}
    assert r.system == "You are terse." and r.synthetic and not r.read_only
    assert r.template and r.template_from_weights  # no TEMPLATE layer: the GGUF chat template

    shown = show_model(store, "tiny:LATEST")
    assert shown["system"] == "You are terse."
    assert 'PARAMETER stop <|eot_id|>' in shown["modelfile"] and "SYSTEM" in shown["modelfile"]
    assert shown["parameters"].splitlines()[0].startswith("temperature" + " " * 20)
    assert shown["model_info"]["evenflow.synthetic"] is True
    assert shown["model_info"]["tokenizer.ggml.tokens"] == []  # big arrays left out unless verbose
    assert "tokenizer.chat_template" not in shown["model_info"] and "completion" in shown["capabilities"]
    verbose = show_model(store, "tiny", verbose=True)
    assert len(verbose["model_info"]["tokenizer.ggml.tokens"]) > 100 and verbose["tensors"]
    assert "synthetic" in shown["license"]

    # re-creating under another casing updates the existing model (Ollama reuses the stored casing)
    list(create_model(store, "TINY", from_="tiny", system="You are terse."))
    assert [e.name for e in store.list()] == ["Tiny:latest"]

    # a second model shares the GGUF blob; deleting one keeps it, deleting both removes it
    store.copy("tiny", "other/copy:v2")
    assert {e.name for e in store.list()} == {"Tiny:latest", "other/copy:v2"}
    model_blob = r.model_path
    store.delete("TINY")
    assert model_blob.exists() and not manifest_path.exists()
    assert not (store.root / "manifests/registry.ollama.ai/library").exists()  # empty folders pruned
    assert store.resolve("other/copy:v2").model_path == model_blob
    store.delete("other/copy:v2")
    assert not model_blob.exists() and list(store.layout.blobs.iterdir()) == []
    with pytest.raises(ModelNotFound, match="model 'tiny' not found"):
        store.resolve("tiny")
    with pytest.raises(ModelNotFound):
        store.delete("tiny")


def test_create_from_model_overrides_and_modelfile_round_trip(store: ModelStore, tiny) -> None:
    _create_gguf(store, "base", tiny["gguf"], parameters={"temperature": 0.2, "top_k": 10}, license="MIT")
    status = list(create_model(store, "derived", from_="base", template=LLAMA3_GO, system="Be kind.",
                               parameters={"top_k": 5, "stop": ["<|eot_id|>", "END"]},
                               messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
                               license=["Apache-2.0"]))
    assert status[-1] == "success"
    r = store.resolve("derived")
    assert r.params == {"temperature": 0.2, "top_k": 5, "stop": ["<|eot_id|>", "END"]}  # merged over the base
    assert r.template == LLAMA3_GO and not r.template_from_weights
    assert r.messages == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert r.license == ["MIT", "Apache-2.0"]
    assert r.model_path == store.resolve("base").model_path
    spec = parse_modelfile(show_model(store, "derived")["modelfile"])
    assert spec.template == LLAMA3_GO and spec.system == "Be kind."
    assert spec.parameters == r.params and spec.messages == r.messages and spec.license == r.license


def test_create_rejects_bad_input_before_writing(store: ModelStore, tiny) -> None:
    digest = store.add_blob_file(tiny["gguf"])
    files = {"m.gguf": digest}
    cases = [
        (dict(files=files, quantize="q4_K_M"), NotSupported, "quantization is not supported yet"),
        (dict(files=files, adapters={"a.gguf": digest}), NotSupported, "adapters"),
        (dict(files=files, parameters={"temprature": 1}), InvalidModel, "unknown parameter 'temprature'"),
        (dict(files=files, parameters={"top_k": "many"}), InvalidModel, "top_k"),
        (dict(files=files, messages=[{"role": "wizard", "content": "x"}]), InvalidModel, "role"),
        (dict(files=files, template="{{ if .X }}unclosed"), InvalidModel, "template error"),
        (dict(files={"m.gguf": _digest(b"absent")}), BlobNotFound, "not found"),
        (dict(files={"../evil.gguf": digest}), InvalidModel, "relative path"),
        (dict(files={"m.gguf": "sha256:../../x"}), InvalidDigest, "invalid digest"),
        (dict(), InvalidModel, "neither 'from' or 'files'"),
        (dict(from_="missing"), ModelNotFound, "model 'missing' not found"),
        (dict(files={"config.json": store.add_blob_bytes(b"{}")}), InvalidModel, "safetensors"),
        (dict(files={"x.gguf": store.add_blob_bytes(b"not a gguf at all, sorry")}), InvalidModel, "not a GGUF"),
    ]
    for kwargs, exc, message in cases:
        with pytest.raises(exc, match=message):
            create_model(store, "m", **kwargs)  # raised before any status line (the HTTP layer answers a real 4xx)
    with pytest.raises(InvalidName):
        create_model(store, "../escape", files=files)
    assert store.list() == [] and not any(store.layout.manifests.rglob("*/*/*/*"))


def test_manifest_write_crash_leaves_old_state(store: ModelStore, tiny, monkeypatch) -> None:
    _create_gguf(store, "keep", tiny["gguf"])
    before = (store.root / "manifests/registry.ollama.ai/library/keep/latest").read_bytes()

    real_replace = os.replace

    def boom(src, dst):
        if "manifests" in str(dst):  # layers land, the manifest rename "crashes"
            raise OSError("simulated crash before rename")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="simulated crash"):
        list(create_model(store, "keep", from_="keep", system="new system"))
    with pytest.raises(OSError, match="simulated crash"):
        list(create_model(store, "fresh", from_="keep"))
    monkeypatch.undo()
    assert (store.root / "manifests/registry.ollama.ai/library/keep/latest").read_bytes() == before
    assert not (store.root / "manifests/registry.ollama.ai/library/fresh").exists() or not any(
        p.is_file() for p in (store.root / "manifests/registry.ollama.ai/library/fresh").rglob("*"))
    assert [e.name for e in store.list()] == ["keep:latest"]
    assert not [p for p in store.root.rglob(".evenflow-tmp-*")]
    assert store.resolve("keep").system is None

    def boom_all(src, dst):
        raise OSError("simulated crash before rename")

    monkeypatch.setattr(os, "replace", boom_all)  # now the blob rename fails too: no blob appears
    with pytest.raises(OSError, match="simulated crash"):
        list(create_model(store, "keep", from_="keep", system="another system"))
    monkeypatch.undo()
    assert not store.has_blob(_digest(b"another system"))
    assert not [p for p in store.root.rglob(".evenflow-tmp-*")]


# ------------------------------------------------------------------------------------------------ read-only Ollama store

def _ollama_store(root: Path, gguf: Path) -> dict[str, str]:
    """Lay out a store exactly as Ollama does: blobs/sha256-<hex>, manifests/<host>/<ns>/<model>/<tag>."""
    blobs = root / "blobs"
    blobs.mkdir(parents=True)

    def blob(data: bytes) -> dict:
        d = hashlib.sha256(data).hexdigest()
        (blobs / f"sha256-{d}").write_bytes(data)
        return {"digest": f"sha256:{d}", "size": len(data)}

    model = blob(gguf.read_bytes())
    template = blob(LLAMA3_GO.encode())
    params = blob(b'{"stop":["<|eot_id|>"],"temperature":0.6}')
    config = blob(json.dumps({"model_format": "gguf", "model_family": "llama", "model_families": ["llama"],
                              "model_type": "1.2M", "file_type": "Q8_0", "architecture": "amd64", "os": "linux",
                              "rootfs": {"type": "layers", "diff_ids": []}}).encode())
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                "config": {"mediaType": "application/vnd.docker.container.image.v1+json", **config},
                "layers": [{"mediaType": "application/vnd.ollama.image.model", **model},
                           {"mediaType": "application/vnd.ollama.image.template", **template},
                           {"mediaType": "application/vnd.ollama.image.params", **params}]}
    mdir = root / "manifests/registry.ollama.ai/library/foo"
    mdir.mkdir(parents=True)
    (mdir / "latest").write_text(json.dumps(manifest))
    return {"model": model["digest"]}


def test_reads_ollama_store_without_writing(tmp_path: Path, tiny) -> None:
    ollama_root = tmp_path / "ollama"
    digests = _ollama_store(ollama_root, tiny["gguf"])
    os.utime(ollama_root / "manifests/registry.ollama.ai/library/foo/latest", ns=(1_600_000_000 * 10**9,) * 2)
    before = _snapshot(ollama_root)
    store = ModelStore(tmp_path / "ours", readonly_roots=[ollama_root])

    [entry] = store.list()
    assert entry.name == "foo:latest" and entry.read_only
    assert entry.modified_at.startswith("2020-09-13T12:26:40")
    assert entry.details["parameter_size"] == "1.2M"
    r = store.resolve("FOO")
    assert r.read_only and r.template == LLAMA3_GO and r.params["temperature"] == 0.6
    assert r.model_path == ollama_root / f"blobs/sha256-{digests['model'][7:]}"
    shown = show_model(store, "foo")
    assert shown["template"] == LLAMA3_GO and "tools" not in shown["capabilities"]
    with pytest.raises(ReadOnlyModel, match="read-only"):
        store.delete("foo")

    store.copy("foo", "mine")  # the manifest lands in OUR store, blobs are read where they are
    assert store.resolve("mine").model_path == r.model_path and not store.resolve("mine").read_only
    store.delete("mine")
    assert [e.name for e in store.list()] == ["foo:latest"]
    assert _snapshot(ollama_root) == before  # bytes and mtimes untouched


# ------------------------------------------------------------------------------------------------ HF safetensors

def test_hf_safetensors_create_and_materialise(store: ModelStore, tiny) -> None:
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    hf = tiny["hf"]
    files = {p.name: store.add_blob_file(p) for p in sorted(hf.iterdir()) if p.is_file()}
    assert "model.safetensors" in files and "config.json" in files
    status = list(create_model(store, "hf-tiny", files=files))
    assert status[-1] == "success"
    manifest = store.manifest("hf-tiny")
    assert {layer.name for layer in manifest.find(MT_FILE)} == set(files)
    assert not manifest.find(MT_MODEL)
    r = store.resolve("hf-tiny")
    assert r.format == "safetensors" and r.synthetic and r.model_path.is_dir()
    assert r.model_path.parent == store.root / "evenflow-hf"
    for name in files:
        assert (r.model_path / name).read_bytes() == (hf / name).read_bytes()
    tensors = load_file(str(r.model_path / "model.safetensors"))
    assert "model.embed_tokens.weight" in tensors
    tok = Tokenizer.from_file(str(r.model_path / "tokenizer.json"))
    assert tok.encode("hello world").ids
    assert json.loads((r.model_path / "config.json").read_text())["model_type"] == "llama"
    assert r.details["format"] == "safetensors" and r.details["family"] == "llama"
    assert r.template and r.eos_token
    assert store.resolve("hf-tiny").model_path == r.model_path  # reused, not rebuilt
    store.delete("hf-tiny")
    assert not r.model_path.exists() and list(store.layout.blobs.iterdir()) == []


def test_demo_model_created_once(store: ModelStore) -> None:
    assert ensure_demo_model(store) is True
    r = store.resolve("demo")
    assert r.synthetic and r.details["quantization_level"] == "Q8_0" and r.template
    assert Manifest.from_bytes((store.root / "manifests/registry.ollama.ai/library/demo/latest").read_bytes()).find(
        MT_TEMPLATE)
    assert ensure_demo_model(store) is False
    store.delete("demo")
    assert ensure_demo_model(store) is False  # a user who deleted it keeps it deleted


def test_modelfile_parser() -> None:
    text = ('# comment\nFROM llama3.2\nPARAMETER temperature 0.7\nPARAMETER stop "<|eot_id|>"\n'
            'PARAMETER stop END\nSYSTEM """multi\nline"""\ntemplate {{ .Prompt }}\nMESSAGE user hi there\n'
            'LICENSE """MIT"""\n')
    spec = parse_modelfile(text)
    assert spec.from_ == "llama3.2" and spec.system == "multi\nline" and spec.template == "{{ .Prompt }}"
    assert spec.parameters == {"temperature": 0.7, "stop": ["<|eot_id|>", "END"]}
    assert spec.messages == [{"role": "user", "content": "hi there"}] and spec.license == ["MIT"]
    from evenflow.daemon.store import ModelfileError

    for bad in ("FROM x\nPARAMETER bogus 1\n", "FROM x\nWHATEVER y\n", "SYSTEM hi\n", "FROM x\nMESSAGE wizard x\n"):
        with pytest.raises(ModelfileError):
            parse_modelfile(bad)


def test_store_roots_from_environment(tmp_path: Path, monkeypatch) -> None:
    from evenflow.daemon.store import default_readonly_roots, default_store_root

    monkeypatch.delenv("EVENFLOW_MODELS", raising=False)
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    assert default_store_root() == tmp_path / "ollama"  # OLLAMA_MODELS alone: that is our (writable) store
    monkeypatch.setenv("EVENFLOW_MODELS", f'"{tmp_path / "ours"}"')  # quotes stripped like Ollama's envconfig
    assert default_store_root() == tmp_path / "ours"  # the evenflow twin wins
    (tmp_path / "ollama" / "manifests").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_readonly_roots() == [tmp_path / "ollama"]  # then the Ollama store is read, not written
    monkeypatch.setenv("EVENFLOW_OLLAMA_STORE", "")
    assert default_readonly_roots() == []
    monkeypatch.delenv("EVENFLOW_MODELS")
    monkeypatch.delenv("OLLAMA_MODELS")
    assert default_store_root().name == "models" and "evenflow" in str(default_store_root())
