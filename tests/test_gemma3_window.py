"""Real Gemma 3 270M (a 512-token window on 5 of every 6 layers) at the daemon's KV defaults: the document's next
question after an answer longer than the window, and after a restart (the disk KV cache), gives the cold run's
greedy tokens, served from the cache, and the restore keeps its windows as views of what it read. Skips where the
real weights are not fetched (../shared/tools/real_models.py; CI fetches them)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp")

from evenflow.backends.base import RunnerSettings, load_runner  # noqa: E402
from evenflow.daemon.engine import Engine, EngineConfig, SamplingParams  # noqa: E402
from evenflow.daemon.engine.kv_disk import DiskKVCache  # noqa: E402

TOOLS = Path(__file__).resolve().parents[2] / "shared" / "tools"
GEMMA3 = Path(os.environ.get("EVENFLOW_REAL_MODELS", Path.home() / ".cache" / "evenflow-real-models")) \
    / "gemma-3-270m-q4_k_m.gguf"
pytestmark = pytest.mark.skipif(not TOOLS.is_dir() or not GEMMA3.is_file(),
                                reason=f"real Gemma 3 weights not fetched ({GEMMA3}; ../shared/tools/real_models.py)")
WINDOW = 512
DOC = " ".join(f"Paragraph {i}: the river town of Elm{i} trades wool, salt and {i * 3} barrels of cider each autumn."
               for i in range(24))  # ~640 tokens: longer than the window


def load():
    # the daemon's defaults on a CPU (q8_0 K, flash attention off, streams), with fewer and shorter slots
    return load_runner("llamacpp", str(GEMMA3), RunnerSettings(max_num_seqs=2, context_length=2048))


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    warm, solo = load(), load()
    assert warm._window is not None and warm._window.n_swa == WINDOW
    tok = warm.tokenizer
    doc = tok.encode(DOC, add_special=True)
    assert len(doc) > WINDOW
    asks = [doc + tok.encode(f"\nQuestion: {q}\nAnswer:", add_special=False)
            for q in ("write a long story about Elm3.", "how many barrels does Elm12 sell?",
                      "what does Elm7 trade?")]
    yield warm, solo, doc, asks, tmp_path_factory.mktemp("kv")
    warm.close()
    solo.close()


def run(engine: Engine, prompt: list[int], n: int) -> list[int]:
    stream = engine.submit(prompt, SamplingParams(temperature=0, num_predict=n, ignore_eos=True), loop=None)
    while engine.run_once():
        pass
    return [t for d in stream for t in d.token_ids]


def cold(runner, prompt: list[int], n: int) -> list[int]:
    return run(Engine(runner, EngineConfig(prefix_caching=False)), prompt, n)


def test_the_next_question_after_an_answer_longer_than_the_window_and_after_a_restart(gemma):
    warm, solo, doc, asks, kv = gemma
    disk = DiskKVCache(kv, 1 << 30)
    engine = Engine(warm, EngineConfig(), kv_disk=disk, model_id="gemma3")
    run(engine, asks[0], WINDOW + 40)  # the window moves well past the document
    hit = engine.cache_hit_tokens
    assert run(engine, asks[1], 8) == cold(solo, asks[1], 8)
    assert engine.cache_hit_tokens - hit >= len(doc) // 16 * 16 and engine.blocks.rewind_tokens == 0
    engine.shutdown()
    assert disk.flush(60)
    warm.close()
    restarted = load()  # a restart: a new process would load the same file and read the same folder
    try:
        again = Engine(restarted, EngineConfig(), kv_disk=DiskKVCache(kv, 1 << 30), model_id="gemma3")
        again.warm_disk_cache()
        assert run(again, asks[2], 8) == cold(solo, asks[2], 8)
        assert again.disk.restored_tokens >= len(doc) // 16 * 16 and again.disk.failed == 0
        assert again.cache_hit_tokens >= len(doc) // 16 * 16 and again.blocks.rewind_tokens == 0
        # the restore copied none of its windows (they are most of the payload): views of it, counted once
        points = restarted._window._points
        held = [points.get(b) for b in list(points._data)]
        assert held and all(isinstance(w, memoryview) for w in held)
        assert len({id(w.obj) for w in held}) == 1 and points.bytes == len(held[0].obj)
    finally:
        restarted.close()
