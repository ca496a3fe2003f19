"""How a prompt too long for its window is cut (daemon/api/overflow.py), as pure functions: a chat loses its oldest
turns (every system message and the latest message stay, a tool call keeps its results, the fewest turns go), a
single prompt keeps its start and end as Ollama's runner does, and a refusal carries the numbers."""
from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evenflow.daemon.api.overflow import cut_points, fit_chat, kept_from, truncate_ids
from evenflow.daemon.api.prompt_size import ContextOverflow

OVERHEAD = 3  # tokens a template adds per message


def size(msgs: list[dict[str, Any]]) -> int:
    return sum(OVERHEAD + len(m["content"]) for m in msgs)


class Measure:
    """A stand-in for render + tokenize: one token per character plus a per-message overhead; over `chars` it
    refuses by size alone, as the real character bound does."""

    def __init__(self, chars: int | None = None, window: int = 100) -> None:
        self.chars, self.window, self.calls = chars, window, 0

    def __call__(self, msgs: list[dict[str, Any]]) -> tuple[str, list[int], int]:
        self.calls += 1
        n = size(msgs)
        if self.chars is not None and n > self.chars:
            raise ContextOverflow("m", self.window, 10_000, None, chars=self.chars)
        return "x" * n, [0] * n, 0


def refuse(window: int):
    return lambda tokens, minimal: ContextOverflow("m", window, 10_000, tokens, minimal=minimal)


@st.composite
def chats(draw) -> list[dict[str, Any]]:
    """A system prompt (maybe), then turns: a user message, tool rounds (an assistant call, its results), maybe an
    answer; a system message now and then; the last turn may end on tool results (an agent loop)."""
    text = st.integers(0, 40).map(lambda n: "w" * n)
    msgs: list[dict[str, Any]] = []
    if draw(st.booleans()):
        msgs.append({"role": "system", "content": draw(text)})
    for turn in range(draw(st.integers(1, 8))):
        if draw(st.integers(0, 5)) == 0:
            msgs.append({"role": "system", "content": draw(text)})
        msgs.append({"role": "user", "content": draw(text)})
        for _ in range(draw(st.integers(0, 2))):
            msgs.append({"role": "assistant", "content": draw(text), "tool_calls": [{"function": {"name": "f"}}]})
            msgs += [{"role": "tool", "content": draw(text)} for _ in range(draw(st.integers(1, 2)))]
        if draw(st.booleans()):
            msgs.append({"role": "assistant", "content": draw(text)})
    for i, m in enumerate(msgs):
        m["i"] = i  # identity, to tell which messages stayed
    return msgs


def cut_of(msgs: list[dict[str, Any]], kept: list[dict[str, Any]]) -> int:
    """The index the kept chat starts at (its first non-system message, or where the system-only head ends)."""
    rest = [m for m in kept if m["role"] != "system"]
    return rest[0]["i"] if rest else len(msgs)


@settings(max_examples=300, deadline=None)
@given(msgs=chats(), window=st.integers(8, 400), chars=st.one_of(st.none(), st.integers(50, 500)))
def test_a_chat_loses_its_oldest_turns_and_nothing_else(msgs, window, chars) -> None:
    measure = Measure(chars, window)
    cuts = cut_points(msgs)
    try:
        fitted = fit_chat(msgs, measure, window, True, refuse(window))
    except ContextOverflow as e:
        least = kept_from(msgs, cuts[-1]) if cuts else msgs
        assert size(least) >= window or (chars is not None and size(least) > chars)  # even the least is too long
        assert e.tokens is None or e.tokens == size(least)
        assert e.tokens is None or e.minimal
        return
    kept = fitted.messages
    assert size(kept) < window and len(fitted.ids) == size(kept)
    assert [m for m in msgs if m["role"] == "system"] == [m for m in kept if m["role"] == "system"]
    assert kept[-1] is msgs[-1]  # the latest message stays
    c = cut_of(msgs, kept)
    assert kept == kept_from(msgs, c)  # one run from the cut to the end, after the earlier system messages
    if fitted.truncation is None:
        assert kept == msgs
        return
    assert c in cuts and msgs[c]["role"] != "tool"  # a cut is where a turn starts, or the latest call and results
    for j, m in enumerate(kept):  # every tool result still follows the assistant call it answers
        if m["role"] == "tool":
            k = j - 1
            while kept[k]["role"] == "tool":
                k -= 1
            assert kept[k]["role"] == "assistant" and kept[k].get("tool_calls")
    for earlier in cuts[: cuts.index(c)]:  # the fewest turns went: cutting any later would not have fitted
        before = kept_from(msgs, earlier)
        assert size(before) >= window or (chars is not None and size(before) > chars)
    t = fitted.truncation
    assert t.messages == sum(1 for m in msgs[:c] if m["role"] != "system")
    if chars is None or size(msgs) <= chars:
        assert not t.approximate and t.tokens == size(msgs) - size(kept)
    else:
        assert t.approximate and t.tokens > 0
    assert measure.calls <= 2 + math.ceil(math.log2(len(cuts) + 1))  # a binary search, not one render per message


def test_truncate_false_refuses_with_the_whole_prompts_tokens() -> None:
    msgs = [{"role": "system", "content": "s" * 10}] + [{"role": "user", "content": "u" * 30}] * 5
    with pytest.raises(ContextOverflow) as e:
        fit_chat(msgs, Measure(), 100, False, refuse(100))
    assert e.value.tokens == size(msgs) and not e.value.minimal
    assert "the prompt is 178 tokens but the context length of model 'm' is 100 tokens" in e.value.message


def test_the_latest_message_alone_too_long_is_refused_not_cut() -> None:
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "a"},
            {"role": "user", "content": "b" * 200}]
    with pytest.raises(ContextOverflow) as e:
        fit_chat(msgs, Measure(), 100, True, refuse(100))
    assert e.value.minimal and e.value.tokens == size([msgs[0], msgs[2]])
    assert "with only its system messages and latest message kept (a message is never cut)" in e.value.message
    assert e.value.as_anthropic().message == f"prompt is too long: {size([msgs[0], msgs[2]])} tokens > 100 maximum"
    oa = e.value.as_openai("messages")
    assert oa.code == "context_length_exceeded" and oa.param == "messages"
    assert "maximum context length is 100 tokens" in oa.message


def test_an_agent_loop_keeps_the_call_its_results_answer() -> None:
    call = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f"}}]}
    msgs = [{"role": "user", "content": "u" * 80}, call, {"role": "tool", "content": "r1"},
            {"role": "tool", "content": "r2"}]
    assert cut_points(msgs) == [1]
    fitted = fit_chat(msgs, Measure(), 40, True, refuse(40))
    assert fitted.messages == msgs[1:] and fitted.truncation.messages == 1


@pytest.mark.parametrize("window,keep,n", [(256, 5, 600), (256, 5, 256), (100, 99, 300), (100, 0, 101),
                                           (16, 200, 40)])
def test_a_single_prompt_keeps_its_start_and_end_as_ollama(window, keep, n) -> None:
    ids = list(range(n))
    cut = truncate_ids(ids, window, keep)
    k = min(keep, window - 1)
    limit = window - max((window - k) // 2, 1)  # Ollama's contextShiftPromptLimit
    assert len(cut) == limit < window
    assert cut[:k] == ids[:k] and cut[k:] == ids[n - (limit - k):] if limit > k else cut == ids[:k]
