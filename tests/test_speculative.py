"""Speculative decoding (daemon/engine/speculative.py): drafts verified inside the step change nothing but speed.

Greedy output equals decoding one token at a time, sampled output equals it token for token under the same seed
(whoever shares the step), rejected draft tokens leave no KV and no block behind, steps with a prompt chunk carry
no draft, grammar-constrained requests never draft, and the counters say what happened. The toy backend gives exact
logits; the real backends run in test_cache_model.py (the hypothesis machine drafts there too) and below.
"""
from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np
import pytest

from evenflow.backends.base import RunnerSettings, load_runner
from evenflow.daemon.engine import Engine, EngineConfig, SamplingParams
from evenflow.daemon.engine.draft_cost import DraftCost
from evenflow.daemon.engine.grammar import grammar_for_format
from evenflow.daemon.engine.blocks import blocks_for
from evenflow.daemon.engine.ngram import lookup
from evenflow.daemon.engine.speculative import _SeqSpec

from toy_runner import ToyRunner

HAS = {"llamacpp": importlib.util.find_spec("llama_cpp"), "torch": importlib.util.find_spec("torch"),
       "mlx": importlib.util.find_spec("mlx")}


def run(engine: Engine, prompts: list[list[int]], params: list[SamplingParams], on_step: Any = None,
        **kw: Any) -> list[tuple[list[int], Any]]:
    """Submit all, step until done; (tokens, final delta) per prompt."""
    streams = [engine.submit(p, sp, loop=None, **kw) for p, sp in zip(prompts, params)]
    while engine.run_once():
        if on_step is not None:
            on_step(engine)
    out = []
    for s in streams:
        deltas = list(s)
        out.append(([t for d in deltas for t in d.token_ids], deltas[-1]))
    return out


def toy_engine(spec: str = "ngram", **cfg: Any) -> Engine:
    runner = ToyRunner(num_kv_blocks=256, block_size=4, max_num_seqs=4, context_length=256)
    return Engine(runner, EngineConfig(max_num_batched_tokens=cfg.pop("budget", 64), speculative=spec, **cfg))


PROMPTS = [list(np.random.default_rng(i).integers(0, 256, 20 + 7 * i)) for i in range(4)]
PROMPTS = [[int(t) for t in p] for p in PROMPTS]


def test_lookup_takes_the_longest_latest_match() -> None:
    toks = np.array([5, 1, 2, 3, 9, 1, 2, 3, 7, 8, 4, 1, 2, 3], dtype=np.int32)
    draft, match = lookup(toks, 3)
    assert (draft, match) == ([7, 8, 4], 3)  # "1 2 3" last occurred before 7 (not before 9: latest wins)
    assert lookup(np.array([4, 4, 4], dtype=np.int32), 5) == ([4], 2)
    assert lookup(np.array([1, 2, 3], dtype=np.int32), 4) == ([], 0)
    img = -(2**62)  # an image's placeholder rows (negative 64-bit ids) are never drafted
    assert lookup(np.array([1, 2, 5, img, img, 1, 2], dtype=np.int64), 4) == ([5], 2)
    assert lookup(np.array([1, img, 1], dtype=np.int64), 4) == ([], 0)


@pytest.mark.parametrize("drafts", [-1, 1, 4, 16])
def test_greedy_output_equals_one_token_at_a_time(drafts: int) -> None:
    params = [SamplingParams(temperature=0, num_predict=70, draft_num_predict=drafts)] * len(PROMPTS)
    spec = toy_engine()
    got = run(spec, PROMPTS, params)
    want = run(toy_engine("off"), PROMPTS, params)
    assert [g[0] for g in got] == [w[0] for w in want]
    assert [g[1].done_reason for g in got] == [w[1].done_reason for w in want]
    st = spec.stats()
    if drafts > 0:  # a fixed number of draft tokens: drafted wherever a match was, kept some, rejected some
        assert 0 < st.accepted_tokens < st.draft_tokens
        assert st.tokens_per_forward > 1.0
    # eval_count counts the tokens returned, not the drafts
    assert [g[1].metrics.eval_count for g in got] == [len(g[0]) for g in got]
    assert sum(g[1].metrics.accepted_tokens for g in got) == st.accepted_tokens
    assert st.kv_blocks_used == 0


def test_seeded_sampling_gives_the_same_tokens_with_or_without_drafts_and_neighbours() -> None:
    """Each sampled token draws the uniform it would draw decoding one token at a time: speculative rejection
    sampling for a deterministic draft, coupled to the request's own random stream."""
    params = [SamplingParams(temperature=0.9, top_k=0, top_p=1.0, seed=s, num_predict=60, draft_num_predict=6)
              for s in range(4)]
    alone = [run(toy_engine("off"), [p], [sp])[0][0] for p, sp in zip(PROMPTS, params)]
    spec = toy_engine()
    together = [g[0] for g in run(spec, PROMPTS, params)]
    assert together == alone
    assert spec.stats().accepted_tokens > 0
    other = run(toy_engine(), PROMPTS[:1], [SamplingParams(temperature=0.9, top_k=0, top_p=1.0, seed=99,
                                                           num_predict=60, draft_num_predict=6)])[0][0]
    assert other != alone[0]


def test_penalties_stop_strings_and_logprobs_see_each_drafted_position() -> None:
    params = [SamplingParams(temperature=0, num_predict=80, draft_num_predict=5, repeat_penalty=1.3,
                             repeat_last_n=8, stop=["zz"]),
              SamplingParams(temperature=0.7, seed=3, num_predict=80, draft_num_predict=5, presence_penalty=0.5)]
    spec = toy_engine()
    got = run(spec, PROMPTS[:2], params, logprobs=2)
    want = run(toy_engine("off"), PROMPTS[:2], params, logprobs=2)
    for (g, gd), (w, wd) in zip(got, want):
        assert g == w and gd.done_reason == wd.done_reason
    assert spec.stats().draft_tokens > 0
    spec_lp = toy_engine()
    streams = [spec_lp.submit(p, sp, loop=None, logprobs=2) for p, sp in zip(PROMPTS[:2], params)]
    off = toy_engine("off")
    ref = [off.submit(p, sp, loop=None, logprobs=2) for p, sp in zip(PROMPTS[:2], params)]
    for e in (spec_lp, off):
        while e.run_once():
            pass
    for s, r in zip(streams, ref):
        a = [(lp.token_id, round(lp.logprob, 5), [t for t, _ in lp.top]) for d in s for lp in d.logprobs or []]
        b = [(lp.token_id, round(lp.logprob, 5), [t for t, _ in lp.top]) for d in r for lp in d.logprobs or []]
        assert a == b


def test_rejected_tokens_leave_no_block_and_no_cached_key() -> None:
    """After every step a sequence holds exactly the blocks of its computed tokens (what decoding token by token
    holds), and every cached block's key is that of the accepted tokens it holds."""
    engine = toy_engine()
    streams = [engine.submit(p, SamplingParams(temperature=0, num_predict=60, draft_num_predict=7), loop=None)
               for p in PROMPTS]
    runner: ToyRunner = engine.runner  # type: ignore[assignment]
    while engine.run_once():
        for seq in engine.scheduler.running:
            if seq.num_computed >= len(seq.prompt_ids):
                assert len(seq.block_table) == blocks_for(seq.num_computed, engine.block_size), seq
            for i in range(seq.num_registered):
                b = seq.block_table[i]
                assert list(runner.kv[b]) == seq.tokens(i * engine.block_size, (i + 1) * engine.block_size)
    assert all(list(s)[-1].done_reason == "length" for s in streams)
    assert engine.stats().draft_tokens > engine.stats().accepted_tokens > 0
    # the prefix cache serves the accepted output: the same prompt + output again is a hit past the prompt
    first = run(toy_engine("off"), PROMPTS[:1], [SamplingParams(temperature=0, num_predict=60)])[0][0]
    again = engine.submit(PROMPTS[0] + first + [65], SamplingParams(temperature=0, num_predict=1), loop=None)
    while engine.run_once():
        pass
    assert list(again)[-1].metrics.cached_tokens >= len(PROMPTS[0]) + len(first) - engine.block_size


def test_steps_with_a_prompt_chunk_carry_no_draft_and_drafts_stay_in_the_budget() -> None:
    engine = toy_engine(budget=12)
    steps: list[dict] = []
    engine.subscribe(lambda ev: ev["type"] == "step" and steps.append(ev))
    streams = [engine.submit(p, SamplingParams(temperature=0, num_predict=60, draft_num_predict=16), loop=None)
               for p in PROMPTS[:2]]
    for _ in range(12):
        engine.run_once()
    late = engine.submit(PROMPTS[3] * 3, SamplingParams(temperature=0, num_predict=4), loop=None)
    while engine.run_once():
        pass
    assert any(ev["draft_tokens"] for ev in steps)
    assert all(ev["draft_tokens"] == 0 for ev in steps if ev["prefill_tokens"])
    assert all(ev["decodes"] + ev["prefill_tokens"] + ev["draft_tokens"] <= 12 for ev in steps)
    assert all(list(s)[-1].done_reason == "length" for s in streams + [late])


def test_draft_num_predict_0_never_drafts() -> None:
    engine = toy_engine()
    loop = PROMPTS[0][:8] * 4
    [(_, final)] = run(engine, [loop], [SamplingParams(temperature=0, num_predict=40, draft_num_predict=0)])
    assert final.metrics.draft_tokens == 0 and engine.stats().draft_tokens == 0
    [(_, final)] = run(engine, [loop], [SamplingParams(temperature=0, num_predict=40, draft_num_predict=3)])
    assert final.metrics.draft_tokens > 0


def _sized(kept: int, step_s: float, per_draft_s: float, target_ms: float = 150.0, streams: int = 1,
           jump_s: float = 0.0, jitter_s: float = 0.0, seen: tuple[int, ...] | None = None) -> int:
    """The draft tokens the speculator gives `streams` decodes once it has measured steps costing `step_s` plus
    `per_draft_s` a draft token (and `jump_s` more from 5 tokens in the step on), and drafts of 5 tokens of which
    `kept` were kept (5: all, 4: 80%, 0: none)."""
    engine = toy_engine(target_itl_ms=target_ms, budget=256)
    spec = engine.spec
    subs = [engine.submit(PROMPTS[i][:10] * 6, SamplingParams(temperature=0, num_predict=100, draft_num_predict=0),
                          loop=None) for i in range(streams)]
    while len(engine.scheduler.running) < streams or any(q.num_computed < 60 for q in engine.scheduler.running):
        engine.run_once()
    for q in engine.scheduler.running:
        q.params.draft_num_predict = -1
        for _ in range(30):
            spec.verified(q, 4, 5, kept)
    for rnd in range(3 if jitter_s else 1):  # jitter: each step measured above and below its cost
        for d in (1, 2):
            for i, k in enumerate(seen or ((0, 0, 2, 4, 8, 0, 6, 1, 3, 5) if jump_s else (0, 0, 2, 4, 8, 0, 6, 1))):
                spec.cost.observe(d, k, 0, 0, step_s + per_draft_s * k + (jump_s if d + k >= 5 else 0.0)
                                  + (jitter_s if (i + rnd) % 2 else -jitter_s))
    plan = engine.scheduler.schedule()
    spec.drafter.offer = lambda s, cap: (cap, 4)  # a match of 4+ tokens, as long as allowed
    spec.drafter.draft = lambda wants: [[7] * k for _, k in wants]
    spec.extend(plan, engine.blocks, lambda s: True)
    for sub in subs:
        engine.abort(sub.seq_id)
    return plan.draft_tokens


def test_adaptive_draft_size_follows_acceptance_and_cost() -> None:
    """Kept drafts and cheap draft tokens: long drafts; rejected drafts: none; dear draft tokens: fewer; and past
    the latency target only for a lone stream (the target is the other streams' promise)."""
    long = _sized(5, 0.020, 0.002)
    assert long == 16
    assert _sized(0, 0.020, 0.002) == 0
    assert 1 < _sized(4, 0.020, 0.002) < long  # 80% kept: the 16th token is worth 0.8^16 of one
    assert _sized(4, 0.020, 0.015) == 1  # dearer: only the first pays (1.8 tokens in 35 ms beat 1 in 20)
    assert _sized(4, 0.020, 0.030) == 0
    assert _sized(5, 0.020, 0.015, target_ms=60, streams=2) <= 2  # 0.020 + 0.015 * k <= 0.060
    assert _sized(5, 0.020, 0.002, target_ms=30) == long  # alone: its own tokens per second decide


def test_drafts_aim_below_the_target_by_what_the_cost_model_misses() -> None:
    """Others decoding: a step with drafts is planned under the target less the budget's margin and one deviation of
    the cost model's misses, as a prompt chunk is (planned at 149 ms of 150, such steps took 158-205 ms)."""
    exact = _sized(5, 0.020, 0.005, target_ms=60, streams=2)
    assert exact == 7  # 20 + 5 * 7 = 55 ms <= 0.97 * 60
    assert _sized(5, 0.020, 0.005, target_ms=60, streams=2, jitter_s=0.008) < exact  # steps measured +-8 ms


def test_a_step_in_the_kernels_cost_is_learned_and_avoided() -> None:
    """llama.cpp's CPU kernels: Gemma 3 270M's step with 5 logits rows cost 2.1 decodes, with 4 rows 1.5 (its
    262k-row output matrix). A line through such costs mispredicts both sides; the per-count residuals do not, and
    the drafts stop below the step unless enough tokens past it pay for it."""
    def t(k: int) -> float:
        return 0.020 * (1 + 0.15 * k + (0.7 if k >= 4 else 0))
    cost = DraftCost()
    for _ in range(6):
        for k in (0, 1, 2, 3, 4, 5, 6, 8):
            cost.observe(1, k, 0, 0, t(k))
    for k in (0, 1, 2, 3, 4, 5, 6, 8):
        assert cost.predict(1, k, 0) == pytest.approx(t(k), rel=0.08), k
    assert _sized(4, 0.020, 0.003, jump_s=0.014) == 3  # 80% kept: the 4th token is not worth 0.7 of a decode
    assert _sized(5, 0.020, 0.001, jump_s=0.014) == 16  # all kept and cheap: 12 more tokens pay for the step


def test_what_a_draft_costs_outlives_a_run_of_plain_steps() -> None:
    """Drafting steps measured dear stay measured after hundreds of plain steps (a prompt going in, drafts failing):
    the prior, which prices a draft far cheaper on llama.cpp's streams, does not come back."""
    cost = DraftCost()
    for k in (1, 2, 1, 2, 1, 3):
        cost.observe(4, k, k, 0, 0.045 + k * 0.025)
    for _ in range(300):
        cost.observe(4, 0, 0, 0, 0.045)
    assert cost.predict(4, 1, 1) == pytest.approx(0.070, rel=0.1)
    assert cost.predict(4, 0, 0) == pytest.approx(0.045, rel=0.05)


def test_drafts_grow_from_what_was_measured_while_others_wait() -> None:
    """Others decoding: a step carries at most 1.5x the draft tokens a step was measured with (at least 2), as the
    budget never extrapolates a chunk far; a lone decode is bound only by what pays."""
    assert _sized(5, 0.020, 0.002, streams=2, seen=(0, 0, 0, 1, 0, 2, 0)) == 3
    assert _sized(5, 0.020, 0.002, streams=2, seen=(0, 0, 0, 0, 0, 0)) == 2
    assert _sized(5, 0.020, 0.002, streams=2, seen=(0, 4, 0, 6, 0)) == 9
    assert _sized(5, 0.020, 0.002, seen=(0, 0, 0, 1, 0, 2, 0)) == 16


def test_sampled_requests_learn_their_own_acceptance() -> None:
    """A sampled token equals a draft only with its probability: greedy extraction's kept drafts do not make a story
    at temperature 0.8 draft, and its rejected drafts do not stop extraction's."""
    from evenflow.daemon.engine.speculative import _rate_key

    engine = toy_engine()
    spec = engine.spec
    greedy, sampled = [engine.submit(PROMPTS[i], SamplingParams(temperature=t, seed=1, num_predict=50), loop=None)
                       for i, t in ((0, 0.0), (1, 0.8))]
    engine.run_once()
    g, s = sorted(engine.scheduler.running, key=lambda q: q.params.temperature)
    src = spec.source(g)
    before = spec.alpha(src, _SeqSpec(), 4, _rate_key(s, 4))
    for _ in range(40):
        spec.verified(g, 4, 8, 8)
        spec.verified(s, 4, 8, 0)
    fresh = _SeqSpec()
    assert spec.alpha(src, fresh, 4, _rate_key(g, 4)) > 0.85  # greedy: drafts of a 4+ match kept
    assert spec.alpha(src, fresh, 4, _rate_key(s, 4)) < before < 0.8  # sampled: its own record, rejected
    for sub in (greedy, sampled):
        engine.abort(sub.seq_id)


def _probes(target_ms: float, pass_s: float, streams: int = 4) -> tuple[int, int]:
    """(draft tokens, drafting spans) the speculator gives `streams` decodes that have all drafted nothing for long
    and hold a 2-token match of poor acceptance, on llama.cpp's per-sequence streams (a drafting span is a pass of
    its own, measured at `pass_s`; a step of plain decodes at 45 ms)."""
    engine = toy_engine(target_itl_ms=target_ms, budget=256)
    spec = engine.spec
    spec.one_pass = False
    subs = [engine.submit(PROMPTS[i][:10] * 6, SamplingParams(temperature=0, num_predict=100, draft_num_predict=0),
                          loop=None) for i in range(streams)]
    while len(engine.scheduler.running) < streams or any(q.num_computed < 60 for q in engine.scheduler.running):
        engine.run_once()
    for _ in range(40):
        spec.cost.observe(streams, 0, 0, 0, 0.045)
    for k in (1, 2):
        spec.cost.observe(streams, k, k, 0, 0.045 + k * (0.006 + pass_s))
    plan = engine.scheduler.schedule()
    spec.drafter.offer = lambda s, cap: (cap, 2)
    spec.drafter.draft = lambda wants: [[7] * k for _, k in wants]
    for q in engine.scheduler.running:
        q.params.draft_num_predict = -1
        spec.verified(q, 2, 4, 0)  # drafts of a 2-token match fail here: none worth sizing
        spec._seqs[q.seq_id] = _SeqSpec(idle=10_000)
    spec.extend(plan, engine.blocks, lambda s: True)
    for sub in subs:
        engine.abort(sub.seq_id)
    return plan.draft_tokens, sum(1 for sp in plan.spans if sp.draft)


def test_probes_come_one_a_step_within_the_target_and_back_off() -> None:
    """Streams that have not drafted for long probe one token each, but one stream a step (four at once on llama.cpp's
    streams took 138 ms where the decodes took 45), never past the latency target, and a stream whose drafts keep
    failing probes ever more rarely."""
    assert _probes(target_ms=150, pass_s=0.020) == (1, 1)
    assert _probes(target_ms=60, pass_s=0.020) == (0, 0)  # 45 + 26 ms > 60 ms: the others' gap comes first
    engine = toy_engine()
    [sub] = [engine.submit(PROMPTS[0], SamplingParams(temperature=0, num_predict=5), loop=None)]
    engine.run_once()
    seq = engine.scheduler.running[0]
    spec = engine.spec
    spec._seqs[seq.seq_id] = _SeqSpec()
    waits = []
    for _ in range(6):
        spec.verified(seq, 2, 1, 0)
        waits.append(spec._seqs[seq.seq_id].probe_every)
    assert waits == [64, 128, 256, 512, 512, 512]
    spec.verified(seq, 2, 1, 1)
    assert spec._seqs[seq.seq_id].probe_every == 32
    engine.abort(sub.seq_id)


# ---- real backends: a model that repeats itself, so drafts are kept, and one that does not ----

def _audit(engine: Engine, backend: str) -> None:
    """After a step: llama.cpp holds exactly the computed positions of each running sequence (rejected draft tokens
    rolled back), and a decoding sequence holds the blocks of its computed tokens, no more."""
    for seq in engine.scheduler.running:
        if backend == "llamacpp":
            assert engine.runner.cached_tokens(seq.slot) == seq.num_computed, seq
        if seq.num_computed >= len(seq.prompt_ids):
            assert len(seq.block_table) == blocks_for(seq.num_computed, engine.block_size), seq


def _settings(layout: str | None) -> RunnerSettings:
    return RunnerSettings(max_num_seqs=4, block_size=4, num_kv_blocks=None if layout == "streams" else 96,
                          context_length=160, max_num_batched_tokens=64, num_threads=2, dtype="float32",
                          flash_attention="off", kv_layout=layout)


@pytest.fixture(scope="module", params=[("llamacpp", "streams"), ("llamacpp", "unified"), ("torch", None),
                                        ("mlx", None)], ids=lambda p: "-".join(x for x in p if x))
def backend(request) -> tuple[str, str | None]:
    if not HAS[request.param[0]]:
        pytest.skip(f"{request.param[0]} is not installed")
    return request.param


@pytest.mark.parametrize("tied", [True, False], ids=["repeats-itself", "random"])
def test_real_backends_equal_one_token_at_a_time(backend, synthetic_model, tied: bool) -> None:
    name, layout = backend
    fmt = "gguf" if name == "llamacpp" else "hf"
    path = str(synthetic_model("tiny", "llama", formats=(fmt,), gguf_dtype="f32", qk_std=0.3,
                               tie_word_embeddings=tied)[fmt])
    runner = load_runner(name, path, _settings(layout))
    try:
        rng = np.random.default_rng(5)
        prompts = [[int(t) for t in rng.integers(3, 1900, n)] for n in (9, 23, 40)]
        prompts.append(prompts[1][:12] + prompts[1])  # a prompt that repeats itself: lookup drafts from it
        params = [SamplingParams(temperature=0, num_predict=40, draft_num_predict=d) for d in (5, -1, 3, 7)]
        spec = Engine(runner, EngineConfig(max_num_batched_tokens=24))
        got = run(spec, prompts, params, on_step=lambda e: _audit(e, name))
        st = spec.stats()
        off = Engine(runner, EngineConfig(max_num_batched_tokens=24, speculative="off"))
        want = run(off, prompts, params)
        assert [g[0] for g in got] == [w[0] for w in want]
        assert st.draft_tokens > 0 and st.kv_blocks_used == 0
        if tied:  # it repeats its last token: drafts from its own output are kept
            assert st.accepted_tokens > st.draft_tokens // 2
        # a grammar-constrained request never drafts, and its output is valid
        c = spec.grammars.compile(grammar_for_format("json"))
        [(toks, final)] = run(spec, [prompts[3]], [SamplingParams(temperature=0, num_predict=30,
                                                                  draft_num_predict=8)], constraint=c)
        assert final.metrics.draft_tokens == 0 and final.done_reason in ("stop", "length")
    finally:
        runner.close()


def test_monitor_shows_drafts_and_their_acceptance() -> None:
    from evenflow.tui.state import MonitorState
    from evenflow.tui.timeline import tokens_rows

    state = MonitorState()
    base = {"type": "step", "model": "m", "prefill_tokens": 0, "step_ms": 40.0, "target_ms": 150.0}
    state.apply({**base, "time": 100.0, "decodes": 2, "draft_tokens": 0, "accepted_tokens": 0})
    assert state.speculation(100.0) is None
    state.apply({**base, "time": 101.0, "decodes": 2, "draft_tokens": 8, "accepted_tokens": 6})
    state.apply({**base, "time": 102.0, "decodes": 1, "draft_tokens": 4, "accepted_tokens": 0})
    spec = state.speculation(102.0)
    assert spec == {"acceptance": 0.5, "tokens_per_forward": (5 + 6) / 5}
    rows = tokens_rows(list(state.steps), 10)
    column = ["".join(piece for piece, _ in row[1:])[1] for row in rows]  # the step with 8 draft tokens
    assert column.count("█") == 2 and column.count("░") == 8
    assert state.speculation(200.0) is None  # a minute later nothing is left in the window
    state.apply({"type": "model", "event": "loaded", "model": "m", "backend": "llamacpp", "size": 100})
    state.apply({"type": "model", "event": "draft_loaded", "model": "m", "draft": "d", "size": 130})
    assert state.models["m"].size == 130  # a request's draft model loaded beside it


# ---- a draft model (llama.cpp) ----

@pytest.mark.skipif(not HAS["llamacpp"], reason="llama_cpp is not installed")
@pytest.mark.parametrize("layout", ["streams", "unified"])
def test_a_draft_model_drafts_and_changes_nothing_but_speed(synthetic_model, layout: str) -> None:
    from evenflow.daemon.engine.draft_model import DraftVocabMismatch, check_vocab

    target_path = str(synthetic_model("tiny", "llama", formats=("gguf",), qk_std=0.3)["gguf"])
    other_path = str(synthetic_model("tiny", "llama", formats=("gguf",), qk_std=0.3, seed=1,
                                     num_hidden_layers=1)["gguf"])
    target = load_runner("llamacpp", target_path, _settings(layout))
    drafts = {"itself": load_runner("llamacpp", target_path, _settings(layout)),
              "another model": load_runner("llamacpp", other_path, _settings(layout))}
    try:
        rng = np.random.default_rng(9)
        prompts = [[int(t) for t in rng.integers(3, 1900, n)] for n in (11, 30, 47)]
        params = [SamplingParams(temperature=0, num_predict=36, draft_num_predict=d) for d in (4, 6, 2)]
        want = run(Engine(target, EngineConfig(max_num_batched_tokens=24, speculative="off")), prompts, params)
        for name, draft in drafts.items():
            check_vocab(target, draft, "target", name)
            engine = Engine(target, EngineConfig(max_num_batched_tokens=24), draft=draft)
            got = run(engine, prompts, params, on_step=lambda e: _audit(e, "llamacpp"))
            assert [g[0] for g in got] == [w[0] for w in want], name
            st = engine.stats()
            assert st.kv_blocks_used == 0 and engine.spec.drafter.blocks.num_used == 0  # type: ignore[union-attr]
            if name == "itself":  # the model drafting for itself is always right
                assert st.accepted_tokens == st.draft_tokens > 0
            else:
                assert st.draft_tokens > st.accepted_tokens
    finally:
        for r in (target, *drafts.values()):
            r.close()
    small_vocab = str(synthetic_model("tiny", "llama", formats=("gguf",), vocab_size=1024)["gguf"])
    a, b = load_runner("llamacpp", target_path, _settings(layout)), load_runner("llamacpp", small_vocab,
                                                                                _settings(layout))
    try:
        with pytest.raises(DraftVocabMismatch, match="has 1024 tokens, 'big' has 2048"):
            check_vocab(a, b, "big", "small")
    finally:
        a.close()
        b.close()


def test_context_shifts_while_drafting_change_nothing() -> None:
    """The window fills mid-draft: the kept part is recomputed (engine._shift) and drafting resumes on the new
    tokens, as without drafts."""
    params = [SamplingParams(temperature=0, num_predict=90, draft_num_predict=d, shift=True) for d in (5, -1)]
    prompts = [PROMPTS[0][:10] * 3, PROMPTS[1][:36]]
    spec = toy_engine(context_length=48)
    got = run(spec, prompts, params)
    want = run(toy_engine("off", context_length=48), prompts, params)
    assert [g[0] for g in got] == [w[0] for w in want]
    assert all(g[1].metrics.shifts >= 1 for g in got) and spec.stats().accepted_tokens > 0
    assert spec.stats().kv_blocks_used == 0


VOCABS = [("llama-spm", 8), ("llama-bpe", 64), ("qwen2", 8), ("phi-3", 64), ("gpt-2", 8)]  # (vocab, step budget)
TEXT = ("The agreement renews every year. The agreement renews every year unless notice is given. Notice is given "
        "in writing, and the agreement ends thirty days later. ")


@pytest.mark.skipif(not HAS["llamacpp"], reason="llama_cpp is not installed")
@pytest.mark.parametrize("vocab,budget", VOCABS)
def test_every_vocabulary_chunked_concurrent_and_cached(fixtures_dir, synthetic_model, vocab: str,
                                                        budget: int) -> None:
    """Prompt lookup over real tokenizers' ids (byte fallback, specials, 150k ids): several requests at once, small
    prompt chunks, a prefix hit; each answer equals the one-token-at-a-time answer."""
    path = synthetic_model("tiny", "llama", formats=("gguf",), tie_word_embeddings=True, qk_std=0.3,
                           vocab=str(fixtures_dir / "vocab" / f"ggml-vocab-{vocab}.gguf"))["gguf"]
    runner = load_runner("llamacpp", str(path), _settings("streams"))
    try:
        tok = runner.tokenizer
        prompts = [tok.encode(TEXT * 2), tok.encode("Notice: " + TEXT), tok.encode(TEXT * 2 + "The agreement")]
        params = [SamplingParams(temperature=0, num_predict=24, draft_num_predict=d) for d in (4, -1, 7)]
        spec = Engine(runner, EngineConfig(max_num_batched_tokens=budget))
        got = run(spec, prompts, params, on_step=lambda e: _audit(e, "llamacpp"))
        again = run(spec, prompts[:1], params[:1])  # the first prompt again: a prefix hit
        st = spec.stats()
        want = run(Engine(runner, EngineConfig(max_num_batched_tokens=budget, speculative="off")), prompts, params)
        assert [g[0] for g in got] == [w[0] for w in want] and again[0][0] == want[0][0]
        assert st.accepted_tokens > 0 and st.cache_hit_tokens > 0 and st.kv_blocks_used == 0
    finally:
        runner.close()
