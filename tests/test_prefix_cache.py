"""Automatic prefix caching on the engine (toy backend): block manager rules, identical greedy output with and
without a hit, and no leaks or shared-block writes over many mixed requests with aborts and preemptions."""
from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from evenflow.backends.base import Batch
from evenflow.daemon.engine import Engine, EngineConfig, SamplingParams
from evenflow.daemon.engine.blocks import BlockManager
from evenflow.daemon.engine.params import SamplingParams as Params
from evenflow.daemon.engine.sequence import Sequence
from toy_runner import ToyRunner


def seq_of(tokens: list[int]) -> Sequence:
    return Sequence(tokens, Params(temperature=0), 10_000)


def computed(bm: BlockManager, tokens: list[int]) -> Sequence:
    """A sequence whose whole prompt was computed and committed, then finished."""
    s = seq_of(tokens)
    assert bm.acquire_prefix(s) == 0
    bm.allocate(s, len(tokens))
    s.num_computed = len(tokens)
    bm.commit(s)
    return s


def test_a_finished_prompt_is_reused_and_refcounts_return_to_zero():
    bm = BlockManager(16, 4)
    a = computed(bm, list(range(10)))  # blocks 0..1 full, block 2 partial
    assert bm.num_cached == 2
    bm.free(a)
    assert bm.num_used == 0 and bm.num_free == 16 and bm.num_cached == 2
    b = seq_of(list(range(8)) + [99, 98, 97])
    assert bm.acquire_prefix(b) == 8 and b.num_computed == 8
    assert b.block_table == [0, 1] and bm.refcount(0) == 1
    c = seq_of(list(range(9)))
    assert bm.acquire_prefix(c) == 8 and bm.refcount(0) == bm.refcount(1) == 2
    bm.free(b)
    bm.free(c)
    assert all(bm.refcount(i) == 0 for i in range(16)) and bm.num_free == 16


def twins_parting(whole_chains: bool) -> tuple[BlockManager, list[int], list[int]]:
    """Two prompts computed side by side: the same first 8 tokens, then different ones; the one committed last
    takes the shared keys over (its own chain whole)."""
    bm = BlockManager(16, 4, whole_chains=whole_chains)
    a, b = seq_of(list(range(8)) + [50, 51, 52, 53, 0]), seq_of(list(range(8)) + [60, 61, 62, 63, 0])
    for s in (a, b):
        assert bm.acquire_prefix(s) == 0
        bm.allocate(s, 13)
        s.num_computed = 13
    bm.commit(a)
    bm.commit(b)
    return bm, a.block_table, b.block_table


def test_twins_parting_leave_whole_chains():
    bm, a, b = twins_parting(whole_chains=True)
    # a's last full block follows blocks that lost their keys to b's twins: no run held together serves it now
    assert bm.hit_blocks([bm._key[x] for x in b[:3]]) == 3 and bm._key[a[2]] is None
    assert bm._key[a[0]] is None and bm._key[a[1]] is None


def test_twins_parting_in_a_shared_pool_keep_both_continuations():
    bm, a, b = twins_parting(whole_chains=False)
    assert bm._key[a[2]] is not None and bm._key[b[2]] is not None and bm.num_cached == 4


def test_the_last_token_is_always_recomputed():
    bm = BlockManager(16, 4)
    bm.free(computed(bm, list(range(8))))
    same = seq_of(list(range(8)))  # block-aligned and fully cached: only the first block may be shared
    assert bm.acquire_prefix(same) == 4
    assert same.num_uncomputed == 4


def test_a_different_token_anywhere_in_a_block_misses_from_there():
    bm = BlockManager(16, 4)
    bm.free(computed(bm, list(range(12))))
    other = seq_of([0, 1, 2, 3, 4, 5, 77, 7, 8, 9, 10, 11, 12])
    assert bm.acquire_prefix(other) == 4  # block 1 differs at one token; block 2 is not reachable past it


def test_cached_blocks_are_evicted_lru_before_anyone_is_preempted():
    bm = BlockManager(6, 4)
    old = computed(bm, list(range(100, 108)))
    bm.free(old)
    new = computed(bm, list(range(200, 208)))
    bm.free(new)
    assert bm.num_cached == 4 and bm.num_free == 6
    big = seq_of(list(range(300, 316)))
    bm.acquire_prefix(big)
    assert bm.can_allocate(big, 16)  # the 2 plain free blocks + 2 evicted cached ones
    bm.allocate(big, 16)
    assert sorted(bm.take_forgotten()) == [0, 1]  # the older document went first
    assert bm.acquire_prefix(seq_of(list(range(200, 209)))) == 8  # the newer one is still cached
    assert bm.acquire_prefix(seq_of(list(range(100, 109)))) == 0


def test_prefix_caching_off_never_shares():
    bm = BlockManager(8, 4, prefix_caching=False)
    bm.free(computed(bm, list(range(8))))
    assert bm.num_cached == 0 and bm.acquire_prefix(seq_of(list(range(9)))) == 0


def collect(engine: Engine, prompt: list[int], n: int) -> tuple[list[int], int]:
    stream = engine.submit(prompt, SamplingParams(temperature=0, num_predict=n), loop=None)
    while engine.run_once():
        pass
    deltas = list(stream)
    return [t for d in deltas for t in d.token_ids], deltas[-1].metrics.cached_tokens


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), shared=st.integers(0, 40), tail=st.integers(0, 9),
       block_size=st.sampled_from([1, 4, 16]), chunk=st.sampled_from([None, 3, 16]))
def test_greedy_output_is_identical_with_and_without_a_hit(seed, shared, tail, block_size, chunk):
    """Shared-prefix lengths cover block boundaries (every length 0..40 against block sizes 1, 4, 16)."""
    rng = random.Random(seed)
    doc = [rng.randrange(256) for _ in range(shared)]
    first = doc + [rng.randrange(256) for _ in range(rng.randint(1, 5))]
    second = doc + [rng.randrange(256) for _ in range(tail)] or [7]
    cfg = dict(max_num_batched_tokens=64, max_prefill_chunk=chunk)
    warm = Engine(ToyRunner(num_kv_blocks=256, block_size=block_size), EngineConfig(**cfg))
    first_out, _ = collect(warm, first, 6)
    warm_out, hit = collect(warm, second, 8)
    cold = Engine(ToyRunner(num_kv_blocks=256, block_size=block_size), EngineConfig(prefix_caching=False, **cfg))
    cold_out, cold_hit = collect(cold, second, 8)
    assert warm_out == cold_out and cold_hit == 0
    common = next((i for i, (x, y) in enumerate(zip(first + first_out, second)) if x != y), min(len(first) + len(first_out), len(second)))
    # every full block of the common part is cached, except what the last prompt token needs recomputed;
    # the first request's final sampled token has no KV, so it cannot be shared
    reusable = min(common, len(first) + len(first_out) - 1, len(second) - 1)
    assert hit == (reusable // block_size) * block_size
    assert warm.stats().kv_blocks_used == 0


class CheckingRunner(ToyRunner):
    """Asserts the engine never asks it to write into a block that another sequence holds."""

    def __init__(self, blocks: BlockManager | None = None, **kw) -> None:
        super().__init__(**kw)
        self.manager = blocks
        self.shared_reads = 0

    def step(self, batch: Batch) -> "object":
        bs = batch.block_size
        for s in batch.spans:
            written = {s.block_table[p // bs] for p in range(s.start_pos, s.start_pos + s.length)}
            for b in written:
                assert self.manager.refcount(b) == 1, f"block {b} written while {self.manager.refcount(b)} hold it"
            self.shared_reads += sum(self.manager.refcount(b) > 1 for b in s.block_table)
        return super().step(batch)


def test_a_thousand_mixed_requests_with_aborts_and_preemptions_leak_nothing():
    runner = CheckingRunner(num_kv_blocks=48, block_size=4, max_num_seqs=6, context_length=256, eos_bias=-2.0)
    eng = Engine(runner, EngineConfig(max_num_batched_tokens=24, max_prefill_chunk=16))
    runner.manager = eng.blocks
    events = {"preempted": 0, "cached": 0}

    def on(e: dict) -> None:
        if e["type"] == "step":
            events["preempted"] += e["preempted"]
            events["cached"] += e["cached_tokens"]

    eng.subscribe(on)
    rng = random.Random(5)
    docs = [[rng.randrange(256) for _ in range(rng.randint(8, 40))] for _ in range(6)]
    live: list[tuple[int, int]] = []  # (seq_id, abort at step)
    submitted = step = 0
    streams = []
    while submitted < 1000 or eng.scheduler.has_work:
        for _ in range(rng.randint(0, 3)):
            if submitted >= 1000:
                break
            prompt = rng.choice(docs)[: rng.randint(1, 40)] + [rng.randrange(256) for _ in range(rng.randint(0, 12))]
            st_ = eng.submit(prompt or [1], SamplingParams(temperature=0.8, seed=submitted, num_predict=rng.randint(1, 20)),
                             loop=None)
            streams.append(st_)
            if rng.random() < 0.15:
                live.append((st_.seq_id, step + rng.randint(0, 6)))
            submitted += 1
        for sid, at in [x for x in live if x[1] <= step]:
            eng.abort(sid)
            live.remove((sid, at))
        eng.run_once()
        step += 1
        assert step < 100_000
    reasons = [list(s)[-1].done_reason for s in streams]
    assert len(reasons) == 1000 and "error" not in reasons and "abort" in reasons
    assert events["preempted"] > 0 and events["cached"] > 0 and runner.shared_reads > 0
    bm = eng.blocks
    assert all(bm.refcount(b) == 0 for b in range(bm.num_blocks)), "a block is still referenced"
    assert bm.num_used == 0 and bm.num_free == bm.num_blocks
    assert eng.stats().cache_hit_tokens == events["cached"] > 0 and 0 < eng.stats().cache_hit_rate < 1


def test_shared_kv_cache_keeps_few_cached_tokens_while_others_run():
    """llama.cpp's unified cache: every query attends cached prefixes nobody runs. While sequences run, the
    engine keeps at most as many cached tokens as they hold (>= MIN_CACHED_TOKENS); with nobody running, all
    of a finished document stays cached and a repeat of it hits."""
    from evenflow.daemon.engine.scheduler import MIN_CACHED_TOKENS
    from toy_runner import ToyRunner

    runner = ToyRunner(num_kv_blocks=800, block_size=4, max_num_seqs=4, context_length=2048)
    runner.shared_kv = True
    eng = Engine(runner, EngineConfig(max_num_batched_tokens=512))
    steps: list[dict] = []
    eng.subscribe(lambda e: steps.append(e) if e["type"] == "step" else None)
    rng = random.Random(1)
    doc = [rng.randrange(1, 256) for _ in range(1600)]
    greedy = SamplingParams(temperature=0, num_predict=2)

    def run(prompt, params=greedy):
        st_ = eng.submit(prompt, params, loop=None)
        for _ in range(100_000):
            if not eng.run_once():
                return list(st_)
        raise AssertionError("the engine never finished")

    run(doc)
    assert eng.blocks.num_cached_free * 4 >= 1590  # nobody ran meanwhile: the whole document stays cached
    steps.clear()
    run(doc + [7])
    assert steps[0]["cached_tokens"] >= 1590  # ... and a repeat hits it
    # now a short stream runs: the cached document beyond MIN_CACHED_TOKENS goes
    run([3, 4, 5, 6], SamplingParams(temperature=0, num_predict=4))
    assert eng.blocks.num_cached_free * 4 <= MIN_CACHED_TOKENS + 16
    assert all(s["held"] <= MIN_CACHED_TOKENS + 64 for s in steps[-3:])
