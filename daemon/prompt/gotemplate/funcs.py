"""Go template values (truth, printing, field access) and the built-in functions templates call."""
from __future__ import annotations

import datetime as _dt
import html as _html
import json
import re
import urllib.parse
from typing import Any, Callable

from .render_budget import TemplateBudgetExceeded, check_size, size_of
from .template_error import TemplateError


class GoValue:
    """Marks a value with a custom String() (Ollama's Tool and tool-call Arguments print as JSON)."""

    def __init__(self, fields: dict[str, Any], text: str, truthy: bool = True):
        self.fields, self.text, self.truthy = fields, text, truthy

    def __str__(self) -> str:
        return self.text


def printed_size(v: Any) -> int:
    """At least the characters `v` prints as (counted without printing it)."""
    return size_of(v, unpack=lambda x: x.text if isinstance(x, GoValue) else None)


def truth(v: Any) -> bool:
    if isinstance(v, GoValue):
        return v.truthy
    if v is None:
        return False
    if isinstance(v, (bool, int, float, str, list, tuple, dict)):
        return bool(v)
    return True


def go_str(v: Any) -> str:
    """fmt.Sprint semantics for the value kinds templates print."""
    if v is None:
        return "<no value>"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        if v.is_integer() and abs(v) < 1e21:
            return str(int(v))
        return repr(v).replace("inf", "+Inf")
    if isinstance(v, (list, tuple)):
        return "[" + " ".join(go_str(x) for x in v) + "]"
    if isinstance(v, dict):
        return "map[" + " ".join(f"{go_str(k)}:{go_str(v[k])}" for k in sorted(v, key=str)) + "]"
    return str(v)


def _get_field(v: Any, name: str) -> Any:
    if isinstance(v, GoValue):
        return v.fields.get(name)
    if isinstance(v, dict):
        return v.get(name)
    if v is None:
        raise TemplateError(f"nil pointer evaluating .{name}")
    raise TemplateError(f"can't evaluate field {name} in type {type(v).__name__}")


def _to_json_value(v: Any) -> Any:
    if isinstance(v, GoValue):
        return json.loads(v.text) if v.text[:1] in "{[" else v.text
    if isinstance(v, dict):
        return {k: _to_json_value(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_to_json_value(x) for x in v]
    return v


def _json(v: Any) -> str:
    return json.dumps(_to_json_value(v), ensure_ascii=False, separators=(",", ":"))


def _cmp(a: Any, b: Any, op: str) -> bool:
    if isinstance(a, bool) != isinstance(b, bool) or not (
        (isinstance(a, (int, float)) and isinstance(b, (int, float))) or (isinstance(a, str) and isinstance(b, str))
    ):
        raise TemplateError(f"incompatible types for comparison: {go_str(a)!r} {op} {go_str(b)!r}")
    return {"lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b}[op]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, GoValue) or isinstance(b, GoValue):
        return str(a) == str(b)
    if isinstance(a, bool) != isinstance(b, bool):
        return False
    return a == b


def _eq(a: Any, *bs: Any) -> bool:
    if not bs:
        raise TemplateError("missing argument for comparison")
    return any(_same(a, b) for b in bs)


def _len(v: Any) -> int:
    if isinstance(v, GoValue):
        return len(v.fields)
    if isinstance(v, (str, list, tuple, dict)):
        return len(v.encode() if isinstance(v, str) else v)
    raise TemplateError(f"len of type {type(v).__name__}")


def _index(v: Any, *keys: Any) -> Any:
    for k in keys:
        if isinstance(v, GoValue):
            v = v.fields
        if isinstance(v, dict):
            v = v.get(k)
        elif isinstance(v, (list, tuple, str)):
            if not isinstance(k, int) or not 0 <= k < len(v):
                raise TemplateError(f"index out of range: {k}")
            v = v[k]
        else:
            raise TemplateError(f"can't index item of type {type(v).__name__}")
    return v


def _slice(v: Any, *idx: Any) -> Any:
    if not isinstance(v, (list, tuple, str)):
        raise TemplateError(f"can't slice item of type {type(v).__name__}")
    if len(idx) > 2:
        raise TemplateError("slice with 3 indices is not supported")
    lo = idx[0] if idx else 0
    hi = idx[1] if len(idx) > 1 else len(v)
    if not (isinstance(lo, int) and isinstance(hi, int) and 0 <= lo <= hi <= len(v)):
        raise TemplateError(f"slice index out of range: [{lo}:{hi}] of length {len(v)}")
    return v[lo:hi]


_VERB = re.compile(r"%([-+# 0]*\d*(?:\.\d+)?)([a-zA-Z%])")


def _printf(fmt: str, *args: Any) -> str:
    if isinstance(fmt, str):  # each verb prints one argument once, padded to its width (or precision)
        pads = sum(int(n[:6]) for flags, _ in _VERB.findall(fmt) for n in re.findall(r"\d+", flags))
        check_size(len(fmt) + printed_size(args) + pads, "printf")
    it = iter(args)

    def repl(m: re.Match[str]) -> str:
        verb = m.group(2)
        if verb == "%":
            return "%"
        if any(len(n) > 4 for n in re.findall(r"\d+", m.group(1))):  # "%999999999d" would build a huge string
            raise TemplateBudgetExceeded(f"printf: width or precision too large in %{m.group(1)}{verb}")
        try:
            a = next(it)
        except StopIteration:
            return f"%!{verb}(MISSING)"
        if verb == "q":
            return json.dumps(str(a), ensure_ascii=False)
        if verb == "d" and isinstance(a, (int, float)):
            return ("%" + m.group(1) + "d") % int(a)
        if verb in "feg" and isinstance(a, (int, float)):
            return ("%" + m.group(1) + verb) % a
        return ("%" + m.group(1) + "s") % go_str(a)

    return _VERB.sub(repl, fmt)


def _print(*args: Any) -> str:
    # fmt.Sprint adds spaces between operands when neither side is a string
    out = ""
    for i, a in enumerate(args):
        if i and not isinstance(a, str) and not isinstance(args[i - 1], str):
            out += " "
        out += go_str(a)
    return out


def _ts_type(v: Any) -> str:
    """Ollama's toTypeScriptType for a tool parameter's properties (best effort)."""
    v = _to_json_value(v)
    if not isinstance(v, dict):
        return "any"
    t = v.get("type")
    if isinstance(t, list):
        return " | ".join(_ts_type({**v, "type": x}) for x in t)
    if v.get("enum"):
        return " | ".join(json.dumps(e) for e in v["enum"])
    if t == "array":
        return f"{_ts_type(v.get('items') or {})}[]"
    if t == "object" and isinstance(v.get("properties"), dict):
        return "{" + ", ".join(f"{k}: {_ts_type(p)}" for k, p in v["properties"].items()) + "}"
    return {"string": "string", "integer": "number", "number": "number", "boolean": "boolean", "null": "null"}.get(
        str(t), "any")


def _bounded(name: str, factor: int, fn: Callable[..., str]) -> Callable[..., str]:
    """`fn` refusing arguments whose printed form, `factor` times longer (escaping), is past the value limit."""
    def bounded(*args: Any) -> str:
        check_size(printed_size(args) * factor, name)
        return fn(*args)
    return bounded


FUNCS: dict[str, Callable[..., Any]] = {
    "not": lambda a: not truth(a),
    "eq": _eq,
    "ne": lambda a, b: not _eq(a, b),
    "lt": lambda a, b: _cmp(a, b, "lt"),
    "le": lambda a, b: _cmp(a, b, "le"),
    "gt": lambda a, b: _cmp(a, b, "gt"),
    "ge": lambda a, b: _cmp(a, b, "ge"),
    "len": _len,
    "index": _index,
    "slice": _slice,
    "print": _bounded("print", 1, _print),
    "println": _bounded("println", 1, lambda *a: " ".join(go_str(x) for x in a) + "\n"),
    "printf": _printf,
    "json": _bounded("json", 6, _json),
    "html": _bounded("html", 6, lambda *a: _html.escape(_print(*a))),
    "js": _bounded("js", 6, lambda *a: json.dumps(_print(*a), ensure_ascii=False)[1:-1]),
    "urlquery": _bounded("urlquery", 9, lambda *a: urllib.parse.quote_plus(_print(*a))),
    "currentDate": lambda: _dt.date.today().strftime("%Y-%m-%d"),
    "yesterdayDate": lambda: (_dt.date.today() - _dt.timedelta(days=1)).strftime("%Y-%m-%d"),
    "toTypeScriptType": _ts_type,
}
LAZY_FUNCS = ("and", "or")  # short-circuit: evaluated argument by argument
