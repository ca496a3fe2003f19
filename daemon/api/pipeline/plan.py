"""The first step of a local model request, before any model is held: what a dialect's plan step (ollama/plan.py,
openai/plan.py, ...) returns after the checks that need no model (a 400 there costs no load): how the request holds
its model (keep_alive, num_ctx, streamed or not) and what the prepare step gets besides the model and the request."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any



@dataclass
class Plan:
    """How a generation request holds its model and what its prepare step gets."""

    stream: bool
    keep_alive: float | None = None
    num_ctx: int | None = None  # the request's own window (Ollama's option); None: the model's default
    args: tuple[Any, ...] = ()  # the prepare step's arguments after the model, the request and the window
    load_only: bool = False  # Ollama's empty prompt or messages: load the model (unload it with keep_alive 0)


@dataclass
class EmbedPlan:
    """An embedding request's texts, and how it holds its model."""

    inputs: list[str]
    truncate: bool = True  # cut an input to the window (else a 400)
    keep_alive: float | None = None
    num_ctx: int | None = None
