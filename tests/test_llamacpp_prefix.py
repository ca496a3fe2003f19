"""llama.cpp prefix sharing under pressure: LRU evictions, more finished conversations than holder ids, concurrent
requests and aborts. Every answer must equal the one computed without a cache, and nothing may stay held."""
from __future__ import annotations

import random

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")

from evenflow.backends.base import RunnerSettings  # noqa: E402
from evenflow.backends.llamacpp.runner import PREFIX_HOLDERS, load  # noqa: E402
from evenflow.backends.synthetic import cached_model, make_spec  # noqa: E402
from evenflow.daemon.engine import Engine, EngineConfig, SamplingParams  # noqa: E402


@pytest.fixture(scope="module")
def runner():
    path = cached_model(make_spec("tiny", architecture="llama"), formats=("gguf",), gguf_dtype="f32")["gguf"]
    # f32 KV, flash attention off: logits then do not depend on how a pass is batched (see test_engine_backends)
    r = load(str(path), RunnerSettings(max_num_seqs=4, block_size=16, num_kv_blocks=96, max_num_batched_tokens=128,
                                       num_threads=2, dtype="float32", flash_attention="off"))
    yield r
    r.close()


def run(engine: Engine, prompts: list[list[int]], concurrent: int, aborts: set[int]) -> list[tuple[list[int], str, int]]:
    """Submit `concurrent` prompts at a time; abort the given ones after their first step."""
    results = []
    for i in range(0, len(prompts), concurrent):
        streams = [engine.submit(p, SamplingParams(temperature=0, num_predict=4), loop=None) for p in prompts[i:i + concurrent]]
        engine.run_once()
        for j, s in enumerate(streams):
            if i + j in aborts:
                engine.abort(s.seq_id)
        while engine.run_once():
            pass
        for s in streams:
            ds = list(s)
            results.append(([t for d in ds for t in d.token_ids], ds[-1].done_reason, ds[-1].metrics.cached_tokens))
    return results


def test_evictions_and_holder_overflow_keep_answers_exact(runner):
    rng = random.Random(11)
    vocab = runner.info.vocab_size

    def toks(n: int) -> list[int]:
        return [rng.randrange(10, vocab - 64) for _ in range(n)]

    small = [toks(rng.randint(17, 40)) for _ in range(PREFIX_HOLDERS + 4)]  # more conversations than holder ids
    long = [toks(200) for _ in range(4)]  # then more KV than the pool holds: LRU evictions
    docs = small + small[-8:] + long + long + small[:2]
    prompts = [d + toks(rng.randint(1, 10)) for d in docs]
    aborts = {3, 30, 41}
    uncached: list[int] = []
    take = runner.take_uncached
    runner.take_uncached = lambda: (lambda got: uncached.extend(got) or got)(take())  # count, then pass on
    try:
        warm = Engine(runner, EngineConfig(max_num_batched_tokens=128))
        got = run(warm, prompts, 2, aborts)
    finally:
        del runner.take_uncached
    assert all(r != "error" for _, r, _ in got), [r for _, r, _ in got]
    assert uncached, "more finished conversations than holder ids must drop the oldest"
    n = len(small)
    assert all(got[n + i][2] >= 16 for i in range(8) if n + i not in aborts)  # recent small docs: hits
    assert all(got[n + 12 + i][2] >= 192 for i in range(4))  # each long doc, asked again: hit
    assert got[-2][2] == got[-1][2] == 0  # the oldest small docs were dropped or evicted
    assert warm.stats().kv_blocks_used == 0 and runner._cells.num_holders <= PREFIX_HOLDERS
    assert all(runner.cached_tokens(s) == 0 for s in range(runner.max_num_seqs))  # finished slots hold nothing
    cold = Engine(runner, EngineConfig(max_num_batched_tokens=128, prefix_caching=False))
    want = run(cold, prompts, 2, aborts)
    for k, ((g, gr, _), (w, wr, _)) in enumerate(zip(got, want)):
        if k not in aborts:
            assert (g, gr) == (w, wr), f"request {k} differs with the prefix cache"


def test_per_sequence_streams_under_pressure_keep_answers_exact(monkeypatch):
    """The streams layout: a finished conversation stays in its stream until the stream is needed; hits take a
    parked stream over or copy a running one. Every answer equals the uncached one, nothing stays held."""
    path = cached_model(make_spec("tiny", architecture="llama"), formats=("gguf",), gguf_dtype="f32")["gguf"]
    monkeypatch.setenv("EVENFLOW_LLAMACPP_KV", "streams")
    r = load(str(path), RunnerSettings(max_num_seqs=4, block_size=16, context_length=256, max_num_batched_tokens=128,
                                       num_threads=2, dtype="float32", flash_attention="off"))
    try:
        assert r.kv_layout == "streams"
        rng = random.Random(3)
        vocab = r.info.vocab_size

        def toks(n: int) -> list[int]:
            return [rng.randrange(10, vocab - 64) for _ in range(n)]

        docs = [toks(rng.randint(17, 60)) for _ in range(10)] + [toks(200) for _ in range(2)]
        order = docs + docs[-4:] + docs[:3] + [docs[5]] * 3  # recent ones asked again, old ones, twins at once
        prompts = [d + toks(rng.randint(1, 10)) for d in order]
        aborts = {2, 13}
        uncached: list[int] = []
        take = r.take_uncached
        r.take_uncached = lambda: (lambda got: uncached.extend(got) or got)(take())
        try:
            warm = Engine(r, EngineConfig(max_num_batched_tokens=128))
            got = run(warm, prompts, 3, aborts)
        finally:
            del r.take_uncached
        assert all(reason != "error" for _, reason, _ in got)
        assert uncached, "more finished conversations than streams must drop the oldest"
        assert sum(hit > 0 for _, _, hit in got) >= 4  # parked streams taken over, running ones copied
        assert warm.stats().kv_blocks_used == 0
        assert all(r.cached_tokens(s) == 0 for s in range(r.max_num_seqs))
        cold = Engine(r, EngineConfig(max_num_batched_tokens=128, prefix_caching=False))
        want = run(cold, prompts, 3, aborts)
        for k, ((g, gr, _), (w, wr, _)) in enumerate(zip(got, want)):
            if k not in aborts:
                assert (g, gr) == (w, wr), f"request {k} differs with the prefix cache"
    finally:
        r.close()


def test_a_prefix_the_runner_lost_unannounced_is_recomputed_and_counted(monkeypatch):
    """The defensive half of the contract: a cached prefix the runner can no longer serve (here its parked stream
    is emptied behind the engine's back) is cut at admission and recomputed; the answer is unchanged."""
    path = cached_model(make_spec("tiny", architecture="llama"), formats=("gguf",), gguf_dtype="f32")["gguf"]
    monkeypatch.setenv("EVENFLOW_LLAMACPP_KV", "streams")
    r = load(str(path), RunnerSettings(max_num_seqs=2, block_size=16, context_length=256, max_num_batched_tokens=128,
                                       num_threads=2, dtype="float32", flash_attention="off"))
    try:
        rng = random.Random(7)
        doc = [rng.randrange(10, r.info.vocab_size - 64) for _ in range(70)]
        engine = Engine(r, EngineConfig(max_num_batched_tokens=128))
        run(engine, [doc + [11]], 1, set())
        parked = r._cells.stream_of(0) if r._cells.stream_of(0) is not None else next(iter(r._cells._parked))
        r._cells._truncate(parked, 0)
        r._cells.take_uncached()  # ... and nobody tells the engine
        (got,) = run(engine, [doc + [12, 13]], 1, set())
        assert got[1] == "length" and got[2] == 0
        assert engine.stats().prefix_fallback_tokens == 64  # the four full blocks it had counted on
        cold = Engine(r, EngineConfig(max_num_batched_tokens=128, prefix_caching=False))
        assert run(cold, [doc + [12, 13]], 1, set())[0][0] == got[0]
    finally:
        r.close()
