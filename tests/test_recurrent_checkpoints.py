"""Recurrent-state checkpoints (backends/llamacpp/recurrent.py) and the scheduling that makes them land on block
boundaries (scheduler.checkpoint_chunk): hybrid models' prefix hits and disk restores resume from a checkpoint and
recompute the rest, giving the cold run's tokens and log-probabilities."""
from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evenflow.daemon.engine import Engine, EngineConfig, SamplingParams
from evenflow.daemon.engine.scheduler import checkpoint_chunk

from toy_runner import ToyRunner


@settings(max_examples=400, deadline=None)
@given(start=st.integers(0, 300), n=st.integers(1, 200), extra=st.integers(0, 300), bs=st.sampled_from([1, 4, 16]),
       every=st.sampled_from([8, 48, 512]))
def test_a_recurrent_chunk_ends_where_a_checkpoint_can_be_taken(start, n, extra, bs, every):
    total = start + n + extra  # a chunk never runs past the known tokens
    got = checkpoint_chunk(start, n, total, bs, every)
    end, want = start + got, start + min(n, every)
    assert 1 <= got <= min(n, every)
    last = (total - 1) // bs * bs  # the furthest block boundary a later prefix hit can reach
    if want >= total and start < last:  # the last chunk stops at the last full block; the rest goes next step
        assert end == last
    elif want < total and want // bs > start // bs:  # crossing a boundary: it stops on the last one, losing < a block
        assert end % bs == 0 and want - end < bs
    else:  # no boundary within reach: all of it
        assert got == min(n, every)


def drive(engine: Engine, prompt: list[int], n: int = 2) -> list[int]:
    stream = engine.submit(prompt, SamplingParams(temperature=0, num_predict=n), loop=None)
    while engine.run_once():
        pass
    return [t for d in stream for t in d.token_ids]


def test_the_scheduler_checkpoints_every_chunk_of_a_recurrent_model():
    """Prompt chunks of a runner declaring `checkpoint_every` end on block boundaries, at most that far apart, and a
    prompt's last full block ends a step of its own; an attention-only runner's chunks are left as they were."""
    runner = ToyRunner(num_kv_blocks=64, block_size=4)
    runner.checkpoint_every = 12
    prompt = list(range(40, 77))  # 37 tokens: the last full block ends at 36
    drive(Engine(runner, EngineConfig(max_num_batched_tokens=10, target_itl_ms=0)), prompt)
    ends = [s.start_pos + s.length for b in runner.steps for s in b.spans if s.start_pos + s.length <= len(prompt)]
    assert ends == [8, 16, 24, 32, 36, 37]
    plain = ToyRunner(num_kv_blocks=64, block_size=4)
    drive(Engine(plain, EngineConfig(max_num_batched_tokens=10, target_itl_ms=0)), prompt)
    assert [s.start_pos + s.length for b in plain.steps for s in b.spans][:4] == [10, 20, 30, 37]
    no_cache = ToyRunner(num_kv_blocks=64, block_size=4)
    no_cache.checkpoint_every = 12
    drive(Engine(no_cache, EngineConfig(max_num_batched_tokens=10, target_itl_ms=0, prefix_caching=False)), prompt)
    assert [s.start_pos + s.length for b in no_cache.steps for s in b.spans][:4] == [10, 20, 30, 37]


# ---- hybrid models on llama.cpp ----

HYBRID = ["lfm2", "qwen35"]


def llama_runner(path, layout: str):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    from evenflow.backends.base import RunnerSettings, load_runner

    return load_runner("llamacpp", str(path), RunnerSettings(
        max_num_seqs=3, block_size=4, context_length=128, num_kv_blocks=None if layout == "streams" else 96,
        max_num_batched_tokens=128, num_threads=2, dtype="float32", flash_attention="off", kv_layout=layout))


def run(engine: Engine, prompt: list[int], n: int = 6) -> tuple[list[int], list[float], int]:
    stream = engine.submit(prompt, SamplingParams(temperature=0, num_predict=n), loop=None, logprobs=0)
    while engine.run_once():
        pass
    deltas = list(stream)
    assert deltas[-1].done_reason == "length", deltas[-1].error
    return ([t for d in deltas for t in d.token_ids], [lp.logprob for d in deltas for lp in d.logprobs or []],
            deltas[-1].metrics.cached_tokens)


def same(got: tuple, want: tuple) -> None:
    assert got[0] == want[0]
    np.testing.assert_allclose(got[1], want[1], atol=1e-4)


@pytest.mark.parametrize("layout", ["streams", "unified"])
@pytest.mark.parametrize("arch", HYBRID)
def test_hits_resume_at_the_last_checkpoint_and_equal_cold_runs(arch, layout, synthetic_model):
    """A prompt prefilled in one chunk is checkpointed at its last full block, an answer at the last block boundary
    it crossed: a hit short of any checkpoint recomputes (counted), one on a checkpoint resumes there, and a follow-up
    turn resumes inside the previous answer. Every output equals the cold run's."""
    path = synthetic_model("tiny", arch, formats=("gguf",), gguf_dtype="f32", qk_std=0.3)["gguf"]
    rng = random.Random(5)
    words = lambda n: [rng.randrange(10, 1900) for _ in range(n)]  # noqa: E731
    doc = words(53)
    first = doc + words(5)  # 58 tokens: computed as 0..56 (its last full block) and 56..58
    short = doc[:41] + words(1)  # 10 cached blocks, no checkpoint at or below them: recomputed, checkpointed at 40
    again = doc + words(5)  # 13 cached blocks: the checkpoint at 56 is past them (its block holds first's tail)
    r = llama_runner(path, layout)
    try:
        # the cold runs first: an engine built on the runner resets what another one cached there
        cold = Engine(r, EngineConfig(max_num_batched_tokens=128, prefix_caching=False))
        answer = run(cold, first)
        follow = first + answer[0] + words(3)  # the answer's 5 computed tokens end at 63: a checkpoint at 60
        want = [run(cold, p) for p in (short, again, follow)]
        warm = Engine(r, EngineConfig(max_num_batched_tokens=128))
        same(run(warm, first), answer)
        got = [run(warm, p) for p in (short, again, follow)]
        for g, w in zip(got, want):
            same(g, w)
        # short: none of its 10 cached blocks ends on a checkpoint; again: short's at 40; follow: the answer's at 60,
        # past the first prompt
        assert [g[2] for g in got] == [0, 40, 60]
        stats = warm.stats()
        assert stats.prefix_rewind_tokens == 40 + 12 and stats.prefix_fallback_tokens == 0 and stats.kv_blocks_used == 0
    finally:
        r.close()


@pytest.mark.parametrize("layout", ["streams", "unified"])
def test_evicted_checkpoints_make_hits_resume_earlier_never_wrong(layout, synthetic_model):
    """Checkpoints are kept within a memory budget, least recently used out first: a hit whose checkpoints went
    recomputes from the last one left (here: none), with the cold run's output."""
    path = synthetic_model("tiny", "qwen35", formats=("gguf",), gguf_dtype="f32", qk_std=0.3)["gguf"]
    rng = random.Random(9)
    doc = [rng.randrange(10, 1900) for _ in range(100)]
    r = llama_runner(path, layout)
    try:
        cold = Engine(r, EngineConfig(max_num_batched_tokens=24, target_itl_ms=0, prefix_caching=False))
        cuts = (100, 70, 30)
        want = [run(cold, doc[:cut] + [12]) for cut in cuts]
        warm = Engine(r, EngineConfig(max_num_batched_tokens=24, target_itl_ms=0))  # chunk ends: 24, 48, 72, 96
        run(warm, doc + [11])  # ... then 100 (its last full block) and 104 (its answer)
        states = r._states
        states.budget = 5 * states.state_bytes
        run(warm, [rng.randrange(10, 1900) for _ in range(30)])  # 24, 28, 32: the document keeps 100 and 104
        assert states.evicted == 4
        # 100: its checkpoint is there (and its answer evicts it); 70: none left, all of it recomputed, which saves
        # checkpoints at 24 and 48 again (in the same blocks); 30: resumes at 24
        got = [run(warm, doc[:cut] + [12]) for cut in cuts]
        for g, w in zip(got, want):
            same(g, w)
        assert [g[2] for g in got] == [100, 0, 24] and warm.stats().prefix_rewind_tokens == 68 + 4
    finally:
        r.close()


@pytest.mark.parametrize("arch", HYBRID)
def test_a_restored_prefix_resumes_from_a_saved_checkpoint(arch, synthetic_model, tmp_path):
    from evenflow.daemon.engine.kv_disk import DiskKVCache

    path = synthetic_model("tiny", arch, formats=("gguf",), gguf_dtype="f32", qk_std=0.3)["gguf"]
    rng = random.Random(2)
    doc = [rng.randrange(10, 1900) for _ in range(90)]
    ask = doc + [rng.randrange(10, 1900)]
    r = llama_runner(path, "streams")
    try:
        want = run(Engine(r, EngineConfig(max_num_batched_tokens=24, target_itl_ms=0, prefix_caching=False)), ask)
        disk = DiskKVCache(tmp_path, 1 << 30, min_tokens=16)
        first = Engine(r, EngineConfig(max_num_batched_tokens=24, target_itl_ms=0), kv_disk=disk, model_id="m")
        run(first, doc + [rng.randrange(10, 1900)])
        first.shutdown()
        assert disk.flush(30)
        again = Engine(r, EngineConfig(max_num_batched_tokens=24, target_itl_ms=0), kv_disk=disk, model_id="m")
        got = run(again, ask)
        assert again.disk.restored_tokens >= 88 and again.disk.failed == 0
        assert got[2] == 88  # the checkpoint at the document's last full block came back with its cells
        same(got, want)
    finally:
        r.close()


@pytest.mark.parametrize("arch", HYBRID)
def test_a_hit_shared_from_a_running_sequence_resumes_from_its_checkpoint(arch, synthetic_model):
    """In the unified layout a hit's cells may come from a sequence still running, and llama.cpp then shares that
    sequence's recurrent state too (at its own position): the new sequence must still load the checkpoint where its
    hit ends (found by test_cache_model's state machine)."""
    path = synthetic_model("tiny", arch, formats=("gguf",), gguf_dtype="f32", qk_std=0.3)["gguf"]
    rng = random.Random(8)
    doc = [rng.randrange(10, 1900) for _ in range(48)]
    first, second = doc + [11], doc + [12]  # the second's hit: the document's 12 blocks, checkpointed at 48
    r = llama_runner(path, "unified")
    try:
        cold = Engine(r, EngineConfig(max_num_batched_tokens=24, target_itl_ms=0, prefix_caching=False))
        want = run(cold, second)
        warm = Engine(r, EngineConfig(max_num_batched_tokens=24, target_itl_ms=0))
        running = warm.submit(first, SamplingParams(temperature=0, num_predict=30), loop=None)
        for _ in range(5):  # 0..24, 24..48, 48..49 and two decodes: the first is running, past the document
            warm.run_once()
        got = run(warm, second)
        assert got[2] == 48
        same(got, want)
        while warm.run_once():
            pass
        assert list(running)[-1].done_reason == "length" and warm.stats().kv_blocks_used == 0
    finally:
        r.close()


def test_checkpoint_store_keeps_the_newest_within_its_budget() -> None:
    from evenflow.backends.llamacpp.checkpoints import Checkpoints

    cp = Checkpoints()
    assert cp.put(1, b"a" * 4, 10) == 0 and cp.put(2, b"b" * 4, 10) == 0
    assert cp.get(1) == b"aaaa"  # 1 is now the most recent: 2 goes first
    assert cp.put(3, b"c" * 4, 10) == 1 and 2 not in cp and cp.bytes == 8
    assert cp.last_in([7, 1, 8]) == 2 and cp.last_in([8]) == 0
    assert cp.along([3, 9, 1]) == [(0, b"cccc"), (2, b"aaaa")]
    assert cp.put(4, b"d" * 20, 10) == 2 and cp.bytes == 20  # never the newest, even over the budget
    cp.forget(4)
    assert cp.bytes == 0 and 4 not in cp
