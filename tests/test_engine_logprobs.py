"""Engine-level logprobs and n > 1 groups on the toy backend: values against the runner's own logits, the prompt
computed once for a group, per-sequence seeds, and aborts."""
from __future__ import annotations

import numpy as np
import pytest

from evenflow.daemon.engine import Engine, EngineConfig, SamplingParams
from evenflow.daemon.engine.logprobs import log_softmax, token_logprob
from toy_runner import ToyRunner


def drain(engine: Engine, streams: list) -> list[list]:
    while engine.run_once():
        pass
    return [list(s) for s in streams]


def test_log_softmax_and_top_k():
    row = np.array([[1.0, 3.0, 2.0, -np.inf]], dtype=np.float32)
    lp = log_softmax(row)[0]
    assert np.isclose(np.exp(lp).sum(), 1.0)
    assert lp[3] == -np.inf
    t = token_logprob(lp, 2, 2)
    assert t.token_id == 2 and t.logprob == pytest.approx(lp[2])
    assert [i for i, _ in t.top] == [1, 2]
    assert token_logprob(lp, 0, 0).top == []


def test_logprobs_are_the_models_log_softmax_and_greedy_picks_the_top():
    runner = ToyRunner(num_kv_blocks=128)
    eng = Engine(runner, EngineConfig(max_num_batched_tokens=64))
    prompt = list(b"hello world")
    (deltas,) = drain(eng, [eng.submit(prompt, SamplingParams(temperature=0, num_predict=6), loop=None, logprobs=5)])
    lps = [lp for d in deltas for lp in (d.logprobs or [])]
    toks = [t for d in deltas for t in d.token_ids]
    assert len(lps) == len(toks) == 6 and [lp.token_id for lp in lps] == toks
    # Recompute every position's distribution with the toy model directly: the same numbers.
    ref = Engine(ToyRunner(num_kv_blocks=128), EngineConfig(max_num_batched_tokens=64))
    ctx = list(prompt)
    for lp, tok in zip(lps, toks):
        assert len(lp.top) == 5 and lp.top[0][0] == tok  # greedy: the chosen token is the most likely
        assert lp.logprob == pytest.approx(max(v for _, v in lp.top))
        assert [v for _, v in lp.top] == sorted((v for _, v in lp.top), reverse=True)
        logits = ref.runner.step(_single_batch(ref, ctx))[0]
        assert lp.logprob == pytest.approx(float(log_softmax(logits[None])[0][tok]), abs=1e-6)
        ctx.append(tok)


def _single_batch(engine: Engine, tokens: list[int]):
    from evenflow.backends.base import Batch, SeqSpan  # noqa: PLC0415

    bs = engine.block_size
    blocks = list(range((len(tokens) + bs - 1) // bs))
    span = SeqSpan(slot=0, start=0, length=len(tokens), start_pos=0, block_table=blocks, need_logits=True)
    return Batch(token_ids=list(tokens), positions=list(range(len(tokens))), spans=[span], block_size=bs)


def test_logprobs_ignore_temperature_and_are_absent_unless_asked():
    eng = Engine(ToyRunner(num_kv_blocks=128), EngineConfig(max_num_batched_tokens=64))
    prompt = list(b"abc")
    hot = eng.submit(prompt, SamplingParams(temperature=5.0, seed=3, num_predict=4), loop=None, logprobs=0)
    plain = eng.submit(prompt, SamplingParams(temperature=0, num_predict=4), loop=None)
    cold = eng.submit(prompt, SamplingParams(temperature=0, num_predict=1), loop=None, logprobs=0)
    a, b, c = drain(eng, [hot, plain, cold])
    assert all(d.logprobs is None for d in b)
    first_hot = next(d for d in a if d.token_ids).logprobs[0]
    first_cold = next(d for d in c if d.token_ids).logprobs[0]
    assert first_hot.top == [] and first_cold.top == []
    # Same context, different temperature: the logprob is of the model's distribution, not the tempered one.
    tok = first_hot.token_id
    logits = ToyRunner(num_kv_blocks=128).step(_single_batch(eng, prompt))[0]
    assert first_hot.logprob == pytest.approx(float(log_softmax(logits[None])[0][tok]), abs=1e-6)
    with pytest.raises(ValueError, match="between 0 and 20"):
        eng.submit(prompt, SamplingParams(), loop=None, logprobs=21)


def test_group_computes_the_prompt_once_and_samples_each_sequence_on_its_own():
    runner = ToyRunner(num_kv_blocks=256, block_size=4)
    eng = Engine(runner, EngineConfig(max_num_batched_tokens=256))
    prompt = list(b"a prompt that spans several blocks of four tokens")  # 49 tokens
    params = [SamplingParams(temperature=1.0, top_k=0, top_p=1.0, seed=10 + i, num_predict=8) for i in range(3)]
    outs = drain(eng, eng.submit_group(prompt, params, loop=None))
    computed = sum(s.length for b in runner.steps for s in b.spans if s.start_pos < len(prompt))
    # first sequence: the whole prompt; each other: only past the cached full blocks (the last partial block)
    assert computed == len(prompt) + 2 * (len(prompt) - (len(prompt) - 1) // 4 * 4)
    toks = [[t for d in ds for t in d.token_ids] for ds in outs]
    solo = []
    for p in params:  # each member samples exactly as the same request alone would
        e = Engine(ToyRunner(num_kv_blocks=256, block_size=4), EngineConfig(max_num_batched_tokens=256))
        (ds,) = drain(e, [e.submit(prompt, SamplingParams(**{**p.__dict__}), loop=None)])
        solo.append([t for d in ds for t in d.token_ids])
    assert toks == solo and len({tuple(t) for t in toks}) > 1
    assert eng.blocks.num_used == 0


def test_aborting_a_group_frees_everything_even_members_not_yet_admitted():
    eng = Engine(ToyRunner(num_kv_blocks=256, block_size=4), EngineConfig(max_num_batched_tokens=8))
    streams = eng.submit_group(list(range(40)), [SamplingParams(temperature=0, num_predict=50)] * 3, loop=None)
    eng.run_once()  # the first member is prefilling (8 tokens a step); the others are held
    for s in streams:
        eng.abort(s.seq_id)
    outs = drain(eng, streams)
    assert [ds[-1].done_reason for ds in outs] == ["abort"] * 3
    assert eng.idle and eng.blocks.num_used == 0 and not eng._held
