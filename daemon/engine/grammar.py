"""Constrained decoding with llguidance: `format` / `response_format` -> a grammar -> one token mask per step.

A `GrammarCompiler` is built once per loaded model from the runner's `GrammarVocab` (plain data, so this
module never sees a backend); each constrained sequence owns a `Constraint` (an `LLMatcher`). Masks for all
the constrained rows of a step are computed together in llguidance's thread pool, into one bitmask.
"""
from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from typing import Any

import llguidance as llg
import numpy as np
from llguidance.numpy import fill_next_token_bitmask_par

from ...backends.base import Tokenizer
from .json_schema import SchemaError, check_finite, check_size, ollama_semantics

log = logging.getLogger(__name__)

# Ollama's JSON grammar (llama.cpp's json.gbnf) has an object at its root; so does OpenAI's json_object mode.
JSON_OBJECT_SCHEMA: dict[str, Any] = {"type": "object"}
# Compact separators and no free whitespace: a free-whitespace grammar lets a weak model emit blanks
# until num_predict runs out (llama.cpp's JSON grammar bounds its whitespace for the same reason).
# lenient: keywords it cannot enforce (an unknown string format) are ignored, as llama.cpp does, not refused.
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ", "lenient": True}


_SPECIAL_MARK = b"\xff"  # llguidance's first byte of a special token (backends.base.special_piece)


class GrammarError(ValueError):
    """`format` is not "json" nor a JSON schema the engine can compile; the message says why."""


def grammar_for_format(fmt: Any) -> str | None:
    """Ollama's `format` ("json", a JSON-schema object, ""/None for none) as an llguidance grammar; a schema
    is read as Ollama reads it (json_schema.ollama_semantics)."""
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        schema: Any = JSON_OBJECT_SCHEMA
    elif isinstance(fmt, dict):
        try:
            schema = _readable(fmt)
        except SchemaError as e:
            raise GrammarError(f"invalid JSON schema in format: {e}") from None
    else:
        raise GrammarError(f"invalid format: {json.dumps(fmt)}; expected \"json\" or a valid JSON Schema object")
    try:
        grammar = llg.LLMatcher.grammar_from_json_schema(json.dumps(schema), overrides=_JSON_OPTIONS)
    except (ValueError, TypeError) as e:
        raise GrammarError(f"invalid JSON schema in format: {e}") from None
    problem = llg.LLMatcher.validate_grammar(grammar)
    if problem and not problem.startswith("WARNING"):
        raise GrammarError(f"invalid JSON schema in format: {problem.strip()}")
    return grammar


def _readable(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` as Ollama reads it, once its size is known to compile fast (checked again after allOf merges
    objects) and a finite value satisfies it; SchemaError otherwise."""
    check_size(schema)
    schema = ollama_semantics(schema)
    check_size(schema)
    check_finite(schema)
    return schema


def grammar_for_tool_call(schema: dict[str, Any], prefix: str = "", suffix: str = "") -> str:
    """A JSON value of `schema` between two literal texts: a forced tool call in its template's markers
    (`<tool_call>\n` ... `\n</tool_call>`). The schema is read as `format` schemas are."""
    try:
        schema = _readable(schema)
    except SchemaError as e:
        raise GrammarError(f"invalid tool input_schema: {e}") from None
    body = json.dumps({**schema, "x-guidance": _JSON_OPTIONS})
    pieces = (json.dumps(prefix) if prefix else "", "call", json.dumps(suffix) if suffix else "")
    parts = " ".join(p for p in pieces if p)
    try:
        grammar = llg.grammar_from("lark", f"start: {parts}\ncall: %json {body}\n")
    except (ValueError, TypeError) as e:
        raise GrammarError(f"invalid tool input_schema: {e}") from None
    problem = llg.LLMatcher.validate_grammar(grammar)
    if problem and not problem.startswith("WARNING"):
        raise GrammarError(f"invalid tool input_schema: {problem.strip()}")
    return grammar


class GrammarCompiler:
    """One model's vocabulary in llguidance, built on first use (a second for a large vocab) and kept."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size  # logits width (may exceed the tokenizer's ids: padding rows)
        self._lock = threading.Lock()
        self._ll: llg.LLTokenizer | None = None
        self._executor: llg.LLExecutor | None = None

    def _lltokenizer(self) -> llg.LLTokenizer:
        with self._lock:
            if self._ll is None:
                self._ll = _build_lltokenizer(self._tokenizer.grammar_vocab(), self._vocab_size)
                self._executor = llg.LLExecutor()
            return self._ll

    def compile(self, grammar: str, start_after: str | None = None) -> "Constraint":
        """A fresh matcher for one sequence; GrammarError with llguidance's message if it cannot compile."""
        ll = self._lltokenizer()
        m = llg.LLMatcher(ll, grammar, log_level=0)
        if m.is_error():
            raise GrammarError(f"invalid format: {m.get_error()}")
        return Constraint(m, start_after)

    @property
    def executor(self) -> llg.LLExecutor:
        self._lltokenizer()
        assert self._executor is not None
        return self._executor


class _VocabWrapper:
    """The duck-typed tokenizer `llg.TokenizerWrapper` reads. llguidance requires its tokenizer to spell exactly
    the text it is given: a tokenization whose bytes differ (a SentencePiece `▁` prepended, a BOS) panics inside
    its mask computation, which then allows only end-of-generation tokens, so a grammar ended in an empty reply."""

    def __init__(self, tokens: list[bytes], special_ids: list[int], eos: int, bos: int | None, encode) -> None:
        self.tokens, self.special_token_ids = tokens, special_ids
        self.eos_token_id, self.bos_token_id = eos, bos
        self._encode = encode
        self._greedy: _GreedySpeller | None = None
        self._warned = False

    def __call__(self, text: str) -> list[int]:
        if isinstance(text, bytes):  # llguidance probes with bytes first; we take text only
            raise TypeError("text only")
        ids = self._encode(text)
        if spells(self.tokens, ids, text.encode("utf-8")):
            return ids
        # A tokenizer that breaks the contract of GrammarVocab.encode: spell it from the vocab instead.
        if not self._warned:
            self._warned = True
            log.warning("the grammar tokenizer spelled %r as %r; using greedy longest-match tokenization",
                        text, b"".join(self.tokens[i] for i in ids if 0 <= i < len(self.tokens)))
        if self._greedy is None:
            self._greedy = _GreedySpeller(self.tokens, set(self.special_token_ids))
        return self._greedy.encode(text.encode("utf-8"))


def spells(tokens: list[bytes], ids: list[int], data: bytes) -> bool:
    """Whether `ids` are exactly the bytes `data` in this vocabulary."""
    return all(0 <= i < len(tokens) for i in ids) and b"".join(tokens[i] for i in ids) == data


class _GreedySpeller:
    """Longest-match tokenization over the vocabulary's byte strings (special tokens excluded)."""

    def __init__(self, tokens: list[bytes], special: set[int]) -> None:
        self._ids: dict[bytes, int] = {}
        for i in reversed(range(len(tokens))):  # the lowest id wins among equal byte strings
            if i not in special and tokens[i]:
                self._ids[tokens[i]] = i
        self._longest = max(map(len, self._ids), default=1)

    def encode(self, data: bytes) -> list[int]:
        out, pos = [], 0
        while pos < len(data):
            for n in range(min(self._longest, len(data) - pos), 0, -1):
                tid = self._ids.get(data[pos:pos + n])
                if tid is not None:
                    out.append(tid)
                    pos += n
                    break
            else:
                raise GrammarError(f"the vocabulary has no token for byte 0x{data[pos]:02x}")
        return out


def _build_lltokenizer(vocab: Any, vocab_size: int) -> llg.LLTokenizer:
    tokens = list(vocab.tokens) + [b""] * max(0, vocab_size - len(vocab.tokens))
    eos = [e for e in vocab.eos_ids if 0 <= e < vocab_size]
    if not eos:
        raise GrammarError("this model has no end-of-generation token, so a grammar could never end")
    special = set(vocab.special_ids)
    # The engine ends a sequence on any end-of-generation id, so none may also stand for text in a grammar
    # (phi-3's user-defined "</s>", Qwen2's normal "</s>"): a grammar would pick it mid-string and end the reply.
    for e in eos:
        if not tokens[e].startswith(_SPECIAL_MARK):
            tokens[e] = _SPECIAL_MARK + (tokens[e] or f"<eos_{e}>".encode())
        special.add(e)
    wrapper = _VocabWrapper(tokens, sorted(special), eos[0], vocab.bos_id, vocab.encode)
    return llg.LLTokenizer(llg.TokenizerWrapper(wrapper), n_vocab=vocab_size, eos_token=eos)


@dataclass
class Constraint:
    """One sequence's grammar state. With `start_after` (a thinking end tag) it is free until that text
    has been generated, as Ollama leaves thinking unconstrained and constrains the answer."""

    matcher: llg.LLMatcher
    start_after: str | None = None
    _seen: str = ""

    @property
    def active(self) -> bool:
        return self.start_after is None

    def observe_text(self, text: str) -> None:
        """Before activation: watch the generated text for `start_after`."""
        if self.start_after is None:
            return
        self._seen = (self._seen + text)[-(len(self.start_after) + len(text)):]
        if self.start_after in self._seen:
            self.start_after = None

    def consume(self, token: int) -> bool:
        """Advance over a sampled token; False if the grammar rejects it or the matcher is in error.

        A matcher that failed while computing its mask allows only end-of-generation tokens, and accepts the
        one sampled: without the error check that ended the sequence as a normal, empty stop."""
        return bool(self.matcher.consume_token(token)) and not self.matcher.is_error()

    @property
    def finished(self) -> bool:
        """The grammar is complete: nothing but EOS can follow."""
        return self.matcher.is_stopped() and not self.matcher.is_error()

    @property
    def error(self) -> str:
        """llguidance's error, first line only (the rest is its parser state and a backtrace)."""
        return self.matcher.get_error().strip().split("\n", 1)[0]

    def fork(self) -> "Constraint":
        """An independent copy (n > 1 sequences sharing a prompt)."""
        return Constraint(self.matcher.deep_copy(), self.start_after)


def mask_rows(executor: llg.LLExecutor, logits: np.ndarray, rows: list[tuple[int, Constraint]]) -> None:
    """In place: -inf on every token the grammar forbids, for the given (row, constraint) pairs."""
    if not rows:
        return
    V = logits.shape[1]
    words = (V + 31) // 32
    bitmask = np.empty((len(rows), words), dtype=np.int32)
    fill_next_token_bitmask_par(executor, [(c.matcher, k) for k, (_, c) in enumerate(rows)], bitmask)
    allowed = np.unpackbits(bitmask.view(np.uint8), axis=1, bitorder="little")[:, :V].astype(bool)
    idx = np.array([r for r, _ in rows], dtype=np.int64)
    logits[idx] = np.where(allowed, logits[idx], -np.inf)
