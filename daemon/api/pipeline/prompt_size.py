"""Refusing a prompt that cannot fit by its size in characters, before it is rendered out and tokenized.

No token of a vocabulary stands for more than its longest piece (L bytes), so a text of more than
window x L characters needs more than `window` tokens: it cannot fit, whatever the tokenizer does with it.
That bound costs nothing to check, while rendering 50,000 chat messages and tokenizing the result costs
seconds to minutes of a worker (llama.cpp's tokenizer is slow on megabytes). L is measured once per loaded
tokenizer, and only when a request is big enough for the bound to matter: a few pieces sampled across the
vocabulary give a lower bound on L first (measuring all of a 262k-token vocabulary costs ~0.4 s on a CPU, which a
long prompt after each model load paid on its TTFT), and a text within window x that bound cannot be refused.
"""
from __future__ import annotations

import logging
import weakref
from typing import Any

from ...model_types import LoadedModel
from ..http.errors import APIError

log = logging.getLogger(__name__)

_longest: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()
_at_least: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()
SAMPLES = 2048  # pieces read for the lower bound (~2 ms)


def piece_lower_bound(model: LoadedModel) -> int:
    """Bytes of the longest of a sample of the vocabulary's pieces: the longest piece is at least this long."""
    tok = model.runner.tokenizer
    try:
        return _at_least[tok]
    except (KeyError, TypeError):
        pass
    n = 1
    try:
        step = max(1, int(tok.vocab_size) // SAMPLES)
        n = max(1, max((len(tok.token_bytes(t)) for t in range(0, int(tok.vocab_size), step)), default=1))
    except Exception:  # noqa: BLE001 - 1 is always a lower bound; the full measurement decides then
        log.debug("could not sample the vocabulary of %s", model.name, exc_info=True)
    try:
        _at_least[tok] = n
    except TypeError:
        pass
    return n


def longest_piece(model: LoadedModel) -> int | None:
    """Bytes of the longest token text (special tokens included) of the model's vocabulary; None if unknown."""
    tok = model.runner.tokenizer
    try:
        return _longest[tok]
    except (KeyError, TypeError):
        pass
    try:  # special tokens carry a one-byte marker there: one byte too many only loosens the bound
        n = max(1, max((len(t) for t in tok.grammar_vocab().tokens), default=1))
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
    if input_chars <= window * piece_lower_bound(model):  # ... nor at least window x a piece we know of
        return None
    n = longest_piece(model)
    return None if n is None else window * n


class ContextOverflow(APIError):
    """A prompt that does not fit its window, with the numbers; each API words it its own way (`as_openai`,
    `as_anthropic`). `tokens` is None where the prompt was refused by its size in characters (`chars`), before
    tokenizing. `minimal`: even the least a chat can be cut to (its system messages and latest message) is too long."""

    def __init__(self, model: str, window: int, trained: int, tokens: int | None, *, chars: int | None = None,
                 minimal: bool = False, hint: str = "") -> None:
        self.model, self.window, self.trained, self.tokens = model, window, trained, tokens
        self.chars, self.minimal, self.hint = chars, minimal, hint
        super().__init__(400, self._ollama())

    def _ollama(self) -> str:
        fix = f"shorten the prompt or raise num_ctx (up to {self.trained})"
        if self.tokens is None:
            per = self.chars // self.window if self.chars else 0
            return (f"the prompt is longer than the context length of model '{self.model}' ({self.window} tokens) "
                    f"can hold: over {self.chars} characters, and no token of its vocabulary is longer than {per} "
                    f"bytes; {fix}{self.hint}")
        kept = " with only its system messages and latest message kept (a message is never cut)" \
            if self.minimal else ""
        return (f"the prompt is {self.tokens} tokens{kept} but the context length of model '{self.model}' is "
                f"{self.window} tokens (it must leave room for at least one generated token); {fix}{self.hint}")

    def with_hint(self, hint: str) -> "ContextOverflow":
        """The same refusal with `hint` after Ollama's wording."""
        self.hint = hint
        self.message = self._ollama()
        self.args = (self.message,)
        return self

    def _count(self) -> str:
        return f"{self.tokens} tokens" if self.tokens is not None else \
            f"more than {self.window} tokens (over {self.chars} characters)"

    def as_openai(self, what: str = "messages", hint: str = "") -> APIError:
        """OpenAI's context_length_exceeded (chat: what = "messages"; completions: "prompt"; responses: "input")."""
        if what == "input":
            msg = (f"Your input exceeds the context window of this model: {self._count()}, and the context window "
                   f"is {self.window} tokens. Please adjust your input and try again.")
        else:
            some = "even its latest message with the system messages" if self.minimal else f"your {what}"
            msg = (f"This model's maximum context length is {self.window} tokens. However, {some} resulted in "
                   f"{self._count()}. Please reduce the length of the {what}.")
        return APIError(400, msg + hint, param=what, code="context_length_exceeded")

    def as_anthropic(self) -> APIError:
        """Anthropic's wording (Claude Code compacts its conversation on seeing it)."""
        n = self.tokens if self.tokens is not None else f"more than {self.window}"
        return APIError(400, f"prompt is too long: {n} tokens > {self.window} maximum")


def too_long(model: LoadedModel, window: int, limit: int) -> ContextOverflow:
    return ContextOverflow(model.name, window, model.trained_context, None, chars=limit)


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
