"""A prompt longer than its window: Ollama's `truncate`, said out loud.

A chat drops its oldest turns until it fits, as Ollama's chatPrompt does, keeping every system message and the latest
message, and more carefully: it is cut only where a user turn starts (or at the latest message, with the tool calls
its tool results answer), so a tool call never loses its result and a message is never cut inside; when even that
does not fit, the request is refused with the numbers. A single prompt (/api/generate, /v1/completions) keeps its
first num_keep tokens and its end, as Ollama's runner does. Every cut is reported: the `Truncation` goes into the
final response, a header, an /api/events event and a WARNING line (`announce`)."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

from ...model_types import LoadedModel
from . import prompt_size, prompting
from .prompt_size import ContextOverflow, chat_chars

log = logging.getLogger(__name__)

HEADER = "X-Evenflow-Truncated"


@dataclass
class Truncation:
    """What a request's prompt lost to fit its window."""

    messages: int  # chat messages dropped from the start (system messages are kept); 0 for a single prompt
    tokens: int  # prompt tokens dropped
    approximate: bool = False  # `tokens` estimated from the characters (a prompt too long to tokenize whole)

    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = {"messages": self.messages, "tokens": self.tokens}
        if self.approximate:
            out["approximate"] = True
        return out

    def header(self) -> str:
        """An RFC 8941 dictionary, e.g. `messages=3, tokens=5210`."""
        return ", ".join(f"{k}={'?1' if v is True else v}" for k, v in self.report().items())


def report(truncation: Truncation | None, metrics: Any | None) -> dict[str, Any] | None:
    """The final response's `truncated` object: the prompt's cut and the context shifts while generating."""
    out = truncation.report() if truncation is not None else {}
    if metrics is not None and metrics.shifts:
        out.update(shifts=metrics.shifts, shifted_tokens=metrics.shifted_tokens)
    return out or None


@dataclass
class Fitted:
    """A chat prompt that fits: the messages kept, their text and ids, and what was dropped (None: nothing)."""

    messages: list[dict[str, Any]]
    text: str
    ids: list[int]
    truncation: Truncation | None = None


Measure = Callable[[list[dict[str, Any]]], tuple[str, list[int], int]]  # messages -> (text, ids, extra tokens)


def cut_points(messages: list[dict[str, Any]]) -> list[int]:
    """Where a chat may start once its oldest messages go: at a user turn, or at the latest message (back over the
    tool results it ends with, to the call they answer). Ascending; empty when nothing can go."""
    last = len(messages) - 1
    while last > 0 and messages[last].get("role") == "tool":
        last -= 1
    cuts = [i for i in range(1, last) if messages[i].get("role") == "user"]
    return cuts + [last] if last > 0 else []


def kept_from(messages: list[dict[str, Any]], cut: int) -> list[dict[str, Any]]:
    """The chat from `cut` on, after the system messages of what went (Ollama's order)."""
    return [m for m in messages[:cut] if m.get("role") == "system"] + messages[cut:]


def fit_chat(messages: list[dict[str, Any]], measure: Measure, window: int, truncate: bool,
             overflow: Callable[[int, bool], ContextOverflow]) -> Fitted:
    """The longest end of the chat whose prompt fits `window` (room left for one generated token). `measure`
    renders and tokenizes (the extra tokens: what the ids do not count, images), raising ContextOverflow for a
    prompt too long by its characters alone; `overflow(tokens, minimal)` is the refusal with the numbers. A binary
    search over the cut points: O(log n) renders, each bounded by the window."""
    full: tuple[str, list[int], int] | None = None
    over: ContextOverflow | None = None
    try:
        full = measure(messages)
    except ContextOverflow as e:
        over = e
    if full is not None and _size(full) < window:
        return Fitted(messages, full[0], full[1])
    if not truncate:
        raise over if over is not None else overflow(_size(full), False)  # type: ignore[arg-type]
    cuts = cut_points(messages)
    best: tuple[int, tuple[str, list[int], int]] | None = None
    least: tuple[str, list[int], int] | ContextOverflow | None = over if not cuts else None  # the shortest tried
    lo, hi = 0, len(cuts) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        try:
            got: tuple[str, list[int], int] | ContextOverflow = measure(kept_from(messages, cuts[mid]))
        except ContextOverflow as e:
            got = e
        if not isinstance(got, ContextOverflow) and _size(got) < window:
            best, hi = (cuts[mid], got), mid - 1
        else:
            lo = mid + 1
            if mid == len(cuts) - 1:
                least = got
    if best is None:
        if least is None:  # nothing could go: the chat is its latest message (and system messages)
            least = full
        raise least if isinstance(least, ContextOverflow) else overflow(_size(least), True)  # type: ignore
    cut, (text, ids, extra) = best
    kept = kept_from(messages, cut)
    dropped = sum(1 for m in messages[:cut] if m.get("role") != "system")
    if full is not None:
        tokens, approx = _size(full) - len(ids) - extra, False
    else:  # the whole chat was too long to render: its tokens estimated from the characters
        total, kept_chars = chat_chars(messages), max(chat_chars(kept), 1)
        tokens, approx = round((len(ids) + extra) * (total / kept_chars - 1)), True
    return Fitted(kept, text, ids, Truncation(dropped, max(tokens, 0), approx))


def _size(measured: tuple[str, list[int], int]) -> int:
    return len(measured[1]) + measured[2]


def keep_tokens(num_keep: int, prompt_len: int, adds_bos: bool) -> int:
    """Ollama's num_keep as tokens: -1 = the whole prompt; after BOS where the model adds one."""
    return (prompt_len if num_keep < 0 else num_keep) + (1 if adds_bos else 0)


def truncate_ids(ids: list[int], window: int, keep: int) -> list[int]:
    """Ollama's cut of a single prompt (its first context shift): the first `keep` tokens, then the end, so that
    about half the window is left for the reply (llm/llama_server.go's contextShiftPromptLimit)."""
    keep = max(0, min(keep, window - 1))
    limit = window - max((window - keep) // 2, 1)
    return ids[:keep] + (ids[len(ids) - (limit - keep):] if limit > keep else [])


def refusal(model: LoadedModel, window: int, tokens: int, minimal: bool = False, hint: str = "") -> ContextOverflow:
    return ContextOverflow(model.name, window, model.trained_context, tokens, minimal=minimal, hint=hint)


def fit_prompt(model: LoadedModel, text: str, add_special: bool, context: list[int], window: int,
               limit: int | None, num_keep: int, truncate: bool) -> tuple[list[int], Truncation | None]:
    """A single prompt's ids (after `context`), cut to the window when `truncate`: its first num_keep tokens and its
    end. A text over the character bound `limit` is tokenized only near its ends (the kept tokens far from the cut)."""
    adds_bos = add_special and model.runner.tokenizer.add_bos
    if limit is None or len(text) <= limit:
        ids = context + prompting.encode(model, text, add_special=add_special)
        if len(ids) < window:
            return ids, None
        if not truncate:
            raise refusal(model, window, len(ids))
        cut = truncate_ids(ids, window, keep_tokens(num_keep, len(ids), adds_bos))
        return cut, Truncation(0, len(ids) - len(cut))
    if not truncate:
        raise prompt_size.too_long(model, window, limit)
    longest = max(limit // window, 1)
    keep = keep_tokens(num_keep, window, adds_bos)  # -1: as much of the start as the window takes
    head = context + prompting.encode(model, text[: 2 * (min(keep, window) + 1) * longest], add_special=add_special)
    tail_text = text[-2 * limit:]
    tail = prompting.encode(model, tail_text, add_special=False)
    cut = truncate_ids(head[:keep] + tail, window, keep)
    whole = len(context) + round(len(text) * len(tail) / max(len(tail_text), 1))  # the tail's tokens per character
    return cut, Truncation(0, max(whole - len(cut), 0), approximate=True)


def announce(events: Any, endpoint: str, model: str, seq_id: int, prompt_tokens: int, window: int,
             truncation: Truncation) -> None:
    """The WARNING line and the /api/events event of a truncated prompt (the response tells its client)."""
    what = f"{truncation.messages} oldest messages and " if truncation.messages else ""
    log.warning("request %d (%s %s): the prompt did not fit the context of %d tokens; dropped %s%s%d tokens "
                "(%d kept)", seq_id, endpoint, model, window, what, "about " if truncation.approximate else "",
                truncation.tokens, prompt_tokens)
    events.publish({"type": "request", "event": "truncated", "time": time.time(), "model": model, "seq_id": seq_id,
                    "user": {"model": model, "endpoint": endpoint}, "prompt_tokens": prompt_tokens,
                    "window": window, **truncation.report()})
