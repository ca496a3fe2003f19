"""gpt-oss's harmony format, both ways. Out: a reply is messages `<|start|>assistant<|channel|>analysis<|message|>
...<|end|>`; the analysis channel is thinking, `final` (and plain `commentary`) is content, and a message to
`functions.NAME` (`<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>`) is a tool
call. `<|call|>` and `<|return|>` end generation, so the end of the output closes the last message too.
In: `think` levels become the template's `reasoning_effort`, and an assistant turn with several tool calls is
rendered as harmony has them, one call per message, each followed by its result."""
from __future__ import annotations

import re
from typing import Any

from .callargs import Call, Schema, json_values, make_call, no_schema

START, END, MESSAGE, CHANNEL = "<|start|>", "<|end|>", "<|message|>", "<|channel|>"
_ENDS = (END, "<|call|>", "<|return|>", START)  # what closes a message's body
_HEADER_MAX = 256  # a header this long without <|message|> is not harmony: the text is content
_CHANNEL = re.compile(r"<\|channel\|>\s*([^\s<]+)")
_RECIPIENT = re.compile(r"(?:^|\s)to=([^\s<]+)")


def _held(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest tail of `text` that could be the start of one of `markers`."""
    best = 0
    for m in markers:
        for n in range(min(len(m) - 1, len(text)), best, -1):
            if m.startswith(text[-n:]):
                best = n
                break
    return best


class HarmonyParser:
    """Streams a harmony reply into (thinking, content, calls); each call goes out when its message closes.
    Text that is not harmony (no header ever completes) comes back as content, never dropped."""

    def __init__(self, prompt_text: str = "", tools: bool = True, schema: Schema = no_schema) -> None:
        self.tools, self.schema = tools, schema
        # the reply continues the prompt's last message header (`<|start|>assistant`, or a forced final channel)
        i = prompt_text.rfind(START)
        tail = prompt_text[i + len(START):] if i != -1 else ""
        self.state, self.buf = "header", ""
        self.channel: str | None = None
        self.recipient: str | None = None
        self.args = ""  # a tool message's body so far
        self.head = ""  # its header, as written
        self.raw = False  # no harmony structure after all: everything is content
        self.implicit = 0
        closed = any(m in tail for m in _ENDS[:3])
        self._run(tail if tail and not closed else "assistant", emit=False)
        self.implicit = len(self.buf) if self.state == "header" else 0  # header text that is not the reply's

    # ---- API: feed(text, final) -> (thinking, content, calls)
    def feed(self, text: str, final: bool = False) -> tuple[str, str, list[Call]]:
        out = self._run(text, emit=True)
        if final:
            out = _join(out, self._finish())
        return out

    def _run(self, text: str, emit: bool) -> tuple[str, str, list[Call]]:
        thinking, content, calls = [], [], []
        if self.raw:
            return "", text, []
        self.buf += text
        while True:
            if self.state == "header":
                j = self.buf.find(MESSAGE)
                if (j if j != -1 else len(self.buf)) - self.implicit > _HEADER_MAX:  # not harmony: as it is
                    self.raw, rest = True, self.buf[self.implicit:]
                    self.buf = ""
                    content.append(rest)
                    break
                if j == -1:
                    break
                self._header(self.buf[:j])
                self.head = self.buf[self.implicit:j + len(MESSAGE)]  # as the reply wrote it
                self.buf, self.state, self.args, self.implicit = self.buf[j + len(MESSAGE):], "body", "", 0
            elif self.state == "body":
                ends = [(self.buf.find(m), m) for m in _ENDS if m in self.buf]
                if not ends:
                    keep = _held(self.buf, _ENDS)
                    self._route(self.buf[:len(self.buf) - keep], thinking, content)
                    self.buf = self.buf[len(self.buf) - keep:]
                    break
                at, marker = min(ends)
                self._route(self.buf[:at], thinking, content)
                self._close(content, calls)
                self.buf = self.buf[at + (0 if marker == START else len(marker)):]
                self.state = "between"
            else:  # between messages: a new header starts at <|start|> (or straight at <|channel|>)
                starts = [(self.buf.find(m), m) for m in (START, CHANNEL) if m in self.buf]
                if not starts:  # stray text (whitespace kept back: between messages it is nothing)
                    keep = _held(self.buf, (START, CHANNEL))
                    keep += len(self.buf) - keep - len(self.buf[:len(self.buf) - keep].rstrip())
                    if keep < len(self.buf):
                        content.append(self.buf[:len(self.buf) - keep])
                    self.buf = self.buf[len(self.buf) - keep:]
                    break
                at, marker = min(starts)
                if self.buf[:at].strip():
                    content.append(self.buf[:at])
                if marker == START:
                    self.buf, self.implicit = self.buf[at + len(START):], 0
                else:  # the model left out <|start|>assistant
                    self.buf, self.implicit = "assistant" + self.buf[at:], len("assistant")
                self.state = "header"
        if not emit:
            return "", "", []
        return "".join(thinking), "".join(content), calls

    def _header(self, header: str) -> None:
        m = _CHANNEL.search(header)
        self.channel = m.group(1) if m else None
        r = _RECIPIENT.search(header.replace(CHANNEL, " " + CHANNEL).replace("<|constrain|>", " <|constrain|>"))
        self.recipient = r.group(1) if r else None

    def _route(self, text: str, thinking: list[str], content: list[str]) -> None:
        if not text:
            return
        if self.recipient:
            self.args += text
        elif self.channel == "analysis":
            thinking.append(text)
        else:
            content.append(text)

    def _close(self, content: list[str], calls: list[Call]) -> None:
        """A message ended: a tool message becomes a call (or, not decoding, its text becomes content)."""
        if self.recipient:
            call = self._call(self.recipient, self.args) if self.tools else None
            if call is not None:
                calls.append(call)
            else:  # not a call after all (cut off, bad JSON, no tools asked for): the message as written
                content.append(self.head + self.args)
        self.channel, self.recipient, self.args = None, None, ""

    def _call(self, recipient: str, args: str) -> Call | None:
        found = json_values(args)
        if len(found) != 1 or args[:found[0][1]].strip() or args[found[0][2]:].strip():
            return None
        name = recipient[len("functions."):] if recipient.startswith("functions.") else recipient
        return make_call(name, found[0][0])

    def _finish(self) -> tuple[str, str, list[Call]]:
        """End of output: it closes the open message (`<|call|>`/`<|return|>` end generation unseen)."""
        thinking, content, calls = [], [], []
        if self.raw:
            return "", "", []
        if self.state == "body":
            self._route(self.buf, thinking, content)
            self._close(content, calls)
        elif self.state == "header":
            head = self.buf[self.implicit:]
            if head.strip() and (CHANNEL not in head or _RECIPIENT.search(head)):
                content.append(head)  # never harmony, or a call cut off in its header: the text as it came
        elif self.buf.strip():
            content.append(self.buf)
        self.buf, self.state = "", "between"
        return "".join(thinking), "".join(content), calls


def _join(a: tuple[str, str, list[Call]], b: tuple[str, str, list[Call]]) -> tuple[str, str, list[Call]]:
    return a[0] + b[0], a[1] + b[1], a[2] + b[2]


# ------------------------------------------------------------------------------------------ the prompt side

def reasoning_effort(think: bool | str | None) -> str | None:
    """The template's `reasoning_effort` for a `think` value, as Ollama maps it: a level is the effort ("max"
    is "high"); true, false or unset leave the template's default (medium): gpt-oss cannot stop thinking."""
    if isinstance(think, str) and think in ("low", "medium", "high", "max"):
        return "high" if think == "max" else think
    return None


def prompt_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as the gpt-oss template takes them: one tool call per assistant message, and a tool-calling
    turn's text beside its thinking folded into that thinking (the template refuses both; it renders either
    as the analysis message before the call)."""
    out = []
    for m in one_call_per_message(messages):
        if m.get("role") == "assistant" and m.get("tool_calls") and m.get("content") and m.get("thinking"):
            m = {**m, "thinking": f"{m['thinking']}\n\n{m['content']}", "content": ""}
        out.append(m)
    return out


def one_call_per_message(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An assistant turn with several tool calls as harmony renders them: one call per assistant message, each
    followed by its result (matched by tool_call_id, else in order); the turn's thinking stays with the first."""
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(messages):
        m = messages[i]
        calls = m.get("tool_calls") or []
        if m.get("role") != "assistant" or len(calls) < 2:
            out.append(m)
            i += 1
            continue
        j = i + 1
        results = []
        while j < len(messages) and messages[j].get("role") == "tool":
            results.append(messages[j])
            j += 1
        by_id = {r.get("tool_call_id"): r for r in results if r.get("tool_call_id")}
        rest = [r for r in results if not r.get("tool_call_id")]
        for n, call in enumerate(calls):
            out.append({**m, "tool_calls": [call]} if n == 0 else {"role": "assistant", "content": "",
                                                                    "tool_calls": [call]})
            result = by_id.pop(call.get("id"), None) if call.get("id") else None
            if result is None and rest:
                result = rest.pop(0)
            if result is not None:
                out.append(result)
        out += list(by_id.values()) + rest
        i = j
    return out
