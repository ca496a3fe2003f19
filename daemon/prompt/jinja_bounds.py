"""The Jinja sandbox that chat templates (the model's, or one a request carries) run in, with every operation
that could build a huge value in one step checked before it runs: `*`, `**`, `+`, `%`, `~`, printing, the
widening filters (`center`, `indent`, `format`, `replace`, `join`, `wordwrap`, ...) and str methods
(`"x".center(10**9)`, `"{:>999999999}".format(x)`). Over the limit: TemplateBudgetExceeded (HTTP 400 upstream)."""
from __future__ import annotations

import functools
import inspect
import itertools
import json
import re
import string
from collections.abc import Iterator, Sized
from typing import Any, Callable

import jinja2
from jinja2.compiler import CodeGenerator, Frame, optimizeconst
from jinja2.sandbox import SandboxedEnvironment
from jinja2.utils import Namespace, generate_lorem_ipsum

from .gotemplate.render_budget import MAX_ITEMS, MAX_OUTPUT, TemplateBudgetExceeded, check_size, size_of

MAX_INT_BITS = 1 << 17  # ~40,000 digits: int arithmetic past this is slow in one step and prints as an error anyway


def _unpack(x: Any) -> Any:
    """What a Jinja object prints besides its name: a namespace its attributes."""
    if isinstance(x, Namespace):
        return object.__getattribute__(x, "_Namespace__attrs")
    return None


def printed_size(v: Any, limit: int = MAX_OUTPUT) -> int:
    return size_of(v, limit, _unpack)


def too_big(v: Any) -> bool:
    """A value past the limits on its own (the line tracer's check of a template's variables)."""
    if isinstance(v, str):
        return len(v) > MAX_OUTPUT
    return isinstance(v, (list, tuple, dict)) and len(v) > MAX_ITEMS


def _int(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def _bounded_list(value: Any, what: str) -> Any:
    """An iterator materialised (at most MAX_ITEMS items) so that its size can be known; other values as given."""
    if isinstance(value, Iterator):
        items = list(itertools.islice(value, MAX_ITEMS + 1))
        check_size(len(items), what, MAX_ITEMS)
        return items
    return value


# ------------------------------------------------------------------------------------------ format strings

_PERCENT = re.compile(r"%(?:\([^)]*\))?[#0 +-]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?[a-zA-Z%]")


def _number(text: str) -> int:
    return int(text) if len(text) <= 12 else 10**12


def percent_size(fmt: str, args: Any) -> int:
    """At least the length of `fmt % args`: each conversion may print every argument, padded to its width."""
    values = args if isinstance(args, tuple) else (args,)
    total, per_field, star = len(fmt), printed_size(values), False
    for m in _PERCENT.finditer(fmt):
        total += per_field
        for g in m.groups():
            if g == "*":
                star = True
            elif g:
                total += _number(g)
        if total > MAX_OUTPUT:
            break
    if star:  # widths taken from the arguments
        total += sum(abs(_int(a)) for a in values)
    return total


def format_size(fmt: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """At least the length of `fmt.format(*args, **kwargs)`: every field may print every argument, padded."""
    total, per_field, nested = len(fmt), printed_size((args, kwargs)), False
    for _, field, spec, _ in string.Formatter().parse(fmt):
        if field is None:
            continue
        total += per_field + sum(_number(n) for n in re.findall(r"\d+", spec or ""))
        nested = nested or "{" in (spec or "")
        if total > MAX_OUTPUT:
            break
    if nested:  # `{:{w}}`: widths taken from the arguments
        total += sum(abs(_int(a)) for a in (*args, *kwargs.values()))
    return total


# ------------------------------------------------------------------------------------------ filters

def _replace_size(s: Any, old: Any, new: Any, count: Any) -> int:
    if not isinstance(s, str) or not isinstance(old, str) or not isinstance(new, str):
        return printed_size(s) * (printed_size(new) + 1)
    n = s.count(old) if old else len(s) + 1
    if isinstance(count, int) and count >= 0:
        n = min(n, count)
    return len(s) + n * max(0, len(new) - len(old))


def _join_size(items: Any, sep: Any) -> int:
    n = len(items) if isinstance(items, Sized) else 1
    return printed_size(items) + n * printed_size(sep)


def _lines(s: Any) -> int:
    return s.count("\n") + 1 if isinstance(s, str) else printed_size(s)


def _wordwrap_size(a: dict[str, Any]) -> int:
    n = printed_size(a["s"])
    breaks = n // max(1, _int(a["width"]) or 1) + _lines(a["s"])
    return n + breaks * printed_size(a["wrapstring"] or "\n")


def _indent_size(a: dict[str, Any]) -> int:
    w = a["width"]
    width = len(w) if isinstance(w, str) else _int(w)
    return printed_size(a["s"]) + _lines(a["s"]) * width + width


def _items(n: int, what: str) -> int:
    check_size(n, what, MAX_ITEMS)
    return 0


# Per filter: the (at least) size of its result from its bound arguments; checked before the filter runs.
_FILTER_SIZES: dict[str, Callable[[dict[str, Any]], int]] = {
    "center": lambda a: max(printed_size(a["value"]), _int(a["width"])),
    "indent": _indent_size,
    "format": lambda a: (percent_size(a["value"], a["kwargs"] or a["args"]) if isinstance(a["value"], str)
                         else printed_size(a["value"]) + printed_size((a["args"], a["kwargs"]))),
    "replace": lambda a: _replace_size(a["s"], a["old"], a["new"], a["count"]),
    "join": lambda a: _join_size(a["value"], a["d"]),
    "wordwrap": _wordwrap_size,
    "truncate": lambda a: printed_size(a["s"]) + printed_size(a["end"]),
    "batch": lambda a: _items(_int(a["linecount"]) if a["fill_with"] is not None else 0, "the batch filter"),
    "slice": lambda a: _items(_int(a["slices"]), "the slice filter"),
    "list": lambda a: _items(len(a["value"]) if isinstance(a["value"], Sized) else 0, "the list filter"),
}
# Filters that print their input, and how much longer the result can be (escaping: `"` -> `&#34;`).
_PRINTING = {"capitalize": 2, "e": 6, "escape": 6, "forceescape": 6, "lower": 2, "pprint": 4, "safe": 1,
             "string": 1, "striptags": 1, "title": 2, "trim": 1, "upper": 3, "urlencode": 12, "urlize": 4,
             "wordcount": 1, "xmlattr": 6, "sum": 1}
_MATERIALISE = {"join": "value", "list": "value"}  # iterators these filters consume, counted first


def _guard_filter(name: str, f: Callable[..., Any]) -> Callable[..., Any]:
    inner = getattr(f, "__wrapped__", f)  # jinja's async variants wrap the sync filter
    sig = inspect.signature(inner)
    params = list(sig.parameters)
    # A pass_eval_context wrapper around a filter without that parameter: its first argument is not bound here.
    skip = 1 if getattr(f, "jinja_pass_arg", None) and not getattr(inner, "jinja_pass_arg", None) else 0
    passed = params[0] if getattr(inner, "jinja_pass_arg", None) else None
    estimate = _FILTER_SIZES.get(name)
    factor = _PRINTING.get(name, 1)

    @functools.wraps(f)  # keeps jinja's pass_context/pass_environment marker
    def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = sig.bind(*args[skip:], **kwargs)
        except TypeError:
            return f(*args, **kwargs)  # the filter reports its own wrong arguments
        bound.apply_defaults()
        a = bound.arguments
        if name in _MATERIALISE:
            a[_MATERIALISE[name]] = _bounded_list(a[_MATERIALISE[name]], f"the {name} filter")
        if estimate is not None:
            n = estimate(a)
        else:
            n = printed_size([v for k, v in a.items() if k != passed]) * factor
        check_size(n, f"the {name} filter")
        return f(*args[:skip], *bound.args, **bound.kwargs)

    return guarded


# ------------------------------------------------------------------------------------------ str methods

def _split_items(s: str, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    if name == "splitlines":
        return sum(s.count(c) for c in "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029") + 1
    sep = args[0] if args else kwargs.get("sep")
    maxsplit = _int(args[1] if len(args) > 1 else kwargs.get("maxsplit", -1)) or -1
    n = s.count(sep) + 1 if isinstance(sep, str) and sep else len(s) // 2 + 1
    return min(n, maxsplit + 1) if maxsplit >= 0 else n


def _str_method_size(s: str, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    first = args[0] if args else None
    if name in ("center", "ljust", "rjust", "zfill"):
        return max(len(s), _int(first if first is not None else kwargs.get("width")))
    if name == "expandtabs":
        return len(s) + s.count("\t") * _int(first if first is not None else kwargs.get("tabsize", 8))
    if name == "replace":
        return _replace_size(s, first, args[1] if len(args) > 1 else None, args[2] if len(args) > 2 else -1)
    if name == "join":
        return _join_size(first, s)
    if name == "format":
        return format_size(s, args, kwargs)
    if name == "format_map":
        return format_size(s, (), first if isinstance(first, dict) else {})
    if name == "translate" and isinstance(first, dict):
        return len(s) * max([printed_size(v) for v in first.values()] + [1])
    if name in ("split", "rsplit", "splitlines"):
        check_size(_split_items(s, name, args, kwargs), f"str.{name}", MAX_ITEMS)
    return 0


# ------------------------------------------------------------------------------------------ the environment

class _BoundedNamespace(Namespace):
    """`namespace()` whose attributes cannot grow past the output budget (`{% set ns.s = ns.s ~ ns.s %}`)."""

    def __setitem__(self, name: str, value: Any) -> None:
        check_size(printed_size(value), "a namespace attribute")
        super().__setitem__(name, value)


class _BoundedCodeGenerator(CodeGenerator):
    """`a ~ b ~ c` checked (by the environment) before the pieces are joined."""

    @optimizeconst
    def visit_Concat(self, node: jinja2.nodes.Concat, frame: Frame) -> None:
        join = "str_join"
        if frame.eval_ctx.volatile:
            join = "(markup_join if context.eval_ctx.volatile else str_join)"
        elif frame.eval_ctx.autoescape:
            join = "markup_join"
        self.write(f"{join}(environment.checked_pieces((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write(")))")


class BoundedSandbox(SandboxedEnvironment):
    """The sandbox with the operations that build values checked before they run."""

    code_generator_class = _BoundedCodeGenerator
    intercepted_binops = frozenset({"*", "**", "+", "%"})

    @staticmethod
    def checked_pieces(pieces: tuple[Any, ...]) -> tuple[Any, ...]:
        check_size(sum(printed_size(p) for p in pieces), "the ~ operator")
        return pieces

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and _int(n) > 0:
                    check_size(printed_size(seq) * n, "the * operator")
                    check_size(len(seq) * n if not isinstance(seq, str) else 0, "the * operator", MAX_ITEMS)
            if _int(left) and _int(right):
                check_size(left.bit_length() + right.bit_length(), "the * operator", MAX_INT_BITS)
        elif operator == "**" and _int(left) not in (0, 1, -1) and _int(right) > 0:
            check_size(left.bit_length() * right, "the ** operator", MAX_INT_BITS)
        elif operator == "+" and isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
            check_size(len(left) + len(right), "the + operator", MAX_OUTPUT if isinstance(left, str) else MAX_ITEMS)
        elif operator == "%" and isinstance(left, str):
            check_size(percent_size(left, right), "the % operator")
        return super().call_binop(context, operator, left, right)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 - jinja's form
        target = getattr(__obj, "__wrapped__", __obj)  # the sandbox wraps str.format
        owner = getattr(target, "__self__", None)
        if isinstance(owner, str):
            name = getattr(target, "__name__", "")
            if name == "join" and args:
                args = (_bounded_list(args[0], "str.join"), *args[1:])
            check_size(_str_method_size(owner, name, args, kwargs), f"str.{name}")
        return super().call(__context, __obj, *args, **kwargs)


def _finalize(value: Any) -> Any:
    """Every `{{ value }}`: checked before it is turned into text."""
    check_size(printed_size(value), "printing a value")
    return value


def _bounded_concat(parts: Any) -> str:
    parts = list(parts)
    check_size(sum(len(p) for p in parts if isinstance(p, str)), "a block of template output")
    return "".join(parts)


def _lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:  # noqa: A002 - jinja's names
    check_size(_int(n) * _int(max), "lipsum", 100_000)
    return generate_lorem_ipsum(n, html, min, max)


def _json_nodes(x: Any, limit: int = MAX_ITEMS) -> tuple[int, int]:
    """(nodes, depth) of a value, refusing more than `limit` nodes: a list that holds itself twice, doubled 30
    times, is tiny in memory but would take json.dumps (holding the GIL) hours."""
    stack, seen, depth = [(x, 1)], 0, 0
    while stack:
        v, d = stack.pop()
        seen += 1
        depth = max(depth, d)
        if seen > limit:
            raise TemplateBudgetExceeded(f"tojson: the value has over {limit} elements")
        if isinstance(v, dict):
            stack.extend((c, d + 1) for c in v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend((c, d + 1) for c in v)
    return seen, depth


def json_default(o: Any) -> Any:
    if isinstance(o, (jinja2.Undefined,)):
        return None
    try:
        return list(o)  # `tools | map(attribute='function') | tojson` hands over a generator
    except TypeError:
        return str(o)


def tojson(x: Any, ensure_ascii: bool = False, indent: int | str | None = None, separators: Any = None,
           sort_keys: bool = False) -> str:
    # HF's version: no HTML escaping, unicode kept (jinja's built-in returns escaped Markup)
    nodes, depth = _json_nodes(x)
    pad = len(indent) if isinstance(indent, str) else _int(indent)
    check_size(printed_size(x) * (6 if ensure_ascii else 1) + nodes * (printed_size(separators) + 4 + pad * depth),
               "tojson")
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys,
                      default=json_default)


def bounded_environment(**options: Any) -> BoundedSandbox:
    """A bounded sandbox: every filter guarded, printing and block output checked, namespace and lipsum bounded."""
    env = BoundedSandbox(finalize=_finalize, **options)
    env.concat = _bounded_concat  # type: ignore[method-assign] - joins of buffered output (macros, set blocks)
    env.filters["tojson"] = tojson
    env.filters = {name: _guard_filter(name, f) if name in _FILTER_SIZES or name in _PRINTING else f
                   for name, f in env.filters.items()}
    env.globals["namespace"] = _BoundedNamespace
    env.globals["lipsum"] = _lipsum
    return env
