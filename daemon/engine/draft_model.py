"""A draft model: a small model with the target's vocabulary proposes the draft tokens (speculative.py verifies).

It runs beside the target on a runner of its own (its own KV, blocks and slots; no prefix cache), inside the
target's engine step: while the target prefills a prompt chunk the draft model reads the same tokens (a prefix the
target had cached, the draft reads too, up to twice the chunk per step), so when the answer starts it has the prompt
already; at a decode, it reads what it has not seen yet (the pending token, the drafts just accepted) and then
proposes k tokens greedily, one pass per token, all drafting sequences in each pass. A greedy draft is deterministic,
so the target's verification is exact (speculative.py). A sequence that has not drafted for a while falls behind
(its tokens are not read while it does not draft); past LAG_MAX tokens it no longer drafts with the model.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from ...backends.base import Batch, Runner
from .blocks import BlockManager, SlotPool
from .scheduler import StepPlan
from .sequence import Sequence

log = logging.getLogger(__name__)

LAG_MAX = 32  # tokens a drafting pass may first have to read for a sequence
CATCH_UP = 2  # while the target prefills, the draft model reads up to this many times the chunk per sequence


class DraftVocabMismatch(ValueError):
    """The draft model's tokens are not the target's: its drafts would be other tokens."""


def check_vocab(target: Runner, draft: Runner, target_name: str, draft_name: str) -> None:
    """Raise DraftVocabMismatch naming the first difference (size, or a token's bytes)."""
    a, b = target.tokenizer, draft.tokenizer
    if a.vocab_size != b.vocab_size:
        raise DraftVocabMismatch(f"draft model {draft_name!r} has {b.vocab_size} tokens, {target_name!r} has "
                                 f"{a.vocab_size}: a draft model must share the model's vocabulary")
    for i in range(a.vocab_size):
        if a.token_bytes(i) != b.token_bytes(i):
            raise DraftVocabMismatch(f"draft model {draft_name!r} and {target_name!r} differ at token {i} "
                                     f"({b.token_bytes(i)!r} vs {a.token_bytes(i)!r}): a draft model must share "
                                     "the model's vocabulary")


@dataclass
class _DraftSeq:
    slot: int
    shifts: int  # the sequence's context shifts when the draft model started reading it
    computed: int = 0  # tokens of the sequence whose KV the draft model holds
    block_table: list[int] = field(default_factory=list)


class _Holder:
    """What BlockManager needs of a sequence, for the draft model's own blocks."""

    def __init__(self, ds: _DraftSeq) -> None:
        self.ds, self.seq_id, self.block_keys, self.num_registered = ds, -1, [], 0

    @property
    def num_computed(self) -> int:
        return self.ds.computed

    @property
    def block_table(self) -> list[int]:
        return self.ds.block_table

    @block_table.setter
    def block_table(self, value: list[int]) -> None:
        self.ds.block_table = value


class DraftModel:
    """The drafter of speculative.py backed by a second, smaller model."""

    sequential = True  # each draft token costs a pass of the draft model (shared by the drafting sequences)

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        runner.reset_prefix_cache()
        self.blocks = BlockManager(runner.num_kv_blocks, runner.block_size, prefix_caching=False)
        self.slots = SlotPool(runner.max_num_seqs)
        self._seqs: dict[int, _DraftSeq] = {}

    # ---- the target's prompt chunks ----
    def follow(self, plan: StepPlan) -> None:
        """Read the prompt chunks the target computes this step (and a prefix it had cached)."""
        reads = []
        for span in plan.spans[plan.num_decodes:]:
            seq = span.seq
            ds = self._track(seq)
            if ds is None:
                continue
            end = min(seq.num_computed + span.num_tokens, ds.computed + CATCH_UP * span.num_tokens)
            if end > ds.computed:
                reads.append((seq, ds, end))
        if reads:
            self._run([(seq, ds, seq.tokens(ds.computed, end)) for seq, ds, end in reads], need=False)

    # ---- drafting (speculative.Drafter) ----
    def offer(self, seq: Sequence, cap: int) -> tuple[int, int]:
        ds = self._track(seq)
        if ds is None or seq.num_tokens - ds.computed > LAG_MAX:
            return 0, 0
        return cap, 0

    def draft(self, wants: list[tuple[Sequence, int]]) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in wants]
        live = [(i, seq, ds, k) for i, (seq, k) in enumerate(wants) if (ds := self._track(seq)) is not None]
        # pass 1 reads what each sequence's draft KV lacks, up to its pending token; pass j feeds draft j - 1
        feed = {i: seq.tokens(ds.computed, seq.num_tokens) for i, seq, ds, _ in live}
        for j in range(max((k for *_, k in live), default=0)):
            step = [(i, seq, ds) for i, seq, ds, k in live if k > j and feed[i]]
            if not step:
                break
            rows = self._run([(seq, ds, feed[i]) for i, seq, ds in step], need=True)
            for (i, _, _), row in zip(step, rows):
                if row is None:
                    feed[i] = []
                    continue
                tok = int(np.argmax(row))
                out[i].append(tok)
                feed[i] = [tok]
        return out

    def rejected(self, seq: Sequence, num_computed: int) -> None:
        """Drafts past the accepted ones were other tokens than the sequence's: the draft KV keeps the common part."""
        ds = self._seqs.get(seq.seq_id)
        if ds is None or ds.computed <= num_computed:
            return
        ds.computed = num_computed
        self.runner.rollback(ds.slot, num_computed)
        self.blocks.trim(_Holder(ds))  # type: ignore[arg-type]
        self.runner.drop_blocks(self.blocks.take_forgotten())

    def forget(self, seq_id: int) -> None:
        ds = self._seqs.pop(seq_id, None)
        if ds is None:
            return
        self.blocks.free(_Holder(ds))  # type: ignore[arg-type]
        self.runner.free(ds.slot)
        self.slots.release(ds.slot)
        self.runner.drop_blocks(self.blocks.take_forgotten())

    # ---- internals ----
    def _track(self, seq: Sequence) -> _DraftSeq | None:
        ds = self._seqs.get(seq.seq_id)
        if ds is not None and ds.shifts != seq.metrics.shifts:  # a context shift rewrote the sequence: read it anew
            self.forget(seq.seq_id)
            ds = None
        if ds is None and self.slots.num_free:
            ds = self._seqs[seq.seq_id] = _DraftSeq(self.slots.acquire(), seq.metrics.shifts)
        return ds

    def _run(self, spans: list[tuple[Sequence, _DraftSeq, list[int]]], need: bool) -> list[np.ndarray | None]:
        """One draft-model pass: each sequence's tokens after what its draft KV holds; with `need`, the logits of
        each one's last token (None for a sequence the draft model has no room for: it drafts nothing)."""
        todo = []
        for i, (seq, ds, toks) in enumerate(spans):
            holder = _Holder(ds)
            if self.blocks.can_allocate(holder, len(toks)):  # type: ignore[arg-type]
                self.blocks.allocate(holder, len(toks))  # type: ignore[arg-type]
                todo.append((i, ds, toks))
        rows: list[np.ndarray | None] = [None] * len(spans)
        if not todo:
            return rows
        self.runner.drop_blocks(self.blocks.take_forgotten())
        batch = Batch.from_spans([(ds.slot, toks, ds.computed, ds.block_table, need) for _, ds, toks in todo],
                                 self.runner.block_size)
        logits = self.runner.step(batch)
        for j, (i, ds, toks) in enumerate(todo):
            ds.computed += len(toks)
            if need:
                rows[i] = logits[j]
        return rows
