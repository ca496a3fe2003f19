"""From request to prompt text and back: template choice, thinking and tool capabilities, streaming splitters
for `<think>` sections and tool calls. The only API module that talks to `daemon/templates.py`."""
from __future__ import annotations

import logging
from typing import Any

from .. import cancel
from .. import templates as tpl
from ..models import LoadedModel
from ..store.names import parse_name
from . import prompt_size
from .errors import APIError

log = logging.getLogger(__name__)


def template_of(model: LoadedModel) -> str | None:
    """The store's TEMPLATE wins; else the chat template inside the model files; else Ollama's `{{ .Prompt }}`."""
    return model.record.template or model.runner.chat_template or None


def full_name(model: LoadedModel) -> str:
    try:
        return parse_name(model.name).full()
    except ValueError:
        return model.name


def capabilities(model: LoadedModel) -> list[str]:
    return tpl.template_capabilities(template_of(model))


def supports_tools(model: LoadedModel) -> bool:
    t = template_of(model)
    return "tools" in tpl.template_capabilities(t) and tpl.tool_format_for(t) is not None


def thinking_tags(model: LoadedModel) -> tuple[str, str] | None:
    """The model's (open, close) reasoning markers, None where its template teaches none."""
    return tpl.thinking_tags(template_of(model))


def resolve_think(model: LoadedModel, think: bool | str | None) -> bool | str | None:
    """None/False: no thinking; a thinking-capable model defaults to on (as Ollama); 400 where unsupported."""
    capable = tpl.thinking_tags(template_of(model)) is not None
    if isinstance(think, str) and think not in ("low", "medium", "high", "max"):
        raise APIError(400, f"invalid think value {think!r}: expected true, false, \"low\", \"medium\", \"high\" or \"max\"")
    if think is None:
        return True if capable else None
    if think and not capable:
        raise APIError(400, f'"{model.name}" does not support thinking')
    return think if capable else None


def _special_text(model: LoadedModel, token_id: int | None) -> str:
    piece = getattr(model.runner.tokenizer, "id_to_piece", None)
    if token_id is None or piece is None:
        return ""
    try:
        return piece(token_id) or ""
    except Exception:  # noqa: BLE001 - a tokenizer without that id simply has no text for it
        return ""


def _eos_text(model: LoadedModel) -> str:
    tok = model.runner.tokenizer
    return model.record.eos_token or _special_text(model, getattr(tok, "eos_id", None))


def _bos_text(model: LoadedModel) -> str:
    # The tokenizer adds BOS itself (encode drops a BOS the template wrote), so `{{ bos_token }}` is harmless.
    return model.record.bos_token or _special_text(model, model.runner.tokenizer.bos_id)


def _budget(max_chars: int | None) -> tpl.Budget:
    """A render's budget; with `max_chars` (the most a prompt that fits can have) its output stops there."""
    return tpl.Budget(max_output=min(tpl.MAX_OUTPUT, max_chars)) if max_chars is not None else tpl.Budget()


def _over(budget: tpl.Budget, max_chars: int | None) -> bool:
    """Whether a budget error was the prompt outgrowing `max_chars` (not a runaway template)."""
    return max_chars is not None and budget.max_output == max_chars and budget.output > max_chars


def render_chat(model: LoadedModel, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None,
                think: bool | str | None, window: int | None = None,
                max_chars: int | None = None) -> tuple[str, bool]:
    """The /api/chat prompt text, and whether the tokenizer should add BOS (the template never does here).
    With `max_chars` a prompt growing past it stops rendering there: a 400 saying it cannot fit `window`."""
    msgs = tpl.prepare_chat_messages(messages, model_system=model.record.system,
                                     model_messages=model.record.messages)
    budget = _budget(max_chars)
    try:
        text = tpl.render_messages(template_of(model), msgs, tools=tools, bos_token=_bos_text(model), eos_token=_eos_text(model),
                                   think=think, budget=budget)
    except tpl.TemplateCancelled:
        raise
    except tpl.TemplateError as e:
        if _over(budget, max_chars) and window:
            raise prompt_size.too_long(model, window, max_chars) from None  # type: ignore[arg-type]
        raise APIError(400, f"cannot render the chat template of '{model.name}': {e}") from None
    return text, True


def render_generate(model: LoadedModel, prompt: str, *, system: str | None, suffix: str, template: str | None,
                    think: bool | str | None, window: int | None = None,
                    max_chars: int | None = None) -> tuple[str, bool]:
    budget = _budget(max_chars)
    try:
        text = tpl.render_generate(template or template_of(model), prompt, system=system,
                                   model_system=model.record.system, model_messages=model.record.messages,
                                   suffix=suffix or None, bos_token=_bos_text(model), eos_token=_eos_text(model),
                                   think=think, budget=budget)
    except tpl.TemplateCancelled:
        raise
    except tpl.SuffixNotSupported:
        raise APIError(400, f"model '{model.name}' does not support insert (its template has no .Suffix)") from None
    except tpl.TemplateError as e:
        if _over(budget, max_chars) and window:
            raise prompt_size.too_long(model, window, max_chars) from None  # type: ignore[arg-type]
        raise APIError(400, f"cannot render the template of '{model.name}': {e}") from None
    return text, True


def encode(model: LoadedModel, text: str, *, add_special: bool) -> list[int]:
    """The prompt's ids, starting with one BOS where the model adds one, whether or not the template wrote it."""
    cancel.checkpoint()  # the render may have been long: its client may have gone since
    tok = model.runner.tokenizer
    bos = tok.bos_id
    if add_special and tok.add_bos:
        text = _without_leading_bos(model, text)
    ids = list(tok.encode(text, add_special=add_special, parse_special=True))
    if add_special and bos is not None and len(ids) > 1 and ids[0] == bos and ids[1] == bos:
        ids = ids[1:]  # a BOS written some other way (its piece spelled differently, after whitespace)
    return ids


def _without_leading_bos(model: LoadedModel, text: str) -> str:
    """`text` less the BOS a template wrote at its start, as llama-server does (common/chat.cpp): the tokenizer
    adds BOS, and handing llama.cpp both made it warn on every request that the prompt starts with 2 BOS tokens."""
    lead = _bos_text(model)
    if not lead or not text.startswith(lead):
        return text
    tok = model.runner.tokenizer
    if tok.encode(lead, add_special=False, parse_special=True) != [tok.bos_id]:
        return text  # the record's BOS text is not what this tokenizer reads as BOS: leave the prompt alone
    return text[len(lead):]


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
        self.fmt = tpl.tool_format_for(self.template)
        self.marker = tpl.TOOL_CALL_PREFIX.get(self.fmt or "", "")
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
        content, calls = tpl.extract_tool_calls(text, self.fmt)
        return content, self._number(calls)

    def _closed_calls(self) -> list[dict[str, Any]]:
        """Calls whose closing tag has arrived (hermes' `</tool_call>`), taken off `pending`."""
        closer = tpl.TOOL_CALL_SUFFIX.get(self.fmt or "")
        done: list[dict[str, Any]] = []
        while closer and closer in self.pending:
            end = self.pending.index(closer) + len(closer)
            content, calls = tpl.extract_tool_calls(self.pending[:end], self.fmt)
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

    def __init__(self, model: LoadedModel, prompt_text: str, think: bool | str | None,
                 tools: list[dict[str, Any]] | None) -> None:
        self.splitter = ThinkSplitter(think, prompt_text) if think else None
        self.tools = ToolCallStream(template_of(model)) if tools else None

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
