"""Write a synthetic model as a GGUF file: llama.cpp tensor names, metadata, tokenizer and chat template."""
from __future__ import annotations

import logging
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .archs import GGUF_ONLY
from .spec import ModelSpec, spec_hash
from .tokenizer import Vocab, gguf_vocab_fields, vocab_for
from .random_weights import build_weights, is_norm, llama3_rope_factors, permute_qk

log = logging.getLogger(__name__)

GGUF_DTYPES = ("f32", "f16", "q8_0")

_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_TOP_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
              "lm_head.weight": "output.weight"}
_LAYER_RE = re.compile(r"model\.layers\.(\d+)\.(.+)")


def gguf_name(hf_name: str) -> str:
    """llama.cpp's tensor name for a Hugging Face tensor name."""
    if hf_name in _TOP_NAMES:
        return _TOP_NAMES[hf_name]
    m = _LAYER_RE.fullmatch(hf_name)
    if m is None or m.group(2) not in _LAYER_NAMES:
        raise ValueError(f"no GGUF name for tensor {hf_name!r}")
    return f"blk.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}"


def gguf_tensors(spec: ModelSpec, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """GGUF name -> float32 array, Q/K rows permuted for llama/mistral, plus rope_freqs for llama3 scaling."""
    out: dict[str, np.ndarray] = {}
    if spec.rope_scaling is not None:
        out["rope_freqs.weight"] = llama3_rope_factors(spec)
    permute = spec.gguf_architecture == "llama"  # qwen2/qwen3 run NEOX rope in llama.cpp: rows stay as in HF
    for name, w in weights.items():
        if permute and name.endswith(("q_proj.weight", "q_proj.bias")):
            w = permute_qk(w, spec.num_attention_heads)
        elif permute and name.endswith(("k_proj.weight", "k_proj.bias")):
            w = permute_qk(w, spec.num_key_value_heads)
        out[gguf_name(name)] = w
    return out


# kept F32 whatever the file's type, as llama.cpp's converter does: routers and convolution kernels
_F32_WEIGHTS = ("ffn_gate_inp.weight", "ssm_conv1d.weight", "shortconv.conv.weight")


def _encode(name: str, w: np.ndarray, dtype: str):
    """(data, raw_dtype) for one tensor: 1-D tensors, norms, biases, routers and convolutions stay F32, as llama.cpp's
    converter does."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    if dtype == "f32" or w.ndim == 1 or is_norm(name) or not name.endswith(".weight") or name.endswith(_F32_WEIGHTS):
        return np.ascontiguousarray(w, dtype=np.float32), None
    if dtype == "f16":
        return np.ascontiguousarray(w, dtype=np.float16), None
    if w.shape[-1] % 32:  # Q8_0 blocks are 32 wide; llama.cpp's converter falls back to F16 too
        log.warning("%s: row length %d is not a multiple of 32; stored as F16", name, w.shape[-1])
        return np.ascontiguousarray(w, dtype=np.float16), None
    return quantize(np.ascontiguousarray(w, dtype=np.float32), GGMLQuantizationType.Q8_0), GGMLQuantizationType.Q8_0


def _size_label(n: int) -> str:
    for div, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.1f}{suffix}"
    return str(n)


def _add_vocab(writer, spec: ModelSpec, vocab: Vocab) -> None:
    """Tokenizer metadata: copied verbatim from a vocab GGUF, or our trained BPE."""
    from gguf import GGUFValueType

    if vocab.gguf_path is not None:
        for key, value, types in gguf_vocab_fields(vocab.gguf_path):
            sub = types[-1] if types[0] == GGUFValueType.ARRAY else None
            writer.add_key_value(key, value, types[0], sub_type=sub)
        return
    writer.add_tokenizer_model(vocab.model)
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.token_types)
    writer.add_token_merges(vocab.merges)
    for setter, value in ((writer.add_bos_token_id, vocab.bos_id), (writer.add_eos_token_id, vocab.eos_id),
                          (writer.add_eot_token_id, vocab.eot_id), (writer.add_pad_token_id, vocab.pad_id),
                          (writer.add_unk_token_id, vocab.unk_id)):
        if value is not None:
            setter(value)
    writer.add_add_bos_token(vocab.add_bos)
    writer.add_add_eos_token(False)
    if vocab.chat_template:
        writer.add_chat_template(vocab.chat_template)


def write_gguf(spec: ModelSpec, path: str | Path, dtype: str = "f32",
               weights: dict[str, np.ndarray] | None = None) -> Path:
    """Write one GGUF file (atomically: temp file + rename) in f32, f16 or q8_0."""
    if spec.architecture in GGUF_ONLY:  # llama.cpp's own layouts (archs.py): no HF weights to start from
        from .arch_writer import arch_tensors, write_arch_hparams

        return write_file(spec, path, dtype, arch_tensors(spec), write_arch_hparams)
    if weights is None:
        weights = build_weights(spec)
    return write_file(spec, path, dtype, gguf_tensors(spec, weights), _llama_hparams)


def _llama_hparams(writer, spec: ModelSpec) -> None:
    """The hyperparameters of the Llama-shaped architectures (llama, mistral, qwen2, qwen3)."""
    writer.add_context_length(spec.max_position_embeddings)
    writer.add_embedding_length(spec.hidden_size)
    writer.add_block_count(spec.num_hidden_layers)
    writer.add_feed_forward_length(spec.intermediate_size)
    writer.add_head_count(spec.num_attention_heads)
    writer.add_head_count_kv(spec.num_key_value_heads)
    writer.add_key_length(spec.resolved_head_dim)
    writer.add_value_length(spec.resolved_head_dim)
    writer.add_rope_dimension_count(spec.resolved_head_dim)
    writer.add_rope_freq_base(spec.rope_theta)
    writer.add_layer_norm_rms_eps(spec.rms_norm_eps)


def write_file(spec: ModelSpec, path: str | Path, dtype: str, tensors: dict[str, np.ndarray],
               hparams: Callable[[Any, ModelSpec], None]) -> Path:
    """The GGUF file of a spec: general and evenflow keys, `hparams(writer, spec)`, the vocab, the tensors."""
    from gguf import GGUFWriter, LlamaFileType

    if dtype not in GGUF_DTYPES:
        raise ValueError(f"gguf dtype {dtype!r} is not supported; allowed: {', '.join(GGUF_DTYPES)}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    vocab = vocab_for(spec)
    if len(vocab.tokens) != spec.vocab_size:
        raise ValueError(f"vocab has {len(vocab.tokens)} tokens but spec.vocab_size={spec.vocab_size}")
    arch = spec.gguf_architecture
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        writer = GGUFWriter(tmp, arch)
        writer.add_name(spec.name)
        writer.add_type("model")
        writer.add_size_label(_size_label(spec.parameter_count()))
        writer.add_file_type({"f32": LlamaFileType.ALL_F32, "f16": LlamaFileType.MOSTLY_F16,
                              "q8_0": LlamaFileType.MOSTLY_Q8_0}[dtype])
        writer.add_quantization_version(2)
        writer.add_vocab_size(spec.vocab_size)
        hparams(writer, spec)
        writer.add_bool("evenflow.synthetic", True)
        writer.add_string("evenflow.source_architecture", spec.architecture)
        writer.add_string("evenflow.spec_hash", spec_hash(spec))
        writer.add_uint64("evenflow.parameter_count", spec.parameter_count())
        writer.add_uint64("evenflow.seed", spec.seed)
        _add_vocab(writer, spec, vocab)
        for name, w in tensors.items():
            data, raw_dtype = _encode(name, w, dtype)
            writer.add_tensor(name, data, raw_dtype=raw_dtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; a model file is meant to be shared
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    log.info("wrote GGUF %s (%s, %s) to %s", spec.name, arch, dtype, path)
    return path
