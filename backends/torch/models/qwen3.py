"""Qwen3 (dense): the Llama decoder with per-head RMSNorm on q and k before RoPE, no q/k/v biases."""
from __future__ import annotations

import dataclasses

from ...common.config import ModelArgs
from . import llama


class Model(llama.Model):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__(dataclasses.replace(args, qk_norm=True))
