"""Scripted models: GGUFs whose greedy output after a given prompt is a given text, in a real family's vocabulary
and chat template, so a family's real output bytes travel the daemon's real path (tokenizer -> engine ->
detokenizer -> reply parser -> API) in tests.

    spec = ScriptedSpec(vocab=".../ggml-vocab-qwen2.gguf", chat_template=open(".../Qwen-Qwen3-0.6B.jinja").read(),
                        architecture="qwen3", special_tokens={"<think>": "user_defined", "</think>": "user_defined"},
                        replies=(Reply(prompt="...<|im_start|>user\\nWeather in Paris?<|im_end|>\\n<|im_start|>"
                                              "assistant\\n", text="<think>\\nTool.\\n</think>\\n\\n<tool_call>..."),))
    path = cached_scripted(spec)          # or write_scripted(spec, path)

How it works (scripted_weights.py has the arithmetic): a one-layer GPT-2 (llama.cpp architecture `gpt2`: learned
position embeddings, LayerNorm, GELU) predicts the next token from the last 17 tokens only. Sixteen attention heads
copy the 16 previous tokens into their own slots of the residual stream, steered by the position embeddings; one MLP
neuron per script token recognises the shortest context that tells it apart and writes that token's logit. So a
reply depends on the prompt's tail only (the prompt before it may be anything, of any length), several replies live
in one model (told apart by their prompts' tails, e.g. the user's last words), and chunked prefill, prefix-cache
hits and batching cannot change the output. A context no reply knows gives the end-of-generation token: an empty
reply. The script ends with `Reply.end` (default: the vocabulary's EOS), so `done_reason` is `stop`.

The vocabulary is the family's real one (fixtures/vocab) with `special_tokens` added where the family has them:
into the vocab's reserved slots (`[PAD…]`, `<|reserved_special_token_…|>`), else appended, as control tokens (which
llama.cpp prints only when asked) or user-defined ones (always printed), so how the daemon turns special tokens
into text is part of what a test sees. llama.cpp cannot run a gpt2-shaped file that names another architecture, so
`general.architecture` is `gpt2` and the family's own architecture is stored as ARCHITECTURE_KEY, which the store
reports as the model's family (/api/show details.family; daemon/store/weight_info.py FAMILY_KEY).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np

from .scripted_vocab import add_vocab_fields, family_tokenizer, family_vocab, gguf_writer
from .scripted_weights import N_EMBD, N_HEAD, NORM_EPS, SparseRows, build_tensors, compile_neurons
from .spec import file_sha256
from .tokenizer import cache_dir

log = logging.getLogger(__name__)

SCRIPTED_VERSION = 1  # bump when the bytes written for an unchanged spec change
ARCHITECTURE_KEY = "evenflow.scripted.architecture"


@dataclass(frozen=True)
class Reply:
    """After a prompt ending like `prompt` (a whole rendered prompt, or enough of its tail), the model emits `text`
    (tokenized with the model's vocabulary, special tokens parsed) and then `end`."""

    prompt: str
    text: str
    end: str | None = None  # the end-of-generation token's text; None: the vocabulary's EOS


@dataclass(frozen=True)
class ScriptedSpec:
    """Everything that determines a scripted model's file."""

    vocab: str  # a vocab-only GGUF, e.g. shared/fixtures/vocab/ggml-vocab-qwen2.gguf
    replies: tuple[Reply, ...]
    chat_template: str | None = None  # the family's real template (tokenizer.chat_template)
    architecture: str | None = None  # the family's GGUF architecture (qwen3, llama, ...): ARCHITECTURE_KEY
    special_tokens: dict[str, str] = field(default_factory=dict)  # text -> "control" | "user_defined"
    token_ids: dict[str, str] = field(default_factory=dict)  # bos / eos / eot / eom -> token text
    add_bos: bool | None = None  # None: as the vocabulary says
    context_length: int = 4096
    name: str = "evenflow-scripted"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["vocab"] = file_sha256(self.vocab)  # the bytes, not where they are
        return d


def spec_digest(spec: ScriptedSpec) -> str:
    payload = {"version": SCRIPTED_VERSION, **spec.to_dict()}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


Sequences = list[tuple[list[int], list[int]]]


def _sequences(spec: ScriptedSpec) -> tuple[Sequences, int, Callable[[list[int]], str]]:
    """(prompt ids, script ids + end id) per reply, as llama.cpp tokenizes them; the default end token; ids -> text."""
    vocab, tok = family_tokenizer(spec.vocab, spec.special_tokens, spec.token_ids, spec.add_bos)
    default_end = vocab.id_of("eos")
    if default_end is None:
        raise ValueError(f"{spec.vocab}: the vocabulary names no EOS token; set token_ids={{'eos': ...}}")
    out = []
    for r in spec.replies:
        end = default_end if r.end is None else vocab.token_id(r.end)
        if end not in tok.eog_ids:
            raise ValueError(f"reply end {vocab.tokens[end]!r} is not an end-of-generation token for llama.cpp")
        out.append((tok.prompt(r.prompt), tok.encode(r.text) + [end]))
    return out, default_end, tok.text


def group_replies(spec: ScriptedSpec) -> list[ScriptedSpec]:
    """`spec` split into as few specs as keep every reply apart (two replies sharing a stretch of CONTEXT tokens with
    different continuations cannot live in one model), in order; each keeps the name with a -N suffix past the first."""
    sequences, _, _ = _sequences(spec)
    groups: list[list[int]] = []
    for i in range(len(sequences)):
        for g in groups:
            try:
                compile_neurons([sequences[j] for j in g + [i]])
            except ValueError:
                continue
            g.append(i)
            break
        else:
            compile_neurons([sequences[i]])  # a reply that clashes with itself: its own message
            groups.append([i])
    return [replace(spec, replies=tuple(spec.replies[j] for j in g), name=spec.name + (f"-{n}" if n else ""))
            for n, g in enumerate(groups)]


def write_scripted(spec: ScriptedSpec, path: str | Path) -> Path:
    """Write the scripted model's GGUF (atomically: temp file + rename)."""
    from gguf import GGMLQuantizationType, LlamaFileType

    if not spec.replies:
        raise ValueError("a scripted model needs at least one reply")
    sequences, end_id, text = _sequences(spec)
    neurons = compile_neurons(sequences, text)
    vocab = family_vocab(spec.vocab, spec.special_tokens, spec.token_ids, spec.add_bos, spec.chat_template)
    tensors = build_tensors(neurons, vocab.size, end_id, spec.context_length)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        w = gguf_writer(tmp, "gpt2")
        w.add_name(spec.name)
        w.add_type("model")
        w.add_file_type(LlamaFileType.MOSTLY_Q4_0)
        w.add_quantization_version(2)
        w.add_context_length(spec.context_length)
        w.add_embedding_length(N_EMBD)
        w.add_block_count(1)
        w.add_feed_forward_length(len(neurons))
        w.add_head_count(N_HEAD)
        w.add_layer_norm_eps(NORM_EPS)
        w.add_bool("evenflow.synthetic", True)
        if spec.architecture:
            w.add_string(ARCHITECTURE_KEY, spec.architecture)
        w.add_string("evenflow.scripted.spec_hash", spec_digest(spec))
        add_vocab_fields(w, vocab)
        for name, t in tensors.items():
            if isinstance(t, SparseRows):  # token_embd (and the output): Q4_0 holds its ±1, ±EPS codes exactly
                w.add_tensor(name, sparse_q4_0(t), raw_dtype=GGMLQuantizationType.Q4_0)
            else:
                w.add_tensor(name, np.ascontiguousarray(t, dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    log.info("wrote scripted model %s (%d replies, %d neurons) to %s", spec.name, len(spec.replies), len(neurons), path)
    return path


def q4_0(w: np.ndarray) -> np.ndarray:
    """Q4_0 blocks (f16 scale + 32 nibbles) of a matrix whose 32-wide blocks each hold 0 and ±v for one v: exact, as
    the scale is v/7 (the stock quantizer picks max/-8, which turns -v into -7/8 v)."""
    rows, cols = w.shape
    blocks = w.reshape(-1, 32)
    d = (np.abs(blocks).max(axis=1) / 7).astype(np.float16)
    inv = np.divide(1.0, d.astype(np.float32), out=np.zeros(len(d), dtype=np.float32), where=d != 0)
    q = (np.clip(np.round(blocks * inv[:, None]), -8, 7) + 8).astype(np.uint8)
    nibbles = q[:, :16] | (q[:, 16:] << 4)  # ggml's layout: element j low, element j + 16 high
    out = np.concatenate([d.view(np.uint8).reshape(-1, 2), nibbles], axis=1)
    return out.reshape(rows, cols // 32 * 18)


def sparse_q4_0(m: SparseRows) -> np.ndarray:
    """q4_0 of a SparseRows matrix: the default row's blocks tiled, the few other rows encoded alone."""
    out = np.tile(q4_0(m.default[None, :]), (m.n_rows, 1))
    if m.rows:
        ids = sorted(m.rows)
        out[ids] = q4_0(np.stack([m.rows[i] for i in ids]))
    return out


def cached_scripted(spec: ScriptedSpec) -> Path:
    """The spec's GGUF under cache_dir()/scripted, written once per spec."""
    path = cache_dir() / "scripted" / f"{spec_digest(spec)[:20]}.gguf"
    if not path.exists():
        write_scripted(spec, path)
    return path
