"""The engine's per-token logprobs in each API's wire shape: Ollama's `logprobs` list, OpenAI chat's
`choices[].logprobs.content`, and the legacy completions object (tokens, token_logprobs, top_logprobs, text_offset)."""
from __future__ import annotations

import math
from typing import Any

from ...engine.logprobs import TokenLogprob

UNLIKELY = -9999.0  # what OpenAI reports for a token too unlikely to have a finite logprob


def _finite(logprob: float) -> float:
    """JSON has no infinities or NaN: a -inf (masked token) or NaN (a model with broken weights) is UNLIKELY."""
    return logprob if math.isfinite(logprob) else UNLIKELY


def _bytes(tokenizer: Any, token_id: int) -> bytes:
    try:
        return tokenizer.token_bytes(token_id)
    except (IndexError, ValueError):  # a padding row of the logits past the tokenizer's vocabulary
        return b""


def _entry(tokenizer: Any, token_id: int, logprob: float, omit_empty: bool = False) -> dict[str, Any]:
    """`token` is the token's text (invalid UTF-8 of a partial character replaced); `bytes` its raw bytes."""
    raw = _bytes(tokenizer, token_id)
    out: dict[str, Any] = {"token": raw.decode("utf-8", errors="replace"), "logprob": _finite(logprob)}
    if raw or not omit_empty:
        out["bytes"] = list(raw)
    return out


def ollama(tokenizer: Any, lps: list[TokenLogprob]) -> list[dict[str, Any]]:
    """Ollama's `[{token, logprob, bytes, top_logprobs?}]` (empty bytes and top_logprobs omitted, as Go's omitempty)."""
    out = []
    for lp in lps:
        e = _entry(tokenizer, lp.token_id, lp.logprob, omit_empty=True)
        if lp.top:
            e["top_logprobs"] = [_entry(tokenizer, t, v, omit_empty=True) for t, v in lp.top]
        out.append(e)
    return out


def openai_chat(tokenizer: Any, lps: list[TokenLogprob]) -> dict[str, Any]:
    """OpenAI's ChoiceLogprobs: `{"content": [{token, logprob, bytes, top_logprobs: [...]}], "refusal": null}`."""
    return {"content": [{**_entry(tokenizer, lp.token_id, lp.logprob),
                         "top_logprobs": [_entry(tokenizer, t, v) for t, v in lp.top]} for lp in lps],
            "refusal": None}


def legacy(tokenizer: Any, lps: list[TokenLogprob], starts: list[int], text: str, text_base: int = 0) -> dict[str, Any]:
    """The /v1/completions object. `starts[i]`: where the text streamed with token i begins in the choice's text;
    `text` is that text from `text_base` on. A token's `text_offset` is where its own text starts, or, when the
    token is part of a character split over several tokens, where that character starts."""
    def piece(t: int) -> str:
        return _bytes(tokenizer, t).decode("utf-8", errors="replace")

    tokens = [piece(lp.token_id) for lp in lps]
    offsets, cursor = [], 0
    for tok, start in zip(tokens, starts):
        cursor = max(cursor, start)
        offsets.append(cursor)
        if tok and text.startswith(tok, cursor - text_base):
            cursor += len(tok)
    return {"tokens": tokens, "token_logprobs": [_finite(lp.logprob) for lp in lps],
            "top_logprobs": [{piece(t): _finite(v) for t, v in lp.top} for lp in lps], "text_offset": offsets}
