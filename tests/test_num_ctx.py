"""num_ctx is a per-sequence limit (issue 38): a request's num_ctx changes nothing loaded while one sequence of the KV
pool can hold it; only a larger one reloads (and the log says why), and a generation stops at its own num_ctx."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
from pathlib import Path
from typing import Any, Iterator

import httpx
import ollama
import pytest

from api_harness import BACKENDS, Daemon, start_daemon, upload_model
from evenflow.backends.base import RunnerSettings, load_runner
from evenflow.daemon.settings import load_settings
from evenflow.daemon.manager import ModelManager
from evenflow.daemon.model_types import CannotServe, ModelRecord
from evenflow.daemon.engine import Engine, EngineConfig, PromptTooLong, SamplingParams
from toy_runner import ToyRunner

WINDOW = 512  # the daemon's default num_ctx in these tests
TRAINED = 8192


@pytest.fixture(scope="module")
def gguf(synthetic_model) -> Path:
    return Path(synthetic_model("tiny", formats=("gguf",), max_position_embeddings=TRAINED)["gguf"])


@pytest.fixture(scope="module", params=BACKENDS)
def daemon(request, tmp_path_factory, gguf: Path) -> Iterator[Daemon]:
    d = start_daemon(tmp_path_factory.mktemp("num-ctx"), backend=request.param, context_length=str(WINDOW))
    upload_model(d.url, gguf, "tiny")
    d.backend = request.param  # type: ignore[attr-defined]
    yield d
    d.stop()


class Loads:
    """The manager's model events, as /api/events gets them: counts the loads."""

    def __init__(self, daemon: Daemon) -> None:
        self.events: list[dict] = []
        daemon.ctx.manager.add_listener(self.events.append)

    @property
    def count(self) -> int:
        return sum(1 for e in self.events if e.get("type") == "model" and e.get("event") == "loaded")


def _generate(daemon: Daemon, num_ctx: int | None, prompt: str = "x", shift: bool | None = None,
              **options: Any) -> dict:
    opts = {"num_predict": 1, "temperature": 0, **options}
    if num_ctx is not None:
        opts["num_ctx"] = num_ctx
    body = {"model": "tiny", "prompt": prompt, "stream": False, "options": opts}
    if shift is not None:
        body["shift"] = shift
    r = httpx.post(daemon.url + "/api/generate", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def _ps(daemon: Daemon) -> dict:
    return next(m for m in httpx.get(daemon.url + "/api/ps").json()["models"] if m["name"] == "tiny:latest")


def test_switching_num_ctx_does_not_reload(daemon: Daemon, caplog) -> None:
    _generate(daemon, None)
    loads = Loads(daemon)
    model = daemon.ctx.manager.models["tiny:latest"]
    pool = _ps(daemon)["kv_pool"]
    assert _ps(daemon)["context_length"] == WINDOW and pool["max_context"] >= WINDOW
    assert pool["tokens"] >= pool["max_context"] and 0 <= pool["held"] <= pool["tokens"]
    biggest = pool["max_context"]  # llama.cpp: a stream of the window; torch/MLX: the whole paged pool
    for n in (128, WINDOW, 300, biggest, None, 64, biggest):
        _generate(daemon, n)
        assert daemon.ctx.manager.models["tiny:latest"] is model, f"num_ctx {n} reloaded the model"
    # a client that sends its own num_ctx on every chat (Open WebUI, Aider do) through Ollama's own client
    client = ollama.Client(host=daemon.url)
    for n in (2 * WINDOW if biggest >= 2 * WINDOW else WINDOW // 2, 100, biggest):
        r = client.chat("tiny", messages=[{"role": "user", "content": "hi"}],
                        options={"num_ctx": n, "num_predict": 2, "temperature": 0})
        assert r.done and r.eval_count is not None and r.eval_count >= 1
        assert daemon.ctx.manager.models["tiny:latest"] is model, f"num_ctx {n} reloaded the model"
    assert loads.count == 0
    # one more token than a sequence can hold: a reload, and the log says why
    with caplog.at_level(logging.INFO, logger="evenflow.daemon.manager"):
        _generate(daemon, biggest + 1)
    assert loads.count == 1
    why = [r.getMessage() for r in caplog.records if r.getMessage().startswith("reloading tiny:latest")]
    assert why and f"num_ctx {biggest + 1} is more than one sequence can hold in its KV pool" in why[0], why
    grown = _ps(daemon)
    assert grown["kv_pool"]["max_context"] >= biggest + 1
    model = daemon.ctx.manager.models["tiny:latest"]
    for n in (None, 64, biggest + 1):  # the default window again, and the large one: no reload back and forth
        _generate(daemon, n)
        assert daemon.ctx.manager.models["tiny:latest"] is model
    assert loads.count == 1


def test_a_generation_stops_or_shifts_at_its_own_num_ctx(daemon: Daemon) -> None:
    biggest = _ps(daemon)["kv_pool"]["max_context"]
    model = daemon.ctx.manager.models["tiny:latest"]
    # below the default window, and (on a paged pool) above it: each sequence's own limit, no reload; long prompts
    # leave a few dozen tokens to generate
    for n in sorted({200, min(biggest, 2 * WINDOW)}):
        prompt = "count with me " * ((n - 40) // 3)
        p = _generate(daemon, n, prompt=prompt)["prompt_eval_count"]
        assert n - 64 < p < n  # the synthetic vocabulary gives about one token a word
        out = _generate(daemon, n, prompt=prompt, num_predict=100000, ignore_eos=True, shift=False)
        assert out["done_reason"] == "length"
        assert out["prompt_eval_count"] + out["eval_count"] == n, out
        # with Ollama's context shift (on by default) the window that fills is the sequence's own: the first shift
        # comes when prompt + output reach n, not the loaded window
        extra = 8
        out = _generate(daemon, n, prompt=prompt, num_predict=n - p + extra, ignore_eos=True)
        assert out["done_reason"] == "length" and out["eval_count"] == n - p + extra, out
        assert out["truncated"]["shifts"] == 1, out
    assert daemon.ctx.manager.models["tiny:latest"] is model


def test_ps_pool_fields_through_the_official_client(daemon: Daemon) -> None:
    _generate(daemon, None)
    m = next(m for m in ollama.Client(host=daemon.url).ps().models if m.model == "tiny:latest")
    assert m.context_length == _ps(daemon)["context_length"]  # Ollama's client reads the usual fields and ignores ours
    pool = _ps(daemon)["kv_pool"]
    assert set(pool) == {"tokens", "held", "cached", "slots", "running", "max_context", "available"}
    assert pool["running"] == 0 and pool["available"] == pool["max_context"]  # idle: any slot, a whole window


def test_num_ctx_over_the_trained_window_is_refused_before_loading(daemon: Daemon) -> None:
    r = httpx.post(daemon.url + "/api/generate", json={"model": "tiny", "prompt": "x",
                                                       "options": {"num_ctx": TRAINED + 1}})
    assert r.status_code == 400 and f"use num_ctx <= {TRAINED}" in r.json()["error"]


def test_pool_too_small_even_after_a_reload_is_a_clear_error(tmp_path: Path, gguf: Path) -> None:
    """A machine whose memory gives the KV 1024 tokens: a larger num_ctx reloads once, then is refused (400)."""
    loads: list[RunnerSettings] = []

    def small_memory(backend: str, path: str, rs: RunnerSettings):
        loads.append(rs)
        return load_runner(backend, path, dataclasses.replace(rs, num_kv_blocks=1024 // rs.block_size))

    settings = load_settings({}, {"backend": BACKENDS[0], "context_length": str(WINDOW), "kv_cache_size": "0",
                                  "models": str(tmp_path)})
    record = ModelRecord("tiny:latest", str(gguf), context_length=TRAINED)

    async def scenario() -> None:
        manager = ModelManager(settings, lambda name: record, loader=small_memory)
        try:
            lease = await manager.acquire("tiny", num_ctx=1000)
            assert lease.num_ctx == 1000 and len(loads) == 1
            lease.release()
            for _ in range(2):  # the first reloads for the window, the second does not try again
                with pytest.raises(CannotServe, match=r"num_ctx 4000 is more than one sequence .* use num_ctx <= 1024"):
                    await manager.acquire("tiny", num_ctx=4000)
            assert len(loads) == 2 and loads[1].context_length == 4000
            lease = await manager.acquire("tiny")  # the default window still fits
            assert lease.num_ctx == WINDOW and len(loads) == 2
            lease.release()
        finally:
            await manager.shutdown()

    asyncio.run(scenario())


def test_engine_limits_each_sequence() -> None:
    runner = ToyRunner(num_kv_blocks=64, block_size=4, max_num_seqs=4, context_length=256)
    engine = Engine(runner, EngineConfig(context_length=64))
    assert engine.context_length == 64 and engine.max_context == 256
    params = SamplingParams(temperature=0, num_predict=1000, ignore_eos=True)
    engine.start()
    try:
        for window, prompt in ((None, 10), (32, 10), (200, 50)):
            deltas = list(engine.submit(list(range(1, prompt + 1)), params, context_length=window))
            out = sum(len(d.token_ids) for d in deltas)
            assert deltas[-1].done_reason == "length" and prompt + out == (window or 64)
        with pytest.raises(ValueError, match="one sequence can hold"):
            engine.submit([1, 2, 3], params, context_length=257)
        with pytest.raises(PromptTooLong):
            engine.submit(list(range(1, 33)), params, context_length=32)
    finally:
        engine.shutdown()
