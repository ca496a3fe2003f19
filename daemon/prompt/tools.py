"""Tool calls in generated text: which format a model's template teaches, and parsing it into Ollama's shape.

Ollama's shape: `{"function": {"name": str, "arguments": {...}}}` (arguments always an object).
Formats: `hermes` (Hermes/Qwen `<tool_call>{json}</tool_call>`), `llama3` (`{"name", "parameters"}` JSON,
optionally after `<|python_tag|>`, several joined by `;`), `mistral` (`[TOOL_CALLS][{...}]` and the newer
`[TOOL_CALLS]name[ARGS]{...}`), `granite` (`<|tool_call|>[...]`), `firefunction` (` functools[...]`),
`deepseek` (`<｜tool▁call▁begin｜>` blocks).
"""
from __future__ import annotations

import json
import logging
import re
from typing import Any

log = logging.getLogger(__name__)

TOOL_FORMATS = ("hermes", "llama3", "mistral", "granite", "firefunction", "deepseek")
# Text that opens a tool call in each format: a streaming API holds output back once it sees this.
TOOL_CALL_SUFFIX = {"hermes": "</tool_call>"}  # formats that close each call: a closed call streams at once
TOOL_CALL_PREFIX = {"hermes": "<tool_call>", "llama3": "{", "mistral": "[TOOL_CALLS]", "granite": "<|tool_call|>",
                    "firefunction": " functools[", "deepseek": "<｜tool▁calls▁begin｜>"}
# Model families (GGUF general.architecture / HF model_type) whose instruct models use a known format.
FAMILY_FORMATS = {"qwen2": "hermes", "qwen2moe": "hermes", "qwen3": "hermes", "qwen3moe": "hermes",
                  "mistral": "mistral", "granite": "granite", "granitemoe": "granite"}
_DS_BEGIN, _DS_END = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>"
_DS_SEP = "<｜tool▁sep｜>"


def tool_format_for(template: str | None) -> str | None:
    """The tool-call format a (Jinja or Go) chat template teaches, or None when unknown."""
    if not template:
        return None
    if "<tool_call>" in template:
        return "hermes"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<|tool_call|>" in template:
        return "granite"
    if "functools[" in template:
        return "firefunction"
    if "tool▁call▁begin" in template or "tool▁calls▁begin" in template:
        return "deepseek"
    if "<|python_tag|>" in template or ("<|start_header_id|>" in template and '"parameters"' in template):
        return "llama3"
    return None


def resolve_format(fmt_family_or_template: str | None) -> str | None:
    """A format name passes through; a family name maps via FAMILY_FORMATS; anything else is a template."""
    if fmt_family_or_template in TOOL_FORMATS:
        return fmt_family_or_template
    if fmt_family_or_template in FAMILY_FORMATS:
        return FAMILY_FORMATS[fmt_family_or_template]
    return tool_format_for(fmt_family_or_template)


def _call(name: Any, args: Any) -> dict[str, Any] | None:
    if not isinstance(name, str) or not name:
        return None
    if isinstance(args, str):  # some models emit arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            return None
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return None
    return {"function": {"name": name, "arguments": args}}


def _from_obj(obj: Any) -> dict[str, Any] | None:
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("function"), dict):  # already OpenAI/Ollama-shaped
        obj = obj["function"]
    args = obj.get("arguments", obj.get("parameters"))
    return _call(obj.get("name"), args)


def _json_values(text: str) -> list[tuple[Any, int, int]]:
    """Every top-level JSON object/array found in `text`, as (value, start, end)."""
    dec = json.JSONDecoder()
    out, i = [], 0
    while i < len(text):
        j = min((k for k in (text.find("{", i), text.find("[", i)) if k != -1), default=-1)
        if j == -1:
            break
        try:
            value, end = dec.raw_decode(text, j)
        except ValueError:
            i = j + 1
            continue
        out.append((value, j, end))
        i = end
    return out


def _calls_from_json(text: str) -> list[dict[str, Any]]:
    calls = []
    for value, _, _ in _json_values(text):
        for obj in value if isinstance(value, list) else [value]:
            call = _from_obj(obj)
            if call:
                calls.append(call)
    return calls


def extract_tool_calls(text: str, fmt_or_template: str | None) -> tuple[str, list[dict[str, Any]] | None]:
    """Split model output into (content without the tool calls, calls or None)."""
    fmt = resolve_format(fmt_or_template)
    if fmt is None or not text:
        return text, None
    calls: list[dict[str, Any]] = []
    content = text
    if fmt == "hermes":
        blocks = re.findall(r"<tool_call>(.*?)(?:</tool_call>|$)", text, flags=re.S)
        for block in blocks:
            calls.extend(_calls_from_json(block))
            if not _json_values(block):  # Qwen3-Coder XML style: <function=name><parameter=k>v</parameter>
                calls.extend(_xml_function_calls(block))
        content = re.sub(r"<tool_call>.*?(?:</tool_call>|$)", "", text, flags=re.S)
    elif fmt == "mistral":
        idx = text.find("[TOOL_CALLS]")
        if idx != -1:
            content, rest = text[:idx], text[idx:]
            for part in rest.split("[TOOL_CALLS]")[1:]:
                if "[ARGS]" in part:  # [TOOL_CALLS]name[ARGS]{...} (Mistral Small 3.2, Devstral)
                    name, _, args = part.partition("[ARGS]")
                    name = name.split("[CALL_ID]")[0].strip()
                    found = _json_values(args)
                    call = _call(name, found[0][0] if found else None)
                    if call:
                        calls.append(call)
                else:
                    calls.extend(_calls_from_json(part))
    elif fmt == "granite":
        idx = text.find("<|tool_call|>")
        if idx != -1:
            content = text[:idx]
            calls = _calls_from_json(text[idx + len("<|tool_call|>"):])
    elif fmt == "firefunction":
        idx = text.find("functools[")
        if idx != -1:
            content = text[:idx].rstrip()
            calls = _calls_from_json(text[idx + len("functools"):])
    elif fmt == "deepseek":
        for block in re.findall(re.escape(_DS_BEGIN) + r"(.*?)" + re.escape(_DS_END), text, flags=re.S):
            head, _, body = block.partition(_DS_SEP)
            name = head.strip()
            if name == "function":  # V3: function<sep>name\n```json {...}```; V3.1: name<sep>{...}
                name, _, body = body.partition("\n")
            found = _json_values(body)
            call = _call(name.strip(), found[0][0] if found else {})
            if call:
                calls.append(call)
        idx = text.find("<｜tool▁calls▁begin｜>")
        content = text if idx == -1 else text[:idx]
    elif fmt == "llama3":
        stripped = text.strip()
        if stripped.startswith("<|python_tag|>"):
            stripped = stripped[len("<|python_tag|>"):]
        elif not stripped.startswith("{"):
            return text, None
        calls = [c for part in stripped.split(";") for c in _calls_from_json(part)] if stripped.startswith(
            "{") else []
        if calls:
            content = ""
    if not calls:
        return text, None
    return content.strip(), calls


def _xml_function_calls(block: str) -> list[dict[str, Any]]:
    calls = []
    for name, body in re.findall(r"<function=([^>\s]+)>(.*?)(?:</function>|$)", block, flags=re.S):
        args: dict[str, Any] = {}
        for key, value in re.findall(r"<parameter=([^>\s]+)>\n?(.*?)\n?</parameter>", body, flags=re.S):
            try:
                args[key] = json.loads(value)
            except ValueError:
                args[key] = value
        calls.append({"function": {"name": name, "arguments": args}})
    return calls


def parse_tool_calls(text: str, fmt_or_template: str | None) -> list[dict[str, Any]] | None:
    """Tool calls in `text` for a format name (TOOL_FORMATS), a model family or a template; None when none."""
    return extract_tool_calls(text, fmt_or_template)[1]


def format_tool_calls(calls: list[dict[str, Any]], fmt: str) -> str:
    """Render calls the way a model of `fmt` emits them (the inverse of parse_tool_calls; used in tests/tools)."""
    fns = [c["function"] for c in calls]
    if fmt == "hermes":
        return "".join(f"<tool_call>\n{json.dumps({'name': f['name'], 'arguments': f['arguments']})}\n</tool_call>"
                       for f in fns)
    if fmt == "llama3":
        return "; ".join(json.dumps({"name": f["name"], "parameters": f["arguments"]}) for f in fns)
    if fmt == "mistral":
        return "[TOOL_CALLS]" + json.dumps([{"name": f["name"], "arguments": f["arguments"]} for f in fns])
    if fmt == "granite":
        return "<|tool_call|>" + json.dumps([{"name": f["name"], "arguments": f["arguments"]} for f in fns])
    if fmt == "firefunction":
        return " functools" + json.dumps([{"name": f["name"], "arguments": f["arguments"]} for f in fns])
    if fmt == "deepseek":
        return "<｜tool▁calls▁begin｜>" + "".join(
            f"{_DS_BEGIN}function{_DS_SEP}{f['name']}\n```json\n{json.dumps(f['arguments'])}\n```{_DS_END}" for f in fns
        ) + "<｜tool▁calls▁end｜>"
    raise ValueError(f"unknown tool format {fmt!r}; allowed: {', '.join(TOOL_FORMATS)}")
