"""Reply formats (daemon/prompt/): every family's thinking and tool calls parsed streamed and whole, in every split
(char by char, and random splits), malformed or cut-off output kept as content, unknown formats passed through."""
from __future__ import annotations

import json
import logging
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evenflow.daemon.prompt import formats
from evenflow.daemon.prompt.reply import ReplyParser
from evenflow.daemon.prompt.tools import TOOL_FORMATS, format_tool_calls, parse_tool_calls
from reply_samples import PARIS, ROME, SAMPLES, TOOLS, Sample, call

IDS = [s.id for s in SAMPLES]


def parser(s: Sample, think: bool | str | None = None, tools: list | None = TOOLS) -> ReplyParser:
    think = think if think is not None else True if s.think is None else s.think  # the daemon's default: on
    return ReplyParser(s.markers, "...prompt..." + s.prompt_tail, think, tools, s.arch)


def feed_pieces(p: ReplyParser, pieces: list[str]) -> tuple[str, str, list]:
    """Feed the pieces in order (the last one final); what came out, joined, with the calls' indices dropped."""
    thinking, content, calls = "", "", []
    for i, piece in enumerate(pieces):
        t, c, k = p.feed(piece, i == len(pieces) - 1)
        thinking, content, calls = thinking + t, content + c, calls + k
    assert [c["function"]["index"] for c in calls] == list(range(len(calls)))
    return thinking, content, [{"function": {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}}
                               for c in calls]


def expected(s: Sample) -> tuple[str, str, list]:
    return s.thinking, s.content, s.calls


@pytest.mark.parametrize("s", SAMPLES, ids=IDS)
def test_whole_reply_parses(s: Sample) -> None:
    assert formats.detect(s.markers, s.arch).family == s.family
    assert feed_pieces(parser(s), [s.output]) == expected(s)


@pytest.mark.parametrize("s", SAMPLES, ids=IDS)
def test_char_by_char_equals_whole(s: Sample) -> None:
    assert feed_pieces(parser(s), list(s.output)) == expected(s)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
@pytest.mark.parametrize("s", SAMPLES, ids=IDS)
def test_random_splits_equal_whole(s: Sample, data: st.DataObject) -> None:
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(s.output) - 1)), max_size=12)))
    pieces = [s.output[a:b] for a, b in zip([0, *cuts], [*cuts, len(s.output)])]
    assert feed_pieces(parser(s), pieces) == expected(s)


def test_calls_stream_as_soon_as_closed() -> None:
    """A call goes out when the format closes it, before the rest of the reply has arrived; text before it at once."""
    for sid, closer in (("qwen3", "</tool_call>"), ("kimi", "<|tool_call_end|>"), ("gemma4", "<tool_call|>"),
                        ("dsml-v32", "</｜DSML｜invoke>"), ("glm-47-opened", "</tool_call>"),
                        ("lfm25", "<|tool_call_end|>"), ("harmony-call", "<|call|>")):
        s = next(x for x in SAMPLES if x.id == sid)
        first = s.output.index(closer) + len(closer)
        p = parser(s)
        _, content, calls = p.feed(s.output[:first], False)
        assert calls and [c["function"] for c in calls] == [{"index": i, **c["function"]} for i, c in
                                                            enumerate(s.calls[:len(calls)])], sid
        if s.content and s.output.index(s.content) < first:
            assert content.startswith(s.content.split()[0]), sid


def test_hermes_calls_out_one_by_one() -> None:
    """(Moved from test_api_ollama.) Two calls: the first goes out when its </tool_call> arrives, the text before
    them at once; a body that is not JSON gives nothing early and comes back as text at the end."""
    two = [call({"city": c}) for c in ("Paris", "Oslo")]
    first, second = format_tool_calls(two[:1], "hermes"), format_tool_calls(two[1:], "hermes")
    p = ReplyParser("<tool_call>", "", None, TOOLS)
    assert p.feed("Checking both. <tool_ca", False) == ("", "Checking both.", [])
    assert p.feed("ll>" + first[len("<tool_call>"):-3], False) == ("", "", [])
    assert p.feed(first[-3:] + "\n" + second[:5], False) == \
        ("", "", [{"function": {"index": 0, "name": "get_weather", "arguments": {"city": "Paris"}}}])
    assert p.feed(second[5:], True) == \
        ("", "", [{"function": {"index": 1, "name": "get_weather", "arguments": {"city": "Oslo"}}}])
    broken = ReplyParser("<tool_call>", "", None, TOOLS)
    assert broken.feed("<tool_call>not json</tool_call>", False) == ("", "", [])
    assert broken.feed("", True) == ("", "<tool_call>not json</tool_call>", [])
    thought = "<think>\nplan it</think>\n\nanswer"
    for step in (1, 2, 5):
        pieces = [thought[i:i + step] for i in range(0, len(thought), step)]
        assert feed_pieces(ReplyParser("<think>", "", True, None), pieces) == ("plan it", "answer", [])
    assert ReplyParser("<think>", "", True, None).parse_all("no tags here") == ("", "no tags here", [])
    opened = ReplyParser("<think>", "<|im_start|>assistant\n<think>\n", True, None)  # the template opened it
    assert opened.feed("still ", False) == ("still", "", [])
    assert opened.feed("thinking</th", False) == (" thinking", "", [])
    assert opened.feed("ink> done", True) == ("", "done", [])


def test_content_streams_promptly() -> None:
    """Only a possible marker is held back: ordinary text goes out with the piece that brought it."""
    s = next(x for x in SAMPLES if x.id == "qwen3")
    p = parser(s, think=False)
    assert p.feed("Hello wor", False) == ("", "Hello wor", [])
    assert p.feed("ld, all <too", False) == ("", "ld, all", [])  # "<too" may open a call, and the space before it
    assert p.feed("ls> are fine ", False) == ("", " <tools> are fine", [])
    assert p.feed("", True) == ("", " ", [])


# words that are structure in some format's markup (headers, keys), not text a user should see
STRUCTURE_WORDS = ("assistant functions commentary analysis final json constrain function parameter invoke string "
                   "true false name call thought channel arguments parameters tool_name tool_call_id")


@pytest.mark.parametrize("s", [s for s in SAMPLES if s.calls], ids=[s.id for s in SAMPLES if s.calls])
def test_cut_off_reply_never_fails_and_keeps_text(s: Sample) -> None:
    """num_predict can stop a reply anywhere: every prefix parses, the calls found are whole ones, and every word
    that is not structure comes back as thinking, content or inside a call: nothing is dropped."""
    allowed = " ".join(formats.detect(s.markers, s.arch).markers()) + " " + STRUCTURE_WORDS
    for n in range(0, len(s.output) + 1, max(1, len(s.output) // 60)):
        cut = s.output[:n]
        thinking, content, calls = feed_pieces(parser(s), [cut])
        assert calls == s.calls[:len(calls)]
        seen = thinking + content + json.dumps(calls)
        for word in re.findall(r"[A-Za-z]{4,}", cut):
            assert word in seen or word in allowed, (s.id, n, word)


def test_bad_arguments_stay_content() -> None:
    cases = {
        "qwen3": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par\n</tool_call>',
        "kimi": '<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>'
                '{"city": Paris}<|tool_call_end|><|tool_calls_section_end|>',
        "gemma4": '<|tool_call>call:get_weather{city:<|"|>Paris}<tool_call|>',
        "lfm25": '<|tool_call_start|>[get_weather(city=open("x"))]<|tool_call_end|>',
        "harmony-call": '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": <|call|>',
        "glm": "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</tool_call>",
    }
    for sid, text in cases.items():
        s = next(x for x in SAMPLES if x.id == sid)
        for pieces in ([text], list(text)):
            thinking, content, calls = feed_pieces(parser(s, think=False), pieces)
            assert calls == [], sid
            body = {"harmony-call": '{"city": ', "lfm25": 'open("x")', "gemma4": "Paris"}.get(sid, "city")
            assert body in content, (sid, content)


def test_one_good_call_beside_a_bad_one() -> None:
    s = next(x for x in SAMPLES if x.id == "qwen3")
    text = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
            "<tool_call>\nnot json\n</tool_call>")
    for pieces in ([text], list(text)):
        _, content, calls = feed_pieces(parser(s, think=False), pieces)
        assert calls == [call({"city": "Paris"})]
        assert "not json" in content


def test_no_tools_requested_means_no_call_parsing() -> None:
    s = next(x for x in SAMPLES if x.id == "qwen3")
    thinking, content, calls = feed_pieces(parser(s, tools=None), [s.output])
    assert calls == [] and thinking == "Two calls." and "<tool_call>" in content
    h = next(x for x in SAMPLES if x.id == "harmony-call")
    thinking, content, calls = feed_pieces(parser(h, tools=None), [h.output])
    assert calls == [] and thinking == "The user wants the weather." and '"Paris"' in content


def test_harmony_thinks_whatever_think_says() -> None:
    """gpt-oss cannot stop thinking: with think false its analysis channel is still thinking, never content."""
    s = next(x for x in SAMPLES if x.id == "harmony-final")
    for think in (False, None, "low", "high"):
        p = ReplyParser(s.markers, s.prompt_tail, think, None)
        assert feed_pieces(p, list(s.output)) == expected(s)
    # no markers at all (a backend that hid them): the text comes back as content, not dropped
    plain = "analysisThe user says hi.assistantfinalHello!"
    assert feed_pieces(parser(s, tools=None), list(plain)) == ("", plain, [])
    long = "x" * 300
    assert feed_pieces(parser(s, tools=None), [long[:100], long[100:]]) == ("", long, [])
    # a prompt that forced the final channel (a structured answer after thinking)
    forced = ReplyParser(s.markers, "<|start|>assistant<|channel|>final<|message|>", True, None)
    assert forced.parse_all('{"a": 1}') == ("", '{"a": 1}', [])


def test_think_opened_by_prompt_and_not() -> None:
    s = next(x for x in SAMPLES if x.id == "nemotron-v2")
    # the same words, but the prompt closed the section (thinking off): all content
    closed = ReplyParser(s.markers, "<SPECIAL_11>Assistant\n<think></think>", False, None)
    assert closed.parse_all("Hello.") == ("", "Hello.", [])
    # thinking not asked for, yet the prompt opened it: it is still thinking, not content
    opened = ReplyParser(s.markers, "<SPECIAL_11>Assistant\n<think>\n", False, None)
    assert opened.parse_all("Hmm.</think>Hello.") == ("Hmm.", "Hello.", [])


def test_unknown_format_passes_text_and_logs_once(caplog: pytest.LogCaptureFixture) -> None:
    template = "{% for m in messages %}{{ m.content }}{% endfor %}{# tools: a template no table knows #}"
    text = 'CALL get_weather {"city": "Paris"} <think>hm</think>'
    with caplog.at_level(logging.WARNING, logger="evenflow.daemon.prompt.formats"):
        for _ in range(3):
            p = ReplyParser(template, "prompt", None, TOOLS, "llama")
            assert feed_pieces(p, list(text)) == ("", text, [])
    lines = [r for r in caplog.records if "unknown reply format" in r.getMessage()]
    assert len(lines) == 1 and "sha256:" in lines[0].getMessage() and "llama" in lines[0].getMessage()


def test_architecture_picks_the_format_where_the_template_is_silent() -> None:
    assert formats.detect("{{ .Prompt }}", "gpt-oss").harmony
    assert formats.detect(None, "glm4moe").tools == "glm"
    assert formats.detect("{{ .Prompt }}", "llama") is None
    # a scripted test model runs as gpt2 and names the family it speaks
    assert formats.family_architecture("gpt2", {formats.SCRIPTED_ARCHITECTURE: "gpt-oss"}) == "gpt-oss"
    assert formats.family_architecture("qwen3", {}) == "qwen3"
    h = ReplyParser("{{ .Prompt }}", "", None, TOOLS, "gpt-oss")
    assert h.parse_all(SAMPLES[0].output) == ("The user wants the weather.", "",
                                              [{"function": {"index": 0, "name": "get_weather", "arguments": PARIS}}])


def test_schema_types_xml_arguments() -> None:
    """Text-valued parameters stay text when the tool says string, and become numbers where it does not."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "zip": {"type": "string"}, "n": {"type": "integer"}, "tags": {"type": "array"}}}}}]
    out = ("<tool_call>\n<function=f>\n<parameter=zip>\n01234\n</parameter>\n<parameter=n>\n7\n</parameter>\n"
           "<parameter=tags>\n[\"a\", \"b\"]\n</parameter>\n</function>\n</tool_call>")
    p = ReplyParser("<tool_call><function=", "", None, tools)
    assert p.parse_all(out)[2] == [{"function": {"index": 0, "name": "f",
                                                 "arguments": {"zip": "01234", "n": 7, "tags": ["a", "b"]}}}]
    glm = "<tool_call>f\n<arg_key>zip</arg_key>\n<arg_value>01234</arg_value>\n</tool_call>"
    assert ReplyParser("<arg_key>", "", None, tools).parse_all(glm)[2][0]["function"]["arguments"] == {"zip": "01234"}


@pytest.mark.parametrize("fmt", TOOL_FORMATS)
def test_written_calls_parse_back(fmt: str) -> None:
    calls = [call(PARIS), call(ROME)] if fmt != "harmony" else [call(PARIS)]
    assert parse_tool_calls(format_tool_calls(calls, fmt), fmt) == calls


def test_pythonic_calls_are_never_evaluated() -> None:
    from evenflow.daemon.prompt.callargs import pythonic_calls

    assert pythonic_calls("[f(a=__import__('os').system('true'))]") is None
    assert pythonic_calls("[f(a=[1, {'b': None}], c=true)]") == [
        {"function": {"name": "f", "arguments": {"a": [1, {"b": None}], "c": True}}}]
    assert pythonic_calls("[f(1)]") is None and pythonic_calls("[x]") is None


FAMILY_SAMPLES = {s.family: s for s in reversed(SAMPLES)}  # one sample per family: its markers and prompt


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
@pytest.mark.parametrize("s", list(FAMILY_SAMPLES.values()), ids=list(FAMILY_SAMPLES))
def test_any_text_parses_the_same_however_split(s: Sample, data: st.DataObject) -> None:
    """Arbitrary mixes of a family's markers, JSON, words and whitespace (well-formed or not): every split gives
    what the whole gives, and nothing raises."""
    fmt = formats.detect(s.markers, s.arch)
    pieces = [*fmt.markers(), *fmt.markers(), "get_weather", "functions.get_weather", ' {"city": "Paris"}', "{", "}",
              "[", "]", '"', "\n", " ", "  ", "<", "|", ">", "hello", "Paris", "=", ":", "call:", "assistant",
              " to=functions.get_weather", "analysis", "final", "commentary", "json"]
    text = "".join(data.draw(st.lists(st.sampled_from(pieces), max_size=30)))
    whole = feed_pieces(parser(s), [text])
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(text) - 1)), max_size=10))) if len(text) > 1 else []
    split = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    assert feed_pieces(parser(s), split) == whole
    assert feed_pieces(parser(s), list(text) or [""]) == whole
