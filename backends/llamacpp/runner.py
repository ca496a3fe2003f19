"""llama.cpp runner: each engine step is ONE `llama_decode` over the flattened mixed batch.

KV layouts (EVENFLOW_LLAMACPP_KV = auto | streams | unified):
- streams (auto when the pool gives every slot a full window): each sequence has a KV stream of its own
  (`kv_unified=false`), so a query attends only its own sequence's cells: a decode no longer pays for a document
  another sequence is ingesting. llama.cpp runs such a batch as micro-batches (runs of consecutive streams with
  equal token counts); the order of the spans decides which (`micro_batch_order`): the decodes together, each
  prompt chunk alone. Two weight passes instead of one when a chunk rides along.
- unified: one cache shared by every sequence, one pass; every query attends every occupied cell (other
  sequences' cells are masked, not skipped), so a step costs (its tokens) x (tokens all sequences hold).
The batch arrays are numpy buffers we own, and `llama_batch` is a struct pointing into them, so a step costs a
handful of ctypes calls however many tokens it carries.
"""
from __future__ import annotations

import ctypes
import logging
import os
import time

import numpy as np

from ..base import KV_CACHE_TYPES, Batch, ModelInfo, ModelLoadError, Runner, RunnerSettings
from ..common.kv_plan import host_kv_budget, plan_kv
from . import amx, load_probe, offload
from .checkpoints import State, kept, state_pointer
from .embedder import Embedder
from .lib import L, llama_cpp
from .gguf_info import GGUFHeader, is_mla, key_head_dim, kv_bytes_per_token, model_info, read_header
from .native import ensure_backend, physical_cores, take_recent_errors
from .prefix import PrefixCells
from .recurrent import RecurrentStates, pack_prefix, unpack_prefix
from .streams import StreamCells
from .tokenizer import LlamaCppTokenizer
from .window import SlidingWindow

log = logging.getLogger(__name__)

# settings.dtype picks the KV-cache element type here (weights keep the GGUF's own types)
_FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}  # llama_flash_attn_type
# KV element types: name -> (GGML_TYPE_*, bytes per value; q8_0 and q4_0 blocks hold 32 values)
_GGML_TYPES = {"f32": (0, 4), "f16": (1, 2), "bf16": (30, 2), "q8_0": (8, 34 / 32), "q4_0": (2, 18 / 32)}
_KV_TYPES = {"auto": "f16", "float16": "f16", "float32": "f32", "bfloat16": "bf16"}  # settings.dtype -> KV type
MIN_KV_TOKENS = 4096  # ... but never less than this (or one window, if smaller)
DRAFT_ROWS = 32  # logits rows a step may ask for beyond one per sequence: draft tokens verified (speculative.py)
PREFIX_HOLDERS = 24  # unified layout: finished sequences whose cells the prefix cache can keep at once
# ... with a recurrent model, fewer: llama.cpp gives every sequence id a recurrent state's memory, holders included
RECURRENT_HOLDERS = 8
# a recurrent model's prompt chunks end on block boundaries at most this many tokens apart (its checkpoints: a prefix
# hit resumes from the last one before it; llama.cpp runs a step in micro-batches of 512 tokens anyway)
CHECKPOINT_EVERY = 512
KV_ENV = "EVENFLOW_LLAMACPP_KV"
KV_LAYOUTS = ("auto", "streams", "unified")


# our own binding returning a plain int address (llama_cpp's returns a POINTER object, slow to view)
_get_logits_addr = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(("llama_get_logits", L._lib))


def load(model_path: str, settings: RunnerSettings) -> "LlamaCppRunner":
    """Load a GGUF file with llama.cpp; raises ModelLoadError naming the file and the reason."""
    runner = LlamaCppRunner(str(model_path), settings)
    if settings.projector_path:  # images in (vision.py); a projector that cannot load leaves the text model
        from .vision import attach_vision

        attach_vision(runner, settings.projector_path)
    return runner


def plan_kv_tokens(settings: RunnerSettings, ctx_len: int, bytes_per_token: int, budget_bytes: int | None = None,
                   dedicated: bool = False) -> tuple[int, int]:
    """(n_ctx of the unified cache, sequences): the engine's block budget, else the slots' full windows capped by
    `budget_bytes` (None: RAM; host memory is never a dedicated pool: auto slots are 8 there unless num_kv_blocks
    holds more; a fully offloaded model's GPU memory is, offload.place)."""
    bs = settings.block_size
    blocks, seqs = plan_kv(requested_blocks=settings.num_kv_blocks, max_num_seqs=settings.max_num_seqs,
                           context_length=ctx_len, block_size=bs, block_bytes=max(bytes_per_token, 1) * bs,
                           budget_bytes=host_kv_budget() if budget_bytes is None else budget_bytes,
                           dedicated_pool=dedicated)
    if settings.num_kv_blocks is None:  # a long chat fits even when RAM is short
        blocks = max(blocks, -(-min(ctx_len, MIN_KV_TOKENS) // bs))
    return blocks * bs, min(seqs, int(L.llama_max_parallel_sequences()))


MERGE_WASTE = 2048  # (query, masked cell) pairs worth less than a micro-batch of its own (~10 ms on 2 CPU cores)


def micro_batch_order(spans: list, streams: list[int]) -> list[int]:
    """The order of a step's spans (indices) that makes llama.cpp run the micro-batches we want, streams layout.

    llama.cpp puts in one micro-batch a run of consecutive stream ids, in batch order, taking the same number of
    tokens from each, and every query in it attends as many cells as the longest stream in it holds. So a prompt
    chunk runs alone (with decodes it would be cut to one token per pass), and a run of one-token spans is cut
    where a stream holding far more than its neighbours would make them attend its cells (a document's answer
    decoding beside short chats). Runs go in descending stream order, so none can join the next."""
    runs: list[list[int]] = []
    for i in sorted(range(len(spans)), key=streams.__getitem__):
        s, run = spans[i], runs[-1] if runs else None
        if s.length == 1 and run and spans[run[-1]].length == 1 and streams[run[-1]] + 1 == streams[i]:
            ctx = [spans[j].context_len for j in run]
            top = max(ctx)
            waste = top - s.context_len if s.context_len <= top else len(run) * (s.context_len - top)
            if waste <= MERGE_WASTE:
                run.append(i)
                continue
        runs.append([i])
    runs.sort(key=lambda r: -streams[r[0]])
    return [i for r in runs for i in r]


class LlamaCppRunner(Runner):
    """A GGUF model on llama.cpp with one generation context: `max_num_seqs` sequences, KV per stream or unified.

    Its KV cells live outside the engine's block pool: finished sequences' cells stay cached (streams.py,
    prefix.py) and the prefix-cache hooks of base.Runner mirror the engine's cache. `shared_kv` (the unified
    layout), `max_batch_tokens` (n_batch), `device`, `kv_layout` and `kv_types` are set per instance at load."""

    backend = "llamacpp"
    placement: "offload.Placement | None" = None  # where the layers go; None until chosen (_kv_bytes runs before)

    def __init__(self, model_path: str, settings: RunnerSettings):
        if settings.max_num_seqs is not None and not 1 <= settings.max_num_seqs <= L.llama_max_parallel_sequences():
            raise ValueError(
                f"max_num_seqs={settings.max_num_seqs} outside [1, {L.llama_max_parallel_sequences()}] for llama.cpp"
            )
        if settings.dtype not in _KV_TYPES:
            raise ValueError(f"dtype={settings.dtype!r} not supported by llama.cpp; allowed: {', '.join(_KV_TYPES)}")
        if settings.flash_attention not in _FLASH_ATTN:
            raise ValueError(f"flash_attention={settings.flash_attention!r}; allowed: {', '.join(_FLASH_ATTN)}")
        if settings.kv_cache_type not in KV_CACHE_TYPES:
            raise ValueError(f"kv_cache_type={settings.kv_cache_type!r}; allowed: {', '.join(KV_CACHE_TYPES)}")
        self.path = model_path
        self.block_size = settings.block_size
        self.max_num_seqs = settings.max_num_seqs or 0  # resolved with the KV plan in _setup
        self._model = self._ctx = None
        self._embedder: Embedder | None = None
        header = read_header(model_path)  # ModelLoadError on a bad/truncated file, before llama.cpp sees it
        load_probe.check_loads(model_path)  # ModelLoadError where llama.cpp would abort the process instead
        ensure_backend()
        self.n_threads = settings.num_threads or physical_cores()
        self.extra_bufts = amx.extra_bufts_enabled()
        placement: offload.Placement | None = offload.place(header, settings, self._kv_bytes(header, settings),
                                                            host_kv_budget())
        while True:  # a GPU that cannot hold the plan after all: a smaller one, never an out-of-memory crash
            self.placement = placement
            try:
                self._model = self._load_model(settings)
                self._setup(header, settings)
                break
            except ModelLoadError as e:
                self.close()
                placement = offload.smaller(placement, model_path) if offload.out_of_memory(str(e)) else None
                if placement is None:
                    raise
            except BaseException:
                self.close()
                raise

    def _kv_bytes(self, header: GGUFHeader, settings: RunnerSettings) -> float:
        """KV bytes per token (all layers) at the types `_kv_types` will pick, before the model loads."""
        info = model_info(header, 0, 0)
        elem = sum(_GGML_TYPES[t][1] for t in self._kv_types(settings, key_head_dim(info, header), is_mla(header))) / 2
        return kv_bytes_per_token(info, header, elem)

    def _load_model(self, settings: RunnerSettings):
        mp = L.llama_model_default_params()
        mp.load_mode = L.LLAMA_LOAD_MODE_MMAP
        mp.use_extra_bufts = self.extra_bufts
        mp.n_gpu_layers = self.placement.gpu_layers
        devices = offload.device_array(self.placement.devices) if self.placement.devices else None
        if devices is not None:  # main_gpu picks one; an RPC server added after start-up is named here too
            mp.devices = ctypes.cast(devices, ctypes.c_void_p)
        # The engine sizes its default latency target by this.
        self.device = "gpu" if self.placement.gpu_layers else "cpu"
        model = L.llama_model_load_from_file(self.path.encode(), mp)
        if not model:
            reason = take_recent_errors() or "unsupported architecture or tensor layout"
            raise ModelLoadError(f"{self.path}: llama.cpp could not load the model: {reason}")
        return model

    def _setup(self, header: GGUFHeader, settings: RunnerSettings) -> None:
        vocab = L.llama_model_get_vocab(self._model)
        self.tokenizer = LlamaCppTokenizer(vocab)
        self.vocab_size = self.tokenizer.vocab_size
        self.info: ModelInfo = model_info(header, self.vocab_size, int(L.llama_model_n_params(self._model)))
        head_dim = key_head_dim(self.info, header)
        if settings.kv_cache_type not in ("auto", "f16") and head_dim % 32:  # q8_0/q4_0 pack 32 values a block
            raise ModelLoadError(f"{self.path}: a {settings.kv_cache_type} KV cache needs attention heads of a "
                                 f"multiple of 32 values; this model's have {head_dim} (use f16)")
        tmpl = header.metadata.get("tokenizer.chat_template")
        self.chat_template: str | None = tmpl if isinstance(tmpl, str) and tmpl else None
        # per-sequence window: num_ctx when given (even above the trained one, as Ollama allows), else trained
        self.context_length = settings.context_length or self.info.context_length
        self.kv_types = self._kv_types(settings, head_dim, is_mla(header))  # (K, V) type names
        elem = sum(_GGML_TYPES[t][1] for t in self.kv_types) / 2  # a quantized K (and V) leaves room for more
        n_ctx, self.max_num_seqs = plan_kv_tokens(settings, self.context_length,
                                                  kv_bytes_per_token(self.info, header, elem),
                                                  self.placement.budget_bytes, self.placement.dedicated_pool)
        self.kv_layout = self._choose_layout(n_ctx, settings.kv_layout)
        self.shared_kv = self.kv_layout == "unified"
        recurrent = bool(L.llama_model_is_recurrent(self._model) or L.llama_model_is_hybrid(self._model))
        # unified: spare sequence ids hold finished sequences' cells for the prefix cache (one per cached
        # conversation); an id costs no KV memory, but llama.cpp sizes its logits buffer by n_seq_max rows.
        # streams: a finished sequence's cells stay in its own stream instead.
        self._holder_ids = (min(RECURRENT_HOLDERS if recurrent else PREFIX_HOLDERS,
                                int(L.llama_max_parallel_sequences()) - self.max_num_seqs) if self.shared_kv else 0)
        # Rejected draft tokens are taken back with llama_memory_seq_rm: not possible for a recurrent state, nor for a
        # sliding-window cache that keeps only the window (it drops the cells a draft slid past; ours keeps them all,
        # swa_full, the default), so no speculative decoding there.
        self.can_rollback = not recurrent
        self._ctx = self._new_context(n_ctx, settings)
        self.can_rollback = self.can_rollback and (self._swa_full or L.llama_model_n_swa(self._model) == 0)
        self.max_logits_rows = self.max_num_seqs + self._holder_ids + (DRAFT_ROWS if self.can_rollback else 0)
        # llama.cpp may pad n_ctx; the scheduler must never count more than the cache really holds
        self.n_ctx = int(L.llama_n_ctx(self._ctx))
        self.num_kv_blocks = self.n_ctx // self.block_size
        # what one sequence can hold: its own stream (n_ctx / sequences), or the whole unified cache
        self._seq_tokens = min(int(L.llama_n_ctx_seq(self._ctx)), self.num_kv_blocks * self.block_size)
        self._mem = L.llama_get_memory(self._ctx)
        # a hybrid model's recurrent states: saved at block boundaries, a prefix hit resumes from one (recurrent.py)
        self._states = RecurrentStates(self._ctx, self.block_size, self.max_num_seqs, 0) if recurrent else None
        self.checkpoint_every = CHECKPOINT_EVERY if recurrent else None
        # a sliding-window model: where a hit can resume, and windows saved with a prefix on disk (window.py)
        n_swa = int(L.llama_model_n_swa(self._model))
        self._window = SlidingWindow(self._ctx, n_swa, self.block_size, self.shared_kv) \
            if n_swa > 0 and not recurrent else None
        remove = self._remove
        self._cells: PrefixCells | StreamCells
        if self.shared_kv:
            self._cells = PrefixCells(self.max_num_seqs, self._holder_ids, self.block_size, remove, self._copy)
        else:  # llama.cpp copies across streams whole; the stream's cells beyond the prefix are removed after
            self._cells = StreamCells(self.max_num_seqs, self.block_size, remove, self._copy)
        if self._window is not None:
            self._window.attach(self._cells)
        # llama.cpp clamps n_batch to n_ctx: a step can never carry more tokens than that
        self._alloc_batch(int(L.llama_n_batch(self._ctx)))
        self.max_batch_tokens = self._cap
        self.vram_bytes = self.placement.vram_bytes(self.n_ctx)
        self._views: dict[int, type] = {}  # rows -> ctypes float array type over the logits buffer
        self.last_decode_s = 0.0  # wall time of the last llama_decode (benchmarks: overhead = step - decode)
        log.info(
            "llama.cpp loaded %s: %s %s, n_ctx=%d (%d blocks), seqs=%d, kv=%s, kv types K/V=%s/%s, n_batch=%d, "
            "threads=%d, extra_bufts=%s, gpu layers=%d/%d (%.2f GiB on %s)",
            self.path, self.info.architecture, self.info.file_type, self.n_ctx, self.num_kv_blocks,
            self.max_num_seqs, self.kv_layout, *self.kv_types, self.max_batch_tokens,
            self.n_threads, self.extra_bufts, self.placement.gpu_layers, self.info.block_count + 1,
            self.vram_bytes / (1 << 30), ", ".join(d.name for d in self.placement.devices) or "no GPU",
        )

    @property
    def max_seq_tokens(self) -> int:
        return self._seq_tokens
    def _remove(self, seq: int, p0: int, p1: int) -> bool:
        """Remove positions [p0, p1) of `seq`'s cells; a recurrent state goes first where only part of them do (llama.cpp
        refuses to cut a sequence that has one, and it would be stale anyway)."""
        if self._states is not None and (p0 > 0 or p1 >= 0):
            self._states.clear(seq)
        if self._window is not None:
            self._window.removed(seq, p0)
        if L.llama_memory_seq_rm(self._mem, seq, p0, p1):
            return True
        log.error("llama.cpp refused to remove positions [%d, %d) of sequence %d", p0, p1, seq)
        return False

    def _copy(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """dst's cells (positions [p0, p1) of them; -1: all) become src's; across streams llama.cpp copies them whole."""
        if self._window is not None:
            self._window.copied(src, dst, p1)
        L.llama_memory_seq_cp(self._mem, src, dst, p0, p1)

    def _choose_layout(self, n_ctx: int, setting: str | None) -> str:
        """streams when the pool gives every slot a full window (each stream is one), else unified."""
        mode = (os.environ.get(KV_ENV, "auto") if setting is None else setting).strip().lower() or "auto"
        if mode not in KV_LAYOUTS:
            raise ValueError(f"{KV_ENV}={mode!r} is not one of {', '.join(KV_LAYOUTS)}")
        fits = n_ctx // self.max_num_seqs >= self.context_length
        if mode == "streams" and not fits:
            raise ValueError(f"{KV_ENV}=streams gives each of the {self.max_num_seqs} sequences a stream of "
                             f"{n_ctx // self.max_num_seqs} tokens, less than the {self.context_length}-token window; "
                             "raise the KV pool, lower the slots or num_ctx, or use unified")
        if mode == "auto":
            mode = "streams" if fits else "unified"
            if not fits:
                log.info("llama.cpp KV: unified (the pool of %d tokens holds fewer than %d windows of %d)", n_ctx,
                         self.max_num_seqs, self.context_length)
        return mode

    def _kv_types(self, settings: RunnerSettings, head_dim: int, mla: bool = False) -> tuple[str, str]:
        """(K, V) types: `dtype`'s, or kv_cache_type's for K always and for V with flash attention on
        (llama.cpp refuses a quantized V without it).

        auto = a q8_0 K on a CPU-only build (dtype auto, heads of a multiple of 32 values), else f16. On a CPU,
        attention deep into a long prompt is bound by reading K and V from RAM, and llama.cpp's kernel for a
        chunk of 2+ queries reads each K row about once per query pair and per query head sharing it: a q8_0 K
        (about half the bytes) made a 4-token chunk at 8k context 15-31% cheaper and at 16k 39% cheaper
        (docs/bench/attn_depth_kv.md), which is what lets a chunk ride with the decodes under the latency target.
        The logits move a little (the test bounds it at 5% of their spread). A GPU build keeps f16, as Ollama
        does everywhere. An MLA model (DeepSeek) reads V out of its K rows, so llama.cpp wants one type for both:
        auto keeps it unquantized there unless flash attention is on."""
        base, quant = _KV_TYPES[settings.dtype], settings.kv_cache_type
        fa_on = self._flash_attn_type(settings.flash_attention) == _FLASH_ATTN["on"]
        if quant == "auto":
            cpu = self._cpu_only()
            quant = "q8_0" if cpu and settings.dtype == "auto" and head_dim % 32 == 0 and (fa_on or not mla) else "f16"
        if quant == "f16":
            return base, base
        if mla and not fa_on:
            raise ModelLoadError(f"{self.path}: a {quant} KV cache for this MLA model (K and V share one type) needs "
                                 "flash attention on (OLLAMA_FLASH_ATTENTION=1), or use f16")
        return quant, quant if fa_on else base

    def _cpu_only(self) -> bool:
        """No layer on a GPU: the placement's word once made (num_gpu 0 on a GPU build too), else the build's."""
        if self.placement is not None:
            return self.placement.gpu_layers == 0
        return not L.llama_supports_gpu_offload()

    def _flash_attn_type(self, choice: str) -> int:
        """auto = off when no layer is on a GPU (a CPU-only build, or num_gpu 0): the CPU flash-attention kernel
        costs ~10x more per attended key for a small chunk deep into a long prompt (measured: a 16-token chunk at
        2.9k context took 601 ms with it, 109 ms without), and chunked prefill is made of exactly such steps. A
        model on a GPU keeps llama.cpp's auto: on where the device's kernels have it (CUDA, Metal)."""
        if choice == "auto" and self._cpu_only():
            return _FLASH_ATTN["off"]
        return _FLASH_ATTN[choice]

    def _new_context(self, n_ctx: int, settings: RunnerSettings):
        cp = L.llama_context_default_params()
        cp.n_ctx = n_ctx
        # One llama_decode per step; a step over 512 tokens (a prompt with nobody streaming) runs as 512-token
        # micro-batches inside that call, which is faster on a CPU than one huge attention matrix.
        cp.n_batch = max(settings.max_num_batched_tokens, 1)
        cp.n_ubatch = min(cp.n_batch, 512)
        cp.n_seq_max = self.max_num_seqs + self._holder_ids
        # one logits row per sequence per step (llama.cpp wants n_seq_max rows), plus rows for draft tokens being
        # verified (speculative decoding); llama.cpp aborts the process on more, so `step` refuses them first
        cp.n_outputs_max = cp.n_seq_max + (DRAFT_ROWS if self.can_rollback else 0)
        cp.n_outputs_max_per_seq = cp.n_outputs_max
        cp.kv_unified = self.shared_kv  # streams: n_ctx is split evenly, one window per sequence
        cp.n_threads = cp.n_threads_batch = self.n_threads
        cp.no_perf = True
        cp.type_k, cp.type_v = (_GGML_TYPES[t][0] for t in self.kv_types)
        cp.flash_attn_type = self._flash_attn = self._flash_attn_type(settings.flash_attention)
        self._swa_full = bool(cp.swa_full)
        ctx = L.llama_init_from_model(self._model, cp)
        if not ctx:
            raise ModelLoadError(
                f"{self.path}: could not create a llama.cpp context (n_ctx={n_ctx}, n_batch={cp.n_batch}, "
                f"seqs={cp.n_seq_max}): {take_recent_errors() or 'out of memory?'}"
            )
        return ctx

    def _alloc_batch(self, cap: int) -> None:
        """Numpy-owned token/pos/seq/output arrays and a llama_batch struct pointing into them."""
        i32 = ctypes.POINTER(ctypes.c_int32)
        self._cap = cap
        self._tok = np.zeros(cap, dtype=np.int32)
        self._pos = np.zeros(cap, dtype=np.int32)
        self._nseq = np.ones(cap, dtype=np.int32)
        self._seq = np.zeros(cap, dtype=np.int32)
        self._out = np.zeros(cap, dtype=np.int8)
        # seq_id is int32**: row i points at _seq[i] (one sequence per token)
        self._seq_ptrs = (self._seq.ctypes.data + 4 * np.arange(cap, dtype=np.uint64)).astype(np.uintp)
        b = L.llama_batch()
        b.n_tokens = 0
        b.token = self._tok.ctypes.data_as(i32)
        b.embd = None
        b.pos = self._pos.ctypes.data_as(i32)
        b.n_seq_id = self._nseq.ctypes.data_as(i32)
        b.seq_id = self._seq_ptrs.ctypes.data_as(ctypes.POINTER(i32))
        b.logits = self._out.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))
        self._cbatch = b

    def step(self, batch: Batch) -> np.ndarray:
        """The step's spans through llama_decode; float32 logits [len(batch.logits_rows), vocab] in span order."""
        n = len(batch.token_ids)
        if n == 0:
            return np.zeros((0, self.vocab_size), dtype=np.float32)
        if n > self._cap:
            raise ValueError(f"batch of {n} tokens exceeds the llama.cpp batch size {self._cap} "
                             f"(n_ctx={self.n_ctx})")
        if self._ctx is None:
            raise RuntimeError("runner is closed")
        spans = batch.spans
        for s in spans:
            if not 0 <= s.slot < self.max_num_seqs or s.length < 1:
                raise ValueError(f"bad span: slot {s.slot} (allowed [0, {self.max_num_seqs})), length {s.length} (>= 1)")
        if (rows := sum(s.num_logits for s in spans)) > self.max_logits_rows:
            raise ValueError(f"a step asking for {rows} logits rows; this context holds {self.max_logits_rows}")
        fresh = [s.start_pos == 0 or not self._cells.is_live(s.slot) for s in spans]
        if self.shared_kv:
            self._cells.new_step()
            for s in spans:  # a fresh slot: clear it, and share its cached prefix from the sequence holding it
                self._cells.begin(s.slot, s.start_pos, s.length, s.block_table)
            seqs = [s.slot for s in spans]
            order = list(range(len(spans)))
        else:
            seqs = self._cells.place((s.slot, s.start_pos, s.length, s.block_table) for s in spans)
            order = micro_batch_order(spans, seqs)
        if self._states is not None:  # a sequence starting on a cached prefix resumes from its checkpoint
            self._states.resume(self._mem, spans, seqs)
        if self._window is not None:  # ... or, on a window model, from the window before it (window.py)
            for seq, new in zip(seqs, fresh):
                if new:
                    self._window.started(seq)
            self._window.resume(spans, seqs)
        tok = np.asarray(batch.token_ids, dtype=np.int32)
        pos = np.asarray(batch.positions, dtype=np.int32)
        row_of: dict[int, int] = {}  # span index -> its first row in `result`
        n_rows = 0
        for i, s in enumerate(spans):
            if s.num_logits:
                row_of[i], n_rows = n_rows, n_rows + s.num_logits
        result = np.empty((n_rows, self.vocab_size), dtype=np.float32)
        if batch.embeds:  # image rows: llama_decode calls of their own (vision_decode.py)
            from .vision_decode import decode_with_embeddings

            decode_with_embeddings(self, order, spans, seqs, tok, pos, result, row_of, batch)
        else:
            self.decode_spans(order, spans, seqs, tok, pos, result, row_of, batch)
        if self.shared_kv:  # the step's cells are written: a hit admitted before the next step may share them
            self._cells.new_step()
        if self._states is not None:
            self._states.after_step(spans, seqs)
        if self._window is not None:
            self._window.after_step(spans, seqs)
        return result

    def decode_spans(self, order: list[int], spans: list, seqs: list[int], tok: np.ndarray, pos: np.ndarray,
                result: np.ndarray, row_of: dict[int, int], batch: Batch) -> None:
        """One llama_decode over the spans in the given order; their logits rows into `result`."""
        out, seq = self._out, self._seq
        k, want = 0, []
        for i in order:
            s = spans[i]
            self._tok[k : k + s.length] = tok[s.start : s.start + s.length]
            self._pos[k : k + s.length] = pos[s.start : s.start + s.length]
            seq[k : k + s.length] = seqs[i]
            out[k : k + s.length] = 0
            k += s.length
            if (m := s.num_logits):
                out[k - m : k] = 1
                want.extend(range(row_of[i], row_of[i] + m))
        self._cbatch.n_tokens = k
        t0 = time.perf_counter()
        rc = L.llama_decode(self._ctx, self._cbatch)
        self.last_decode_s = time.perf_counter() - t0
        if rc != 0:
            self.raise_decode_error(rc, batch)
        if not want:
            return
        # llama_get_logits returns the output rows in batch order; an int address + a cached ctypes array type
        # makes the numpy view cost ~1 us, not ~70
        addr = _get_logits_addr(self._ctx)
        if not addr:
            raise RuntimeError("llama.cpp returned no logits")
        view_type = self._views.get(len(want))
        if view_type is None:
            view_type = self._views[len(want)] = ctypes.c_float * (len(want) * self.vocab_size)
        result[want] = np.frombuffer(view_type.from_address(addr), dtype=np.float32).reshape(len(want), -1)

    @property
    def llama_context(self) -> ctypes.c_void_p | None:
        """The llama_context (vision_decode.py decodes image rows into it); None once closed."""
        return self._ctx

    @property
    def llama_model(self) -> ctypes.c_void_p | None:
        """The llama_model (vision.py loads the projector beside it); None once closed."""
        return self._model

    def raise_decode_error(self, rc: int, batch: Batch) -> None:
        """llama_decode's return code `rc` as a RuntimeError that says what happened."""
        detail = take_recent_errors()
        if rc == 1:
            raise RuntimeError(
                f"llama_decode: no KV slot for a batch of {batch.num_tokens} tokens "
                f"(KV cache of {self.n_ctx} tokens is full){': ' + detail if detail else ''}"
            )
        if rc == 2:
            raise RuntimeError("llama_decode was aborted")
        raise RuntimeError(f"llama_decode failed with code {rc}{': ' + detail if detail else ''}")

    def free(self, slot: int) -> None:
        """The slot's sequence ended (finish, abort, preempt): its cells stay cached until `drop_blocks`."""
        if not 0 <= slot < self.max_num_seqs:
            raise ValueError(f"slot {slot} outside [0, {self.max_num_seqs})")
        if self._ctx is not None:
            if self._states is not None:  # kept cells hold no recurrent state: checkpoints are what hits resume from
                seq = slot if self.shared_kv else self._cells.stream_of(slot)
                if seq is not None:
                    self._states.clear(seq)
                self._states.release(slot)
            self._cells.free(slot)

    def rollback(self, slot: int, num_tokens: int) -> None:
        """Remove the slot's cells at positions >= num_tokens (rejected draft tokens) and forget the blocks past them:
        a cell left there would be attended beside the one the next step writes at the same position."""
        if self._ctx is not None:
            self._cells.trim(slot if self.shared_kv else self._cells.stream_of(slot), num_tokens)

    def drop_blocks(self, blocks: list[int]) -> None:
        """Remove the cells of blocks the engine will not read again (freed uncached, or evicted)."""
        if self._ctx is not None:
            self._cells.drop_blocks(blocks)
            if self._states is not None:
                self._states.drop(blocks)
            if self._window is not None:
                self._window.drop(blocks)

    def take_uncached(self) -> list[int]:
        """Blocks whose cells went (a dropped holder, a parked stream taken over): no longer cached."""
        return self._cells.take_uncached()

    def servable_prefix(self, blocks: list[int]) -> int:
        """How many leading blocks of a cached prefix this runner can hand a new sequence."""
        return self._cells.servable(blocks) if self._ctx is not None else 0

    def resumable_prefix(self, blocks: list[int]) -> int:
        """A recurrent model resumes a prefix only where a checkpoint of its state was saved; a window model where the
        cells serving it hold the window before its end, or a checkpoint does."""
        if self._states is not None:
            return self._states.resumable(blocks)
        if self._window is None or not blocks or self._ctx is None:
            return len(blocks)
        return self._window.resumable(blocks)

    def reset_prefix_cache(self) -> None:
        if self._ctx is not None:
            self._cells.reset()
            if self._states is not None:
                self._states.reset()
            if self._window is not None:
                self._window.reset()

    def kv_signature(self) -> dict:
        sig = {"backend": self.backend, "block_size": self.block_size, "kv_types": list(self.kv_types),
               "kv_layout": self.kv_layout, "flash_attn": self._flash_attn, "llama_cpp": llama_cpp.__version__}
        if self._states is not None:  # the payload carries checkpoints too (recurrent.pack_prefix)
            sig["recurrent_states"] = 1
        if self._window is not None:  # ... or windows (window.SlidingWindow.export)
            sig["sliding_window"] = self._window.n_swa
        return sig

    def export_prefix(self, blocks: list[int]) -> bytes | None:
        """llama.cpp's state of the sequence whose cells hold the prefix (cells past it go at import)."""
        seq = self._cells.holder(blocks) if self._ctx is not None and blocks else None
        if seq is None:
            return None
        if self._window is not None:
            return self._window.export(seq, blocks)
        size = L.llama_state_seq_get_size(self._ctx, seq)
        buf = (ctypes.c_uint8 * size)()
        got = L.llama_state_seq_get_data(self._ctx, buf, size, seq)
        if not got:
            return None
        data = ctypes.string_at(buf, got)
        if self._states is None:
            return data
        points = self._states.along(blocks)  # without one, a restore would recompute the whole prefix anyway
        return pack_prefix(data, points) if points else None

    def import_prefix(self, blocks: list[int], data: State, stored_blocks: int) -> bool:
        """Into a free stream (or holder id), trimmed to the prefix; parked there as a finished sequence's cells."""
        seq = self._cells.restore_target() if self._ctx is not None and blocks else None
        if seq is None:
            return False
        L.llama_memory_seq_rm(self._mem, seq, -1, -1)
        n = len(blocks) * self.block_size
        if self._window is not None:
            return self._import_windowed(seq, blocks, data, stored_blocks)
        points: list[tuple[int, State]] = []
        if self._states is not None:
            parts = unpack_prefix(data)
            data, points = (parts[0], kept(parts[1], data)) if parts is not None else (b"", [])
        if data and L.llama_state_seq_set_data(self._ctx, state_pointer(data), len(data), seq) and \
                self._remove(seq, n, -1):
            if L.llama_memory_seq_pos_min(self._mem, seq) == 0 and (
                    self._states is not None  # held cells keep no recurrent state: a hybrid's pos_max says -1
                    or L.llama_memory_seq_pos_max(self._mem, seq) == n - 1):
                for i, state in points:  # the checkpoints come back as such
                    if i < len(blocks):
                        self._states.put(blocks[i], state)
                self._cells.adopt(seq, blocks)
                return True
        log.warning("llama.cpp did not take a saved prefix of %d tokens back%s", n,
                    ": " + e if (e := take_recent_errors()) else "")
        L.llama_memory_seq_rm(self._mem, seq, -1, -1)
        self._cells.release(seq)
        return False

    def _import_windowed(self, seq: int, blocks: list[int], data: State, stored_blocks: int) -> bool:
        """A window model's saved prefix into the empty `seq`: its windows become checkpoints (window.py)."""
        if self._window.restore(seq, data, blocks, stored_blocks):
            self._cells.adopt(seq, blocks)
            return True
        log.warning("llama.cpp did not take a saved prefix of %d tokens back%s", len(blocks) * self.block_size,
                    ": " + e if (e := take_recent_errors()) else " (no window to resume from)")
        self._remove(seq, -1, -1)
        self._cells.release(seq)
        return False

    def cached_tokens(self, slot: int) -> int:
        """How many positions of the sequence in `slot` llama.cpp holds in its KV cache (0 when none runs there)."""
        seq = slot if self.shared_kv else self._cells.stream_of(slot)
        return 0 if seq is None else int(L.llama_memory_seq_pos_max(self._mem, seq)) + 1

    def embed(self, token_ids: list[int]) -> np.ndarray:
        """Final-norm hidden states [n, hidden] from a separate embeddings context."""
        if self._model is None:
            raise RuntimeError("runner is closed")
        if self._embedder is None:
            n_embd = int(L.llama_model_n_embd(self._model))
            self._embedder = Embedder(self._model, n_embd, self.context_length, self.n_threads)
        return self._embedder.embed(token_ids)

    def close(self) -> None:
        """Free the contexts and the model; idempotent."""
        if self.vision is not None:
            self.vision.close()
            self.vision = None
        if self._embedder is not None:
            self._embedder.close()
            self._embedder = None
        if self._ctx is not None:
            L.llama_free(self._ctx)
            self._ctx = None
        if self._model is not None:
            L.llama_model_free(self._model)
            self._model = None
