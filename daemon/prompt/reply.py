"""A model's output read back in its template's terms, streamed or all at once: thinking sections (`<think>`
... `</think>`, or the template's own tags) and tool calls in the template's format."""
from __future__ import annotations

from typing import Any

from .tools import TOOL_CALL_PREFIX, TOOL_CALL_SUFFIX, extract_tool_calls, tool_format_for


def _held_prefix(text: str, marker: str) -> int:
    """Length of the longest tail of `text` that could be the start of `marker` (kept back while streaming)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class ThinkSplitter:
    """Splits streamed output into (thinking, content) on `<think>`/`</think>`; starts inside the section when
    the rendered prompt already opened it. Leading whitespace of each section is dropped, as Ollama does."""

    def __init__(self, think: Any, prompt: str = "", open_tag: str = "<think>", close_tag: str = "</think>") -> None:
        self.open, self.close = open_tag, close_tag
        opened = prompt.rstrip().endswith(open_tag)
        self.state = "thinking" if opened else "start"  # start -> thinking -> content
        self.lead = True  # still dropping the section's leading whitespace
        self.buf = ""

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        self.buf += text
        thinking, content = "", ""
        while True:
            if self.lead:
                self.buf = self.buf.lstrip()
                if not self.buf:
                    return thinking, content
            if self.state == "start":
                if self.buf.startswith(self.open):
                    self.buf = self.buf[len(self.open):]
                    self.state, self.lead = "thinking", True
                    continue
                if self.open.startswith(self.buf) and not final:
                    return thinking, content  # maybe the opening tag, arriving in pieces
                self.state, self.lead = "content", False
                continue
            if self.state == "thinking":
                self.lead = False
                idx = self.buf.find(self.close)
                if idx != -1:
                    thinking += self.buf[:idx]
                    self.buf = self.buf[idx + len(self.close):]
                    self.state, self.lead = "content", True
                    continue
                keep = 0 if final else _held_prefix(self.buf, self.close)
                thinking += self.buf[: len(self.buf) - keep]
                self.buf = self.buf[len(self.buf) - keep:]
                return thinking, content
            self.lead = False
            content += self.buf
            self.buf = ""
            return thinking, content

    def split_all(self, text: str) -> tuple[str, str]:
        return self.feed(text, final=True)


class ToolCallStream:
    """Streams content until the model starts a tool call (the format's opening marker), then holds the rest
    back and parses it into Ollama's `tool_calls`: each call as soon as it is closed where the format closes
    calls (`</tool_call>`), else at the end."""

    def __init__(self, template: str | None) -> None:
        self.template = template
        self.fmt = tool_format_for(self.template)
        self.marker = TOOL_CALL_PREFIX.get(self.fmt or "", "")
        self.pending = ""  # text not yet sent (maybe a tool call)
        self.holding = False
        self.index = 0
        self.sent_any = False

    def _number(self, calls: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
        out = []
        for c in calls or []:
            fn = c.get("function", {})
            out.append({"function": {"index": self.index, "name": fn.get("name", ""),
                                     "arguments": fn.get("arguments") or {}}})
            self.index += 1
        return out

    def _calls(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        content, calls = extract_tool_calls(text, self.fmt)
        return content, self._number(calls)

    def _closed_calls(self) -> list[dict[str, Any]]:
        """Calls whose closing tag has arrived (hermes' `</tool_call>`), taken off `pending`."""
        closer = TOOL_CALL_SUFFIX.get(self.fmt or "")
        done: list[dict[str, Any]] = []
        while closer and closer in self.pending:
            end = self.pending.index(closer) + len(closer)
            content, calls = extract_tool_calls(self.pending[:end], self.fmt)
            if not calls or content.strip():
                break  # not one clean call: what is left gets parsed at the end
            done += self._number(calls)
            self.pending = self.pending[end:]
        return done

    def feed(self, text: str, final: bool) -> tuple[str, list[dict[str, Any]]]:
        self.pending += text
        if not self.marker:
            out, self.pending = self.pending, ""
            return out, []
        out = ""
        if not self.holding:
            if self.fmt == "llama3":  # a JSON call is the whole answer: it must come first
                head = self.pending.lstrip()
                if not self.sent_any and (head.startswith(("{", "<|python_tag|>")) or
                                          (not head and not final) or "<|python_tag|>".startswith(head) and head):
                    self.holding = bool(head)
                else:
                    out, self.pending = self.pending, ""
                    self.sent_any = self.sent_any or bool(out)
                    return out, []
            else:
                idx = self.pending.find(self.marker)
                if idx == -1:
                    keep = 0 if final else _held_prefix(self.pending, self.marker)
                    out = self.pending[: len(self.pending) - keep]
                    self.pending = self.pending[len(self.pending) - keep:]
                    self.sent_any = self.sent_any or bool(out)
                    return out, []
                out, self.pending = self.pending[:idx], self.pending[idx:]  # the text before the call streams
                self.sent_any = self.sent_any or bool(out)
                self.holding = True
        if not final:
            return out, self._closed_calls()
        content, calls = self._calls(self.pending)
        self.pending = ""
        return out + content, calls

    def parse_all(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        return self._calls(text)


class ReplyParser:
    """Splits a model's output into (thinking, content, tool calls), streamed or all at once; each part is
    only looked for when the request asked for it (think, tools)."""

    def __init__(self, template: str | None, prompt_text: str, think: bool | str | None,
                 tools: list[dict[str, Any]] | None) -> None:
        self.splitter = ThinkSplitter(think, prompt_text) if think else None
        self.tools = ToolCallStream(template) if tools else None

    def feed(self, text: str, final: bool) -> tuple[str, str, list[dict[str, Any]]]:
        thinking, content = self.splitter.feed(text, final) if self.splitter else ("", text)
        calls: list[dict[str, Any]] = []
        if self.tools:
            content, calls = self.tools.feed(content, final)
        return thinking, content, calls

    def parse_all(self, text: str) -> tuple[str, str, list[dict[str, Any]]]:
        thinking, content = self.splitter.split_all(text) if self.splitter else ("", text)
        calls: list[dict[str, Any]] = []
        if self.tools:
            content, calls = self.tools.parse_all(content)
        return thinking, content, calls
