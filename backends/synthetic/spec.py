"""ModelSpec: the shape of a synthetic model, its presets and a stable hash for caching."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .archs import ARCHS_VERSION, GGUF_ONLY, parameter_count as _arch_parameter_count, resolve_options

log = logging.getLogger(__name__)

# Bump when the bytes written for an unchanged spec change (weights layout, tokenizer, metadata):
# it invalidates every cached model.
FACTORY_VERSION = 2

HF_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")  # written as HF folders and GGUF files, same weights
ARCHITECTURES = HF_ARCHITECTURES + GGUF_ONLY  # GGUF_ONLY: llama.cpp runs them alone (archs.py)


@dataclass(frozen=True)
class ModelSpec:
    """Everything that determines a synthetic model's files; equal specs give identical bytes."""

    architecture: str = "llama"
    vocab_size: int = 2048
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    rope_scaling: dict[str, Any] | None = field(default=None, hash=False)
    seed: int = 0
    vocab: str | None = None  # None: our trained byte-level BPE; else a vocab-only GGUF (GGUF side only)
    text_only_output: bool = False  # zero output rows of special/byte tokens so greedy decoding emits words
    # std of q_proj/k_proj weights. At 0.02 attention is nearly uniform, so RoPE/KV-cache/position bugs barely
    # move the logits; ~0.3 makes attention sharp, for correctness tests that must notice such bugs.
    qk_std: float = 0.02
    name: str = "evenflow-synthetic"
    # the GGUF-only architectures' own shape (window, experts, ranks, recurrent widths): archs.py's defaults with
    # what is given over them; None for the others
    arch_options: dict[str, Any] | None = field(default=None, hash=False)

    def __post_init__(self) -> None:
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.hidden_size // max(self.num_attention_heads, 1))
        if self.architecture in ARCHITECTURES:
            object.__setattr__(self, "arch_options", resolve_options(self.architecture, self.arch_options))
        validate(self)

    @property
    def resolved_head_dim(self) -> int:
        """head_dim after defaulting (never None)."""
        assert self.head_dim is not None
        return self.head_dim

    @property
    def gguf_architecture(self) -> str:
        """llama.cpp's architecture name: Mistral models are `llama` there."""
        return "llama" if self.architecture == "mistral" else self.architecture

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def parameter_count(self) -> int:
        """Number of weights (biases and norms included, rope_freqs excluded)."""
        if self.architecture in GGUF_ONLY:
            return _arch_parameter_count(self)
        h, i, hd = self.hidden_size, self.intermediate_size, self.resolved_head_dim
        q, kv = self.num_attention_heads * hd, self.num_key_value_heads * hd
        layer = h * (q + 2 * kv) + q * h + 3 * h * i + 2 * h
        if self.architecture == "qwen2":
            layer += q + 2 * kv
        if self.architecture == "qwen3":
            layer += 2 * hd
        out = 0 if self.tie_word_embeddings else self.vocab_size * h
        return self.vocab_size * h + self.num_hidden_layers * layer + h + out


def validate(spec: ModelSpec) -> None:
    """Raise ValueError naming the bad field and what is allowed."""
    if spec.architecture not in ARCHITECTURES:
        raise ValueError(f"architecture {spec.architecture!r} is not supported; allowed: {', '.join(ARCHITECTURES)}")
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "max_position_embeddings"):
        value = getattr(spec, name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name}={value!r} must be a positive int")
    if spec.num_attention_heads % spec.num_key_value_heads:
        raise ValueError(f"num_attention_heads={spec.num_attention_heads} must be a multiple of "
                         f"num_key_value_heads={spec.num_key_value_heads}")
    if spec.resolved_head_dim % 2:
        raise ValueError(f"head_dim={spec.head_dim} must be even (RoPE rotates pairs)")
    if spec.vocab is None and spec.vocab_size < 512:
        raise ValueError(f"vocab_size={spec.vocab_size} is too small; the trained BPE needs >= 512 (256 bytes + merges)")
    if not spec.qk_std > 0:
        raise ValueError(f"qk_std={spec.qk_std!r} must be > 0")
    if spec.rope_scaling is not None:
        kind = spec.rope_scaling.get("rope_type", spec.rope_scaling.get("type"))
        if kind != "llama3" or spec.architecture not in ("llama", "mistral"):
            raise ValueError(f"rope_scaling={spec.rope_scaling!r} unsupported for {spec.architecture}; "
                             "allowed: None, or rope_type 'llama3' on llama/mistral")
    if spec.vocab is not None and not Path(spec.vocab).is_file():
        raise ValueError(f"vocab={spec.vocab!r} is not a file; expected a vocab-only GGUF such as "
                         "shared/fixtures/vocab/ggml-vocab-llama-bpe.gguf")


LLAMA3_ROPE_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 8192}

PRESETS: dict[str, dict[str, Any]] = {
    # Unit tests: ~1.4 MB in f32, builds in well under a second once the tokenizer is cached.
    "tiny": dict(architecture="llama", vocab_size=2048, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048, rope_theta=10000.0),
    # Demos and integration runs: small but not trivial, fast on CPU (~6M parameters). Qwen3-shaped, so its
    # template has tools and thinking and a front-end (Open WebUI sends tools with every chat) can use it as is.
    "demo": dict(architecture="qwen3", vocab_size=4096, hidden_size=256, intermediate_size=704, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32768, rope_theta=500000.0),
    # Benchmarks: ~250M parameters, Llama-shaped; greedy decoding streams word-like tokens.
    "bench": dict(architecture="llama", vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                  num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=8,
                  max_position_embeddings=8192, rope_theta=500000.0, text_only_output=True),
}


def make_spec(preset: str = "tiny", **overrides: Any) -> ModelSpec:
    """A preset's spec with any field overridden; `vocab=<gguf>` makes vocab_size follow that vocab."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; allowed: {', '.join(PRESETS)}")
    allowed = {f.name for f in dataclasses.fields(ModelSpec)}
    unknown = sorted(set(overrides) - allowed)
    if unknown:
        raise ValueError(f"unknown ModelSpec field(s) {unknown}; allowed: {', '.join(sorted(allowed))}")
    fields = dict(PRESETS[preset])
    fields.update(overrides)
    if fields.get("vocab") is not None:
        fields["vocab"] = str(Path(fields["vocab"]).resolve())
        if not Path(fields["vocab"]).is_file():
            raise ValueError(f"vocab={fields['vocab']!r} is not a file; expected a vocab-only GGUF such as "
                             "shared/fixtures/vocab/ggml-vocab-llama-bpe.gguf")
        from .tokenizer import gguf_vocab_size  # local: reading a GGUF is only needed here

        fields["vocab_size"] = gguf_vocab_size(fields["vocab"])
    if "name" not in overrides:
        suffix = f"-{Path(fields['vocab']).stem}" if fields.get("vocab") else ""
        fields["name"] = f"evenflow-synthetic-{preset}-{fields.get('architecture', 'llama')}{suffix}"
    if isinstance(fields.get("rope_scaling"), dict):
        fields["rope_scaling"] = dict(fields["rope_scaling"])  # never alias a caller's (or a constant's) dict
    if isinstance(fields.get("arch_options"), dict):
        fields["arch_options"] = dict(fields["arch_options"])
    if "head_dim" not in overrides:
        fields["head_dim"] = None
    return ModelSpec(**fields)


def spec_hash(spec: ModelSpec) -> str:
    """Stable hex digest of everything that determines the files (spec, factory version, vocab bytes)."""
    payload = spec.to_dict()
    if payload["arch_options"] is None:  # the HF-and-GGUF architectures keep the hashes they had
        del payload["arch_options"]
    else:
        payload["_archs_version"] = ARCHS_VERSION
    payload["_factory_version"] = FACTORY_VERSION
    if spec.vocab is not None:
        payload["vocab"] = file_sha256(spec.vocab)
    else:
        from .tokenizer import tokenizer_fingerprint

        payload["_tokenizer"] = tokenizer_fingerprint(spec.vocab_size, spec.architecture)
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
