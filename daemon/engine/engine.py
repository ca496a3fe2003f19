"""The engine loop: schedule -> one forward pass -> sample -> commit, in its own thread.

Callers (asyncio or plain threads) talk to it through a locked inbox; results flow back through each
request's `RequestStream`. An exception inside a step fails only the sequences in that step.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import threading
import time
from typing import Any, Callable

import numpy as np

from ...backends.base import EmbedSpan, Runner
from .budget import AdaptiveBudget, StepCost
# the config, stats and errors live in config.py; imported from here too (daemon/api, daemon/models.py, tests)
from .engine_config import EngineConfig, EngineError, EngineStats, EngineStopped, PromptTooLong, QueueFull  # noqa: F401
from .engine_config import make_budget_policy
from .detokenizer import IncrementalDetokenizer
from .disk_prefixes import DiskPrefixes, prompt_keys
from .draft_model import DraftModel
from .grammar import Constraint, GrammarCompiler, mask_rows
from .blocks import BlockManager, blocks_for
from .kv_disk import DiskKVCache
from .logprobs import MAX_TOP_LOGPROBS, TokenLogprob, log_softmax, token_logprob
from .params import SamplingParams
from .progress import PromptProgress
from .publish import Publisher
from .sampling import RequestRng, penalty_window, sample_batch
from .scheduler import Scheduler, SchedulerConfig
from .sequence import Delta, RequestStream, Sequence, Status
from .speculative import make_speculator

log = logging.getLogger(__name__)


class _SeqState:
    """Per-sequence engine-side state that the scheduler does not need."""

    __slots__ = ("detok", "rng", "constraint", "logprobs")

    def __init__(self, seq: Sequence, constraint: Constraint | None, logprobs: int | None = None) -> None:
        self.detok = IncrementalDetokenizer(seq.params.stop)
        self.rng = RequestRng(seq.params.seed)
        self.constraint = constraint  # format / response_format: a grammar over the output
        self.logprobs = logprobs  # None: not asked; k >= 0: each token's logprob and its top k alternatives


def penalty_history(seq: Sequence, draft: list[int] | None = None) -> list[int]:
    """The tokens the penalties look at, with a speculative row's draft tokens before it appended."""
    tail = draft or []
    n = penalty_window(seq.params, seq.num_tokens + len(tail))
    if not n:
        return []
    k = max(n - len(tail), 0)
    return (seq.tokens(seq.num_tokens - k, seq.num_tokens) if k else []) + tail[len(tail) - (n - k):]


class Engine:
    def __init__(self, runner: Runner, config: EngineConfig | None = None, name: str = "", *,
                 kv_disk: DiskKVCache | None = None, model_id: str = "", draft: Runner | None = None) -> None:
        """`kv_disk`: save cached prefixes there when stopping and read them back for new prompts; `model_id` names
        the weights (their digest) in the disk cache's key; `draft`: a draft model's runner (same vocabulary,
        draft_model.check_vocab) that proposes the draft tokens instead of prompt lookup (the caller closes it)."""
        self.runner = runner
        self.config = config or EngineConfig()
        self.name = name
        max_seqs = min(self.config.max_num_seqs or runner.max_num_seqs, runner.max_num_seqs)
        self.block_size = runner.block_size
        # A runner declares it reads shared blocks correctly (`prefix_caching`); one that keeps KV outside the
        # block pool mirrors the cache through the hooks of backends/base.Runner (drop_blocks, take_uncached, ...).
        caching = self.config.prefix_caching and runner.prefix_caching
        self.blocks = BlockManager(runner.num_kv_blocks, runner.block_size, prefix_caching=caching,
                                   servable=runner.servable_prefix, resumable=runner.resumable_prefix,
                                   rewind_in_place=not runner.shared_kv, whole_chains=not runner.shared_kv)
        runner.reset_prefix_cache()  # a new engine knows nothing the runner may still hold
        self.cache_hit_tokens = 0
        self.cache_query_tokens = 0
        if kv_disk is not None and not model_id:
            raise ValueError("a disk KV cache needs the model's identity (model_id) to key its files")
        sig = runner.kv_signature() if kv_disk is not None and caching and kv_disk.budget > 0 else None
        self.disk = DiskPrefixes(kv_disk, {**sig, "model": model_id}, self.block_size, name) \
            if kv_disk is not None and sig is not None else None
        self._deferred: set[int] = set()  # seq ids whose "add" waits for a disk read
        self._deferred_aborts: set[int] = set()
        self.policy = make_budget_policy(self.config, runner)
        self.spec = make_speculator(self.config.speculative, runner, self.policy, draft)  # None: off
        self._accepted = 0  # draft tokens kept this step
        self.scheduler = Scheduler(
            SchedulerConfig(self.config.prefill_mode, max_seqs, self.config.max_prefill_chunk,
                            runner.max_batch_tokens, runner.shared_kv,
                            runner.checkpoint_every if caching else None),
            self.blocks, self.policy,
            on_release=self._release_slot)
        # One sequence's limit: what the runner's KV can give it (a llama.cpp stream, a paged pool) and the trained
        # window; a request names its own below that (its num_ctx), else it gets `context_length`.
        self.max_context = min(runner.max_seq_tokens, runner.info.context_length)
        self.context_length = min(self.config.context_length or runner.info.context_length, self.max_context)
        self.eos_ids = set(runner.tokenizer.eos_ids)
        self._eos_index = np.array(sorted(e for e in self.eos_ids if 0 <= e < runner.info.vocab_size), dtype=np.int64)
        self.grammars = GrammarCompiler(runner.tokenizer, runner.info.vocab_size)
        self._states: dict[int, _SeqState] = {}
        self._held: dict[int, list[Sequence]] = {}  # n > 1: first sequence's id -> the others, not yet queued
        self._seqs: dict[int, Sequence] = {}
        self._inbox: collections.deque[tuple[str, Any]] = collections.deque()
        self._cv = threading.Condition()
        self.events = Publisher(name)
        self.progress = PromptProgress()  # prompt progress for the requests that asked for it
        self._thread: threading.Thread | None = None
        self._shutdown_lock = threading.Lock()
        self._down = False  # shut down: a later shutdown() has nothing left to do
        self._stopping = False
        self.steps = 0
        self.decode_passes = 0
        self._stats = self._snapshot()

    # ---- public API (any thread) ----
    def cannot_draft(self) -> str | None:
        """Why no request of this model can draft (None: it can)."""
        if self.spec is not None:
            return None
        if self.config.speculative == "off":
            return "speculative decoding is off (EVENFLOW_SPECULATIVE=off)"
        return "its cache cannot take rejected tokens back (a recurrent state or a sliding-window cache)"

    def add_draft(self, names: list[str], runner: Runner) -> None:
        """Requests whose `draft_model` is one of `names` draft with `runner` from now on (a model of the same
        vocabulary, draft_model.check_vocab; the caller closes it after the engine stops)."""
        if self.spec is None or not runner.can_rollback:
            raise ValueError(self.cannot_draft() or "the draft model cannot take rejected tokens back")
        self.spec.add_drafter(names, DraftModel(runner))

    def start(self) -> None:
        self._down = False
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=f"engine-{self.name}", daemon=True)
            self._thread.start()

    def submit(self, prompt_ids: list[int], params: SamplingParams, *, user: dict | None = None,
               loop: asyncio.AbstractEventLoop | None | str = "auto",
               constraint: Constraint | None = None, logprobs: int | None = None, priority: int = 0,
               embeds: list[EmbedSpan] | None = None, context_length: int | None = None,
               progress: bool = False) -> RequestStream:
        """`constraint`: from `self.grammars.compile(...)`, owned by this sequence from now on. `logprobs`:
        None, or report each token's log-probability with that many top alternatives (0..20). `priority`: lower
        is scheduled sooner (0 normal; see scheduler.py for how it orders prompts). `context_length`: this
        sequence's limit (prompt + output; a request's num_ctx), at most `max_context`; None: `context_length`.
        `progress`: the stream also gets prompt progress reports (Delta.progress) until the prompt is computed
        (engine/progress.py)."""
        return self.submit_group(prompt_ids, [params], user=user, loop=loop, constraint=constraint,
                                 logprobs=logprobs, priority=priority, embeds=embeds,
                                 context_length=context_length, progress=progress)[0]

    def submit_group(self, prompt_ids: list[int], params: list[SamplingParams], *, user: dict | None = None,
                     loop: asyncio.AbstractEventLoop | None | str = "auto", constraint: Constraint | None = None,
                     logprobs: int | None = None, priority: int = 0,
                     embeds: list[EmbedSpan] | None = None, context_length: int | None = None,
                     progress: bool = False) -> list[RequestStream]:
        """One sequence per `params` over the same prompt (n > 1). With prefix caching the first computes the
        prompt and the others are admitted once it has, sharing its KV blocks; each gets its own fork of
        `constraint`."""
        if self._stopping:
            raise EngineStopped("the engine is shutting down")
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        if not params:
            raise ValueError("a group needs at least one sequence")
        if logprobs is not None and not 0 <= logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {logprobs}")
        window = self.context_length if context_length is None else context_length
        if not 0 < window <= self.max_context:
            raise ValueError(f"context length {window} is outside what one sequence can hold here "
                             f"(1 to {self.max_context} tokens)")
        n = len(prompt_ids)
        if n >= window:
            raise PromptTooLong(f"the prompt is {n} tokens but the context window is {window} "
                                f"(it must leave room for at least one generated token)")
        if blocks_for(n + 1, self.block_size) > self.blocks.num_blocks:
            raise PromptTooLong(f"the prompt is {n} tokens but the KV cache holds only "
                                f"{self.blocks.num_blocks * self.block_size} tokens")
        # `embeds` (images): those positions hold placeholder ids that only the prefix cache reads
        in_embeds = {p for e in embeds or () for p in range(e.start, e.end)}
        bad = [t for i, t in enumerate(prompt_ids) if not 0 <= t < self.runner.info.vocab_size and i not in in_embeds]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary (size {self.runner.info.vocab_size})")
        if len(self._seqs) + len(params) > self.config.max_queue + self.scheduler.config.max_num_seqs:
            raise QueueFull("server busy, please try again.  maximum pending requests exceeded")
        if loop == "auto":
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
        group = []
        for i, p in enumerate(params):
            seq = Sequence(prompt_ids, p, window, user=user, priority=priority, embeds=embeds)
            seq.stream = RequestStream(seq.seq_id, loop)  # type: ignore[arg-type]
            c = constraint if i == 0 or constraint is None else constraint.fork()
            seq.report_progress = progress and i == 0  # the others share the first one's prompt
            group.append((seq, c))
        hit = None
        if self.disk is not None:
            keys = prompt_keys(prompt_ids, self.block_size)
            for seq, _ in group:
                seq.block_keys = list(keys)  # the memo BlockManager would compute
            hit = self.disk.candidate(keys, self.blocks)
        if hit is None:
            self._post("add", (group, logprobs))
        else:  # read the saved prefix off this thread and the engine's, then queue the request behind it
            with self._cv:
                self._deferred.update(seq.seq_id for seq, _ in group)
            self.disk.read_later(hit, lambda restore: self._restore_then_add(restore, group, logprobs))
        return [seq.stream for seq, _ in group]  # type: ignore[misc]

    def _restore_then_add(self, restore: Any, group: list, logprobs: int | None) -> None:
        if restore is not None:
            self._post("restore", restore)
        self._post("add", (group, logprobs))

    def abort(self, seq_id: int) -> None:
        self._post("abort", seq_id)

    def embed(self, token_ids: list[int]) -> "concurrent.futures.Future[np.ndarray]":
        """Hidden states for `token_ids`, computed on the engine thread between steps."""
        fut: concurrent.futures.Future[np.ndarray] = concurrent.futures.Future()
        self._post("embed", (list(token_ids), fut))
        return fut

    def subscribe(self, fn: Callable[[dict], None]) -> Callable[[], None]:
        """Call `fn(event)` on the engine thread for every step, request and disk event (publish.py)."""
        return self.events.subscribe(fn)

    def stats(self) -> EngineStats:
        """A consistent picture: with the loop thread running, the one it published after its last step or
        queue handling (reading the scheduler live from another thread could catch a sequence half released,
        its KV freed but still counted as running)."""
        if self._thread is None:
            return self._snapshot()
        return self._stats

    def _snapshot(self) -> EngineStats:
        spec = self.spec.counters if self.spec is not None else None
        return EngineStats(len(self.scheduler.running), len(self.scheduler.waiting), self.blocks.num_used,
                           self.blocks.num_blocks, self.steps, self.block_size, self.blocks.num_cached,
                           self.cache_hit_tokens, self.cache_query_tokens, self.blocks.fallback_tokens,
                           self.decode_passes, spec.drafted if spec else 0, spec.accepted if spec else 0,
                           self.blocks.num_cached_free, self.blocks.rewind_tokens)

    def run_once(self) -> bool:
        """Handle queued calls and run one step in the caller's thread (tests, benchmarks; no loop thread).
        Returns whether work remains."""
        if self._thread is not None:
            raise RuntimeError("run_once() drives an engine whose loop thread is not started")
        with self._cv:
            while self._deferred and not self._inbox and not self.scheduler.has_work:
                self._cv.wait()  # a request's saved prefix is being read from disk
            items = list(self._inbox)
            self._inbox.clear()
        for kind, payload in items:
            self._handle(kind, payload)
        if self.scheduler.has_work:
            self._step()
        return self.scheduler.has_work or bool(self._inbox) or bool(self._deferred)

    @property
    def idle(self) -> bool:
        return not self._seqs and not self._inbox

    def shutdown(self, timeout: float = 10.0) -> None:
        """Abort what runs, stop the loop thread, hand the cache to disk. Safe to call from several threads at once
        (the daemon's drain aborts every engine while its shutdown frees them): each returns once the engine is down."""
        self._stopping = True
        with self._shutdown_lock:
            if self._down:
                return
            self._shutdown(timeout)
            self._down = True

    def _shutdown(self, timeout: float) -> None:
        if self.disk is not None:
            self.disk.stop_reading()  # the reads' "add"s land in the inbox, aborted below
        if self._thread is None:
            with self._cv:
                items = [(k, p) for k, p in self._inbox if k == "add"]
                self._inbox.clear()
            for kind, payload in items:
                self._handle(kind, payload)
            self._abort_all("abort", None)
            self._persist()
            return
        self._post("stop", None)
        self._thread.join(timeout)
        if self._thread.is_alive():  # a long step or a large export: the runner must not be freed under it
            log.warning("engine %s still busy after %.0f s of shutdown; waiting for it", self.name, timeout)
            self._thread.join()
        self._thread = None

    # ---- engine thread ----
    def _release_slot(self, slot: int) -> None:
        self.runner.free(slot)
        self.blocks.uncache(self.runner.take_uncached())  # cached KV the runner had to drop of its own accord

    def _post(self, kind: str, payload: Any) -> None:
        with self._cv:
            self._inbox.append((kind, payload))
            self._cv.notify()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._inbox and not self.scheduler.has_work:
                    self._cv.wait()
                items = list(self._inbox)
                self._inbox.clear()
            for kind, payload in items:
                if kind == "stop":
                    self._abort_all("abort", None)
                    self._persist()
                    self._stats = self._snapshot()
                    return
                self._handle(kind, payload)
            self._stats = self._snapshot()
            if self.scheduler.has_work:
                try:
                    self._step()
                except Exception:  # a bug outside the forward pass: fail everything, keep the thread alive
                    log.exception("engine step failed")
                    self._abort_all("error", "internal engine error (see the daemon log)")
                self._stats = self._snapshot()

    def _handle(self, kind: str, payload: Any) -> None:
        if kind == "add":
            group, logprobs = payload
            with self._cv:
                aborted = {seq.seq_id for seq, _ in group} & self._deferred_aborts
                self._deferred.difference_update(seq.seq_id for seq, _ in group)
                self._deferred_aborts -= aborted
            for i, (seq, constraint) in enumerate(group):
                self._seqs[seq.seq_id] = seq
                self._states[seq.seq_id] = _SeqState(seq, constraint, logprobs)
                if i == 0 or not self.blocks.prefix_caching:
                    self.scheduler.add(seq)
                self.events.request(seq, "queued", priority=seq.priority)
                self.progress.add(seq)
            if len(group) > 1 and self.blocks.prefix_caching:
                # the rest wait until the first has computed the prompt, then reuse its cached blocks
                self._held[group[0][0].seq_id] = [seq for seq, _ in group[1:]]
            for seq, _ in group:
                if seq.seq_id in aborted:  # the client left while its prefix was being read
                    self._finish(seq, "abort")
        elif kind == "abort":
            seq = self._seqs.get(payload)
            if seq is not None:
                self._finish(seq, "abort")
            else:
                with self._cv:
                    if payload in self._deferred:
                        self._deferred_aborts.add(payload)
        elif kind == "restore":
            event = self.disk.restore(payload, self.blocks, self.runner)  # type: ignore[union-attr]
            if event is not None:
                self.events.disk(event)
        elif kind == "embed":
            ids, fut = payload
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(self.runner.embed(ids))
                except Exception as e:  # noqa: BLE001 - handed to the caller
                    fut.set_exception(e)

    def _step(self) -> None:
        t_start = time.perf_counter()
        plan = self.scheduler.schedule()
        if self.spec is not None:
            self.spec.extend(plan, self.blocks, self._may_draft)
        if not plan.spans:
            # Blocked (e.g. waiting on KV with nothing running cannot happen, but be safe): let time pass.
            time.sleep(0.001)
            return
        now = time.perf_counter_ns()
        for span in plan.spans:
            if span.seq.t_first_scheduled is None:
                span.seq.t_first_scheduled = now
                span.seq.metrics.queue_ns = now - span.seq.t_arrival
                self.events.request(span.seq, "scheduled", queue_ms=span.seq.metrics.queue_ns / 1e6)
        self.events.waits(plan)
        batch = plan.to_batch(self.block_size)
        self.cache_hit_tokens += plan.cache_hit_tokens
        self.cache_query_tokens += plan.cache_query_tokens
        forgotten = self.blocks.take_forgotten()
        t0 = time.perf_counter()
        try:
            if forgotten:
                self.runner.drop_blocks(forgotten)
            logits = self.runner.step(batch)
        except Exception as e:  # noqa: BLE001 - only this step's sequences fail
            log.exception("forward pass failed; failing the %d sequences of this step", len(plan.spans))
            for span in plan.spans:
                self._finish(span.seq, "error", f"forward pass failed: {e}")
            return
        dt = time.perf_counter() - t0
        self.steps += 1
        self.decode_passes += plan.num_decodes
        self.blocks.uncache(self.runner.take_uncached())  # cells the runner reused (a parked stream taken over)
        self._accepted = 0
        for span in plan.spans:
            span.seq.num_computed += span.num_tokens - len(span.draft)  # a draft token counts once verified
            self.blocks.commit(span.seq)
            if self._held and span.seq.num_computed >= len(span.seq.prompt_ids):
                self._release_held(span.seq)
        if self.progress:
            self.progress.after_step(plan)  # before the first token a prompt's last chunk samples
        sampled = [s for s in plan.spans if s.need_logits]
        if sampled:
            # a row per token to sample: a decode carrying k draft tokens gives k + 1 (speculative.py)
            rows = [(s, j) for s in sampled for j in range(len(s.draft) + 1)]
            seqs = [s.seq for s, _ in rows]
            logits = np.asarray(logits, dtype=np.float32)
            if not (logits.flags.owndata and logits.flags.writeable):  # sampling writes into it
                logits = logits.copy()  # (a runner's fresh array is not copied: 1 MB a row for a 256k vocabulary)
            # the model's own distribution, before penalties, masks and temperature change the logits
            want = [i for i, q in enumerate(seqs) if self._states[q.seq_id].logprobs is not None]
            logp = log_softmax(logits[want]) if want else None
            constrained = [(i, c) for i, q in enumerate(seqs)
                           if (c := self._states[q.seq_id].constraint) is not None and c.active]
            mask_rows(self.grammars.executor if constrained else None, logits, constrained)
            ruled = {i for i, _ in constrained}
            no_eos = [i for i, q in enumerate(seqs) if q.params.ignore_eos and i not in ruled]
            if no_eos and self._eos_index.size:  # a grammar, when active, decides where the end may come
                logits[np.ix_(no_eos, self._eos_index)] = -np.inf
            rngs = self._states
            toks = sample_batch(
                logits, [q.params for q in seqs],
                [rngs[s.seq.seq_id].rng.at(j) if s.draft else rngs[s.seq.seq_id].rng for s, j in rows],
                [penalty_history(s.seq, s.draft[:j]) for s, j in rows]).tolist()
            lps: list[TokenLogprob | None] = [None] * len(seqs)
            for j, i in enumerate(want):
                lps[i] = token_logprob(logp[j], int(toks[i]), self._states[seqs[i].seq_id].logprobs)  # type: ignore
            i = 0
            for s in sampled:
                n = len(s.draft) + 1
                if s.draft:
                    self._verify(s, toks[i:i + n], lps[i:i + n])
                else:
                    self._commit(s.seq, int(toks[i]), lps[i])
                i += n
        # The policy sees the whole iteration (scheduling, forward, sampling, streaming out): that is the gap a
        # decoding stream observes between its tokens.
        total = time.perf_counter() - t_start
        if self.spec is not None:
            self.spec.observe(plan, total)
        if not plan.draft_tokens:  # a step with drafts carries no prompt chunk: it has nothing to teach the budget
            self.policy.observe(StepCost(plan.num_decodes, plan.prefill_tokens, plan.attention_work, total,
                                         len(plan.spans) - plan.num_decodes))
        target = self.policy.target * 1e3 if isinstance(self.policy, AdaptiveBudget) else None
        self.events.step(plan, total, dt, self.scheduler, self.blocks, target, self._accepted)

    def _may_draft(self, seq: Sequence) -> bool:
        """Speculation is off for grammar-constrained requests (a draft would have to pass the grammar first)."""
        st = self._states.get(seq.seq_id)
        return st is not None and st.constraint is None

    def _verify(self, span: Any, toks: list[int], lps: list[TokenLogprob | None]) -> None:
        """A decode that carried draft tokens: keep them while the sampled tokens agree; then the first token that
        differs (or the one after the last draft) ends the step. The rejected tokens' KV goes."""
        seq, draft = span.seq, span.draft
        kept = next((j for j, (t, d) in enumerate(zip(toks, draft)) if t != d), len(draft))
        rng = self._states[seq.seq_id].rng
        if not seq.params.greedy:
            rng.skip(kept + 1)  # the uniforms of the rows used, as decoding token by token would have drawn
        seq.metrics.draft_tokens += len(draft)
        seq.metrics.accepted_tokens += kept
        self._accepted += kept
        self.spec.verified(seq, span.draft_bucket, len(draft), kept)  # type: ignore[union-attr]
        for j in range(kept + 1):
            self._commit(seq, int(toks[j]), lps[j])
            if seq.status is not Status.RUNNING:  # finished, or its window filled and it shifted (recomputed)
                return
            if j < kept:
                seq.num_computed += 1  # this draft token was the one sampled: its KV, computed this step, stands
        self.blocks.commit(seq)
        self.runner.rollback(seq.slot, seq.num_computed)  # type: ignore[arg-type]
        self.blocks.trim(seq)
        self.spec.rejected(seq, seq.num_computed)  # type: ignore[union-attr]

    def _release_held(self, seq: Sequence) -> None:
        """n > 1: the first sequence's prompt is computed (or it ended): queue the others of its group."""
        for other in self._held.pop(seq.seq_id, []):
            if not other.is_finished:
                self.scheduler.add(other)

    def _commit(self, seq: Sequence, tok: int, lp: TokenLogprob | None = None) -> None:
        now = time.perf_counter_ns()
        m = seq.metrics
        if seq.t_first_token is None:
            seq.t_first_token = now
            m.ttft_ns = now - seq.t_arrival
            m.prompt_eval_duration = now - (seq.t_first_scheduled or now)
            self.events.request(seq, "first_token")
        elif seq.t_last_token is not None:
            m.itl_ns.append(now - seq.t_last_token)
        seq.t_last_token = now
        m.eval_count += 1
        st = self._states[seq.seq_id]
        c = st.constraint
        was_active = c is not None and c.active
        if was_active and not c.consume(tok):  # type: ignore[union-attr]
            self._finish(seq, "error", f"grammar rejected a sampled token: {c.error}")  # type: ignore[union-attr]
            return
        if tok in self.eos_ids:
            self._finish(seq, "stop")
            return
        seq.output_ids.append(tok)
        text = st.detok.add(seq.params.preserved_tokens.get(tok) or self.runner.tokenizer.token_bytes(tok))
        if c is not None and not was_active:
            c.observe_text(text)
        lps = None if lp is None else [lp]
        if st.detok.stopped or (was_active and c.finished):  # type: ignore[union-attr]
            if text or lps:
                self._send(seq, Delta(text, [tok], logprobs=lps))
            self._finish(seq, "stop")
            return
        self._send(seq, Delta(text, [tok], logprobs=lps))
        if self.events:
            self.events.request(seq, "token", text=text)
        p = seq.params
        if p.num_predict >= 0 and seq.num_generated >= p.num_predict:
            self._finish(seq, "length")
        elif seq.num_tokens >= seq.max_tokens:
            if p.shift and p.num_predict != -2 and not seq.embeds:  # -2: "until the context is full"
                self._shift(seq)
            else:
                self._finish(seq, "length")

    def _shift(self, seq: Sequence) -> None:
        """Ollama's context shift (`shift`, on by default on its API): the window is full, so the tokens after the
        first num_keep (and BOS) lose half the window and generation goes on. llama.cpp moves the cached K in place;
        here the kept tokens are recomputed, as after a preemption (torch and MLX cache K with its position applied),
        so this stream pauses for one prefill of about half the window while the others go on."""
        p = seq.params
        keep = seq.metrics.prompt_eval_count if p.num_keep < 0 else p.num_keep
        if seq.prompt_ids[:1] == [self.runner.tokenizer.bos_id]:
            keep += 1  # as Ollama and llama-server count num_keep: after BOS
        dropped = seq.shift(keep)
        del seq.block_keys[keep // self.block_size:]  # the memo of keys past the kept start no longer holds
        seq.metrics.shifts += 1
        seq.metrics.shifted_tokens += dropped
        self.scheduler.preempt(seq)  # its KV is freed; it is readmitted and recomputes the kept tokens
        log.warning("request %d (%s %s): its context of %d tokens is full; dropped %d tokens after the first %d "
                    "and recomputing the rest (a context shift; `shift: false` stops with done_reason length)",
                    seq.seq_id, seq.user.get("endpoint", ""), seq.user.get("model", self.name), seq.max_tokens,
                    dropped, min(keep, seq.max_tokens - 1))
        self.events.request(seq, "shifted", tokens=dropped, keep=min(keep, seq.max_tokens - 1))

    def _send(self, seq: Sequence, delta: Delta) -> None:
        if seq.stream is not None:
            seq.stream.push(delta)

    def _finish(self, seq: Sequence, reason: str, error: str | None = None) -> None:
        if seq.is_finished:
            return
        if self.disk is not None and seq.num_registered:
            self.disk.record(seq.block_keys[: seq.num_registered])
        self.scheduler.finish(seq)
        if self._held:
            self._release_held(seq)
        st = self._states.pop(seq.seq_id, None)
        self._seqs.pop(seq.seq_id, None)
        if self.spec is not None:
            self.spec.forget(seq.seq_id)
        tail = st.detok.flush() if st is not None and reason in ("length", "stop") else ""
        now = time.perf_counter_ns()
        m = seq.metrics
        m.total_duration = now - seq.t_arrival
        if seq.t_first_token is not None and seq.t_last_token is not None:
            m.eval_duration = max(seq.t_last_token - seq.t_first_token, 0) or 1
        seq.finish_reason = reason
        if reason == "error":
            log.warning("request %d (%s %s) failed: %s", seq.seq_id, seq.user.get("endpoint", ""),
                        seq.user.get("model", self.name), error)
        self.events.forget(seq.seq_id)
        self.progress.forget(seq.seq_id)
        self._send(seq, Delta(tail, [], done=True, done_reason=reason, error=error, metrics=m))
        self.events.request(seq, "finished", done_reason=reason, text=tail, draft_tokens=m.draft_tokens,
                              accepted_tokens=m.accepted_tokens)

    def _abort_all(self, reason: str, error: str | None) -> None:
        for seq in list(self._seqs.values()):
            self._finish(seq, reason, error)

    def _persist(self) -> None:
        """Stopping: hand the disk cache the prefixes worth keeping (it writes them in the background)."""
        if self.disk is None:
            return
        try:
            event = self.disk.persist(self.blocks, self.runner)
        except Exception:  # noqa: BLE001 - stopping must not fail
            log.exception("saving cached prefixes failed")
            return
        if event["entries"]:
            log.info("%s: saving %d cached prefixes (%.1f MiB) to the disk KV cache", self.name, event["entries"],
                     event["bytes"] / 2**20)
            self.events.disk(event)

    def warm_disk_cache(self) -> None:
        """Before serving (off the event loop): wait for writes still queued and index this model's saved prefixes."""
        if self.disk is not None:
            self.disk.disk.flush(60)
            self.disk.disk.index(self.disk.ns)
