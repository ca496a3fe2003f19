"""`hf.co/{user}/{repo}[:{quant}]` pulls against a fake hub on loopback (HF_ENDPOINT)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import httpx
import ollama
import pytest

from api_harness import BACKENDS, Daemon, start_daemon
from hub_server import Hub
from evenflow.daemon.store.hfpull import HubError, pick_gguf


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[Hub]:
    h = Hub()
    monkeypatch.setenv("HF_ENDPOINT", h.url)
    yield h
    h.close()


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    d = start_daemon(tmp_path, backend=BACKENDS[0])
    yield d
    d.stop()


def test_pick_gguf_for_the_quant_tag() -> None:
    files = ["README.md", "m-Q4_K_M.gguf", "m-Q8_0.gguf", "m.Q4_K_S.gguf", "mmproj-m-f16.gguf", "m-IQ4_XS.gguf"]
    assert pick_gguf(files, "latest") == "m-Q4_K_M.gguf"
    assert pick_gguf(files, "q8_0") == "m-Q8_0.gguf"
    assert pick_gguf(files, "Q4_K_S") == "m.Q4_K_S.gguf"
    assert pick_gguf(files, "IQ4_XS") == "m-IQ4_XS.gguf"
    assert pick_gguf(["a-Q8_0.gguf", "a-F16.gguf"], "latest") == "a-Q8_0.gguf"
    with pytest.raises(HubError, match="no GGUF for the quant 'Q2_K'"):
        pick_gguf(files, "Q2_K")
    with pytest.raises(HubError, match="no .gguf file"):
        pick_gguf(["config.json"], "latest")


def test_hf_pull_picks_the_quant_and_generates(daemon: Daemon, hub: Hub, synthetic_model) -> None:
    q8 = Path(synthetic_model("tiny", formats=("gguf",), gguf_dtype="q8_0")["gguf"]).read_bytes()
    f32 = Path(synthetic_model("tiny", formats=("gguf",), gguf_dtype="f32")["gguf"]).read_bytes()
    hub.repos["someone/tiny-GGUF"] = {"tiny-Q8_0.gguf": q8, "tiny-F32.gguf": f32, "README.md": b"hi"}
    c = ollama.Client(host=daemon.url)
    with httpx.stream("POST", daemon.url + "/api/pull", json={"model": "hf.co/someone/tiny-GGUF:Q8_0"},
                      timeout=120) as r:
        lines = [json.loads(x) for x in r.iter_lines() if x]
    assert lines[0] == {"status": "pulling manifest"} and lines[-1] == {"status": "success"}, lines
    assert hub.downloads == ["tiny-Q8_0.gguf"]
    m = {x.model: x for x in c.list().models}["hf.co/someone/tiny-GGUF:Q8_0"]
    assert m.details.quantization_level == "Q8_0" and m.size >= len(q8)
    assert c.generate("hf.co/someone/tiny-GGUF:Q8_0", "hi", options={"num_predict": 2}).eval_count == 2
    # no quant: Q4_K_M is absent, so the next default (Q8_0) is taken; its blob is already here
    c.pull("hf.co/someone/tiny-GGUF")
    assert hub.downloads == ["tiny-Q8_0.gguf"]
    with pytest.raises(ollama.ResponseError, match="no GGUF for the quant 'Q5_K_M'"):
        c.pull("hf.co/someone/tiny-GGUF:Q5_K_M")
    with pytest.raises(ollama.ResponseError, match="someone/missing"):
        c.pull("hf.co/someone/missing")
