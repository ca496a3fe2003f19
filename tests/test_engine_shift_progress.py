"""The engine's context shift (Ollama's `shift`: a full window drops its middle and generation goes on, here by
recomputing what is kept) and its prompt progress reports, on the toy backend and on every real backend."""
from __future__ import annotations

import importlib.util
import time

import pytest

from evenflow.backends.base import RunnerSettings, load_runner
from evenflow.daemon.engine import Engine, EngineConfig, SamplingParams
from evenflow.daemon.engine.progress import REPORT_EVERY_S
from toy_runner import ToyRunner

PROMPT = list(range(30, 50))  # 20 tokens, no BOS


def drive(engine: Engine, requests: list[tuple[list[int], SamplingParams]], progress: bool = False) -> list[list]:
    """Submit everything, run the engine in this thread, return each request's deltas."""
    streams = [engine.submit(p, sp, loop=None, progress=progress and i == 0) for i, (p, sp) in enumerate(requests)]
    n = 0
    while engine.run_once():
        n += 1
        assert n < 20_000
    return [list(s) for s in streams]


def tokens(deltas: list) -> list[int]:
    return [t for d in deltas for t in d.token_ids]


def shifted(context: list[int], keep: int, window: int) -> list[int]:
    """Ollama's first context shift of a full window: the first `keep` tokens, then the newer half."""
    discard = max((window - keep) // 2, 1)
    return context[:keep] + context[keep + discard:]


def greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0, num_predict=n, ignore_eos=True, **kw)


def test_a_shift_goes_on_as_a_fresh_prompt_of_what_was_kept() -> None:
    events: list[dict] = []
    eng = Engine(ToyRunner(context_length=24), EngineConfig())
    eng.subscribe(lambda e: events.append(e) if e.get("event") == "shifted" else None)
    (out,) = drive(eng, [(PROMPT, greedy(12, shift=True))])
    toks = tokens(out)
    assert len(toks) == 12 and out[-1].done_reason == "length"
    m = out[-1].metrics
    assert (m.shifts, m.shifted_tokens, m.prompt_eval_count, m.eval_count) == (1, 10, 20, 12)
    # the window filled after 4 tokens; keep 4 (num_keep), drop 10: the rest is what a new prompt would give
    kept = shifted(PROMPT + toks[:4], 4, 24)
    (fresh,) = drive(Engine(ToyRunner(context_length=24), EngineConfig()), [(kept, greedy(8))])
    assert toks[4:] == tokens(fresh)
    assert [(e["tokens"], e["keep"], e["prompt_tokens"], e["output_tokens"]) for e in events] == [(10, 4, 20, 4)]
    assert eng.blocks.num_free == eng.blocks.num_blocks


def test_num_keep_and_shift_false_and_num_predict_minus_2() -> None:
    eng = Engine(ToyRunner(context_length=24), EngineConfig())
    (a,) = drive(eng, [(PROMPT, greedy(12, shift=True, num_keep=8))])
    kept = shifted(PROMPT + tokens(a)[:4], 8, 24)
    (fresh,) = drive(Engine(ToyRunner(context_length=24), EngineConfig()), [(kept, greedy(8))])
    assert tokens(a)[4:] == tokens(fresh) and a[-1].metrics.shifted_tokens == 8
    for params in (greedy(12, shift=False), greedy(-2, shift=True)):  # stop at the window: "length"
        (b,) = drive(eng, [(PROMPT, params)])
        assert len(tokens(b)) == 4 and b[-1].done_reason == "length" and b[-1].metrics.shifts == 0


def test_a_shifting_stream_leaves_its_batch_mates_alone() -> None:
    others = [(list(range(60, 70)), greedy(10)), (list(range(80, 95)), greedy(8))]
    solo = [tokens(drive(Engine(ToyRunner(context_length=24), EngineConfig()), [r])[0]) for r in others]
    eng = Engine(ToyRunner(context_length=24, num_kv_blocks=40), EngineConfig(max_num_batched_tokens=8))
    outs = drive(eng, [(PROMPT, greedy(30, shift=True))] + others)
    assert [tokens(o) for o in outs[1:]] == solo
    assert len(tokens(outs[0])) == 30 and outs[0][-1].metrics.shifts >= 2
    assert eng.blocks.num_free == eng.blocks.num_blocks


BACKENDS = [
    pytest.param(("torch", "hf"), id="torch"),
    pytest.param(("llamacpp", "gguf"), id="llamacpp",
                 marks=pytest.mark.skipif(not importlib.util.find_spec("llama_cpp"), reason="llama-cpp-python not installed")),
    pytest.param(("mlx", "hf"), id="mlx",
                 marks=pytest.mark.skipif(not importlib.util.find_spec("mlx"), reason="mlx not installed")),
]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_shift_recomputes_right_on_each_backend(backend, synthetic_model) -> None:
    """The kept tokens recomputed at their new positions give what a fresh prompt of them gives, on a real model
    (llama.cpp mirrors the freed and re-admitted sequence through its prefix-cache hooks)."""
    name, fmt = backend
    path = synthetic_model("tiny", "llama", formats=(fmt,), gguf_dtype="f32", qk_std=0.3)[fmt]
    runner = load_runner(name, str(path), RunnerSettings(max_num_seqs=2, block_size=16, num_kv_blocks=32,
                                                         context_length=64, dtype="float32", flash_attention="off"))
    try:
        prompt = list(range(100, 140))
        (out,) = drive(Engine(runner, EngineConfig(context_length=64)), [(prompt, greedy(40, shift=True))])
        toks = tokens(out)
        assert len(toks) == 40 and out[-1].metrics.shifts == 1
        kept = shifted(prompt + toks[:24], 4, 64)
        (fresh,) = drive(Engine(runner, EngineConfig(context_length=64)), [(kept, greedy(16))])
        assert toks[24:] == tokens(fresh)
    finally:
        runner.close()


def test_prompt_progress_only_when_asked_first_and_last_always() -> None:
    eng = Engine(ToyRunner(context_length=512, num_kv_blocks=128), EngineConfig(max_num_batched_tokens=8,
                                                                                target_itl_ms=0))
    prompt = [i % 250 for i in range(200)]  # 25 chunks of 8
    t0 = time.monotonic()
    asked, quiet = drive(eng, [(prompt, greedy(3)), (prompt[:50], greedy(3))], progress=True)
    elapsed = time.monotonic() - t0
    reports = [d.progress for d in asked if d.progress is not None]
    assert all(d.progress is None for d in quiet)
    first_token = next(i for i, d in enumerate(asked) if d.token_ids)
    assert all(d.progress is not None for d in asked[:first_token])  # every report comes before the reply
    assert reports[0]["processed"] == 0 and reports[0]["total"] == 200
    assert reports[-1]["processed"] == reports[-1]["total"] == 200
    assert [r["processed"] for r in reports] == sorted(r["processed"] for r in reports)
    assert len(reports) <= 2 + elapsed / REPORT_EVERY_S + 1  # throttled: not one per 8-token chunk


def test_prompt_progress_tells_the_queue_position_and_why() -> None:
    eng = Engine(ToyRunner(context_length=256, max_num_seqs=1), EngineConfig())
    busy = eng.submit(list(range(10)), greedy(30), loop=None)
    eng.run_once()  # it holds the only slot
    waiting = eng.submit(list(range(20, 60)), greedy(2), loop=None, progress=True)
    while eng.run_once():
        pass
    reports = [d.progress for d in waiting if d.progress is not None]
    assert any(r.get("position") == 1 and r.get("reason") == "slot" for r in reports)
    assert reports[-1]["processed"] == 40 and "position" not in reports[-1]
    assert len(tokens(list(busy))) == 30
