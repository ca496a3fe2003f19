"""A model's output read back in its family's terms, streamed or all at once: thinking sections and tool calls
(formats.py picks the family from the template and the architecture). Streaming holds back only text that may
still turn out to be a marker, and a call goes out as soon as the format closes it. Whole = one final feed, so
a reply parses the same however it was split. What does not parse stays content: never dropped, never an error."""
from __future__ import annotations

from typing import Any

from .callargs import Call, Schema, no_schema, schema_of
from .formats import THINK, ReplyFormat, detect, warn_unknown
from .harmony import HarmonyParser
from .toolsyntax import SYNTAXES, ToolSyntax, parse_region


def held_prefix(text: str, markers: tuple[str, ...] | str) -> int:
    """Length of the longest tail of `text` that could be the start of one of `markers` (kept back)."""
    best = 0
    for m in (markers,) if isinstance(markers, str) else markers:
        for n in range(min(len(m) - 1, len(text)), best, -1):
            if m.startswith(text[-n:]):
                best = n
                break
    return best


def _hold(text: str, markers: tuple[str, ...], final: bool) -> int:
    """How much of `text`'s tail to keep back: what may start a marker, and the whitespace before it (whitespace
    next to a marker is not part of what it delimits)."""
    if final:
        return 0
    keep = held_prefix(text, markers)
    head = text[:len(text) - keep]
    return keep + len(head) - len(head.rstrip())


def _find_first(text: str, markers: tuple[str, ...]) -> tuple[int, str]:
    """The earliest occurrence of any marker: (index, marker), (-1, "") when none."""
    best, which = -1, ""
    for m in markers:
        i = text.find(m)
        if i != -1 and (best == -1 or i < best):
            best, which = i, m
    return best, which


class ThinkSplitter:
    """Splits output into (thinking, content) on the format's markers. A section opens at the start of the reply
    (or anywhere, for formats that interleave), or is open already when the prompt ended with its opening marker;
    it closes at its closing marker or where a tool call begins (`stops`). Whitespace around a section is not
    part of it, as Ollama trims it."""

    def __init__(self, tags: tuple[str, str] = THINK, *, opened: bool = False, anywhere: bool = False,
                 stops: tuple[str, ...] = ()) -> None:
        self.open, self.close = tags
        self.anywhere, self.stops = anywhere, stops
        self.state = "thinking" if opened else "start"  # start -> thinking -> content (-> thinking, anywhere)
        self.lead = True  # dropping the section's leading whitespace
        self.buf = ""

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        self.buf += text
        thinking, content = [], []
        while True:
            if self.lead:
                self.buf = self.buf.lstrip()
                if not self.buf:
                    break
                self.lead = False
            if self.state == "start":
                if self.buf.startswith(self.open):
                    self.buf, self.state, self.lead = self.buf[len(self.open):], "thinking", True
                    continue
                if self.open.startswith(self.buf) and not final:
                    break  # maybe the opening marker, arriving in pieces
                self.state = "content"
                continue
            if self.state == "thinking":
                at, marker = _find_first(self.buf, (self.close, *self.stops))
                if at != -1:
                    thinking.append(self.buf[:at].rstrip())
                    self.buf = self.buf[at + (len(marker) if marker == self.close else 0):]
                    self.state, self.lead = "content", True
                    continue
                keep = _hold(self.buf, (self.close, *self.stops), final)
                thinking.append(self.buf[:len(self.buf) - keep])
                self.buf = self.buf[len(self.buf) - keep:]
                break
            if self.anywhere:  # content, watching for another section
                at = self.buf.find(self.open)
                if at != -1:
                    content.append(self.buf[:at].rstrip())
                    self.buf, self.state, self.lead = self.buf[at + len(self.open):], "thinking", True
                    continue
                keep = _hold(self.buf, (self.open,), final)
                content.append(self.buf[:len(self.buf) - keep])
                self.buf = self.buf[len(self.buf) - keep:]
                break
            content.append(self.buf)
            self.buf = ""
            break
        return "".join(thinking), "".join(content)


class ToolCallStream:
    """Streams content until a tool call opens, then holds the rest back and parses it: each call as soon as the
    format's closing marker arrives, the rest at the end. Text a call leaves beside it comes back as content;
    a region that yields no call at all comes back as it was written."""

    def __init__(self, syntax: ToolSyntax, schema: Schema = no_schema) -> None:
        self.syntax, self.schema = syntax, schema
        self.pending = ""
        self.holding = False
        self.found_any = False  # this region produced a call
        self.emitted = False  # content went out (before any call; a leading-only call can no longer start)
        self.gap = ""  # whitespace between that content and the first call
        self.index = 0

    def _number(self, calls: list[Call]) -> list[dict[str, Any]]:
        out = []
        for c in calls:
            fn = c["function"]
            out.append({"function": {"index": self.index, "name": fn["name"], "arguments": fn["arguments"]}})
            self.index += 1
        return out

    def _closed_calls(self) -> list[dict[str, Any]]:
        """Calls whose closing marker has arrived, taken off `pending`."""
        closer = self.syntax.close
        done: list[Call] = []
        while closer and closer in self.pending:
            end = self.pending.index(closer) + len(closer)
            calls, left = parse_region(self.syntax, self.pending[:end], self.schema)
            if not calls or left.strip():
                break  # not one clean call: the end decides
            done += calls
            self.pending = self.pending[end:]
        self.found_any = self.found_any or bool(done)
        return self._number(done)

    def _stream(self, final: bool) -> str:
        """Content before any call: out at once, less what may start a call (and trailing whitespace, which a
        call opening after it would drop)."""
        s = self.syntax
        if s.leading:
            head = self.pending.lstrip()
            maybe = not self.emitted and (head.startswith(("{", s.open)) or (s.open.startswith(head) and not final))
            if maybe and head:
                self.holding = True
                return ""
            if not head and not final:
                return ""
            out, self.pending = self.pending, ""
            return out
        at, _ = _find_first(self.pending, s.opens)
        if at != -1:
            out = self.pending[:at].rstrip()
            self.gap, self.pending, self.holding = self.pending[len(out):at], self.pending[at:], True
            return out
        keep = _hold(self.pending, s.opens, final)
        out, self.pending = self.pending[:len(self.pending) - keep], self.pending[len(self.pending) - keep:]
        return out

    def feed(self, text: str, final: bool) -> tuple[str, list[dict[str, Any]]]:
        self.pending += text
        out = "" if self.holding else self._stream(final)
        self.emitted = self.emitted or bool(out)
        if not self.holding:
            return out, []
        if not final:
            return out, self._closed_calls()
        closed = self._closed_calls()
        calls, left = parse_region(self.syntax, self.pending, self.schema)
        if not calls and not self.found_any:
            tail = self.gap + self.pending  # no call at all: the text as it was written
        else:
            left = left.strip()
            tail = ("\n" if self.emitted and left else "") + left
        self.pending = ""
        return out + tail, closed + self._number(calls)


class MarkerDrop:
    """Removes marker texts that frame the answer (structure, not content) from a content stream."""

    def __init__(self, markers: tuple[str, ...]) -> None:
        self.markers, self.buf = markers, ""

    def feed(self, text: str, final: bool) -> str:
        self.buf += text
        for m in self.markers:
            self.buf = self.buf.replace(m, "")
        keep = 0 if final else held_prefix(self.buf, self.markers)
        out, self.buf = self.buf[:len(self.buf) - keep], self.buf[len(self.buf) - keep:]
        return out


class ReplyParser:
    """Splits a model's output into (thinking, content, tool calls), streamed (`feed`) or whole (`parse_all`),
    in the format of the model's family (template + architecture). Tool calls are looked for when the request
    gave tools; thinking when it asked for it, or when the model thinks anyway (the prompt opened a section,
    or the family always does)."""

    def __init__(self, template: str | None, prompt_text: str, think: bool | str | None,
                 tools: list[dict[str, Any]] | None, arch: str | None = None) -> None:
        fmt: ReplyFormat | None = detect(template, arch)
        schema = schema_of(tools)
        self.harmony = HarmonyParser(prompt_text, bool(tools), schema) if fmt and fmt.harmony else None
        self.splitter: ThinkSplitter | None = None
        self.tools: ToolCallStream | None = None
        self.drop: MarkerDrop | None = None
        self.count = 0  # harmony's calls numbered so far
        if self.harmony:
            return
        syntax = SYNTAXES.get(fmt.tools or "") if tools and fmt else None
        if tools and syntax is None:
            warn_unknown(template, arch, "tool calls")
        tags = fmt.think if fmt and fmt.think else THINK
        opened = bool(fmt and fmt.think_implicit) or prompt_text.rstrip().endswith(tags[0])
        anywhere = bool(fmt and fmt.think_anywhere)
        if think or opened or anywhere:
            stops = syntax.opens if syntax and fmt and fmt.calls_in_thinking else ()
            self.splitter = ThinkSplitter(tags, opened=opened, anywhere=anywhere, stops=stops)
        self.tools = ToolCallStream(syntax, schema) if syntax else None
        self.drop = MarkerDrop(fmt.drop) if fmt and fmt.drop else None

    def feed(self, text: str, final: bool) -> tuple[str, str, list[dict[str, Any]]]:
        if self.harmony:
            thinking, content, found = self.harmony.feed(text, final)
            return thinking, content, self._number(found)
        thinking, content = self.splitter.feed(text, final) if self.splitter else ("", text)
        calls: list[dict[str, Any]] = []
        if self.tools:
            content, calls = self.tools.feed(content, final)
        if self.drop:
            content = self.drop.feed(content, final)
        return thinking, content, calls

    def parse_all(self, text: str) -> tuple[str, str, list[dict[str, Any]]]:
        return self.feed(text, True)

    def _number(self, calls: list[Call]) -> list[dict[str, Any]]:
        start, self.count = self.count, self.count + len(calls)
        return [{"function": {"index": start + i, **c["function"]}} for i, c in enumerate(calls)]
