"""Refusing a prompt that cannot fit by its size in characters, before it is rendered out and tokenized.

No token of a vocabulary stands for more than its longest piece (L bytes), so a text of more than
window x L characters needs more than `window` tokens: it cannot fit, whatever the tokenizer does with it.
That bound costs nothing to check, while rendering 50,000 chat messages and tokenizing the result costs
seconds to minutes of a worker (llama.cpp's tokenizer is slow on megabytes). L is measured once per loaded
tokenizer, and only when a request is big enough for the bound to matter.
"""
from __future__ import annotations

import logging
import weakref
from typing import Any

from ..manager import LoadedModel
from .errors import APIError

log = logging.getLogger(__name__)

_longest: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()


def longest_piece(model: LoadedModel) -> int | None:
    """Bytes of the longest token text (special tokens included) of the model's vocabulary; None if unknown."""
    tok = model.runner.tokenizer
    try:
        return _longest[tok]
    except (KeyError, TypeError):
        pass
    vocab = getattr(tok, "grammar_vocab", None)
    if vocab is None:
        return None
    try:  # special tokens carry a one-byte marker there: one byte too many only loosens the bound
        n = max(1, max((len(t) for t in vocab().tokens), default=1))
    except Exception:  # noqa: BLE001 - without the bound the tokenizer still decides, only later
        log.warning("could not measure the vocabulary of %s", model.name, exc_info=True)
        return None
    try:
        _longest[tok] = n
    except TypeError:  # a tokenizer that cannot be weakly referenced is measured each time
        pass
    return n


def char_limit(model: LoadedModel, window: int, input_chars: int) -> int | None:
    """The most characters a prompt for `window` tokens can have; None when the input is too small to matter
    (`input_chars`: the request's own text, which the rendered prompt mostly consists of)."""
    if input_chars <= window:  # the bound is at least `window` characters: nothing to measure for it
        return None
    n = longest_piece(model)
    return None if n is None else window * n


def too_long(model: LoadedModel, window: int, limit: int) -> APIError:
    return APIError(400, f"the prompt is longer than the context length of model '{model.name}' ({window} tokens) "
                         f"can hold: over {limit} characters, and no token of its vocabulary is longer than "
                         f"{limit // window} bytes; shorten the prompt or raise num_ctx (up to "
                         f"{model.trained_context})")


def check_text(model: LoadedModel, text: str, window: int, limit: int | None) -> None:
    """400 before tokenizing a text that cannot fit `window`."""
    if limit is None:
        limit = char_limit(model, window, len(text))
    if limit is not None and len(text) > limit:
        raise too_long(model, window, limit)


def chat_chars(messages: list[dict[str, Any]]) -> int:
    """The characters of a chat's text fields (what a template mostly copies into the prompt)."""
    total = 0
    for m in messages:
        for k in ("content", "thinking"):
            v = m.get(k)
            if isinstance(v, str):
                total += len(v)
    return total
