"""Per-request sampling parameters with Ollama's option names, defaults and validation."""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, fields
from typing import Any

log = logging.getLogger(__name__)

# Ollama's api.DefaultOptions() for the sampling keys (repeat_penalty is 1.0 since v0.32.10).
MIN_SAMPLING_TEMPERATURE = 1e-6
_FLOAT_KEYS = ("temperature", "top_p", "min_p", "typical_p", "repeat_penalty", "presence_penalty", "frequency_penalty")
_INT_KEYS = ("top_k", "repeat_last_n", "seed", "num_predict", "num_keep", "draft_num_predict")
# Accepted and ignored, as Ollama does (runner options and removed knobs).
IGNORED_OPTIONS = frozenset(
    {
        "num_ctx", "num_batch", "num_gpu", "main_gpu", "use_mmap", "num_thread",
        "mirostat", "mirostat_tau", "mirostat_eta", "low_vram", "f16_kv", "logits_all", "vocab_only", "use_mlock",
        "penalize_newline", "numa", "tfs_z", "embedding_only",
        "priority",  # scheduling, not sampling: read by the API layer (daemon/api/pipeline/options.py)
    }
)


class InvalidParams(ValueError):
    """A sampling option has the wrong type or is out of range; the message names it."""


@dataclass
class SamplingParams:
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.9
    min_p: float = 0.0
    typical_p: float = 1.0
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_last_n: int = 64  # 0 = off, -1 = the whole context
    seed: int = -1  # -1 = random
    num_predict: int = -1  # -1 = until a stop condition, -2 = until the context is full
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False  # an extension (llama-server, vLLM): end-of-generation tokens are never sampled
    num_keep: int = 4  # tokens (after BOS) a context shift keeps at the start; -1 = the whole prompt (Ollama's)
    shift: bool = False  # the window full: drop its middle and go on (Ollama's `shift`), else stop with "length"
    # speculative decoding (Ollama's option): -1 = as many draft tokens as pay (adaptive), 0 = none, N = N per step
    draft_num_predict: int = -1
    # the draft model that drafts for this request ("" = the model's own: its Modelfile DRAFT, else prompt lookup);
    # the model manager has loaded it beside the model before the request runs
    draft_model: str = ""
    # Not an option: special tokens whose text is part of the output (id -> bytes), the markers of the model's
    # reply format that the reply parser reads (harmony's <|channel|>); every other special token stays hidden.
    preserved_tokens: dict[int, bytes] = field(default_factory=dict, metadata={"option": False})

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        for name in _FLOAT_KEYS:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise InvalidParams(f"option {name!r} must be a finite number, got {v!r}")
            setattr(self, name, float(v))
        for name in _INT_KEYS:
            v = getattr(self, name)
            if isinstance(v, float) and v.is_integer():
                v = int(v)
                setattr(self, name, v)
            if isinstance(v, bool) or not isinstance(v, int):
                raise InvalidParams(f"option {name!r} must be an integer, got {v!r}")
        if self.temperature < 0:
            raise InvalidParams(f"option 'temperature' must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise InvalidParams(f"option 'top_k' must be >= 0 (0 = off), got {self.top_k}")
        for name in ("top_p", "min_p", "typical_p"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise InvalidParams(f"option {name!r} must be between 0 and 1, got {v}")
        if self.repeat_penalty <= 0:
            raise InvalidParams(f"option 'repeat_penalty' must be > 0, got {self.repeat_penalty}")
        if self.repeat_last_n < -1:
            raise InvalidParams(f"option 'repeat_last_n' must be >= -1, got {self.repeat_last_n}")
        if self.num_predict < -2:
            raise InvalidParams(f"option 'num_predict' must be -1, -2 or >= 0, got {self.num_predict}")
        if self.draft_num_predict < -1:
            raise InvalidParams(f"option 'draft_num_predict' must be -1 (adaptive), 0 (off) or a number of draft "
                                f"tokens, got {self.draft_num_predict}")
        if self.num_keep < -1:
            raise InvalidParams(f"option 'num_keep' must be -1 (the whole prompt) or >= 0, got {self.num_keep}")
        if not isinstance(self.draft_model, str):
            raise InvalidParams(f"option 'draft_model' must be a model name, got {self.draft_model!r}")
        if not isinstance(self.ignore_eos, bool) or not isinstance(self.shift, bool):
            bad = "ignore_eos" if not isinstance(self.ignore_eos, bool) else "shift"
            raise InvalidParams(f"option {bad!r} must be a boolean, got {getattr(self, bad)!r}")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if not isinstance(self.stop, list) or not all(isinstance(s, str) for s in self.stop):
            raise InvalidParams(f"option 'stop' must be a list of strings, got {self.stop!r}")
        self.stop = [s for s in self.stop if s]

    @property
    def greedy(self) -> bool:
        # Below this the softmax is argmax anyway, and dividing float32 logits by a denormal gives inf/NaN.
        return self.temperature < MIN_SAMPLING_TEMPERATURE

    @classmethod
    def from_options(cls, options: dict[str, Any] | None, defaults: dict[str, Any] | None = None) -> "SamplingParams":
        """Ollama precedence: built-in defaults < `defaults` (model PARAMETERs) < request `options`."""
        merged: dict[str, Any] = {}
        # `shift` is a request field (Ollama's), `preserved_tokens` the reply format's: neither is an option
        known = {f.name for f in fields(cls) if f.metadata.get("option", True)} - {"shift"}
        for layer in (defaults or {}, options or {}):
            if not isinstance(layer, dict):
                raise InvalidParams(f"options must be an object, got {type(layer).__name__}")
            for key, value in layer.items():
                if key in known:
                    if value is not None:
                        merged[key] = value
                elif key not in IGNORED_OPTIONS:
                    log.warning("invalid option provided: %s (ignored, as Ollama does)", key)
        return cls(**merged)
