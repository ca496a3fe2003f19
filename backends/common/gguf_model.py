"""A GGUF model opened for loading: metadata, ModelArgs, chat template, tokenizer, HF-named float32 weights."""
from __future__ import annotations

import logging
import re
from typing import Any, Iterator

import numpy as np

from ..base import ModelLoadError
from .model_args import ModelArgs, ModelFiles
from .gguf_checks import check_hparams
from .gguf_file import GGUFFile, file_type_name, is_gguf
from .gguf_tokenizer import tokenizer_from_gguf

log = logging.getLogger(__name__)

__all__ = ["GGUFModel", "is_gguf", "unpermute_qk", "hf_name"]

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "rope_freqs.weight": "rope_freqs",  # llama3 rope scaling factors (not an HF parameter)
}
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")
# Families whose converter permutes Q/K rows for llama.cpp's interleaved (non-NeoX) RoPE.
_PERMUTED_ARCHS = ("llama", "mistral")


def hf_name(gguf_name: str) -> str | None:
    """The HF parameter name for a GGUF tensor name, or None if we don't know it."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _BLOCK_RE.match(gguf_name)
    if m and m.group(2) in _BLOCK_NAMES:
        return f"model.layers.{m.group(1)}.{_BLOCK_NAMES[m.group(2)]}.{m.group(3)}"
    return None


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo convert_hf_to_gguf's `permute` of Q/K rows (pairs interleaved per head back to halves)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


class GGUFModel:
    """One GGUF file: `args`, `tokenizer`, `chat_template`, `metadata`, and `iter_tensors()` in HF names."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.file = GGUFFile(path)
        md = self.file.metadata
        check_hparams(md, path)
        self.metadata = md
        self.arch = str(md.get("general.architecture", ""))
        self.args = ModelArgs.from_gguf_metadata(md, set(self.file.tensors), source=path)
        template = md.get("tokenizer.chat_template")
        self.chat_template: str | None = template if isinstance(template, str) else None  # a file may say anything
        self.tokenizer = tokenizer_from_gguf(md, source=path)
        if self.tokenizer.vocab_size < self.args.vocab_size:
            log.info("%s: tokenizer has %d tokens, model vocab %d", path, self.tokenizer.vocab_size, self.args.vocab_size)
        self.file_type = file_type_name(md, self.file.tensors.values())
        missing = [n for n in ("token_embd.weight", "output_norm.weight") if n not in self.file.tensors]
        if missing and self.file.tensors:
            raise ModelLoadError(f"{path}: missing tensors {', '.join(missing)}")

    def scalar_metadata(self) -> dict[str, Any]:
        """GGUF keys with scalar values (vocab arrays left out), for /api/show."""
        return {k: v for k, v in self.metadata.items() if not isinstance(v, list)}

    @property
    def parameter_count(self) -> int:
        return sum(t.n_elements for n, t in self.file.tensors.items() if n != "rope_freqs.weight")

    def tensor(self, gguf_name: str) -> np.ndarray:
        """One tensor as float32 in HF layout (Q/K un-permuted for llama/mistral)."""
        w = self.file.array(gguf_name)
        if self.arch in _PERMUTED_ARCHS:
            m = _BLOCK_RE.match(gguf_name)
            if m and m.group(2) == "attn_q":
                w = unpermute_qk(w, self.args.num_attention_heads)
            elif m and m.group(2) == "attn_k":
                w = unpermute_qk(w, int(self.args.num_key_value_heads or self.args.num_attention_heads))
        return w

    def iter_tensors(self) -> Iterator[tuple[str, np.ndarray]]:
        """(HF name, float32 array) one tensor at a time; unknown tensors are skipped with a warning."""
        for name in self.file.tensors:
            target = hf_name(name)
            if target is None:
                log.warning("%s: ignoring unknown tensor %r", self.path, name)
                continue
            yield target, self.tensor(name)

    def files(self) -> ModelFiles:
        return ModelFiles(self.path, self.args, self.tokenizer, self.chat_template, self.file_type,
                          self.scalar_metadata())

    def close(self) -> None:
        self.file.close()
