"""Issue 27's first repro through HTTP, at default settings: prompts that share a prefix with cached conversations,
sent one at a time and then eight at once with the real `ollama` client, round after round. Before the fix 9-14 of 30
concurrent requests failed ("prefix ... is not held in any llama.cpp stream")."""
from __future__ import annotations

import concurrent.futures
from pathlib import Path

import ollama
import pytest

from api_harness import Daemon, start_daemon, upload_model


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, synthetic_model, fixtures_dir) -> Daemon:
    vocab = fixtures_dir / "vocab" / "ggml-vocab-llama-spm.gguf"
    if not vocab.is_file():
        pytest.skip(f"{vocab} not present")
    gguf = synthetic_model("tiny", "llama", formats=("gguf",), gguf_dtype="q8_0", vocab=str(vocab))["gguf"]
    d = start_daemon(tmp_path_factory.mktemp("shared-prefix"))  # the default backend: llama.cpp on a CPU
    upload_model(d.url, Path(gguf), "spm")
    yield d
    d.stop()


PREAMBLE = "You are a storyteller. Write one short story about the number you are given, in plain words. "


def test_concurrent_requests_sharing_cached_prefixes_all_succeed(daemon: Daemon) -> None:
    client = ollama.Client(host=daemon.url, timeout=120)
    opts = {"num_predict": 16, "temperature": 0}

    def streamed(prompt: str) -> tuple[str, str]:
        parts = list(client.generate(model="spm", prompt=prompt, options=opts, stream=True))
        return "".join(p.response for p in parts), parts[-1].done_reason

    tried = 0
    for r in range(5):
        # the same instructions before every prompt, as an app's system prompt, once to three times: prefixes of
        # several lengths shared with the cached conversations of earlier rounds
        prompts = [f"{PREAMBLE * (1 + i % 3)} Story {r} number {i}:" for i in range(8)]
        for p in prompts:
            assert client.generate(model="spm", prompt=p, options=opts).done_reason == "length"
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            for text, reason in pool.map(streamed, prompts):  # a failure raises ollama.ResponseError here
                assert reason == "length" and text
                tried += 1
    assert tried == 40
    engine = daemon.ctx.manager.models["spm:latest"].engine
    stats = engine.stats()
    assert stats.cache_hit_tokens > 0 and stats.kv_blocks_used == 0
    assert engine.runner.backend == "llamacpp"
