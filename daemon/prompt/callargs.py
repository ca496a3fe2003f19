"""Tool-call names and arguments as models spell them, decoded into Ollama's shape
`{"function": {"name": str, "arguments": {...}}}`: JSON objects, XML-ish key/value pairs (typed by the tool's
schema where one is given), Python call syntax (LFM2) and Gemma 4's `{key:<|"|>text<|"|>}` objects.
Decoders never evaluate anything: malformed input gives None, and the caller keeps the text as content."""
from __future__ import annotations

import ast
import json
import re
from typing import Any, Callable

Call = dict[str, Any]
# name -> the tool's JSON-schema `properties` (what a parameter's text should become), or None when unknown
Schema = Callable[[str], dict[str, Any] | None]


def no_schema(name: str) -> dict[str, Any] | None:
    return None


def schema_of(tools: list[dict[str, Any]] | None) -> Schema:
    """A lookup of each tool's parameter properties by function name."""
    props: dict[str, dict[str, Any]] = {}
    for t in tools or []:
        fn = t.get("function") if isinstance(t, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            params = fn.get("parameters")
            p = params.get("properties") if isinstance(params, dict) else None
            props[fn["name"]] = p if isinstance(p, dict) else {}
    return props.get


def make_call(name: Any, args: Any) -> Call | None:
    """One call in Ollama's shape; None unless the name is a string and the arguments an object (or its JSON)."""
    if not isinstance(name, str) or not name.strip():
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
    return {"function": {"name": name.strip(), "arguments": args}}


def json_values(text: str) -> list[tuple[Any, int, int]]:
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


def call_from_obj(obj: Any) -> Call | None:
    """`{"name", "arguments"|"parameters"}`, OpenAI's `{"function": {...}}` or Cohere's `{"tool_name", ...}`."""
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("function"), dict):
        obj = obj["function"]
    name = obj.get("name", obj.get("tool_name"))
    return make_call(name, obj.get("arguments", obj.get("parameters")))


def json_calls(text: str) -> list[Call] | None:
    """The calls of a body that is JSON and nothing else (one object, a list, or objects one after another)."""
    values = json_values(text)
    if not values:
        return None
    rest = text
    for _, start, end in reversed(values):
        rest = rest[:start] + rest[end:]
    if rest.strip(" \t\r\n;,"):
        return None  # text beside the JSON: not a clean call
    calls: list[Call] = []
    for value, _, _ in values:
        for obj in value if isinstance(value, list) else [value]:
            call = call_from_obj(obj)
            if call is None:
                return None
            calls.append(call)
    return calls or None


def typed_value(text: str, prop: dict[str, Any] | None, string: bool | None = None) -> Any:
    """A parameter's text as its value: kept as text where the schema (or the model's `string="true"`) says
    string, else JSON when it parses (numbers, booleans, objects), else the text."""
    if string is None and isinstance(prop, dict):
        types = prop.get("type")
        types = types if isinstance(types, list) else [types]
        string = "string" in types and len(types) == 1
    if string:
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def keyed_args(pairs: list[tuple[str, str, bool | None]], name: str, schema: Schema) -> dict[str, Any]:
    """(key, text, string-hint) pairs as an arguments object, typed by the tool's schema."""
    props = schema(name) or {}
    return {k: typed_value(v, props.get(k), hint) for k, v, hint in pairs}


def trim_newline(text: str) -> str:
    """A value written on lines of its own (`<parameter=k>\\nv\\n</parameter>`) loses those two newlines."""
    if text.startswith("\n"):
        text = text[1:]
    if text.endswith("\n"):
        text = text[:-1]
    return text


# ------------------------------------------------------------------------------------------ Python call syntax

def _literal(node: ast.AST) -> Any:
    if isinstance(node, ast.Name) and node.id in ("true", "false", "null", "True", "False", "None"):
        return {"true": True, "True": True, "false": False, "False": False}.get(node.id)
    return ast.literal_eval(node)


def pythonic_calls(text: str) -> list[Call] | None:
    """`[get_weather(city="Paris"), other()]` (LFM2's calls): names and keyword literals, never evaluated."""
    body = text.strip()
    if not body:
        return None
    try:
        tree = ast.parse(body if body.startswith("[") else f"[{body}]", mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if not isinstance(tree.body, ast.List):
        return None
    calls: list[Call] = []
    for node in tree.body.elts:
        if not isinstance(node, ast.Call) or node.args:
            return None
        name = _dotted(node.func)
        try:
            args = {kw.arg: _literal(kw.value) for kw in node.keywords if kw.arg}
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            return None
        call = make_call(name, args)
        if call is None:
            return None
        calls.append(call)
    return calls or None


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return f"{head}.{node.attr}" if head else None
    return None


# ------------------------------------------------------------------------------------------ Gemma 4

GEMMA_QUOTE = '<|"|>'
_GEMMA_STRING = re.compile(r'<\|"\|>(.*?)<\|"\|>', re.S)
_BARE_KEY = re.compile(r'([{,]\s*)([A-Za-z_$][\w$.-]*)(\s*:)')
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def gemma_object(text: str) -> dict[str, Any] | None:
    """Gemma 4's argument object (`{city:<|"|>Paris<|"|>,days:3}`) as a dict; None when it does not parse."""
    strings: list[str] = []

    def stash(m: re.Match[str]) -> str:
        strings.append(m.group(1))
        return f'"\x00{len(strings) - 1}\x00"'

    body = _GEMMA_STRING.sub(stash, text.strip())
    if GEMMA_QUOTE in body:
        return None  # an unclosed string: cut off
    # quote bare keys outside the stashed strings (which hold no braces or commas now)
    parts = _JSON_STRING.split(body)
    quoted = _JSON_STRING.findall(body)
    body = "".join(_BARE_KEY.sub(r'\1"\2"\3', p) + (quoted[i] if i < len(quoted) else "")
                   for i, p in enumerate(parts))
    for i, s in enumerate(strings):
        body = body.replace(f'"\x00{i}\x00"', json.dumps(s, ensure_ascii=False))
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
