"""Write a synthetic model as a Hugging Face directory (config, safetensors, tokenizer, generation config)."""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from .spec import ModelSpec, spec_hash
from .tokenizer import Vocab, trained_vocab
from .random_weights import build_weights

log = logging.getLogger(__name__)

HF_CLASSES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
              "qwen3": "Qwen3ForCausalLM"}


def hf_config(spec: ModelSpec, vocab: Vocab) -> dict[str, Any]:
    """config.json contents for the spec's architecture (legacy `rope_theta`/`rope_scaling` keys: v4 and v5 read them)."""
    cfg: dict[str, Any] = {
        "architectures": [HF_CLASSES[spec.architecture]],
        "model_type": spec.architecture,
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.resolved_head_dim,
        "max_position_embeddings": spec.max_position_embeddings,
        "rope_theta": spec.rope_theta,
        "rope_scaling": spec.rope_scaling,
        "rms_norm_eps": spec.rms_norm_eps,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "attention_dropout": 0.0,
        "use_cache": True,
        "torch_dtype": "float32",
        "bos_token_id": vocab.bos_id,
        "eos_token_id": vocab.stop_ids if len(vocab.stop_ids) > 1 else vocab.eos_id,
        "pad_token_id": vocab.pad_id,
        "evenflow_synthetic": {"spec": spec.to_dict(), "spec_hash": spec_hash(spec)},
    }
    if spec.architecture in ("llama", "qwen3"):
        cfg["attention_bias"] = False
    if spec.architecture == "llama":
        cfg["mlp_bias"] = False
    if spec.architecture in ("mistral", "qwen2", "qwen3"):
        cfg["sliding_window"] = None
    if spec.architecture in ("qwen2", "qwen3"):
        cfg["use_sliding_window"] = False
        cfg["max_window_layers"] = spec.num_hidden_layers
    return cfg


def tokenizer_config(spec: ModelSpec, vocab: Vocab) -> dict[str, Any]:
    """tokenizer_config.json: special tokens, BOS policy and the chat template."""
    fam = vocab.family
    assert fam is not None
    added = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                      "special": ty == 3}
             for i, (t, ty) in enumerate(zip(vocab.tokens, vocab.token_types)) if ty in (3, 4)}
    # Qwen's tokenizer has no BOS token on the HF side; GGUF still names <|endoftext|> (with add_bos false)
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "bos_token": fam.bos if fam.add_bos else None,
        "eos_token": fam.eos,
        "pad_token": fam.pad,
        "unk_token": fam.unk,
        "add_bos_token": fam.add_bos,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,  # keeps decode(encode(x)) == x
        "model_max_length": spec.max_position_embeddings,
        "model_input_names": ["input_ids", "attention_mask"],
        "chat_template": fam.chat_template,
    }


def write_hf(spec: ModelSpec, out_dir: str | Path, weights: dict[str, np.ndarray] | None = None) -> Path:
    """Write config.json, model.safetensors, tokenizer.json, tokenizer_config.json, generation_config.json."""
    if spec.vocab is not None:
        raise ValueError(f"vocab={spec.vocab!r}: a copied GGUF vocab has no Hugging Face tokenizer; "
                         "write only the GGUF format (formats=('gguf',)) or use vocab=None")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab = trained_vocab(spec.vocab_size, spec.architecture)
    if weights is None:
        weights = build_weights(spec)
    meta = {"format": "pt", "evenflow.synthetic": "true", "evenflow.spec_hash": spec_hash(spec)}
    write_safetensors(out / "model.safetensors", weights, meta)
    assert vocab.hf_json is not None
    (out / "tokenizer.json").write_text(vocab.hf_json, encoding="utf-8")
    _write_json(out / "config.json", hf_config(spec, vocab))
    _write_json(out / "tokenizer_config.json", tokenizer_config(spec, vocab))
    gen = {"bos_token_id": vocab.bos_id, "eos_token_id": vocab.stop_ids, "pad_token_id": vocab.pad_id,
           "do_sample": False}
    _write_json(out / "generation_config.json", gen)
    log.info("wrote HF model %s (%s) to %s", spec.name, spec.architecture, out)
    return out


def write_safetensors(path: Path, tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> None:
    """A float32 safetensors file with a byte-stable header (the Rust writer orders metadata keys randomly)."""
    header: dict[str, Any] = {"__metadata__": dict(sorted(metadata.items()))}
    offset = 0
    for name in sorted(tensors):
        nbytes = tensors[name].size * 4
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads the header to 8-byte alignment with spaces
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for name in sorted(tensors):
            f.write(np.ascontiguousarray(tensors[name], dtype="<f4").tobytes())


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
