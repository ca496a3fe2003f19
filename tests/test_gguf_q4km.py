"""docs/bench/gguf_q4km.py (the GPU check's 8B-shaped model, here 2 small layers): llama.cpp loads it as Q4_K_M,
its logits are finite, and the vocabulary's control tokens can never win greedy decoding."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llama_cpp")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docs" / "bench"))
from gguf_q4km import more_bits, write  # noqa: E402

from evenflow.backends.base import Batch, RunnerSettings, load_runner  # noqa: E402


def test_q4km_layout_loads_and_decodes(tmp_path, synthetic_model):
    vocab = synthetic_model("tiny", "llama", formats=("gguf",))["gguf"]
    out = write(tmp_path / "m.gguf", vocab, layers=2, hidden=256, ffn=512, heads=4, kv_heads=2, ctx=4096)
    assert out["layers"] == 2 and out["weight_bytes"] > 0
    assert [more_bits(i, 32) for i in (0, 3, 4, 6, 8, 28, 31)] == [True, True, False, True, False, True, True]
    r = load_runner("llamacpp", str(tmp_path / "m.gguf"), RunnerSettings(context_length=256, max_num_seqs=2))
    try:
        assert r.info.file_type == "Q4_K_M" and r.info.block_count == 2
        ids = r.tokenizer.encode("hello world, a test of the random weights")
        logits = r.step(Batch.from_spans([(0, ids, 0, [], True)], 16))[0]
        assert np.isfinite(logits).all() and logits.std() > 0
        for eos in r.tokenizer.eos_ids:  # zeroed output rows: exactly 0, below the best of the random ones
            assert logits[eos] == 0.0 and logits.max() > 0
    finally:
        r.close()
