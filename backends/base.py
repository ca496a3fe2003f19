"""The contract between the engine and every backend: plain data in (`Batch`), float32 logits out.

The engine owns scheduling and KV *accounting* (which blocks a sequence holds); a backend owns the KV
*memory* and runs one forward pass per engine step over the flattened mixed batch. Nothing here imports
torch, mlx or llama_cpp.
"""
from __future__ import annotations

import abc
import importlib.util
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np

log = logging.getLogger(__name__)


@dataclass
class SeqSpan:
    """One sequence's share of a step: `length` new tokens at flattened offset `start`."""

    slot: int  # the sequence's slot id, 0 <= slot < max_num_seqs (llama.cpp seq_id, per-slot caches)
    start: int  # offset of this span's first token in Batch.token_ids / Batch.positions
    length: int  # number of new tokens this step (1 for a decode, a chunk size for a prefill)
    start_pos: int  # position of the first new token == tokens whose KV is already cached
    block_table: list[int]  # KV blocks covering positions [0, start_pos + length), in order
    need_logits: bool  # True for a decode or the last chunk of a prompt: logits of the span's last token
    # True: logits of every row of the span, in order (a decode carrying draft tokens to verify, speculative.py);
    # implies need_logits. A runner that cannot sets `Runner.max_logits_rows` accordingly.
    all_logits: bool = False

    @property
    def num_logits(self) -> int:
        """Logits rows this span gives: all its rows, its last, or none."""
        return self.length if self.all_logits else int(self.need_logits)

    @property
    def context_len(self) -> int:
        """Tokens attended to by the span's last token (cached prefix + new tokens)."""
        return self.start_pos + self.length


@dataclass
class EmbedSpan:
    """A prompt span given as input embeddings (an image), not token ids: rows for positions [start, start + n)."""

    start: int  # prompt position of the first row
    rows: Any  # float32 numpy array [n, hidden]
    causal: bool = True  # False: the span's rows attend each other both ways, so it must run whole in one pass

    @property
    def end(self) -> int:
        return self.start + len(self.rows)


def embeds_in(embeds: list[EmbedSpan], start_pos: int, length: int, flat: int) -> list[tuple[int, Any, bool]]:
    """(flattened offset, rows, causal) of the embedding rows among positions [start_pos, start_pos + length) of a span
    that starts at flattened offset `flat`."""
    out = []
    for e in embeds:
        lo, hi = max(e.start, start_pos), min(e.end, start_pos + length)
        if lo < hi:
            out.append((flat + lo - start_pos, e.rows[lo - e.start:hi - e.start], e.causal))
    return out


@dataclass
class Batch:
    """A flattened mixed batch: decodes and prompt chunks of several sequences, one forward pass."""

    token_ids: list[int]
    positions: list[int]
    spans: list[SeqSpan]
    block_size: int
    # (flattened offset, rows, causal): tokens given as embeddings (image spans); their token_ids are 0
    embeds: list[tuple[int, Any, bool]] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def logits_rows(self) -> list[int]:
        """Flattened indices of the tokens whose logits the engine needs, in span order (every row of an
        `all_logits` span, the last row of another that needs logits)."""
        rows: list[int] = []
        for s in self.spans:
            if s.num_logits:
                rows.extend(range(s.start + s.length - s.num_logits, s.start + s.length))
        return rows

    @classmethod
    def from_spans(cls, seqs: list[tuple], block_size: int) -> "Batch":
        """Build from (slot, new_token_ids, start_pos, block_table, need_logits[, all_logits]) tuples."""
        token_ids: list[int] = []
        positions: list[int] = []
        spans: list[SeqSpan] = []
        for slot, toks, start_pos, table, need, *rest in seqs:
            every = bool(rest and rest[0])
            spans.append(SeqSpan(slot, len(token_ids), len(toks), start_pos, list(table), need or every, every))
            token_ids.extend(toks)
            positions.extend(range(start_pos, start_pos + len(toks)))
        return cls(token_ids, positions, spans, block_size)


@dataclass
class ModelInfo:
    """What the daemon and the engine need to know about a loaded model."""

    architecture: str  # llama | mistral | qwen2 | qwen3
    vocab_size: int
    context_length: int  # trained context window
    embedding_length: int
    block_count: int
    head_count: int
    head_count_kv: int
    parameter_count: int = 0
    file_type: str = ""  # F32 | F16 | BF16 | Q8_0 | Q4_0 | ... (Ollama's quantization_level)
    metadata: dict[str, Any] = field(default_factory=dict)  # GGUF-style key/values for /api/show model_info


@dataclass
class GrammarVocab:
    """A vocabulary as a grammar engine needs it, as plain data: every id's bytes (special tokens as
    b"\\xff" + their text, so no grammar can spell them by accident), end-of-generation ids, a plain tokenizer."""

    tokens: list[bytes]
    special_ids: list[int]
    eos_ids: list[int]
    bos_id: int | None
    # text -> ids whose bytes are exactly the text: no BOS, no space a SentencePiece tokenizer prepends, and
    # the text of a token listed special spelled by other tokens (llguidance fails on anything else)
    encode: Callable[[str], list[int]]


def special_piece(text: bytes) -> bytes:
    """How a special token appears in a `GrammarVocab` (llguidance's marker byte)."""
    return b"\xff" + text


@runtime_checkable
class Tokenizer(Protocol):
    """Token ids <-> text. `token_bytes` is what streaming detokenisation is built on."""

    vocab_size: int
    bos_id: int | None
    eos_id: int | None  # the vocabulary's end-of-sequence token (a template's `eos_token`); None if it has none
    eos_ids: set[int]  # every end-of-generation token (EOS, EOT, <|im_end|>, ...)
    add_bos: bool  # whether encode(add_special=True) prepends BOS

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Text to ids; `parse_special` turns literal special-token text (e.g. `<|im_end|>`) into its id."""
        ...

    def token_bytes(self, token_id: int) -> bytes:
        """The raw UTF-8 bytes this token contributes to the output (b"" for control tokens)."""
        ...

    def decode(self, token_ids: list[int]) -> str:
        """Ids to text, control tokens dropped, invalid UTF-8 replaced."""
        ...

    def id_to_piece(self, token_id: int) -> str | None:
        """The token as the vocabulary spells it, special tokens included (a template's bos/eos text); None for a
        token it has no text for."""
        ...

    def grammar_vocab(self) -> GrammarVocab:
        """The vocabulary for constrained decoding (daemon/engine/grammar.py)."""
        ...


KV_CACHE_TYPES = ("auto", "f16", "q8_0", "q4_0")  # RunnerSettings.kv_cache_type (OLLAMA_KV_CACHE_TYPE)


@dataclass
class RunnerSettings:
    """Load-time settings a backend honours where they apply."""

    # sequence slots (llama.cpp n_seq_max); None = as many full windows as the KV pool holds, at least 8
    # (common.memory.plan_kv: more than 8 only where the KV has GPU memory of its own)
    max_num_seqs: int | None = None
    block_size: int = 16
    num_kv_blocks: int | None = None  # None: derive from kv_memory_fraction / the context window
    kv_memory_fraction: float = 0.9  # of free device memory, GPU only
    context_length: int | None = None  # num_ctx cap per sequence; None = the model's trained window
    max_num_batched_tokens: int = 2048  # largest step the engine will ask for (n_batch / n_ubatch)
    device: str = "auto"  # torch: auto | cpu | cuda | cuda:N | mps; llama.cpp: cpu = no offload
    # Ollama's load-time GPU options: num_gpu = layers to offload (None or < 0: as many as fit, 0: CPU only);
    # main_gpu = which GPU (llama.cpp: the whole model on that one; torch: cuda:N)
    num_gpu: int | None = None
    main_gpu: int | None = None
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    num_threads: int | None = None  # None = physical cores
    # llama.cpp: auto | on | off. Its CPU flash-attention kernel rounds Q.K through f16, so logits then
    # depend (at ~1e-3) on how many queries share a pass; "off" makes chunked == monolithic exactly.
    flash_attention: str = "auto"
    # llama.cpp KV element type (Ollama's OLLAMA_KV_CACHE_TYPE): auto | f16 | q8_0 | q4_0. A quantized type applies
    # to K always and to V only with flash attention on (llama.cpp's rule); "f16" leaves the type to `dtype`;
    # auto = a q8_0 K when no layer is on a GPU (see LlamaCppRunner._kv_types), f16 on a GPU.
    kv_cache_type: str = "auto"  # one of KV_CACHE_TYPES
    # llama.cpp KV layout: auto | streams | unified; None = the EVENFLOW_LLAMACPP_KV environment variable (auto)
    kv_layout: str | None = None
    projector_path: str | None = None  # a vision projector GGUF (llama.cpp + libmtmd): images in


class Runner(abc.ABC):
    """A loaded model on one backend: the whole contract the engine relies on (docs/engine-api.md describes it).

    One engine thread calls `step`, `free` and the prefix-cache hooks, never concurrently. A subclass sets the
    annotated attributes when it loads and implements the abstract methods; the capabilities below them have
    defaults that fit a runner whose KV memory *is* the engine's block pool (torch, MLX): override them where
    a backend differs (llama.cpp keeps KV cells of its own and overrides every one)."""

    backend: str  # its BackendSpec.name (registry.py)
    info: ModelInfo
    tokenizer: Tokenizer
    chat_template: str | None  # Jinja chat template from the model files, if any
    num_kv_blocks: int  # KV capacity the runner allocated, in blocks of settings.block_size
    block_size: int
    max_num_seqs: int

    # ---- optional capabilities (defaults: KV lives in the engine's blocks) ----
    # Reads shared blocks through `SeqSpan.block_table` as they are, so the engine may share cached prefix
    # blocks; False: the engine never shares (EngineConfig.prefix_caching is then ignored).
    prefix_caching: bool = True
    # Every query attends every occupied cell (llama.cpp's unified cache): the scheduler then models a step's
    # attention as (its tokens) x (tokens all sequences hold).
    shared_kv: bool = False
    max_batch_tokens: int | None = None  # the most tokens one step may carry; None = no limit of the runner's
    vram_bytes: int | None = None  # weights + KV in GPU memory (/api/ps size_vram); None: by `device`
    device: Any = "cpu"  # where it computes: str(device) starting with "cpu" gives the engine CPU defaults
    kv_layout: str | None = None  # how the KV is laid out, where a backend has a choice (llama.cpp: streams | unified)
    kv_types: tuple[str, str] | None = None  # (K, V) element type names, where a backend reports them
    # None: the KV can be cut at any position. A number: the model keeps a recurrent state (SSM, convolution, linear
    # attention) that a prefix hit can only resume where the runner saved one, at block boundaries: the scheduler then
    # ends prompt chunks on block boundaries at most this many tokens apart, and a prompt's last chunk at its last
    # full block (see `resumable_prefix`).
    checkpoint_every: int | None = None
    vision: "VisionEncoder | None" = None  # images in: set at load when the model has a projector (llama.cpp)
    vision_error: str | None = None  # why a model with a projector cannot take images here (e.g. no libmtmd)
    # The most logits rows one step may ask for (`SeqSpan.all_logits` spans count all their rows); None: no limit.
    # The engine caps draft tokens by it (speculative decoding); a runner must accept at least one row per slot.
    max_logits_rows: int | None = None
    # `rollback` can take back draft tokens (False: a recurrent state, which cannot; no speculative decoding)
    can_rollback: bool = True

    @property
    def max_seq_tokens(self) -> int:
        """The most tokens one sequence can hold in this runner's KV: the whole pool where the KV is the engine's
        paged blocks (torch, MLX); a backend that gives each sequence a fixed share of it says so (llama.cpp)."""
        return self.num_kv_blocks * self.block_size

    @abc.abstractmethod
    def step(self, batch: Batch) -> np.ndarray:
        """One forward pass; float32 logits [len(batch.logits_rows), vocab_size] in span order."""

    @abc.abstractmethod
    def free(self, slot: int) -> None:
        """Forget the KV of a slot (finish, abort, preempt). The engine reuses the slot afterwards."""

    def rollback(self, slot: int, num_tokens: int) -> None:
        """Forget the slot's KV at positions >= num_tokens (draft tokens the model rejected). The engine then gives
        back the blocks past them. Nothing to do where the KV is the engine's blocks (torch, MLX): positions past a
        span's context are never read and are overwritten when the sequence computes them."""

    @abc.abstractmethod
    def embed(self, token_ids: list[int]) -> np.ndarray:
        """Final-layer hidden states (after the final norm), float32 [len(token_ids), hidden]; no KV kept."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release memory; the runner is unusable afterwards."""

    # ---- prefix-cache hooks for KV kept outside the block pool (no-ops where the KV is the pool) ----
    def drop_blocks(self, blocks: list[int]) -> None:
        """Before a step: these blocks' contents will never be read again (freed uncached, or evicted)."""

    def take_uncached(self) -> list[int]:
        """After `free` and after each step: blocks whose cached contents the runner dropped on its own."""
        return []

    def servable_prefix(self, blocks: list[int]) -> int:
        """How many leading blocks of a cached prefix (a hit at admission) this runner can still serve."""
        return len(blocks)

    def resumable_prefix(self, blocks: list[int]) -> int:
        """How many leading blocks of a servable cached prefix a new sequence can resume from: all of them where the KV
        can be cut anywhere; a recurrent model's, up to its last saved state. The rest is recomputed (and stays
        cached: another prompt may resume further along it)."""
        return len(blocks)

    def reset_prefix_cache(self) -> None:
        """A new Engine is built on this runner: forget what a previous engine had cached."""

    # ---- saving and restoring cached prefixes (the disk KV cache, daemon/engine/kv_disk.py) ----
    def kv_signature(self) -> dict[str, Any] | None:
        """Everything besides the weights that decides the bytes `export_prefix` gives (None: no export)."""
        return None

    def export_prefix(self, blocks: list[int]) -> bytes | None:
        """The KV of a cached prefix (positions 0 .. len(blocks) * block_size) as bytes `import_prefix` takes back;
        None when this runner cannot give it now."""
        return None

    def import_prefix(self, blocks: list[int], data: bytes, stored_blocks: int) -> bool:
        """Put the first len(blocks) blocks of a prefix exported as `stored_blocks` blocks into `blocks` (which no
        sequence holds). Afterwards they are cached blocks like any other. False: nothing was restored."""
        return False


class ImageInputError(ValueError):
    """An image the vision encoder cannot take (not an image, undecodable, too large): bad input, a 400."""


@dataclass
class MultimodalPrompt:
    """A prompt with images: token ids (an image's positions hold placeholder ids derived from a hash of its bytes,
    so the prefix cache tells images apart) and the embedding spans that replace those positions."""

    token_ids: list[int]
    embeds: list[EmbedSpan]
    images_encoded: int = 0  # images that ran through the vision tower (the rest came from its cache)


class VisionEncoder(abc.ABC):
    """A model's vision tower. Thread-safe: the prepare workers call it, never the engine thread."""

    marker: str  # the text that stands for one image in a rendered prompt

    @abc.abstractmethod
    def build_prompt(self, text: str, images: list[bytes], add_special: bool) -> MultimodalPrompt:
        """Tokenize `text` (one `marker` per image, in order) and encode the images; ImageInputError on a bad one."""

    def close(self) -> None:
        """Release the encoder's memory."""


class ModelLoadError(Exception):
    """A model file is missing, corrupt or unsupported; the message names the file and the reason."""


class UnsupportedArchitecture(ModelLoadError):
    """The backend does not run this model's architecture (or read its file format); the message names those that do."""


class InsufficientMemory(ModelLoadError):
    """The files are fine but this machine cannot hold the model now (a server condition, not bad input)."""


Loader = Callable[[str, RunnerSettings], Runner]


def load_runner(backend: str, model_path: str, settings: RunnerSettings) -> Runner:
    """Load `model_path` (a GGUF file or an HF directory) with the named backend ("auto": by model, `auto_backend`);
    a backend that cannot read the file or run its architecture refuses before importing anything (choice.unsupported
    says which backends can)."""
    from .choice import unsupported
    from .registry import backend_spec

    if backend == "auto":
        backend = auto_backend(model_path)
    spec = backend_spec(backend)  # ValueError naming the registered ones
    if (reason := unsupported(backend, model_path)) is not None:
        raise UnsupportedArchitecture(reason)
    if importlib.util.find_spec(spec.package) is None:  # `auto` may pick a backend for a format nothing installed reads
        raise ModelLoadError(f"{model_path}: the {spec.title} backend needs the Python package {spec.package!r}, "
                             "which is not installed")
    return spec.load(model_path, settings)


def auto_backend(model_path: str) -> str:
    """Per model: a GGUF on llama.cpp (GPU offload where built for it), an HF folder on torch (CUDA or CPU) or
    MLX on Apple Silicon (backends/choice.py)."""
    from .choice import choose_backend, gguf_architecture, model_format, probe_machine

    return choose_backend(model_format(model_path), probe_machine(), gguf_architecture(model_path))
