"""Qwen2 / Qwen2.5: the Llama decoder with q/k/v biases (and usually tied embeddings on small sizes)."""
from __future__ import annotations

import dataclasses

from ...common.config import ModelArgs
from . import llama


class Model(llama.Model):
    def __init__(self, args: ModelArgs) -> None:
        # Qwen2 always has q/k/v biases, whatever config.json says (it has no attention_bias key).
        super().__init__(dataclasses.replace(args, attention_bias=True, qk_norm=False))
