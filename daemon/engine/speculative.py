"""Speculative decoding inside the piggybacked step: drafts verified in the same forward pass as everything else.

A decode span of 1 + k tokens (the pending token and k draft tokens) is a small prefill whose every row gives
logits (`SeqSpan.all_logits`): row j predicts the token after draft j. The engine samples the rows in order with
the request's own sampler and random stream and keeps the draft while each sampled token equals it; the first
token that differs (or the one after the last draft) is the step's last token for that sequence. So the output is
exactly what decoding one token at a time gives: greedy is argmax either way, and sampling draws the same uniform
per token, which for a deterministic draft (prompt lookup, a greedy draft model) is speculative rejection sampling:
the draft token is accepted with the target's probability of it, and a rejection samples the target restricted to
the other tokens (the residual). The KV of the rejected tokens is rolled back (`Runner.rollback`), their blocks are
given back, and the prefix cache only ever keys blocks of accepted tokens.

How many tokens to draft is decided each step: every candidate draft token j of a sequence is worth alpha^j
expected tokens (alpha, its measured acceptance rate, per source: the n-gram match length or the draft model),
and costs what `DraftCost` measured; tokens are added while they raise the step's tokens per second, within the
latency target, the KV blocks and the runner's logits rows. A step that carries a prompt chunk carries no drafts:
the chunk was sized to fill the latency target, and decodes are never slowed for a guess. Each request drafts with
its own drafter: the model's default (prompt lookup, or its Modelfile's draft model) or a draft model it named
(`add_drafter`), each with acceptance rates of its own.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from ...backends.base import Runner
from .blocks import BlockManager
from .budget import AdaptiveBudget, BudgetPolicy
from .draft_cost import DraftCost
from .draft_model import DraftModel
from .ngram import PromptLookup
from .scheduler import ScheduledSpan, StepPlan
from .sequence import Sequence

log = logging.getLogger(__name__)

SPEC_MODES = ("ngram", "draft", "off")
MAX_BUCKET = 4  # acceptance buckets: 0 = a draft model's tokens, 1..4 = prompt lookup by match length (4: 4+)
# Engine-wide prior acceptance per bucket (a longer match is a surer guess), worth PRIOR_WEIGHT drafts
PRIOR_ALPHA = (0.6, 0.3, 0.45, 0.6, 0.7)
PRIOR_WEIGHT = 2.0
SEQ_WEIGHT = 3.0  # the engine-wide rate counts as this many drafts in a sequence's own estimate
DECAY = 0.98  # engine-wide counts fade, so the rate follows what the model is being asked now
LOOKAHEAD = 4  # draft tokens past a sequence's current ones weighed together (a cost step can hide behind one)
PROBE_EVERY = 32  # a sequence not drafting for this many steps tries one token on a match of 2+ (rates change)
MAX_PROBE_EVERY = 512  # ... and after each probe wholly rejected waits twice as long, up to this


class Drafter(Protocol):
    """Where draft tokens come from: prompt lookup (ngram.PromptLookup) or a draft model (draft_model.py)."""

    sequential: bool  # each draft token costs a forward pass of its own (a draft model), shared by the sequences

    def follow(self, spans: list[ScheduledSpan]) -> None:
        """Every step, before drafting: read along the prompt chunks the target computes for the sequences this
        drafter serves (a draft model's prompt)."""
        ...

    def offer(self, seq: Sequence, cap: int) -> tuple[int, int]:
        """(draft tokens it can give `seq` now, at most `cap`; acceptance bucket)."""
        ...

    def draft(self, wants: list[tuple[Sequence, int]]) -> list[list[int]]:
        """The draft tokens, k for each (sequence, k) (fewer where it has fewer)."""
        ...

    def rejected(self, seq: Sequence, num_computed: int) -> None:
        """After verification: `seq` holds `num_computed` computed tokens (its own KV past them is stale)."""
        ...

    def forget(self, seq_id: int) -> None:
        ...


@dataclass
class SpecConfig:
    mode: str = "ngram"  # ngram: prompt lookup; draft: a draft model; off
    max_draft: int = 16  # most draft tokens one sequence carries in a step

    def __post_init__(self) -> None:
        if self.mode not in SPEC_MODES:
            raise ValueError(f"speculative mode {self.mode!r}; allowed: {', '.join(SPEC_MODES)}")
        if self.max_draft < 1:
            raise ValueError(f"max_draft must be >= 1, got {self.max_draft}")


@dataclass
class SpecCounters:
    """Totals since load (the /metrics counters)."""

    steps: int = 0  # steps that carried drafts
    spans: int = 0  # decode spans that carried drafts (forward passes of a speculating sequence)
    drafted: int = 0  # draft tokens verified
    accepted: int = 0  # draft tokens kept


@dataclass
class _SeqSpec:
    acc: list[float] = field(default_factory=lambda: [0.0] * (MAX_BUCKET + 1))
    rej: list[float] = field(default_factory=lambda: [0.0] * (MAX_BUCKET + 1))
    idle: int = 0  # steps since it last carried a draft
    probe_every: int = PROBE_EVERY  # idle steps before it probes; doubles while its drafts are wholly rejected


@dataclass(eq=False)
class _Source:
    """A drafter and its engine-wide acceptance counts per bucket (a draft model's tokens, match lengths), kept apart
    for greedy and sampled requests (`_rate_key`): a sampled token equals the draft only with its probability, so
    extraction's greedy rates said nothing of a story's at temperature 0.8 (2 of 24 drafts kept there)."""

    drafter: Drafter
    acc: list[float] = field(default_factory=lambda: [a * PRIOR_WEIGHT for a in PRIOR_ALPHA] * 2)
    rej: list[float] = field(default_factory=lambda: [(1 - a) * PRIOR_WEIGHT for a in PRIOR_ALPHA] * 2)
    drafted: int = 0  # draft tokens it proposed that were verified


@dataclass
class _Candidate:
    span: ScheduledSpan
    source: _Source
    alpha: float
    bucket: int
    cap: int  # most tokens it may take (what the drafter has, blocks, context, num_predict, draft_num_predict)
    fixed: bool  # the request asked for a number of draft tokens: no adapting
    k: int = 0


class Speculator:
    """Proposes drafts for a step's decodes, sizes them, and learns from how they fared."""

    def __init__(self, config: SpecConfig, drafter: Drafter, max_rows: int | None, *, one_pass: bool,
                 max_step_tokens: int, aim: Callable[[float], float] | None) -> None:
        self.config = config
        # the default drafter under "" (prompt lookup, or the Modelfile's draft model), a request's named draft model
        # under its names; replaced whole when one is added (the manager adds from another thread)
        self._sources: dict[str, _Source] = {"": _Source(drafter)}
        self.max_rows = max_rows
        self.one_pass = one_pass  # a step is one pass whatever its spans (torch, MLX, llama.cpp's unified KV)
        self.max_step_tokens = max_step_tokens
        # the step time a step with drafts plans for, given the cost model's noise: the budget's (None: no target)
        self.aim = aim
        self.cost = DraftCost()
        self.counters = SpecCounters()
        self._seqs: dict[int, _SeqSpec] = {}

    @property
    def drafter(self) -> Drafter:
        """The default drafter."""
        return self._sources[""].drafter

    @drafter.setter
    def drafter(self, drafter: Drafter) -> None:
        """Replace the default drafter (before the engine runs: tests give it an oracle)."""
        self._sources = {**self._sources, "": _Source(drafter)}

    def add_drafter(self, names: list[str], drafter: Drafter) -> None:
        """Requests whose `draft_model` is one of `names` draft with `drafter` from the next step on."""
        src = _Source(drafter)
        self._sources = {**self._sources, **{n: src for n in names if n}}

    def drafted_by(self, name: str) -> int:
        """Draft tokens verified that the drafter under `name` proposed ("" = the default)."""
        src = self._sources.get(name)
        return src.drafted if src is not None else 0

    def source(self, seq: Sequence) -> _Source:
        """The drafter of `seq`: its request's draft model, else the default (the Modelfile's draft model is it)."""
        sources = self._sources
        return sources.get(seq.params.draft_model) or sources[""]

    def _distinct(self) -> list[_Source]:
        return list({id(s): s for s in self._sources.values()}.values())

    # ---- planning ----
    def extend(self, plan: StepPlan, blocks: BlockManager, eligible: Callable[[Sequence], bool]) -> None:
        """Give some of `plan`'s decodes draft tokens (allocating their KV blocks)."""
        chunks = plan.spans[plan.num_decodes:]
        for src in self._distinct():
            if src.drafter.sequential:  # only a draft model reads along
                src.drafter.follow([s for s in chunks if self.source(s.seq) is src])
        if plan.num_decodes == 0 or plan.prefill_tokens or len(plan.spans) != plan.num_decodes:
            return
        cands = [c for span in plan.spans if (c := self._candidate(span, blocks, eligible)) is not None]
        if not cands:
            return
        self._size(plan, cands)
        wants = []
        for c in cands:
            st = self._seqs[c.span.seq.seq_id]
            c.k = min(c.k, blocks.max_new_tokens(c.span.seq) - 1)
            if c.k <= 0:
                st.idle += 1
                continue
            st.idle = 0
            wants.append(c)
        drafts: list[list[int]] = [[] for _ in wants]
        for src in {id(c.source): c.source for c in wants}.values():
            mine = [i for i, c in enumerate(wants) if c.source is src]
            for i, toks in zip(mine, src.drafter.draft([(wants[i].span.seq, wants[i].k) for i in mine])):
                drafts[i] = toks
        for c, toks in zip(wants, drafts):
            # the blocks the drafts before took are gone: drafts past them are dropped (a draft model's KV of
            # them is rolled back with the rejected ones after the step)
            room = max(0, blocks.max_new_tokens(c.span.seq) - 1)
            if toks and not room:
                c.source.drafter.rejected(c.span.seq, c.span.seq.num_computed)  # verified nothing: it keeps nothing
            toks = toks[:room]
            if toks:
                blocks.allocate(c.span.seq, 1 + len(toks))
                c.span.num_tokens = 1 + len(toks)
                c.span.draft = list(toks)
                c.span.draft_bucket = c.bucket

    def _candidate(self, span: ScheduledSpan, blocks: BlockManager,
                   eligible: Callable[[Sequence], bool]) -> _Candidate | None:
        seq = span.seq
        want = seq.params.draft_num_predict
        if want == 0 or span.num_tokens != 1 or not eligible(seq):
            return None
        p = seq.params
        cap = min(self.config.max_draft if want < 0 else want,
                  seq.max_tokens - seq.num_tokens,  # the last draft's position stays inside the window
                  blocks.max_new_tokens(seq) - 1)
        if p.num_predict >= 0:
            cap = min(cap, p.num_predict - seq.num_generated - 1)  # accepted + one more must not exceed it
        if cap <= 0:
            return None
        st = self._seqs.get(seq.seq_id)
        if st is None:
            st = self._seqs[seq.seq_id] = _SeqSpec()
        src = self.source(seq)
        n, bucket = src.drafter.offer(seq, cap)
        if n <= 0:
            st.idle += 1
            return None
        return _Candidate(span, src, self.alpha(src, st, bucket, _rate_key(seq, bucket)), bucket, min(cap, n),
                          want > 0)

    def alpha(self, src: _Source, st: _SeqSpec, bucket: int, key: int) -> float:
        """A draft token's chance of acceptance: the sequence's own record, leaning on its drafter's engine-wide
        rate (under `key`: the bucket, greedy or sampled)."""
        glob = src.acc[key] / (src.acc[key] + src.rej[key])
        return (st.acc[bucket] + SEQ_WEIGHT * glob) / (st.acc[bucket] + st.rej[bucket] + SEQ_WEIGHT)

    def _predict(self, decodes: int, cands: list[_Candidate], ks: list[int]) -> float:
        """The step's time with these draft tokens per candidate."""
        spec = sum(1 for k in ks if k)
        # plain decodes share one pass; a drafting span has one of its own (llama.cpp's per-sequence streams)
        extra = 0 if self.one_pass else (spec if spec < decodes else spec - 1)
        return self.cost.predict(decodes, sum(ks), extra, _draft_passes([(c.source, k) for c, k in zip(cands, ks)]))

    def _size(self, plan: StepPlan, cands: list[_Candidate]) -> None:
        """Draft tokens for each candidate: greedily, the best expected tokens per second first."""
        rows_left = (self.max_rows - sum(int(s.need_logits) for s in plan.spans)
                     if self.max_rows is not None else 1 << 30)
        tokens_left = self.max_step_tokens - plan.num_tokens
        for c in cands:  # a request that named its number of draft tokens gets them (within the step's limits)
            if c.fixed:
                c.k = max(0, min(c.cap, rows_left, tokens_left))
                rows_left, tokens_left = rows_left - c.k, tokens_left - c.k
        if all(c.fixed for c in cands) or not self.cost.ready:
            return
        d = plan.num_decodes
        ks = [c.k for c in cands]
        t = self._predict(d, cands, ks)
        gain = float(d) + sum(sum(c.alpha ** j for j in range(1, c.k + 1)) for c in cands)
        # the latency target is the other streams' promise: a lone decode's step may run past it (it gets the tokens).
        # Aimed below it as the budget aims a prompt chunk, by what the cost model misses (steps planned at 149 ms of
        # 150 took 158-205 once the document that went in was decoding too)
        limit = self.aim(self.cost.noise) if self.aim is not None and d > 1 else float("inf")
        if limit < float("inf"):
            # and, as the budget's chunks, never far past the draft tokens a step has been measured with: the first
            # step with 11 (four streams, one drafting) took 174 ms where the prior had priced it under the target
            tokens_left = min(tokens_left, max(2, int(1.5 * self.cost.most_drafts)) - sum(ks))
        while rows_left > 0 and tokens_left > 0:
            best = None  # (expected tokens per second added, index, tokens, expected tokens, new step time)
            for i, c in enumerate(cands):
                if c.fixed or c.k >= c.cap:
                    continue
                # a sequence's first draft tokens may open a pass of their own, and a few tokens more may cross a
                # step in the kernels' cost (DraftCost's residuals): weigh them as one bundle
                top = min(c.cap, c.k + rows_left, c.k + tokens_left, c.k + LOOKAHEAD if c.k else c.cap)
                for m in range(c.k + 1, top + 1):
                    trial = ks.copy()
                    trial[i] = m
                    t_new = self._predict(d, cands, trial)
                    g = sum(c.alpha ** j for j in range(c.k + 1, m + 1))
                    ratio = g / max(t_new - t, 1e-9)
                    if t_new <= limit and (best is None or ratio > best[0]):
                        best = (ratio, i, m, g, t_new)
            if best is None or best[0] <= gain / max(t, 1e-9):
                break  # no draft token left that raises the step's tokens per second
            _, i, m, g, t_new = best
            add = m - cands[i].k
            cands[i].k = ks[i] = m
            rows_left, tokens_left = rows_left - add, tokens_left - add
            gain, t = gain + g, t_new
        self._probe(d, cands, ks, limit if rows_left > 0 and tokens_left > 0 else -1.0)

    def _probe(self, d: int, cands: list[_Candidate], ks: list[int], limit: float) -> None:
        """A sequence that has not drafted for long tries one token on a good match (rates change): one a step (the
        longest idle), within the latency target. On llama.cpp's per-sequence streams a drafting span is a pass of
        its own, so four streams probing in one step once took 138 ms where their decodes took 45."""
        idle = [(st.idle, c.bucket, i) for i, c in enumerate(cands)
                if not c.fixed and c.k == 0 and c.bucket >= 2
                and (st := self._seqs[c.span.seq.seq_id]).idle >= st.probe_every]
        if not idle:
            return
        i = max(idle)[2]
        trial = ks.copy()
        trial[i] = 1
        if self._predict(d, cands, trial) <= limit:
            cands[i].k = 1

    # ---- feedback ----
    def verified(self, seq: Sequence, bucket: int, drafted: int, accepted: int) -> None:
        """A span's drafts were checked: `accepted` of `drafted` kept."""
        rejected = 1.0 if accepted < drafted else 0.0
        src = self.source(seq)
        src.acc[:] = [a * DECAY for a in src.acc]
        src.rej[:] = [r * DECAY for r in src.rej]
        key = _rate_key(seq, bucket)
        src.acc[key] += accepted
        src.rej[key] += rejected
        src.drafted += drafted
        st = self._seqs.get(seq.seq_id)
        if st is not None:
            st.acc[bucket] += accepted
            st.rej[bucket] += rejected
            st.probe_every = PROBE_EVERY if accepted else min(2 * st.probe_every, MAX_PROBE_EVERY)
        c = self.counters
        c.spans += 1
        c.drafted += drafted
        c.accepted += accepted

    def observe(self, plan: StepPlan, seconds: float) -> None:
        """A finished step: decode-only steps teach the cost model."""
        if plan.prefill_tokens or plan.num_decodes == 0 or len(plan.spans) != plan.num_decodes:
            return
        ks = [len(s.draft) for s in plan.spans]
        if any(ks):
            self.counters.steps += 1
        spec = sum(1 for k in ks if k)
        extra = 0 if self.one_pass else (spec if spec < plan.num_decodes else spec - 1)
        passes = _draft_passes([(self.source(s.seq), len(s.draft)) for s in plan.spans])
        self.cost.observe(plan.num_decodes, sum(ks), extra, passes, seconds)

    def rejected(self, seq: Sequence, num_computed: int) -> None:
        """After verification: `seq` holds `num_computed` computed tokens; its drafter takes back the rest."""
        self.source(seq).drafter.rejected(seq, num_computed)

    def forget(self, seq_id: int) -> None:
        self._seqs.pop(seq_id, None)
        for src in self._distinct():
            src.drafter.forget(seq_id)


def _rate_key(seq: Sequence, bucket: int) -> int:
    """Where a draft's outcome counts engine-wide: its bucket, among the sampled requests' or the greedy ones'."""
    return bucket + (MAX_BUCKET + 1 if seq.params.temperature > 0 else 0)


def _draft_passes(ks: list[tuple[_Source, int]]) -> int:
    """A draft model's passes in a step: its longest draft (its sequences draft together), summed over models."""
    longest: dict[int, int] = {}
    for src, k in ks:
        if src.drafter.sequential:
            longest[id(src)] = max(longest.get(id(src), 0), k)
    return sum(longest.values())


def make_speculator(mode: str, runner: Runner, policy: BudgetPolicy, draft: Runner | None) -> Speculator | None:
    """The engine's speculator: prompt lookup, or the draft model when one is loaded; None when `mode` is off or the
    model cannot take back rejected tokens (a recurrent state)."""
    if mode == "off" or not runner.can_rollback or (draft is not None and not draft.can_rollback):
        return None
    drafter: Drafter = PromptLookup(runner.info.vocab_size) if draft is None else DraftModel(draft)
    return Speculator(SpecConfig("ngram" if draft is None else "draft"), drafter, runner.max_logits_rows,
                      one_pass=runner.kv_layout != "streams",
                      max_step_tokens=min(policy.max_tokens, runner.max_batch_tokens or policy.max_tokens),
                      aim=policy.aim if isinstance(policy, AdaptiveBudget) else None)
