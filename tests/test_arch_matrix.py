"""Every architecture the synthetic factory writes as GGUF only (gemma3, gpt-oss, qwen3moe, lfm2, qwen35, deepseek2) on
llama.cpp: it loads with its tokenizer and chat template, and with flash attention off and on, chunked prefill and
prefix hits give what one pass over the whole prompt gives. (test_cache_model.py runs the concurrent, cached,
preempted and aborted requests over them; test_kv_disk.py the disk KV cache; test_recurrent_checkpoints.py the
hybrid models' state checkpoints.)"""
from __future__ import annotations

import random

import numpy as np
import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")

from evenflow.backends.base import RunnerSettings, load_runner  # noqa: E402
from evenflow.backends.synthetic.tokenizer import family_for  # noqa: E402
from evenflow.backends.synthetic.archs import ARCHS, GGUF_ONLY  # noqa: E402
from evenflow.daemon.engine import Engine, EngineConfig, SamplingParams  # noqa: E402
from evenflow.daemon.prompt.templates import render_chat  # noqa: E402

BS = 4


# KV settings: f32 without flash attention (logits independent of batching), f32 with it, the daemon's defaults (on a
# CPU: a q8_0 K where heads are a multiple of 32 values and K and V may differ, flash attention off; on a GPU build:
# f16, auto), and a q8_0 K and V with flash attention
KV = {"f32": dict(dtype="float32", flash_attention="off"), "f32-fa": dict(dtype="float32", flash_attention="on"),
      "default": {}, "q8_0-fa": dict(kv_cache_type="q8_0", flash_attention="on")}
TOLERANCE = {"f32": 1e-4, "f32-fa": 2e-2, "default": 5e-2, "q8_0-fa": 5e-2}


def load(path, kv: str = "f32", layout: str = "streams"):
    return load_runner("llamacpp", str(path), RunnerSettings(
        max_num_seqs=3, block_size=BS, context_length=128, max_num_batched_tokens=128, num_threads=2, kv_layout=layout,
        **KV[kv]))


def run(engine: Engine, prompt: list[int], n: int = 6) -> tuple[list[int], list[float], int]:
    stream = engine.submit(prompt, SamplingParams(temperature=0, num_predict=n), loop=None, logprobs=0)
    while engine.run_once():
        pass
    deltas = list(stream)
    assert deltas[-1].done_reason == "length", deltas[-1].error
    return ([t for d in deltas for t in d.token_ids], [lp.logprob for d in deltas for lp in d.logprobs or []],
            deltas[-1].metrics.cached_tokens)


@pytest.mark.parametrize("arch", GGUF_ONLY)
def test_the_architecture_loads_with_its_tokenizer_and_chat_template(arch, synthetic_model):
    path = synthetic_model("tiny", arch, formats=("gguf",))["gguf"]
    r = load(path)
    try:
        assert r.info.architecture == arch and r.checkpoint_every == (512 if "recurrent" in ARCHS[arch].kind else None)
        tok, fam = r.tokenizer, family_for(arch)
        text = "def main():\n    return 'héllo wörld' 😀"
        assert tok.decode(tok.encode(text, add_special=False)) == text
        prompt = render_chat(r.chat_template, [{"role": "system", "content": "Be brief."},
                                               {"role": "user", "content": "Hello there"}],
                             bos_token=fam.bos or "", eos_token=fam.eos)
        ids = tok.encode(prompt, add_special=False)
        specials = {s: tok.encode(s, add_special=False) for s in fam.specials}
        used = [s for s in fam.specials if s in prompt]
        assert used, f"{arch}'s template uses none of its control tokens"
        for s in used:  # each control token the template writes is one token, and is where the text put it
            assert len(specials[s]) == 1 and specials[s][0] in ids, s
        assert "Be brief." in tok.decode(ids) and "Hello there" in tok.decode(ids)
        assert {specials[s][0] for s in fam.stop} <= set(tok.eos_ids)  # every end-of-turn token ends a generation
    finally:
        r.close()


@pytest.mark.parametrize("kv", ["f32", "f32-fa", "default"])
@pytest.mark.parametrize("arch", GGUF_ONLY)
def test_chunked_prefill_and_prefix_hits_give_the_one_pass_output(arch, kv, synthetic_model):
    """One pass over the whole prompt, chunks of 7 tokens, and a hit on a cached prefix of another prompt: the same
    tokens and log-probabilities. With flash attention on, llama.cpp's CPU kernel rounds Q.K through f16 and its
    result depends on how many queries share a pass; a quantized K rounds too: hence the looser bounds."""
    path = synthetic_model("tiny", arch, formats=("gguf",), gguf_dtype="f32", qk_std=0.3)["gguf"]
    rng = random.Random(arch)
    doc = [rng.randrange(10, 1900) for _ in range(53)]
    first, second = doc + [rng.randrange(10, 1900) for _ in range(5)], doc + [rng.randrange(10, 1900)]
    tol = TOLERANCE[kv]
    r = load(path, kv)
    try:
        one_pass = [run(Engine(r, EngineConfig(prefill_mode="monolithic", prefix_caching=False)), p)
                    for p in (first, second)]
        chunked = run(Engine(r, EngineConfig(max_num_batched_tokens=7, target_itl_ms=0, prefix_caching=False)), first)
        warm = Engine(r, EngineConfig(max_num_batched_tokens=24, target_itl_ms=0))
        run(warm, first)
        hit = run(warm, second)  # the document's blocks cached by the first prompt; its one-token tail computed
        assert hit[2] >= 48, "the second prompt should start on the cached document"
        for got, want in ((chunked, one_pass[0]), (hit, one_pass[1])):
            assert got[0] == want[0]
            np.testing.assert_allclose(got[1], want[1], atol=tol)
        assert warm.stats().prefix_fallback_tokens == 0
    finally:
        r.close()


@pytest.mark.parametrize("arch", [a for a in GGUF_ONLY if "sliding" not in ARCHS[a].kind])
def test_the_kv_planned_per_token_is_what_llamacpp_keeps(arch, synthetic_model):
    """The pool is sized by KV bytes per token (gguf_info.kv_bytes_per_token): per layer as its KV heads count them (a
    hybrid model's recurrent layers keep one state per sequence instead), one latent row for MLA. Measured as what a
    sequence's saved state grows by per token (cells' data and up to 32 bytes of positions and sequence ids each; a
    window model's saved state stops growing at its window, so it is left out)."""
    import ctypes

    import llama_cpp.llama_cpp as L

    from evenflow.backends.base import Batch
    from evenflow.backends.llamacpp.gguf_info import kv_bytes_per_token, read_header

    path = synthetic_model("tiny", arch, formats=("gguf",))["gguf"]
    r = load(path)
    try:
        sizes = []
        for start, n in ((0, 40), (40, 20)):
            r.step(Batch.from_spans([(0, list(range(100, 100 + n)), start, [], True)], BS))
            sizes.append(L.llama_state_seq_get_size(r._ctx, ctypes.c_int32(0)))
        assert r.kv_types == ("f32", "f32")
        per_token = (sizes[1] - sizes[0]) / 20
        assert 0 <= per_token - kv_bytes_per_token(r.info, read_header(str(path)), 4) <= 32
    finally:
        r.close()


@pytest.mark.parametrize("layout", ["streams", "unified"])
@pytest.mark.parametrize("kv", ["f32-fa", "q8_0-fa"])
def test_mla_prefixes_come_back_from_disk_with_flash_attention_and_a_quantized_kv(kv, layout, synthetic_model,
                                                                                   tmp_path):
    """DeepSeek's latent KV rows (K only, V read from them; in f32 or q8_0) saved at shutdown and put back by a new
    engine: the cold run's output. (llama.cpp wants one type for an MLA model's K and V, and a quantized V needs flash
    attention: without it a quantized KV is refused by name, and auto keeps f16.)"""
    from evenflow.daemon.engine.kv_disk import DiskKVCache

    path = synthetic_model("tiny", "deepseek2", formats=("gguf",), gguf_dtype="f32", qk_std=0.3)["gguf"]
    rng = random.Random(4)
    doc = [rng.randrange(10, 1900) for _ in range(70)]
    ask = doc + [rng.randrange(10, 1900) for _ in range(3)]
    r = load(path, kv, layout)
    try:
        want = run(Engine(r, EngineConfig(max_num_batched_tokens=24, target_itl_ms=0, prefix_caching=False)), ask)
        disk = DiskKVCache(tmp_path, 1 << 30, min_tokens=16)
        first = Engine(r, EngineConfig(max_num_batched_tokens=24, target_itl_ms=0), kv_disk=disk, model_id="m")
        run(first, doc + [rng.randrange(10, 1900)])
        first.shutdown()
        assert disk.flush(30)
        again = Engine(r, EngineConfig(max_num_batched_tokens=24, target_itl_ms=0), kv_disk=disk, model_id="m")
        got = run(again, ask)
        assert again.disk.restored_tokens == 68 and again.disk.failed == 0 and got[2] == 68
        assert got[0] == want[0]
        np.testing.assert_allclose(got[1], want[1], atol=TOLERANCE[kv])
        assert r.kv_types == (("f32", "f32") if kv == "f32-fa" else ("q8_0", "q8_0"))
    finally:
        r.close()
    from evenflow.backends.base import ModelLoadError

    with pytest.raises(ModelLoadError, match="needs flash attention on"):
        load_runner("llamacpp", str(path), RunnerSettings(max_num_seqs=3, block_size=BS, context_length=128,
                                                          kv_cache_type="q8_0", flash_attention="off"))
