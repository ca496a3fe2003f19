"""Tool calls in generated text, all at once: which syntax a model's template teaches (formats.py), parsing a
reply into Ollama's shape `{"function": {"name": str, "arguments": {...}}}`, and writing calls the way each
family's model writes them (the inverse, for tests and tools). The syntaxes themselves: toolsyntax.py."""
from __future__ import annotations

import json
from typing import Any

from .formats import tool_syntax_name
from .harmony import HarmonyParser
from .reply import ToolCallStream
from .toolsyntax import SYNTAXES


TOOL_FORMATS = (*SYNTAXES, "harmony")
# Model families (GGUF general.architecture / HF model_type) whose instruct models use a known syntax.
FAMILY_FORMATS = {"qwen2": "hermes", "qwen2moe": "hermes", "qwen3": "hermes", "qwen3moe": "hermes",
                  "mistral": "mistral", "granite": "granite", "granitemoe": "granite", "gpt-oss": "harmony",
                  "glm4moe": "glm", "seed_oss": "seed", "gemma4": "gemma4", "lfm2": "lfm2", "lfm2moe": "lfm2"}


def tool_format_for(template: str | None, arch: str | None = None) -> str | None:
    """The tool-call syntax a (Jinja or Go) chat template teaches (a name in TOOL_FORMATS), or None when unknown."""
    return tool_syntax_name(template, arch)


def resolve_format(fmt_family_or_template: str | None) -> str | None:
    """A syntax name passes through; a family name maps via FAMILY_FORMATS; anything else is a template."""
    if fmt_family_or_template in TOOL_FORMATS:
        return fmt_family_or_template
    if fmt_family_or_template in FAMILY_FORMATS:
        return FAMILY_FORMATS[fmt_family_or_template]
    return tool_format_for(fmt_family_or_template)


def extract_tool_calls(text: str, fmt_or_template: str | None) -> tuple[str, list[dict[str, Any]] | None]:
    """Split model output into (content without the tool calls, calls or None)."""

    fmt = resolve_format(fmt_or_template)
    if fmt is None or not text:
        return text, None
    if fmt == "harmony":
        _, content, found = HarmonyParser().feed(text, final=True)
        return (content, found) if found else (text, None)
    content, numbered = ToolCallStream(SYNTAXES[fmt]).feed(text, True)
    calls = [{"function": {k: v for k, v in c["function"].items() if k != "index"}} for c in numbered]
    return (content.strip(), calls) if calls else (text, None)


def parse_tool_calls(text: str, fmt_or_template: str | None) -> list[dict[str, Any]] | None:
    """Tool calls in `text` for a syntax name (TOOL_FORMATS), a model family or a template; None when none."""
    return extract_tool_calls(text, fmt_or_template)[1]


def _args(fn: dict[str, Any]) -> Any:
    return fn.get("arguments") or {}


def _text(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)


def _gemma(v: Any) -> str:
    if isinstance(v, str):
        return f'<|"|>{v}<|"|>'
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}:{_gemma(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ",".join(_gemma(x) for x in v) + "]"
    return json.dumps(v)


def _one(fn: dict[str, Any], fmt: str, i: int) -> str:
    name, args = fn["name"], _args(fn)
    if fmt == "hermes":
        return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"
    if fmt == "glm":
        return (f"<tool_call>{name}\n" + "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{_text(v)}</arg_value>\n"
                                                 for k, v in args.items()) + "</tool_call>")
    if fmt == "hy3":
        return (f"<tool_call:opensource>{name}<tool_sep:opensource>\n" + "".join(
            f"<arg_key:opensource>{k}</arg_key:opensource>\n<arg_value:opensource>{_text(v)}</arg_value:opensource>\n"
            for k, v in args.items()) + "</tool_call:opensource>")
    if fmt == "seed":
        params = "".join(f"<parameter={k}>{_text(v)}</parameter>\n" for k, v in args.items())
        return f"<seed:tool_call>\n<function={name}>\n{params}</function>\n</seed:tool_call>"
    if fmt in ("minimax", "dsml"):
        p = "｜DSML｜" if fmt == "dsml" else ""
        typed = (lambda v: f' string="{str(isinstance(v, str)).lower()}"') if fmt == "dsml" else (lambda v: "")
        return (f'<{p}invoke name="{name}">\n' + "".join(
            f'<{p}parameter name="{k}"{typed(v)}>{_text(v)}</{p}parameter>\n' for k, v in args.items())
            + f"</{p}invoke>\n")
    if fmt == "kimi":
        return f"<|tool_call_begin|>functions.{name}:{i}<|tool_call_argument_begin|>{json.dumps(args)}<|tool_call_end|>"
    if fmt == "deepseek":
        return (f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{json.dumps(args)}\n```"
                "<｜tool▁call▁end｜>")
    if fmt == "gemma4":
        return f"<|tool_call>call:{name}{_gemma(args)}<tool_call|>"
    if fmt == "mistral":
        return f"[TOOL_CALLS]{name}[ARGS]{json.dumps(args)}"
    raise ValueError(fmt)


_SECTIONS = {"minimax": ("<minimax:tool_call>\n", "</minimax:tool_call>"),
             "dsml": ("<｜DSML｜function_calls>\n", "</｜DSML｜function_calls>"),
             "kimi": ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"),
             "deepseek": ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>")}


_JSON_LIST = {"granite": ("<|tool_call|>", ""), "firefunction": (" functools", ""),
              "nemotron": ("<TOOLCALL>", "</TOOLCALL>"), "apriel": ("<tool_calls>", "</tool_calls>"),
              "cohere": ("<|START_ACTION|>", "<|END_ACTION|>")}


def format_tool_calls(calls: list[dict[str, Any]], fmt: str) -> str:
    """Write calls the way a model of `fmt` emits them (the inverse of parse_tool_calls)."""
    fns = [c["function"] for c in calls]
    if fmt == "llama3":
        return "; ".join(json.dumps({"name": f["name"], "parameters": _args(f)}) for f in fns)
    if fmt in _JSON_LIST:
        key = ("tool_name", "parameters") if fmt == "cohere" else ("name", "arguments")
        head, tail = _JSON_LIST[fmt]
        return head + json.dumps([{key[0]: f["name"], key[1]: _args(f)} for f in fns]) + tail
    if fmt == "gigachat":
        return "".join(f"<|function_call|>{json.dumps({'name': f['name'], 'arguments': _args(f)})}" for f in fns)
    if fmt == "lfm2":
        def lit(v: Any) -> str:
            return repr(v) if isinstance(v, (str, int, float, list, dict)) and not isinstance(v, bool) else \
                {True: "True", False: "False", None: "None"}[v]
        return "<|tool_call_start|>[" + ", ".join(
            f"{f['name']}(" + ", ".join(f"{k}={lit(v)}" for k, v in _args(f).items()) + ")" for f in fns) + \
            "]<|tool_call_end|>"
    if fmt == "harmony":
        return "".join(f"<|start|>assistant<|channel|>commentary to=functions.{f['name']} <|constrain|>json"
                       f"<|message|>{json.dumps(_args(f))}<|call|>" for f in fns)
    if fmt in SYNTAXES:
        head, tail = _SECTIONS.get(fmt, ("", ""))
        return head + "".join(_one(f, fmt, i) for i, f in enumerate(fns)) + tail
    raise ValueError(f"unknown tool format {fmt!r}; allowed: {', '.join(TOOL_FORMATS)}")
