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
