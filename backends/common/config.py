"""`ModelArgs` (mlx-lm style) from an HF `config.json` or GGUF metadata, and the `ModelInfo` builder.

No torch or mlx here: every backend that runs the model itself (torch, MLX) shares this.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from ..base import ModelInfo, ModelLoadError, UnsupportedArchitecture

log = logging.getLogger(__name__)

SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")
# HF `architectures[0]` -> our architecture name.
_HF_CLASSES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
SUPPORTED_ROPE_SCALING = ("linear", "llama3")


def check_architecture(arch: str, source: str) -> str:
    """Return `arch` if we can run it, else raise `UnsupportedArchitecture` naming it."""
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedArchitecture(
            f"{source}: unsupported architecture {arch!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    return arch


@dataclass
class ModelArgs:
    """Hyper-parameters of a llama-family decoder, named as in HF `config.json`."""

    model_type: str
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    vocab_size: int
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v biases (always on for qwen2)
    mlp_bias: bool = False
    qk_norm: bool = False  # per-head RMSNorm on q and k (qwen3)
    sliding_window: int | None = None  # mistral v0.1; informational, not applied

    def __post_init__(self) -> None:
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.model_type == "qwen2":
            self.attention_bias = True
        if self.model_type == "qwen3":
            self.qk_norm = True
        if self.rope_scaling:
            kind = self.rope_scaling.get("rope_type", self.rope_scaling.get("type"))
            if kind == "default":
                self.rope_scaling = None
            elif kind not in SUPPORTED_ROPE_SCALING:
                raise ModelLoadError(
                    f"rope_scaling type {kind!r} is not supported; supported: {', '.join(SUPPORTED_ROPE_SCALING)}"
                )

    @classmethod
    def from_hf_config(cls, config: dict[str, Any], source: str = "config.json") -> "ModelArgs":
        """Parse an HF `config.json` dict; unknown keys are ignored."""
        arch = config.get("model_type")
        if arch is None and config.get("architectures"):
            arch = _HF_CLASSES.get(config["architectures"][0], config["architectures"][0])
        check_architecture(str(arch), source)
        # transformers >= 5 writes `rope_parameters` (theta + scaling together) instead of the two keys.
        rope = config.get("rope_parameters") or {}
        rope_theta = config.get("rope_theta", rope.get("rope_theta", 10000.0))
        rope_scaling = config.get("rope_scaling") or (
            {k: v for k, v in rope.items() if k != "rope_theta"} if rope.get("rope_type", "default") != "default" else None
        )
        try:
            args = cls(
                model_type=arch,
                hidden_size=int(config["hidden_size"]),
                num_hidden_layers=int(config["num_hidden_layers"]),
                intermediate_size=int(config["intermediate_size"]),
                num_attention_heads=int(config["num_attention_heads"]),
                vocab_size=int(config["vocab_size"]),
                num_key_value_heads=config.get("num_key_value_heads"),
                head_dim=config.get("head_dim"),
                rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
                rope_theta=float(rope_theta),
                rope_scaling=rope_scaling,
                max_position_embeddings=int(config.get("max_position_embeddings", 4096)),
                tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
                attention_bias=bool(config.get("attention_bias", False)),
                mlp_bias=bool(config.get("mlp_bias", False)),
                sliding_window=config.get("sliding_window") if arch == "mistral" else None,
            )
        except KeyError as e:
            raise ModelLoadError(f"{source}: missing required key {e.args[0]!r}") from None
        return args

    @classmethod
    def from_gguf_metadata(cls, md: dict[str, Any], tensor_names: set[str], source: str) -> "ModelArgs":
        """Parse GGUF `{arch}.*` metadata; `tensor_names` tells tied embeddings and rope factors apart."""
        arch = str(md.get("general.architecture", ""))
        check_architecture(arch, source)

        def get(key: str, default: Any = None, required: bool = False) -> Any:
            full = f"{arch}.{key}"
            if full not in md:
                if required:
                    raise ModelLoadError(f"{source}: missing GGUF metadata key {full!r}")
                return default
            return md[full]

        n_vocab = get("vocab_size")
        if n_vocab is None:
            tokens = md.get("tokenizer.ggml.tokens")
            n_vocab = len(tokens) if tokens is not None else None
        if n_vocab is None:
            raise ModelLoadError(f"{source}: no {arch}.vocab_size and no tokenizer.ggml.tokens")
        rope_scaling = None
        kind = get("rope.scaling.type")
        if kind == "linear":
            rope_scaling = {"rope_type": "linear", "factor": float(get("rope.scaling.factor", 1.0))}
        elif kind not in (None, "none"):
            raise ModelLoadError(f"{source}: rope scaling {kind!r} is not supported; supported: linear, llama3")
        heads = int(get("attention.head_count", required=True))
        return cls(
            model_type=arch,
            hidden_size=int(get("embedding_length", required=True)),
            num_hidden_layers=int(get("block_count", required=True)),
            intermediate_size=int(get("feed_forward_length", required=True)),
            num_attention_heads=heads,
            vocab_size=int(n_vocab),
            num_key_value_heads=int(get("attention.head_count_kv", heads)),
            head_dim=get("attention.key_length"),
            rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
            rope_theta=float(get("rope.freq_base", 10000.0)),
            rope_scaling=rope_scaling,
            max_position_embeddings=int(get("context_length", 4096)),
            tie_word_embeddings="output.weight" not in tensor_names,
            attention_bias="blk.0.attn_q.bias" in tensor_names,
            sliding_window=get("attention.sliding_window"),
        )

    def gguf_metadata(self) -> dict[str, Any]:
        """The GGUF-style keys /api/show reports under model_info."""
        a = self.model_type
        md: dict[str, Any] = {
            "general.architecture": a,
            f"{a}.context_length": self.max_position_embeddings,
            f"{a}.embedding_length": self.hidden_size,
            f"{a}.block_count": self.num_hidden_layers,
            f"{a}.feed_forward_length": self.intermediate_size,
            f"{a}.attention.head_count": self.num_attention_heads,
            f"{a}.attention.head_count_kv": self.num_key_value_heads,
            f"{a}.attention.key_length": self.head_dim,
            f"{a}.attention.value_length": self.head_dim,
            f"{a}.attention.layer_norm_rms_epsilon": self.rms_norm_eps,
            f"{a}.rope.freq_base": self.rope_theta,
            f"{a}.vocab_size": self.vocab_size,
        }
        return md


@dataclass
class ModelFiles:
    """What a loader found on disk: args, tokenizer, template, file type and extra metadata."""

    path: str
    args: ModelArgs
    tokenizer: Any  # common.hf_tokenizer.HFTokenizer
    chat_template: str | None
    file_type: str
    metadata: dict[str, Any] = field(default_factory=dict)


def build_model_info(args: ModelArgs, parameter_count: int, file_type: str, extra: dict[str, Any]) -> ModelInfo:
    """ModelInfo from ModelArgs; `extra` (e.g. the GGUF file's own scalar keys) wins over derived keys."""
    md = args.gguf_metadata()
    md["general.parameter_count"] = parameter_count
    md.update(extra)
    return ModelInfo(
        architecture=args.model_type,
        vocab_size=args.vocab_size,
        context_length=args.max_position_embeddings,
        embedding_length=args.hidden_size,
        block_count=args.num_hidden_layers,
        head_count=args.num_attention_heads,
        head_count_kv=int(args.num_key_value_heads or args.num_attention_heads),
        parameter_count=parameter_count,
        file_type=file_type,
        metadata=md,
    )
