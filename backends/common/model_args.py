"""`ModelArgs` (mlx-lm style) from an HF `config.json` or GGUF metadata, and the `ModelInfo` builder.

No torch or mlx here: every backend that runs the model itself (torch, MLX) shares this.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from ..base import ModelInfo, ModelLoadError, UnsupportedArchitecture
from ..registry import LLAMA_DECODERS

log = logging.getLogger(__name__)

SUPPORTED_ARCHITECTURES = LLAMA_DECODERS  # what torch and MLX run (their BackendSpec.architectures)
# HF `architectures[0]` -> our architecture name.
_HF_CLASSES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
SUPPORTED_ROPE_SCALING = ("linear", "llama3")
MAX_LAYERS = 512  # llama.cpp's LLAMA_MAX_LAYERS; no real model comes near it
MAX_WIDTH = 1 << 20
MAX_VOCAB = 1 << 24
MAX_CONTEXT = 1 << 30


def _parsed(make: Callable[[], "ModelArgs"], source: str) -> "ModelArgs":
    """`make()` with every way a hostile value can fail it turned into a ModelLoadError naming `source`."""
    try:
        return make()
    except ModelLoadError as e:
        text = str(e)
        raise type(e)(text if text.startswith(source) else f"{source}: {text}") from None
    except KeyError as e:
        raise ModelLoadError(f"{source}: missing required key {e.args[0]!r}") from None
    except (TypeError, ValueError, ArithmeticError, AttributeError, IndexError) as e:
        raise ModelLoadError(f"{source}: invalid hyperparameter ({str(e)[:200]})") from None


def _check_count(name: str, v: object, hi: int) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= hi:
        raise ModelLoadError(f"{name}={repr(v)[:60]} is invalid: an integer in 1..{hi} expected")


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
        # Model files are untrusted input: every size is checked here, so a zero, a string or a billion
        # layers is one clear ModelLoadError, not a ZeroDivisionError or an allocation deep in a backend.
        for name, hi in (("hidden_size", MAX_WIDTH), ("num_hidden_layers", MAX_LAYERS), ("intermediate_size", MAX_WIDTH),
                         ("num_attention_heads", MAX_WIDTH), ("vocab_size", MAX_VOCAB),
                         ("max_position_embeddings", MAX_CONTEXT)):
            _check_count(name, getattr(self, name), hi)
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        _check_count("num_key_value_heads", self.num_key_value_heads, self.num_attention_heads)
        if self.num_attention_heads % self.num_key_value_heads:
            raise ModelLoadError(f"num_key_value_heads={self.num_key_value_heads} does not divide "
                                 f"num_attention_heads={self.num_attention_heads}")
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        _check_count("head_dim", self.head_dim, MAX_WIDTH)
        for name in ("rms_norm_eps", "rope_theta"):
            v = getattr(self, name)
            if not (isinstance(v, float) and math.isfinite(v) and v > 0):
                raise ModelLoadError(f"{name}={v!r} must be a finite number > 0")
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, dict):
            raise ModelLoadError(f"rope_scaling must be an object, got {repr(self.rope_scaling)[:60]}")
        for k in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
            v = (self.rope_scaling or {}).get(k)
            if v is not None and not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                                      and 0 < v < 1e9):
                raise ModelLoadError(f"rope_scaling {k}={repr(v)[:60]} must be a finite number > 0")
        if not isinstance(self.sliding_window, int) or isinstance(self.sliding_window, bool):
            self.sliding_window = None  # informational only
        # Every supported architecture runs on the one Llama decoder (backends/{torch,mlx}/models/llama.py); what
        # sets a family apart is these flags, decided here once for every backend.
        if self.model_type == "qwen2":  # q/k/v biases whatever config.json says (it has no attention_bias key)
            self.attention_bias, self.qk_norm = True, False
        if self.model_type == "qwen3":  # per-head RMSNorm on q and k before RoPE
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
        """Parse an HF `config.json` dict; unknown keys are ignored. ModelLoadError names a bad or missing one."""
        return _parsed(lambda: cls._from_hf_config(config, source), source)

    @classmethod
    def _from_hf_config(cls, config: dict[str, Any], source: str) -> "ModelArgs":
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
        return args

    @classmethod
    def from_gguf_metadata(cls, md: dict[str, Any], tensor_names: set[str], source: str) -> "ModelArgs":
        """Parse GGUF `{arch}.*` metadata; `tensor_names` tells tied embeddings and rope factors apart."""
        return _parsed(lambda: cls._from_gguf_metadata(md, tensor_names, source), source)

    @classmethod
    def _from_gguf_metadata(cls, md: dict[str, Any], tensor_names: set[str], source: str) -> "ModelArgs":
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
