"""Streaming text: UTF-8 split across tokens, lone bytes, and stop strings across token boundaries."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from evenflow.daemon.engine import Engine, EngineConfig, SamplingParams
from evenflow.daemon.engine.detokenizer import IncrementalDetokenizer
from toy_runner import ToyRunner


def feed(det: IncrementalDetokenizer, pieces: list[bytes]) -> list[str]:
    return [det.add(p) for p in pieces] + [det.flush()]


@settings(max_examples=200, deadline=None)
@given(text=st.text(min_size=0, max_size=40), cuts=st.lists(st.integers(1, 4), min_size=1, max_size=200))
def test_multibyte_utf8_split_anywhere_streams_without_mojibake(text, cuts):
    data = text.encode("utf-8")
    pieces, i, c = [], 0, 0
    while i < len(data):
        n = cuts[c % len(cuts)]
        pieces.append(data[i:i + n])
        i += n
        c += 1
    out = feed(IncrementalDetokenizer(), pieces)
    assert "".join(out) == text
    assert all("\ufffd" not in o for o in out)


def test_lone_bytes_become_replacement_chars_without_stalling():
    det = IncrementalDetokenizer()
    assert det.add(b"a") == "a"
    assert det.add(b"\xe2") == ""  # could still become a 3-byte character: held
    assert det.add(b"\x82") == ""
    assert det.add(b"\xac") == "\u20ac"
    assert det.add(b"\x80") == "\ufffd"  # a continuation byte with no lead can never be valid
    assert det.add(b"\xf0") == "" and det.flush() == "\ufffd"


@settings(max_examples=200, deadline=None)
@given(prefix=st.text(alphabet="ab#\n", max_size=20), stop=st.text(alphabet="ab#\n", min_size=1, max_size=4),
       suffix=st.text(alphabet="ab#\n", max_size=10), size=st.integers(1, 3))
def test_stop_strings_split_across_tokens(prefix, stop, suffix, size):
    text = prefix + stop + suffix
    pieces = [text[i:i + size].encode() for i in range(0, len(text), size)]
    det = IncrementalDetokenizer([stop])
    out = "".join(det.add(p) for p in pieces if not det.stopped) + det.flush()
    assert det.stopped
    assert out == text[: text.find(stop)]
    assert stop not in out


def test_held_back_text_is_released_when_no_stop_matches():
    det = IncrementalDetokenizer(["STOP"])
    assert det.add(b"hello ST") == "hello "
    assert det.add(b"O") == ""
    assert det.add(b"p") == "STOp"
    assert det.add(b" ST") == " "
    assert det.flush() == "ST"


def test_engine_streams_multibyte_text_and_stops_on_a_string():
    """Byte-level toy tokens: every multi-byte character is split across tokens."""
    runner = ToyRunner(eos_bias=-100)
    eng = Engine(runner, EngineConfig())
    free_run = eng.submit([1, 2, 3], SamplingParams(temperature=0, num_predict=40), loop=None)
    while eng.run_once():
        pass
    deltas = list(free_run)
    raw = bytes(t for d in deltas for t in d.token_ids)
    assert "".join(d.text for d in deltas) == raw.decode("utf-8", errors="replace")
    full = raw.decode("utf-8", errors="replace")
    stop = full[10:13]
    stopped = eng.submit([1, 2, 3], SamplingParams(temperature=0, num_predict=40, stop=[stop]), loop=None)
    while eng.run_once():
        pass
    deltas = list(stopped)
    assert deltas[-1].done_reason == "stop"
    assert "".join(d.text for d in deltas) == full[: full.find(stop)]
