"""Image spans in the engine (issue 30): embedding rows decode exactly like the tokens they stand for, chunking an
image span never changes the output, and a non-causal span is placed whole."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")

from evenflow.backends.base import EmbedSpan, RunnerSettings  # noqa: E402
from evenflow.backends.llamacpp.runner import load  # noqa: E402
from evenflow.backends.synthetic import make_spec  # noqa: E402
from evenflow.backends.synthetic.random_weights import build_weights  # noqa: E402
from evenflow.daemon.engine import Engine  # noqa: E402
from evenflow.daemon.engine.engine_config import EngineConfig  # noqa: E402
from evenflow.daemon.engine.params import SamplingParams  # noqa: E402
from evenflow.daemon.engine.sequence import Sequence  # noqa: E402

from vision_util import png, vision_files  # noqa: E402

BS = 16


def _runner(projector: bool):
    model, proj = vision_files()
    return load(str(model), RunnerSettings(max_num_seqs=2, block_size=BS, num_kv_blocks=64, num_threads=2,
                                           max_num_batched_tokens=256, flash_attention="off",
                                           projector_path=str(proj) if projector else None))


def _greedy(runner, ids, embeds, n, chunk=None, mode="chunked"):
    eng = Engine(runner, EngineConfig(max_num_batched_tokens=256, max_prefill_chunk=chunk, prefill_mode=mode,
                                      prefix_caching=False))
    stream = eng.submit(ids, SamplingParams(temperature=0, num_predict=n), loop=None, embeds=embeds)
    while eng.run_once():
        pass
    return [t for d in stream for t in d.token_ids]


def test_embedding_rows_decode_like_their_tokens():
    """Rows taken from the model's own token embeddings, fed as an image span, give the tokens' greedy output:
    the embedding llama_decode calls keep positions, KV and order right, in any chunking."""
    r = _runner(projector=False)
    try:
        table = build_weights(make_spec("tiny", architecture="llama"))["model.embed_tokens.weight"]
        ids = r.tokenizer.encode("def add(a, b):\n    return a + b\nprint(add(2, 3))\n")
        assert len(ids) > 20
        ref = _greedy(r, ids, None, 8)
        lo, hi = 3, 3 + 13
        rows = np.ascontiguousarray(table[ids[lo:hi]], dtype=np.float32)
        placeholders = ids[:lo] + [-1 - j for j in range(hi - lo)] + ids[hi:]
        for chunk in (None, 1, 5, 16):
            assert _greedy(r, placeholders, [EmbedSpan(lo, rows)], 8, chunk) == ref, f"chunk {chunk}"
    finally:
        r.close()


def test_image_prompt_same_output_for_every_chunk_size():
    from evenflow.backends.llamacpp.vision import mtmd_available

    if not mtmd_available():
        pytest.skip("this llama-cpp-python build has no libmtmd (built with -DLLAVA_BUILD=OFF)")
    r = _runner(projector=True)
    try:
        assert r.vision is not None, r.vision_error
        mm = r.vision.build_prompt(f"USER: {r.vision.marker}\nwhat is it? ASSISTANT:", [png(seed=3)], True)
        assert len(mm.embeds) == 1 and len(mm.embeds[0].rows) == 16 and mm.embeds[0].causal
        assert all(t < 0 for t in mm.token_ids[mm.embeds[0].start:mm.embeds[0].end])
        ref = _greedy(r, mm.token_ids, mm.embeds, 8, mode="monolithic")
        for chunk in (1, 4, 7, 16):
            assert _greedy(r, mm.token_ids, mm.embeds, 8, chunk) == ref, f"chunk {chunk}"
        again = r.vision.build_prompt(f"USER: {r.vision.marker}\nagain ASSISTANT:", [png(seed=3)], True)
        assert r.vision.encodes == 1  # the same image's rows came from the encoder's cache
        assert again.token_ids[again.embeds[0].start:again.embeds[0].end] == \
            mm.token_ids[mm.embeds[0].start:mm.embeds[0].end]  # same image, same placeholder ids (prefix cache key)
    finally:
        r.close()


def test_a_non_causal_span_is_never_split():
    seq = Sequence(list(range(40)), SamplingParams(), 100,
                   embeds=[EmbedSpan(10, np.zeros((16, 4), np.float32), causal=False)])
    assert seq.fit_chunk(5) == 5  # before the span
    assert seq.fit_chunk(15) == 10  # would end inside: stops at its start
    seq.num_computed = 10
    assert seq.fit_chunk(4) == 16  # at its start: the whole span
    assert seq.fit_chunk(30) == 30  # covers it whole


def test_the_engine_places_a_non_causal_span_whole():
    """An image whose rows attend each other both ways (Gemma 3's projector) is never cut by a chunk: every step's
    prefill ends before the span or at/after its end, and its rows run with causal attention off."""
    r = _runner(projector=False)
    try:
        ids = r.tokenizer.encode("def add(a, b):\n    return a + b\nprint(add(2, 3))\n")
        lo, n = 4, 13
        rows = np.random.default_rng(0).standard_normal((n, 64)).astype(np.float32) * 0.02
        eng = Engine(r, EngineConfig(max_num_batched_tokens=256, max_prefill_chunk=5, prefix_caching=False))
        ends = []
        eng.subscribe(lambda e: ends.extend(c for _, c in e["prefilled"]) if e["type"] == "step" else None)
        stream = eng.submit(ids[:lo] + [-1 - j for j in range(n)] + ids[lo + n:],
                            SamplingParams(temperature=0, num_predict=3), loop=None,
                            embeds=[EmbedSpan(lo, rows, causal=False)])
        while eng.run_once():
            pass
        assert sum(len(d.token_ids) for d in stream) == 3
        assert ends and not any(lo < e < lo + n for e in ends), ends
        assert lo + n in ends  # the span went in as one piece (13 rows with chunks of 5)
    finally:
        r.close()


def test_an_image_prompt_comes_back_from_the_disk_kv_cache(tmp_path):
    """An image's KV is saved and restored like text's (its placeholder ids key the blocks): after a restore the
    greedy output equals the cold one."""
    from evenflow.backends.llamacpp.vision import mtmd_available
    from evenflow.daemon.engine.kv_disk import DiskKVCache

    if not mtmd_available():
        pytest.skip("this llama-cpp-python build has no libmtmd (built with -DLLAVA_BUILD=OFF)")
    r = _runner(projector=True)
    try:
        text = " ".join(f"line {i} of the screenshot says something." for i in range(12))
        first = r.vision.build_prompt(f"USER: {r.vision.marker}\n{text}\nWhat is it? ASSISTANT:", [png(seed=5)], True)
        ask = r.vision.build_prompt(f"USER: {r.vision.marker}\n{text}\nAnd why? ASSISTANT:", [png(seed=5)], True)
        cold = _greedy(r, ask.token_ids, ask.embeds, 8)

        def run(eng, mm):
            stream = eng.submit(mm.token_ids, SamplingParams(temperature=0, num_predict=8), loop=None,
                                embeds=mm.embeds)
            while eng.run_once():
                pass
            return [t for d in stream for t in d.token_ids]

        disk = DiskKVCache(tmp_path, 1 << 30, min_tokens=32)
        eng = Engine(r, EngineConfig(max_num_batched_tokens=64), kv_disk=disk, model_id="vision")
        run(eng, first)
        eng.shutdown()
        assert disk.flush(30)
        again = Engine(r, EngineConfig(max_num_batched_tokens=64), kv_disk=disk, model_id="vision")
        assert run(again, ask) == cold
        assert again.disk.restored_tokens >= 48  # the image's rows and the text after them, not recomputed
    finally:
        r.close()
