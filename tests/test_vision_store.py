"""Vision models in the store (issue 30): the projector layer from `evenflow create` (a second FROM) and from
hf.co pulls (the repo's mmproj), /api/show's capability; torch answers images with a 400 naming llama.cpp.
None of this needs libmtmd."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import httpx
import ollama
import pytest

from api_harness import start_daemon
from hub_server import Hub
from vision_util import b64, create_vision_model, png, vision_files

from evenflow.daemon.store.hfpull import pick_mmproj

PROJECTOR = "application/vnd.ollama.image.projector"


@pytest.fixture
def daemon(tmp_path):
    d = start_daemon(tmp_path / "d", backend="llamacpp")
    yield d
    d.stop()


def _layers(daemon, name: str) -> list[str]:
    return [lay.media_type for lay in daemon.ctx.store.store.manifest(name).layers]


def test_create_from_a_modelfile_with_the_projector_as_a_second_from(daemon, tmp_path):
    model, proj = vision_files()
    work = tmp_path / "work"
    work.mkdir()
    (work / "model.gguf").write_bytes(model.read_bytes())
    (work / "mmproj.gguf").write_bytes(proj.read_bytes())
    (work / "Modelfile").write_text("FROM ./model.gguf\nFROM ./mmproj.gguf\n")
    env = {"EVENFLOW_HOST": daemon.url.removeprefix("http://")}
    import os

    out = subprocess.run([sys.executable, "-m", "evenflow.clients.cli", "create", "vis"], cwd=work,
                         env={**os.environ, **env}, capture_output=True, text=True, timeout=300,
                         stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    assert _layers(daemon, "vis").count(PROJECTOR) == 1
    assert "vision" in ollama.Client(host=daemon.url).show("vis").capabilities
    show = httpx.post(daemon.url + "/api/show", json={"model": "vis"}).json()  # the client has no projector_info
    assert show["projector_info"]["clip.projector_type"] == "mlp"


def test_create_refuses_a_projector_alone_and_two_projectors(daemon):
    import hashlib

    model, proj = vision_files()
    data = proj.read_bytes()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    with httpx.Client(base_url=daemon.url, timeout=60) as c:
        assert c.post(f"/api/blobs/{digest}", content=data).status_code in (200, 201)
        r = c.post("/api/create", json={"model": "p", "files": {"mmproj.gguf": digest}, "stream": False})
        assert r.status_code == 400 and "vision projector" in r.json()["error"]
        r = c.post("/api/create", json={"model": "p", "stream": False,
                                        "files": {"a-mmproj.gguf": digest, "b-mmproj.gguf": digest}})
        assert r.status_code == 400


def test_pick_mmproj():
    assert pick_mmproj(["m-Q4_K_M.gguf", "mmproj-m-Q8_0.gguf", "mmproj-m-F16.gguf"]) == "mmproj-m-F16.gguf"
    assert pick_mmproj(["m-Q4_K_M.gguf", "README.md"]) is None


def test_hf_pull_fetches_the_repos_mmproj(daemon, monkeypatch):
    hub = Hub()
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    try:
        model, proj = vision_files()
        hub.repos["someone/vis-GGUF"] = {"vis-F32.gguf": model.read_bytes(),
                                         "mmproj-vis-F16.gguf": proj.read_bytes(), "README.md": b"hi"}
        with httpx.stream("POST", daemon.url + "/api/pull", json={"model": "hf.co/someone/vis-GGUF"},
                          timeout=120) as r:
            lines = [json.loads(x) for x in r.iter_lines() if x]
        assert lines[-1] == {"status": "success"}, lines
        assert sorted(hub.downloads) == ["mmproj-vis-F16.gguf", "vis-F32.gguf"]
        assert "vision" in ollama.Client(host=daemon.url).show("hf.co/someone/vis-GGUF").capabilities
    finally:
        hub.close()


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_torch_answers_images_with_a_400_naming_llamacpp(tmp_path):
    d = start_daemon(tmp_path / "t", backend="torch")
    try:
        create_vision_model(d.url, "vis")
        with httpx.Client(base_url=d.url, timeout=300) as c:
            r = c.post("/api/generate", json={"model": "vis", "prompt": "hi", "images": [b64(png())],
                                              "stream": False})
            assert r.status_code == 400, r.text
            assert "torch backend does not run vision models" in r.json()["error"]
            assert "llama.cpp" in r.json()["error"]
            r = c.post("/api/generate", json={"model": "vis", "prompt": "hi", "stream": False,
                                              "options": {"num_predict": 2}})
            assert r.status_code == 200 and r.json()["eval_count"] == 2  # text still works
    finally:
        d.stop()


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python is not installed")
def test_without_libmtmd_images_are_a_501_naming_the_fix_and_text_still_works(daemon, monkeypatch):
    """A build without libmtmd (-DLLAVA_BUILD=OFF) loads the text model; an image names the rebuild."""
    from evenflow.backends.base import ModelLoadError
    from evenflow.backends.llamacpp import vision

    def missing():
        raise ModelLoadError(vision.MTMD_MISSING)

    monkeypatch.setattr(vision, "mtmd_module", missing)
    create_vision_model(daemon.url, "vis")
    with httpx.Client(base_url=daemon.url, timeout=300) as c:
        r = c.post("/api/chat", json={"model": "vis", "stream": False,
                                      "messages": [{"role": "user", "content": "hi", "images": [b64(png())]}]})
        assert r.status_code == 501, r.text
        assert "-DLLAVA_BUILD=ON" in r.json()["error"]
        r = c.post("/api/generate", json={"model": "vis", "prompt": "hi", "stream": False,
                                          "options": {"num_predict": 2}})
        assert r.status_code == 200 and r.json()["eval_count"] == 2
