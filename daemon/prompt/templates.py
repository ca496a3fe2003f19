"""Prompt formatting: a model's Jinja chat template (HF semantics) or an Ollama Go TEMPLATE (Ollama semantics).

Entry points for the API layer:
- `render_messages(template, messages, tools=..., ...)` for /api/chat: picks Jinja or Go by `is_go_template`.
- `render_generate(template, prompt, system=..., suffix=..., ...)` for /api/generate (non-raw).
- `prepare_chat_messages(...)` adds the model's SYSTEM and MESSAGE history the way Ollama does.
- `template_capabilities(template)` -> subset of ["tools", "insert", "thinking"].
Every failure is a `TemplateError` (HTTP 400 upstream) whose message says what went wrong.
"""
from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import json
import logging
import re
import sys
from typing import Any, Iterable

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import SandboxedEnvironment

from . import gotemplate
from .gotemplate import Budget, TemplateBudgetExceeded, TemplateError
from .gotemplate.render_budget import MAX_ITEMS, MAX_OUTPUT, TemplateCancelled, cache_small
from .gotemplate.ollama import DEFAULT_TEMPLATE, render_go_chat
from .gotemplate.ollama import go_nodes as _go_nodes
from .gotemplate.ollama import go_vars as _go_vars
from .jinja_bounds import bounded_environment, printed_size, too_big
from . import formats, harmony
from .tools import extract_tool_calls, format_tool_calls, parse_tool_calls, tool_format_for

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_TEMPLATE", "MAX_OUTPUT", "Budget", "SuffixNotSupported", "TemplateBudgetExceeded", "TemplateCancelled",
    "TemplateError", "check_template",
    "extract_tool_calls", "fold_system_into_user", "is_go_template", "parse_tool_calls", "prepare_chat_messages",
    "render_chat", "render_generate", "render_go_chat", "render_messages", "template_capabilities", "thinking_tags",
    "tool_format_for",
]



class SuffixNotSupported(TemplateError):
    """/api/generate got a `suffix` but the model's template has no `.Suffix` (no `insert` capability)."""


# ------------------------------------------------------------------------------------------ detection

_JINJA_STMT = re.compile(r"\{%-?\s*(if|for|set|macro|raw|filter|generation)\b")
_GO_ACTION = re.compile(r"\{\{-?\s*(\.|\$|range\b|if\b|end\b|with\b|else\b|json\b|template\b|define\b|block\b|/\*|printf?\s|println\s)")


def is_go_template(template: str | None) -> bool:
    """True for an Ollama Go text/template (`{{ .Prompt }}`, `{{ range .Messages }}`), False for Jinja."""
    if not template:
        return True  # no template: Ollama's default `{{ .Prompt }}`
    if _JINJA_STMT.search(template) or "{#" in template:
        return False
    if _GO_ACTION.search(template):
        return True
    return "{{" not in template  # plain text with no actions renders the same either way


def check_template(template: str) -> None:
    """Parse (and for Jinja, compile) a template; raise TemplateError with the reason (for /api/create)."""
    if is_go_template(template):
        _go_nodes(template)
    else:
        _compile_jinja(template)


def template_capabilities(template: str | None, arch: str | None = None) -> list[str]:
    """Ollama capabilities a template enables: "tools", "insert" (suffix/FIM), "thinking"."""
    caps: list[str] = []
    if not template:
        return ["thinking"] if thinking_tags(template, arch) else caps
    if is_go_template(template):
        try:
            names = _go_vars(template)
        except TemplateError:
            return caps
        for cap, var in (("tools", "tools"), ("insert", "suffix"), ("thinking", "think")):
            if var in names:
                caps.append(cap)
        if "thinking" not in caps and thinking_tags(template, arch):
            caps.append("thinking")
        return caps
    if re.search(r"\btools\b", template):
        caps.append("tools")
    if thinking_tags(template, arch):
        caps.append("thinking")
    return caps


def thinking_tags(template: str | None, arch: str | None = None) -> tuple[str, str] | None:
    """The (open, close) markers of reasoning text the model writes, e.g. ("<think>", "</think>"); None when its
    template (or, for gpt-oss, its architecture) teaches none."""
    fmt = formats.detect(template, arch)
    if fmt is not None and (fmt.harmony or fmt.think_implicit):
        return fmt.think
    if not template:
        return None
    tags = fmt.think if fmt is not None and fmt.think else formats.THINK
    if tags[0] in template or tags[1] in template:
        return tags
    if is_go_template(template):
        return tags if "think" in _safe_go_vars(template) else None
    if "enable_thinking" in template and _switches_on_thinking(template):
        return tags
    return None


@cache_small(maxsize=64)
def _switches_on_thinking(template: str) -> bool:
    """A Jinja template thinks if `enable_thinking` changes what it renders (not merely that it names it)."""
    msgs = [{"role": "user", "content": "hi"}]
    try:
        on, off = (render_chat(template, msgs, enable_thinking=flag) for flag in (True, False))
    except TemplateCancelled:
        raise  # not an answer about the template: must not be cached
    except TemplateError:
        return False
    return on != off


def _safe_go_vars(template: str) -> set[str]:
    try:
        return _go_vars(template)
    except TemplateError:
        return set()


# ------------------------------------------------------------------------------------------ Jinja (HF)

def _raise_exception(message: Any) -> None:
    text = str(message)[:2000] if printed_size(message, 100_000) <= 100_000 else "(a message too long to show)"
    raise TemplateError(f"template raised: {text}")


def _strftime_now(fmt: Any) -> str:
    if not isinstance(fmt, str) or len(fmt) > 1000:
        raise TemplateError("strftime_now: the format must be a string of at most 1000 characters")
    return _dt.datetime.now().strftime(fmt)


class JsonArgs(dict):
    """Tool-call arguments: a dict (Ollama's shape) that reads as its JSON text where a template wants the
    OpenAI string form (`'>>>' + name + '\\n' + arguments`, `arguments | string`)."""

    def __str__(self) -> str:
        return json.dumps(self, ensure_ascii=False)

    def __add__(self, other: Any) -> Any:
        if isinstance(other, str):
            return str(self) + other
        return NotImplemented

    def __radd__(self, other: Any) -> Any:
        if isinstance(other, str):
            return other + str(self)
        return NotImplemented


class _GenerationTag(Extension):
    """`{% generation %}...{% endgeneration %}` (HF's assistant-mask marker): renders its body unchanged."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return caller()


@functools.lru_cache(maxsize=1)
def _jinja_env() -> SandboxedEnvironment:
    # Mutable sandbox (HF uses the immutable one): real templates such as Kimi-K2's call list.append on
    # lists they build themselves, as llama.cpp's minja allows; the sandbox still blocks unsafe attributes,
    # and the messages handed in are copies. Operations that build values are bounded (jinja_bounds).
    env = bounded_environment(trim_blocks=True, lstrip_blocks=True,
                              extensions=[_GenerationTag, "jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


@cache_small(maxsize=64)
def _compile_jinja(template: str) -> jinja2.Template:
    try:
        return _jinja_env().from_string(template)
    except jinja2.TemplateSyntaxError as e:
        raise TemplateError(f"template syntax error at line {e.lineno}: {e.message}") from None
    except (RecursionError, SyntaxError, MemoryError):
        # jinja2's parser recurses per nested expression, and the Python it generates has a block per
        # nested statement: Python stops at 20 nested loops and 100 indentation levels
        raise TemplateError("template nesting too deep: blocks or expressions inside one another go deeper "
                            "than Jinja can compile") from None


def _call_id(raw: Any, salt: str, strict9: bool) -> str:
    if isinstance(raw, str) and raw and (not strict9 or (len(raw) == 9 and raw.isalnum())):
        return raw
    # Mistral templates insist on 9 alphanumeric characters; derive a stable one from what we have
    return hashlib.sha256(f"{raw}|{salt}".encode()).hexdigest()[:9]


def _jinja_messages(messages: list[dict[str, Any]], strict_ids: bool) -> list[dict[str, Any]]:
    """Ollama messages -> the HF shape templates expect: typed tool_calls with ids, tool results linked."""
    out: list[dict[str, Any]] = []
    pending: list[tuple[str, str]] = []  # (id, name) of calls not yet answered by a tool message
    for n, m in enumerate(messages):
        msg = {k: v for k, v in m.items() if v is not None}
        msg.setdefault("content", "")
        if msg.get("thinking") and "reasoning_content" not in msg:
            msg["reasoning_content"] = msg["thinking"]  # the name HF templates read (GLM, DeepSeek, Qwen3, Seed)
        if msg.get("tool_calls"):
            calls = []
            for i, call in enumerate(msg["tool_calls"]):
                fn = dict(call.get("function") or {})
                args = fn.get("arguments")
                if isinstance(args, str):
                    try:
                        args = json.loads(args) if args.strip() else {}
                    except ValueError:
                        pass
                fn["arguments"] = JsonArgs(args) if isinstance(args, dict) else (args if args is not None else JsonArgs())
                cid = _call_id(call.get("id"), f"{n}.{i}", strict_ids)
                calls.append({"id": cid, "type": "function", "function": fn})
            msg["tool_calls"] = calls
            pending = [(c["id"], c["function"].get("name", "")) for c in calls]
        if msg.get("role") == "tool":
            name = msg.get("tool_name") or msg.get("name") or ""
            if name and "name" not in msg:
                msg["name"] = name
            match = next((p for p in pending if p[1] == name), pending[0] if pending else None)
            if match is not None:
                pending.remove(match)
            cid = msg.get("tool_call_id") or (match[0] if match else None)
            msg["tool_call_id"] = _call_id(cid, f"{n}", strict_ids)
            if match and "name" not in msg:
                msg["name"] = match[1]
        out.append(msg)
    return out


def render_chat(template: str, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None,
                documents: list[dict[str, Any]] | None = None, add_generation_prompt: bool = True,
                bos_token: str = "", eos_token: str = "", budget: Budget | None = None, **extra: Any) -> str:
    """Render a Jinja chat template the way HF's apply_chat_template does, within `budget`."""
    compiled = _compile_jinja(template)
    context = dict(extra)
    strict_ids = "[TOOL_CALLS]" in template  # Mistral: ids must be 9 alphanumeric characters
    context.update(messages=_jinja_messages(messages, strict_ids), tools=tools or None, documents=documents,
                   add_generation_prompt=add_generation_prompt, bos_token=bos_token or "", eos_token=eos_token or "")
    try:
        return _render_within(compiled, context, budget or Budget())
    except TemplateError:
        raise
    except RecursionError:
        raise TemplateError("template nesting too deep") from None
    except jinja2.exceptions.SecurityError as e:
        raise TemplateError(f"template tried an unsafe operation: {e}") from None
    except (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError, IndexError,
            ArithmeticError) as e:
        raise TemplateError(f"template error: {type(e).__name__}: {e}") from None


def _render_within(compiled: jinja2.Template, context: dict[str, Any], budget: Budget) -> str:
    """Render, counting the template's executed lines as steps (a line tracer on the template's own frames, in
    this thread only) and its output as it is produced; TemplateBudgetExceeded beyond either."""

    def on_line(frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            budget.step()
            for v in frame.f_locals.values():  # a variable doubled in a loop is caught before it is huge
                if too_big(v):
                    raise TemplateBudgetExceeded(f"template built a value of over {MAX_OUTPUT} characters or "
                                                 f"{MAX_ITEMS} items")
        return on_line

    def on_call(frame: Any, event: str, arg: Any) -> Any:
        return on_line if frame.f_code.co_filename == "<template>" else None

    previous = sys.gettrace()
    sys.settrace(on_call)
    try:
        parts = []
        for chunk in compiled.generate(**context):
            budget.emit(len(chunk))
            parts.append(chunk)
        return "".join(parts)
    finally:
        sys.settrace(previous)


# ------------------------------------------------------------------------------------------ entry points

def render_messages(template: str | None, messages: list[dict[str, Any]], *,
                    tools: list[dict[str, Any]] | None = None, add_generation_prompt: bool = True,
                    bos_token: str = "", eos_token: str = "", think: bool | str | None = None,
                    budget: Budget | None = None, arch: str | None = None, **extra: Any) -> str:
    """/api/chat prompt: Go templates with Ollama semantics, Jinja templates with HF semantics; one render's
    work is bounded by `budget` (TemplateBudgetExceeded beyond it). `arch` (the model's architecture) tells
    gpt-oss's harmony apart where the template does not."""
    budget = budget or Budget()
    fmt = formats.detect(template, arch)
    if fmt is not None and fmt.harmony:
        effort = harmony.reasoning_effort(think)
        think = effort or think  # a Go template's .ThinkLevel: "max" is "high" for gpt-oss
        if effort and not is_go_template(template):
            extra.setdefault("reasoning_effort", effort)
        messages = harmony.prompt_messages(messages)
    if is_go_template(template):
        return render_go_chat(template, messages, tools=tools, think=think, budget=budget)
    if think is not None:
        extra.setdefault("enable_thinking", bool(think))  # Qwen3-style switch; other templates ignore it
    if fmt is not None and fmt.tools and "tool_calls" not in (template or ""):
        messages = _calls_in_content(messages, fmt.tools)
    kwargs = dict(tools=tools, add_generation_prompt=add_generation_prompt, bos_token=bos_token,
                  eos_token=eos_token, budget=budget, **extra)
    try:
        return render_chat(template or "", messages, **kwargs)
    except TemplateError as e:
        # Templates without a system role (Gemma: "System role not supported") get the system text folded
        # into the first user message, which is what their model cards recommend.
        if isinstance(e, (TemplateBudgetExceeded, TemplateCancelled)) or "system" not in str(e).lower() or \
                not any(m.get("role") == "system" for m in messages):
            raise
        log.info("template rejects the system role; folding the system prompt into the first user message")
        return render_chat(template or "", fold_system_into_user(messages), **kwargs)


def _calls_in_content(messages: list[dict[str, Any]], syntax: str) -> list[dict[str, Any]]:
    """For a template that never renders an assistant's tool_calls (LFM2's first one): the calls written into the
    content the way the model writes them, so the model sees its own earlier calls."""
    out = []
    for m in messages:
        if m.get("role") == "assistant" and m.get("tool_calls"):
            try:
                text = format_tool_calls([{"function": _object_args(c.get("function") or {})}
                                          for c in m["tool_calls"]], syntax)
            except (ValueError, KeyError, TypeError, AttributeError):
                text = ""
            m = {k: v for k, v in m.items() if k != "tool_calls"}
            m["content"] = (m.get("content") or "") + text
        out.append(m)
    return out


def _object_args(fn: dict[str, Any]) -> dict[str, Any]:
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            pass
    return {**fn, "arguments": args}


def fold_system_into_user(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Move system messages' text to the front of the first user message (for templates without a system role)."""
    system = "\n\n".join(m.get("content") or "" for m in messages if m.get("role") == "system")
    rest = [dict(m) for m in messages if m.get("role") != "system"]
    for m in rest:
        if m.get("role") == "user":
            m["content"] = f"{system}\n\n{m.get('content') or ''}" if system else m.get("content")
            return rest
    return [{"role": "user", "content": system}, *rest]


def prepare_chat_messages(messages: Iterable[dict[str, Any]], *, model_system: str | None = None,
                          model_messages: Iterable[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """Ollama's chat prelude: the model's MESSAGE history first, its SYSTEM unless the request starts with one."""
    msgs = [dict(m) for m in messages]
    out = [dict(m) for m in model_messages]
    if model_system and not (msgs and msgs[0].get("role") == "system"):
        out.insert(0, {"role": "system", "content": model_system})
    return out + msgs


def render_generate(template: str | None, prompt: str, *, system: str | None = None, model_system: str | None = None,
                    model_messages: Iterable[dict[str, Any]] = (), suffix: str | None = None,
                    images: int = 0, bos_token: str = "", eos_token: str = "", think: bool | str | None = None,
                    has_context: bool = False, budget: Budget | None = None, arch: str | None = None) -> str:
    """/api/generate prompt (non-raw): system from the request else the model; suffix needs `.Suffix`; the
    render's work within `budget`."""
    go = is_go_template(template)
    if suffix:
        if not go or "suffix" not in _go_vars(template or DEFAULT_TEMPLATE):
            raise SuffixNotSupported("this model does not support insert: its template has no .Suffix")
        values = {"Prompt": prompt, "Suffix": suffix, "Response": "", "Think": bool(think),
                  "ThinkLevel": think if isinstance(think, str) else "", "IsThinkSet": think is not None}
        return gotemplate.execute(_go_nodes(template or DEFAULT_TEMPLATE), values, budget or Budget())
    msgs: list[dict[str, Any]] = []
    if system or model_system:
        msgs.append({"role": "system", "content": system or model_system})
    if not has_context:
        msgs.extend(dict(m) for m in model_messages)
    content = "".join(f"[img-{i}] " for i in range(images)) + prompt
    msgs.append({"role": "user", "content": content})
    return render_messages(template, msgs, bos_token=bos_token, eos_token=eos_token, think=think, budget=budget,
                           arch=arch)
