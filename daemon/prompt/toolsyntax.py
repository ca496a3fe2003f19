"""How each model family writes tool calls, as a table: the text that opens a call (or a section of calls), the
text that closes one call, and how a call's body becomes a name and arguments (callargs.py).

`parse_region(syntax, text, schema)` reads a stretch of output that starts where a call opens: the calls it
holds, and whatever text was left beside them (section markers removed). A call that does not decode stays text."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

from .callargs import (Call, Schema, gemma_object, json_calls, json_values, keyed_args, make_call, no_schema,
                       pythonic_calls, trim_newline)

Body = Callable[[str, Schema], "list[Call] | None"]


@dataclass(frozen=True)
class ToolSyntax:
    """One family's call syntax. A call is `open` + body + `close`; with `close` None a call runs to the next
    `open` or the end. `sections` wrap a run of calls and are dropped; `close_optional`: a call whose body
    decodes on its own (JSON) may lack its close (the model stopped at end-of-turn instead)."""

    name: str
    open: str
    close: str | None
    body: Body
    sections: tuple[str, ...] = ()
    close_optional: bool = False
    leading: bool = False  # a call is only recognised at the very start of the reply (Llama 3's bare JSON)
    inner: tuple[str, ...] = ()  # markers inside a call (special tokens in some vocabularies)
    opens: tuple[str, ...] = field(default=())  # every text that starts a tool-call region (computed)

    def __post_init__(self) -> None:
        starts = [s for s in self.sections[::2]] + [self.open]
        object.__setattr__(self, "opens", tuple(dict.fromkeys(s for s in starts if s)))


# ------------------------------------------------------------------------------------------ bodies

_XML_FUNCTION = re.compile(r"<function=([^>\s]+)>(.*?)</function>", re.S)
_XML_PARAM = re.compile(r"<parameter=([^>\s]+)>(.*?)</parameter>", re.S)


def _hermes(body: str, schema: Schema) -> list[Call] | None:
    """JSON (`{"name", "arguments"}`) or Qwen3-Coder's `<function=name><parameter=k>v</parameter></function>`."""
    calls = json_calls(body)
    if calls is not None:
        return calls
    return _xml_functions(body, schema)


def _xml_functions(body: str, schema: Schema) -> list[Call] | None:
    found = list(_XML_FUNCTION.finditer(body))
    if not found or _XML_FUNCTION.sub("", body).strip():
        return None
    out = []
    for m in found:
        name = m.group(1)
        pairs = [(k, trim_newline(v), None) for k, v in _XML_PARAM.findall(m.group(2))]
        call = make_call(name, keyed_args(pairs, name, schema))
        if call is None:
            return None
        out.append(call)
    return out


def _keyed_body(key_tag: str, value_tag: str, sep: str = "") -> Body:
    """GLM: `name\\n<arg_key>k</arg_key>\\n<arg_value>v</arg_value>...` (Hy3 spells the tags its own way)."""
    pair = re.compile(rf"<{key_tag}>(.*?)</{key_tag}>\s*<{value_tag}>(.*?)</{value_tag}>", re.S)

    def decode(body: str, schema: Schema) -> list[Call] | None:
        calls = json_calls(body)
        if calls is not None:
            return calls
        cut = body.find(f"<{key_tag}>")
        head = body if cut == -1 else body[:cut]
        name = head.replace(sep, "").strip() if sep else head.strip()
        rest = "" if cut == -1 else body[cut:]
        if not name or "\n" in name or pair.sub("", rest).strip():
            return None
        call = make_call(name, keyed_args([(k.strip(), v, None) for k, v in pair.findall(rest)], name, schema))
        return [call] if call else None

    return decode


def _invoke_body(prefix: str, typed: bool) -> Body:
    """`<invoke name="f"><parameter name="k">v</parameter></invoke>` (MiniMax M2) and its DSML spelling with
    `string="true|false"` (DeepSeek V3.2: false means the value is JSON)."""
    attrs = r'\s+name="([^"]*)"' + (r'(?:\s+string="(true|false)")?' if typed else r"()")
    param = re.compile(rf"<{prefix}parameter{attrs}\s*>(.*?)</{prefix}parameter>", re.S)
    head = re.compile(r'\s*name="([^"]*)"\s*>')

    def decode(body: str, schema: Schema) -> list[Call] | None:
        m = head.match(body)
        if not m:
            return None
        rest = body[m.end():]
        if param.sub("", rest).strip():
            return None
        pairs = [(k, trim_newline(v), None if s == "" else s == "true") for k, s, v in param.findall(rest)]
        call = make_call(m.group(1), keyed_args(pairs, m.group(1), schema))
        return [call] if call else None

    return decode


def _kimi(body: str, schema: Schema) -> list[Call] | None:
    """`functions.get_weather:0<|tool_call_argument_begin|>{...}` (the id's name part and index dropped)."""
    head, sep, args = body.partition("<|tool_call_argument_begin|>")
    if not sep:
        return None
    name = head.strip()
    name = name[len("functions."):] if name.startswith("functions.") else name
    name = re.sub(r":\d+$", "", name)
    return _one_json(name, args)


def _one_json(name: str, args: str) -> list[Call] | None:
    found = json_values(args)
    if not found or args[:found[0][1]].strip() or args[found[0][2]:].strip():
        return None
    call = make_call(name, found[0][0])
    return [call] if call else None


def _deepseek(body: str, schema: Schema) -> list[Call] | None:
    """R1/V3: `function<｜tool▁sep｜>name\\n```json\\n{...}\\n````; V3.1: `name<｜tool▁sep｜>{...}`."""
    head, sep, rest = body.partition("<｜tool▁sep｜>")
    if not sep:
        return None
    name = head.strip()
    if name == "function":
        name, _, rest = rest.partition("\n")
        rest = rest.strip()
        if rest.startswith("```"):
            rest = rest[3:].removeprefix("json").rstrip()
            rest = rest[:-3] if rest.endswith("```") else rest
    return _one_json(name.strip(), rest)


def _gemma(body: str, schema: Schema) -> list[Call] | None:
    """`call:get_weather{city:<|"|>Paris<|"|>}`."""
    if not body.startswith("call:") or "{" not in body:
        return None
    name, brace, args = body[len("call:"):].partition("{")
    obj = gemma_object(brace + args)
    call = make_call(name, obj) if obj is not None else None
    return [call] if call else None


def _mistral(body: str, schema: Schema) -> list[Call] | None:
    """`name[ARGS]{...}` (Mistral Small 3.2, Devstral, Ministral; `[CALL_ID]id` may sit in between) or `[{...}]`."""
    if "[ARGS]" in body:
        name, _, args = body.partition("[ARGS]")
        return _one_json(name.split("[CALL_ID]")[0], args)
    return json_calls(body)


def _pythonic(body: str, schema: Schema) -> list[Call] | None:
    return pythonic_calls(body)


def _json(body: str, schema: Schema) -> list[Call] | None:
    return json_calls(body)


def _llama3(body: str, schema: Schema) -> list[Call] | None:
    """`{"name", "parameters"}` objects, several joined by `;`."""
    calls: list[Call] = []
    for part in body.split(";"):
        if part.strip():
            found = json_calls(part)
            if found is None:
                return None
            calls += found
    return calls or None


SYNTAXES: dict[str, ToolSyntax] = {s.name: s for s in (
    ToolSyntax("hermes", "<tool_call>", "</tool_call>", _hermes, close_optional=True),
    ToolSyntax("glm", "<tool_call>", "</tool_call>", _keyed_body("arg_key", "arg_value"),
               inner=("<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")),
    ToolSyntax("hy3", "<tool_call:opensource>", "</tool_call:opensource>",
               _keyed_body("arg_key:opensource", "arg_value:opensource", "<tool_sep:opensource>"),
               inner=("<tool_sep:opensource>", "<arg_key:opensource>", "</arg_key:opensource>",
                      "<arg_value:opensource>", "</arg_value:opensource>"),
               sections=("<tool_calls:opensource>", "</tool_calls:opensource>")),
    ToolSyntax("seed", "<seed:tool_call>", "</seed:tool_call>", _xml_functions),
    ToolSyntax("minimax", "<invoke", "</invoke>", _invoke_body("", False),
               sections=("<minimax:tool_call>", "</minimax:tool_call>")),
    ToolSyntax("dsml", "<｜DSML｜invoke", "</｜DSML｜invoke>", _invoke_body("｜DSML｜", True),
               sections=("<｜DSML｜function_calls>", "</｜DSML｜function_calls>",
                         "<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>")),
    ToolSyntax("kimi", "<|tool_call_begin|>", "<|tool_call_end|>", _kimi, close_optional=True,
               inner=("<|tool_call_argument_begin|>",),
               sections=("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>")),
    ToolSyntax("deepseek", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", _deepseek, close_optional=True,
               inner=("<｜tool▁sep｜>",), sections=("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>")),
    ToolSyntax("gemma4", "<|tool_call>", "<tool_call|>", _gemma, close_optional=True),
    ToolSyntax("lfm2", "<|tool_call_start|>", "<|tool_call_end|>", _pythonic, close_optional=True),
    ToolSyntax("nemotron", "<TOOLCALL>", "</TOOLCALL>", _json, close_optional=True),
    ToolSyntax("apriel", "<tool_calls>", "</tool_calls>", _json, close_optional=True),
    ToolSyntax("cohere", "<|START_ACTION|>", "<|END_ACTION|>", _json, close_optional=True),
    ToolSyntax("mistral", "[TOOL_CALLS]", None, _mistral, inner=("[ARGS]", "[CALL_ID]")),
    ToolSyntax("granite", "<|tool_call|>", None, _json),
    ToolSyntax("firefunction", " functools", None, _json),
    ToolSyntax("gigachat", "<|function_call|>", None, _json),
    ToolSyntax("llama3", "<|python_tag|>", None, _llama3, leading=True),
)}


def parse_region(syntax: ToolSyntax, text: str, schema: Schema = no_schema) -> tuple[list[Call], str]:
    """The calls in `text` (which starts where a call or section opens) and the text left beside them, section
    markers removed; a call that does not decode stays in the text as written."""
    if syntax.leading:
        body = text.strip()
        body = body[len(syntax.open):] if body.startswith(syntax.open) else body
        calls = syntax.body(body, schema) if body.startswith("{") else None
        return (calls, "") if calls else ([], text)
    for marker in syntax.sections:
        text = text.replace(marker, "")
    calls: list[Call] = []
    left: list[str] = []
    pos = 0
    while True:
        start = text.find(syntax.open, pos)
        if start == -1:
            left.append(text[pos:])
            break
        left.append(text[pos:start])
        body_at = start + len(syntax.open)
        end, after = _call_end(syntax, text, body_at)
        found = syntax.body(text[body_at:end], schema) if end is not None else None
        if found is None:
            # not a call: keep its opening text and look further on (a later call may still decode)
            left.append(syntax.open)
            pos = body_at
            continue
        calls += found
        pos = after
    return calls, "".join(left)


def _call_end(syntax: ToolSyntax, text: str, at: int) -> tuple[int | None, int]:
    """Where the body that starts at `at` ends, and where the text after the call resumes."""
    if syntax.close is None:
        nxt = text.find(syntax.open, at)
        return (len(text), len(text)) if nxt == -1 else (nxt, nxt)
    close = text.find(syntax.close, at)
    if close != -1:
        nxt = text.find(syntax.open, at)
        if nxt == -1 or nxt > close or not syntax.close_optional:
            return close, close + len(syntax.close)
        return nxt, nxt  # the next call opens before this one closes: this one ended unclosed
    if syntax.close_optional:
        nxt = text.find(syntax.open, at)
        return (len(text), len(text)) if nxt == -1 else (nxt, nxt)
    return None, len(text)
