"""Ollama's num_gpu / main_gpu reach the runner's settings, reload the model when they change (as Ollama's
needsReload does), and /api/ps's size_vram is what the runner holds on the GPU."""
from __future__ import annotations

import asyncio

import pytest

from evenflow.daemon.api.http.errors import APIError
from evenflow.daemon.api.pipeline.options import requested_gpu
from evenflow.daemon.settings import load_settings
from evenflow.daemon.manager import ModelManager, _device
from evenflow.daemon.model_types import GpuOptions, ModelRecord
from evenflow.daemon.model_report import vram_size

from toy_runner import ToyRunner


def test_requested_gpu_options():
    assert requested_gpu(None) == GpuOptions()
    assert requested_gpu({"num_gpu": 0, "main_gpu": 1}) == GpuOptions(0, 1)
    assert requested_gpu({"num_gpu": -1.0}) == GpuOptions(-1, None)
    for bad in ({"num_gpu": -2}, {"num_gpu": "all"}, {"main_gpu": -1}, {"main_gpu": True}, {"num_gpu": 1.5}):
        with pytest.raises(APIError, match="must be an integer"):
            requested_gpu(bad)


def test_reload_rule():
    loaded = GpuOptions(None, None)
    assert not GpuOptions().reloads(loaded) and not GpuOptions(-1).reloads(loaded)  # auto never reloads
    assert GpuOptions(0).reloads(loaded) and GpuOptions(20).reloads(GpuOptions(0))
    assert not GpuOptions(20).reloads(GpuOptions(20, 1)) and GpuOptions(main_gpu=0).reloads(GpuOptions(20, 1))
    assert GpuOptions(main_gpu=None).over(GpuOptions(5, 1)) == GpuOptions(5, 1)  # a request over PARAMETERs
    assert GpuOptions(0).over(GpuOptions(5, 1)) == GpuOptions(0, 1)


def test_torch_device_from_the_options():
    assert _device("torch", "auto", GpuOptions(0)) == "cpu"
    assert _device("torch", "auto", GpuOptions(main_gpu=1)) == "cuda:1"
    assert _device("torch", "auto", GpuOptions()) == "auto"
    assert _device("torch", "cuda:0", GpuOptions(0)) == "cuda:0"  # EVENFLOW_DEVICE wins
    assert _device("llamacpp", "auto", GpuOptions(0)) == "auto"  # llama.cpp reads num_gpu itself


def test_manager_passes_the_options_and_reloads_on_change(tmp_path):
    calls = []

    def loader(backend, path, rs):
        calls.append((backend, rs))
        runner = ToyRunner()
        runner.vram_bytes = 0 if rs.num_gpu == 0 else 1000  # as a llama.cpp runner counts it
        return runner

    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF" + b"\0" * 60)
    params = {"main_gpu": 0}
    settings = load_settings(env={"EVENFLOW_BACKEND": "llamacpp"})
    mgr = ModelManager(settings, lambda name: ModelRecord(name, str(path), size=5000, params=params), loader)

    async def run():
        async def use(**kw):
            lease = await mgr.acquire("m", **kw)
            lease.release()
            return lease.model

        m = await use()
        assert len(calls) == 1 and (calls[0][1].num_gpu, calls[0][1].main_gpu) == (None, 0)  # the PARAMETER
        assert calls[0][1].context_length == 4096  # no GPU memory here: Ollama's smallest default
        assert vram_size(m) == 1000
        await use(gpu=GpuOptions(-1))
        await use()
        assert len(calls) == 1  # auto and nothing asked: the loaded model serves
        m = await use(gpu=GpuOptions(0))
        assert len(calls) == 2 and calls[1][1].num_gpu == 0 and vram_size(m) == 0
        await use(gpu=GpuOptions(0, 0))
        assert len(calls) == 2
        await use(gpu=GpuOptions(main_gpu=1))
        assert len(calls) == 3 and calls[2][1].main_gpu == 1
        await mgr.shutdown()

    asyncio.run(run())


def test_num_gpu_over_http(tmp_path, synthetic_model):
    """Through /api/generate: a bad num_gpu is a 400 before any load; num_gpu 0 loads on the CPU (size_vram 0);
    a changed num_gpu reloads the model."""
    pytest.importorskip("llama_cpp")
    import httpx

    from api_harness import start_daemon, upload_model

    d = start_daemon(tmp_path, backend="llamacpp", context_length="256")
    try:
        upload_model(d.url, synthetic_model("tiny", "llama", formats=("gguf",))["gguf"], "tiny")
        with httpx.Client(base_url=d.url, timeout=120) as c:
            r = c.post("/api/generate", json={"model": "tiny", "prompt": "hi", "options": {"num_gpu": "all"}})
            assert r.status_code == 400 and "option 'num_gpu' must be an integer >= -1" in r.json()["error"]
            assert c.get("/api/ps").json()["models"] == []  # refused before loading
            body = {"model": "tiny", "prompt": "hi", "stream": False, "options": {"num_gpu": 0, "num_predict": 2}}
            assert c.post("/api/generate", json=body).status_code == 200
            (ps,) = c.get("/api/ps").json()["models"]
            assert ps["size_vram"] == 0 and ps["size"] > 0
            loads = d.ctx.manager.models["tiny:latest"]
            body["options"]["num_gpu"] = 5
            assert c.post("/api/generate", json=body).status_code == 200
            assert d.ctx.manager.models["tiny:latest"] is not loads  # reloaded with the new option
            assert d.ctx.manager.models["tiny:latest"].gpu == GpuOptions(5, None)
    finally:
        d.stop()
