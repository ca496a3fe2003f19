"""Scheduler invariants as property tests over random arrivals, lengths, budgets and KV sizes."""
from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from evenflow.daemon.engine.budget import FixedBudget
from evenflow.daemon.engine.blocks import BlockManager
from evenflow.daemon.engine.params import SamplingParams
from evenflow.daemon.engine.scheduler import Scheduler, SchedulerConfig
from evenflow.daemon.engine.sequence import Sequence, Status

requests = st.lists(
    st.tuples(st.integers(0, 30), st.integers(1, 60), st.integers(1, 25), st.one_of(st.none(), st.integers(1, 40))),
    min_size=1, max_size=12)


@settings(max_examples=150, deadline=None)
@given(reqs=requests, budget=st.integers(9, 96), chunk=st.one_of(st.none(), st.integers(1, 40)),
       blocks=st.integers(20, 80), block_size=st.sampled_from([1, 4, 16]), max_seqs=st.integers(1, 8),
       mode=st.sampled_from(["chunked", "monolithic"]), hard=st.one_of(st.none(), st.integers(10, 50)))
def test_scheduler_invariants(reqs, budget, chunk, blocks, block_size, max_seqs, mode, hard):
    """No step exceeds the budget; every running decode gets one token per step unless preempted;
    every sequence finishes; afterwards every block and slot is free."""
    budget = max(budget, max_seqs + 1)
    bm = BlockManager(max(blocks, (61 + 25) // block_size + 2), block_size)
    hard = None if hard is None else max(hard, max_seqs + 1)
    sched = Scheduler(SchedulerConfig(mode, max_seqs, chunk, hard), bm, FixedBudget(budget))
    rng = random.Random(0)
    pending = sorted(reqs, key=lambda r: r[0])
    seqs: list[tuple[Sequence, int, int | None]] = []
    step = 0
    while pending or sched.has_work:
        while pending and pending[0][0] <= step:
            arrive, plen, npred, abort_at = pending.pop(0)
            seq = Sequence([rng.randrange(100) for _ in range(plen)], SamplingParams(temperature=0), 1000)
            seqs.append((seq, npred, None if abort_at is None else step + abort_at))
            sched.add(seq)
        for seq, _, abort_at in seqs:
            if abort_at is not None and abort_at <= step and not seq.is_finished:
                sched.finish(seq)
        decoding_before = {s.seq_id for s in sched.running if s.is_decoding}
        plan = sched.schedule()
        ids = [s.seq.seq_id for s in plan.spans]
        assert len(ids) == len(set(ids)), "a sequence appears twice in one step"
        if hard is not None:
            assert plan.num_tokens <= hard, "a step exceeded the backend's per-forward limit"
        if mode == "chunked":
            assert plan.num_tokens <= budget
            if chunk is not None:
                assert all(s.num_tokens <= chunk for s in plan.spans if not s.seq.is_decoding)
        preempted = {s.seq_id for s in plan.preempted}
        for sid in decoding_before - preempted:
            span = next((s for s in plan.spans if s.seq.seq_id == sid), None)
            assert span is not None and span.num_tokens == 1, f"decode of seq {sid} was paused"
        slots = [s.seq.slot for s in plan.spans]
        assert len(slots) == len(set(slots)) and None not in slots
        for span in plan.spans:
            seq = span.seq
            assert len(seq.block_table) * block_size >= seq.num_computed + span.num_tokens
        used = sum(len(s.block_table) for s in sched.running)
        assert used == bm.num_used
        for span in plan.spans:
            seq = span.seq
            seq.num_computed += span.num_tokens
            if span.need_logits:
                seq.output_ids.append(rng.randrange(100))
                npred = next(n for q, n, _ in seqs if q is seq)
                if len(seq.output_ids) >= npred:
                    sched.finish(seq)
        step += 1
        assert step < 5000, "no progress"
    assert all(s.status is Status.FINISHED for s, _, _ in seqs)
    assert bm.num_free == bm.num_blocks and sched.slots.num_free == max_seqs
    assert not sched.running and not sched.waiting


def test_shared_kv_attention_work_counts_every_cached_cell():
    """With a shared cache each of a step's tokens attends what every sequence holds, masked or not."""
    bm = BlockManager(64, 4)
    sched = Scheduler(SchedulerConfig("chunked", 4, None, None, shared_kv=True), bm, FixedBudget(8))
    a = Sequence(list(range(10)), SamplingParams(temperature=0), 100)
    b = Sequence(list(range(20)), SamplingParams(temperature=0), 100)
    sched.add(a)
    sched.add(b)
    plan = sched.schedule()  # a: 8 of its 10 prompt tokens
    assert plan.held == 0 and plan.num_tokens == 8 and plan.attention_work == 8 * 8
    for s in plan.spans:
        s.seq.num_computed += s.num_tokens
    plan = sched.schedule()  # a's last 2 tokens, then b's first 6
    assert plan.held == 8 and plan.num_tokens == 8
    assert plan.attention_work == 8 * (8 + 8)
    own = Scheduler(SchedulerConfig("chunked", 4, None, None), BlockManager(64, 4), FixedBudget(8))
    own.add(Sequence(list(range(10)), SamplingParams(temperature=0), 100))
    p = own.schedule()
    assert p.held is None and p.attention_work == 8 * 9 // 2
