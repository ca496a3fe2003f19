"""Model-based test of the engine and the runners' KV caches (hypothesis' stateful testing).

Random requests that share prefixes of random lengths with a few documents (block boundaries included) arrive while
others run; some are aborted; small KV pools force preemptions and LRU evictions, and llama.cpp's parked streams and
holder ids are taken over. After every engine step the engine's view of the cache and the runner's agree, and every
request that finished equals its solo greedy output (the same prompt alone on a second runner, no cache, no
speculative decoding), token by token and in each token's log-probability (a recurrent state resumed from the wrong
checkpoint can leave the greedy tokens alone and still move the logits). Requests draft tokens as the engine decides,
a fixed number, or none (`draft_num_predict`), so rejected draft tokens are rolled back under all of the above.
"""
from __future__ import annotations

import importlib.util
from typing import Any

import pytest
import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition, rule,
                                run_state_machine_as_test)

from evenflow.backends.base import RunnerSettings, load_runner
from evenflow.backends.synthetic.archs import GGUF_ONLY
from evenflow.daemon.engine import Engine, EngineConfig, SamplingParams

BS = 4
DOC_LEN = 48
HAS = {"llamacpp": importlib.util.find_spec("llama_cpp"), "torch": importlib.util.find_spec("torch"),
       "mlx": importlib.util.find_spec("mlx")}
# (backend, KV layout, engine block pool): the llama.cpp streams layout gives every slot a whole window, so its
# pressure comes from the LRU evicting parked streams; the other pools are small enough to preempt.
CONFIGS = [
    pytest.param(("llamacpp", "streams", None, "llama"), id="llamacpp-streams"),
    pytest.param(("llamacpp", "unified", 40, "llama"), id="llamacpp-unified"),
    pytest.param(("torch", None, 40, "llama"), id="torch"),
    pytest.param(("mlx", None, 40, "llama"), id="mlx"),
]
# The factory's GGUF-only architectures (llama.cpp runs them alone): sliding window (gemma3, gpt-oss), attention
# sinks and MoE (gpt-oss, qwen3moe), hybrid recurrent (lfm2, qwen35: hits resume from state checkpoints), MLA
# (deepseek2), each in both KV layouts.
CONFIGS += [pytest.param(("llamacpp", layout, blocks, arch), id=f"llamacpp-{layout}-{arch}")
            for arch in GGUF_ONLY for layout, blocks in (("streams", None), ("unified", 40))]


def _settings(layout: str | None, blocks: int | None) -> RunnerSettings:
    # f32 KV and flash attention off: logits do not depend on how a pass is batched (test_engine_backends)
    return RunnerSettings(max_num_seqs=4, block_size=BS, num_kv_blocks=blocks, context_length=96,
                          max_num_batched_tokens=64, num_threads=2, dtype="float32", flash_attention="off",
                          kv_layout=layout)


@pytest.fixture(scope="module", params=CONFIGS)
def runners(request, synthetic_model):
    backend, layout, blocks, arch = request.param
    if not HAS[backend]:
        pytest.skip(f"{backend} is not installed")
    fmt = "gguf" if backend == "llamacpp" else "hf"
    path = str(synthetic_model("tiny", arch, formats=(fmt,), gguf_dtype="f32", qk_std=0.3)[fmt])
    warm = load_runner(backend, path, _settings(layout, blocks))
    solo = load_runner(backend, path, _settings(layout, None if backend == "llamacpp" else 64))
    yield warm, solo
    warm.close()
    solo.close()


def audit(engine: Engine) -> None:
    """The engine's and the runner's views of the KV cache agree (and the block pool is self-consistent)."""
    bm, runner = engine.blocks, engine.runner
    running = engine.scheduler.running
    refs = [0] * bm.num_blocks
    for seq in running:
        for b in seq.block_table:
            refs[b] += 1
        assert len(seq.block_table) * BS >= seq.num_computed
    assert refs == [bm.refcount(b) for b in range(bm.num_blocks)], "a block is held by nobody or counted twice"
    assert bm.num_free + sum(r > 0 for r in refs) == bm.num_blocks
    cells = getattr(runner, "_cells", None)
    if cells is None:  # torch / MLX: the KV memory *is* the engine's blocks
        return
    cached = set(bm._cached.values())
    held = {b for b, where in cells._where.items() if where}
    assert cached <= held, f"the engine counts on blocks llama.cpp no longer holds: {sorted(cached - held)}"
    known = {b for b in range(bm.num_blocks) if refs[b] or bm._key[b] is not None} | set(bm.forgotten)
    assert held <= known, f"llama.cpp holds cells of blocks the engine forgot: {sorted(held - known)}"
    for seq in running:
        assert runner.cached_tokens(seq.slot) == seq.num_computed, seq
        full = seq.num_computed // BS
        assert runner.servable_prefix(seq.block_table[:full]) == full, seq


class OracleDrafter:
    """Drafts a request's solo greedy continuation with every fifth-or-so token wrong (a hash of where), so drafts are
    kept in part and rejected at every position, across block boundaries (a random model rarely repeats itself,
    so prompt lookup alone would seldom draft here)."""

    sequential = False

    def __init__(self) -> None:
        self.expected: dict[int, list[int]] = {}

    def follow(self, plan: Any) -> None:
        pass

    def offer(self, seq: Any, cap: int) -> tuple[int, int]:
        left = self.expected.get(seq.seq_id, [])[len(seq.output_ids):]
        return min(cap, len(left)), 4

    def draft(self, wants: list[tuple[Any, int]]) -> list[list[int]]:
        out = []
        for seq, k in wants:
            m = len(seq.output_ids)
            toks = list(self.expected[seq.seq_id][m:m + k])
            for j in range(len(toks)):
                if hash((seq.seq_id, m + j, len(toks))) % 5 == 0:
                    toks[j] = 3 + (toks[j] + 1) % 1800
            out.append(toks)
        return out

    def rejected(self, seq: Any, num_computed: int) -> None:
        pass

    def forget(self, seq_id: int) -> None:
        self.expected.pop(seq_id, None)
def logprobs(deltas: list) -> list[float]:
    return [lp.logprob for d in deltas for lp in d.logprobs or []]


class CacheMachine(RuleBasedStateMachine):
    warm: Any = None
    solo: Any = None
    oracle: dict[tuple[tuple[int, ...], int], tuple[list[int], str]] = {}

    @initialize(docs=st.lists(st.lists(st.integers(3, 1900), min_size=DOC_LEN, max_size=DOC_LEN),
                              min_size=3, max_size=3), oracle=st.booleans())
    def start(self, docs: list[list[int]], oracle: bool = False) -> None:
        self.docs = docs
        self.engine = Engine(self.warm, EngineConfig(max_num_batched_tokens=24))
        self.drafter = OracleDrafter() if oracle and self.engine.spec is not None else None
        if self.drafter is not None:
            self.engine.spec.drafter = self.drafter  # type: ignore[union-attr]
        self.finished: list[int] = []
        self.engine.subscribe(lambda ev: ev["type"] == "request" and ev["event"] == "finished"
                              and self.finished.append(ev["seq_id"]))
        self.live: dict[int, tuple[list[int], int, Any]] = {}

    @rule(doc=st.integers(0, 2), blocks=st.integers(0, DOC_LEN // BS), off=st.sampled_from([0, 0, 1, 3]),
          tail=st.lists(st.integers(3, 1900), min_size=1, max_size=12), n=st.integers(1, 8),
          drafts=st.sampled_from([-1, 0, 1, 3, 7]), copy=st.sampled_from([0, 0, 2, 5]))
    def submit(self, doc: int, blocks: int, off: int, tail: list[int], n: int, drafts: int, copy: int) -> None:
        # `copy`: the prompt ends with the document's first tokens again, so prompt lookup drafts what followed them
        prompt = self.docs[doc][: min(blocks * BS + off, DOC_LEN)] + tail + self.docs[doc][:copy]
        stream = self.engine.submit(prompt, SamplingParams(temperature=0, num_predict=n, draft_num_predict=drafts),
                                    loop=None, logprobs=0)
        self.live[stream.seq_id] = (prompt, n, stream)
        if self.drafter is not None:
            self.drafter.expected[stream.seq_id] = self._solo(prompt, n)[0]

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        self.engine.abort(data.draw(st.sampled_from(sorted(self.live))))

    @rule(steps=st.integers(1, 4))
    def step(self, steps: int) -> None:
        for _ in range(steps):
            self.engine.run_once()
            audit(self.engine)
            self._check_finished()

    def _check_finished(self) -> None:
        for seq_id in self.finished:
            prompt, n, stream = self.live.pop(seq_id)
            deltas = list(stream)
            reason = deltas[-1].done_reason
            assert reason != "error", deltas[-1].error
            if reason == "abort":
                continue
            got = [t for d in deltas for t in d.token_ids]
            want, want_reason, want_lp = self._solo(prompt, n)
            assert (got, reason) == (want, want_reason), f"prompt of {len(prompt)} tokens differs from its solo run"
            np.testing.assert_allclose(logprobs(deltas), want_lp, atol=1e-4, err_msg="log-probabilities differ")
        self.finished.clear()

    def _solo(self, prompt: list[int], n: int) -> tuple[list[int], str, list[float]]:
        key = (tuple(prompt), n)
        if key not in self.oracle:
            engine = Engine(self.solo, EngineConfig(max_num_batched_tokens=24, prefix_caching=False, speculative="off"))
            stream = engine.submit(prompt, SamplingParams(temperature=0, num_predict=n), loop=None, logprobs=0)
            while engine.run_once():
                pass
            deltas = list(stream)
            self.oracle[key] = ([t for d in deltas for t in d.token_ids], deltas[-1].done_reason, logprobs(deltas))
        return self.oracle[key]

    @invariant()
    def nothing_lost(self) -> None:
        if hasattr(self, "engine"):
            assert self.engine.blocks.fallback_tokens == 0, "a prefix hit had to be recomputed"

    def teardown(self) -> None:
        if not hasattr(self, "engine"):
            return
        while self.engine.run_once():
            audit(self.engine)
            self._check_finished()
        self._check_finished()
        assert not self.live
        assert self.engine.stats().kv_blocks_used == 0


def test_concurrent_cached_chunked_and_preempted_runs_equal_solo_greedy(runners):
    CacheMachine.warm, CacheMachine.solo = runners
    CacheMachine.oracle = {}
    # the Llama-shaped model runs the long search; each further architecture a short one (they share the machinery,
    # and the CI box is a loaded 2-core machine)
    llama = runners[0].info.architecture == "llama"
    run_state_machine_as_test(CacheMachine, settings=settings(
        max_examples=12 if llama else 2, stateful_step_count=30 if llama else 24, deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]))


def test_twins_extended_leave_one_chain(runners):
    """Requests that compute the same blocks side by side, one going further: a later hit is one run of blocks
    (found by the state machine: llama.cpp's streams served only part of it)."""
    CacheMachine.warm, CacheMachine.solo = runners
    CacheMachine.oracle = {}
    machine = CacheMachine()
    machine.start(docs=[[3] * DOC_LEN] * 3)
    for blocks in (2, 4, 4):
        machine.submit(doc=0, blocks=blocks, off=0, tail=[3], n=1, drafts=-1, copy=0)
        machine.nothing_lost()
    machine.step(steps=2)
    machine.nothing_lost()
    machine.teardown()


def test_twins_parting_leave_whole_chains(runners):
    """Requests that compute the same blocks side by side and then part: the one whose twins keep the keys leaves
    the other's continuation uncached, so no hit runs through blocks no single llama.cpp stream holds (found by the
    state machine: a hit had to be recomputed)."""
    CacheMachine.warm, CacheMachine.solo = runners
    CacheMachine.oracle = {}
    machine = CacheMachine()
    doc = [3] * DOC_LEN
    doc[3] = doc[23] = 4
    machine.start(docs=[doc, [3] * DOC_LEN, [3] * DOC_LEN])
    for blocks, doc_i, n, off, tail in ((6, 0, 1, 1, [3]), (0, 0, 3, 3, [3]), (6, 1, 2, 0, [3]), (7, 0, 1, 0, [3]),
                                         (5, 0, 1, 3, [3, 3])):
        machine.submit(doc=doc_i, blocks=blocks, off=off, tail=tail, n=n, drafts=0, copy=0)
    for steps in (1, 3):
        machine.step(steps=steps)
        machine.nothing_lost()
    machine.teardown()
    machine.nothing_lost()


def test_identical_prompts_admitted_together_over_a_parked_twin(runners):
    """Several requests with one prompt admitted in the same step, while an earlier request with that prompt is parked
    (its prefix cached, its output after it), beside a shorter and a longer prompt sharing the start: each equals its
    solo run (the all-at-once family test's pattern, at the engine: hits taken over in place and copied at once)."""
    CacheMachine.warm, CacheMachine.solo = runners
    CacheMachine.oracle = {}
    machine = CacheMachine()
    machine.start(docs=[list(range(3, 3 + DOC_LEN)), [7] * DOC_LEN, [9] * DOC_LEN])
    machine.submit(doc=0, blocks=5, off=2, tail=[5], n=6, drafts=-1, copy=4)
    machine.step(steps=4)
    machine.step(steps=4)
    assert not machine.live, "the first request is parked before the others come"
    for blocks, off, drafts in ((5, 2, -1), (5, 2, 3), (5, 2, 0), (5, 2, -1), (3, 1, -1), (7, 0, -1)):
        machine.submit(doc=0, blocks=blocks, off=off, tail=[5], n=6, drafts=drafts, copy=4)
    machine.step(steps=1)
    # the parked stream taken over by one, copied for the others (the twins' 6 full blocks each)
    assert machine.engine.cache_hit_tokens >= 3 * 6 * BS, "identical prompts served from the cache in one step"
    machine.nothing_lost()
    machine.teardown()
    machine.nothing_lost()
