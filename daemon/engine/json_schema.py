"""A `format` JSON schema read as Ollama reads it, before llguidance compiles it.

Ollama hands the schema to llama.cpp's `json-schema-to-grammar`, which departs from JSON Schema where a
literal reading lets a weak model run until `num_predict`: an object lists only its `properties` unless
`additionalProperties` is `true` or a schema, required properties come first, and an integer has at most
16 digits. `ollama_semantics` rewrites a schema so that llguidance's literal reading gives those grammars;
`check_finite` refuses a schema no finite JSON value satisfies (a required property that contains itself),
which would otherwise be a grammar that can never end; `check_size` refuses a schema too big to compile in
well under a second. docs/api.md lists what still differs.
"""
from __future__ import annotations

import copy
from typing import Any
from urllib.parse import unquote

# llama.cpp's integral-part is "0" or up to 16 digits, so |n| <= 10**16 - 1. llguidance reads bounds through a
# float, where 10**16 - 1 rounds up to 10**16 (17 digits); 10**16 - 2 is exact, so that is the bound used.
MAX_INTEGER = 10**16 - 2
# A number's fraction, as a multipleOf: llama.cpp allows 16 digits, but llguidance reads multipleOf through a
# float and refuses 1e-11 and finer; 10 digits still keeps a weak model from writing digits forever.
FRACTION_STEP = 1e-10

_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
               "additionalItems", "unevaluatedProperties", "unevaluatedItems")
_VISIT_BUDGET = 20_000  # schema nodes check_finite looks at before it gives up and lets llguidance decide
# llguidance's grammar for an object's optional properties grows with the square of their number (any later
# property may follow each one): 1,000 compile in ~0.1 s, 10,000 in 10-60 s of a worker. OpenAI's structured
# outputs allow 5,000 properties in a schema; one object is held to fewer here for that square.
MAX_OBJECT_PROPERTIES = 1000
MAX_SCHEMA_PROPERTIES = 5000


class SchemaError(ValueError):
    """The schema cannot give a grammar; the message says why."""


def ollama_semantics(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of `schema` whose literal JSON Schema reading is what llama.cpp's converter makes of it."""
    root = copy.deepcopy(schema)
    _rewrite(root, root)
    return root


def _rewrite(node: Any, root: dict[str, Any]) -> None:
    if not isinstance(node, dict):
        return
    _merge_all_of(node, root)
    for sub in _subschemas(node):
        _rewrite(sub, root)
    _close_object(node)
    _bound_numbers(node)


def _types(node: dict[str, Any]) -> list[Any]:
    t = node.get("type")
    return t if isinstance(t, list) else [t]


def _close_object(node: dict[str, Any]) -> None:
    """No keys beyond `properties` unless additionalProperties says so; required ones first, as llama.cpp."""
    props = node.get("properties")
    if not isinstance(props, dict) or not ({None, "object"} & set(_types(node))):
        return
    node.setdefault("type", "object")  # llama.cpp makes any schema with properties an object
    node.setdefault("additionalProperties", False)
    required = node.get("required")
    if isinstance(required, list):
        if node["additionalProperties"] is False:  # llama.cpp ignores required names it has no schema for
            node["required"] = required = [r for r in required if isinstance(r, str) and r in props]
        wanted = {r for r in required if isinstance(r, str)}  # a set: 10,000 names are not 10**8 comparisons
        first = [k for k in props if k in wanted]
        node["properties"] = {k: props[k] for k in first + [k for k in props if k not in wanted]}


def _bound_numbers(node: dict[str, Any]) -> None:
    types = set(_types(node))
    has_min = "minimum" in node or "exclusiveMinimum" in node
    has_max = "maximum" in node or "exclusiveMaximum" in node
    if "integer" in types and "number" not in types:
        if not has_min and _number(node.get("maximum"), MAX_INTEGER) >= -MAX_INTEGER:
            node["minimum"] = -MAX_INTEGER
        if not has_max and _number(node.get("minimum"), -MAX_INTEGER) <= MAX_INTEGER:
            node["maximum"] = MAX_INTEGER
    elif "number" in types:  # an integral part of at most 16 digits: |x| < 10**16
        if not has_min and _number(node.get("maximum"), 0) > -10**16:
            node["exclusiveMinimum"] = -10**16
        if not has_max and _number(node.get("minimum"), 0) < 10**16:
            node["exclusiveMaximum"] = 10**16
        node.setdefault("multipleOf", FRACTION_STEP)


def _number(value: Any, default: float) -> float:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def _merge_all_of(node: dict[str, Any], root: dict[str, Any]) -> None:
    """allOf's object parts merged into one object, as llama.cpp does: closing each part on its own would
    forbid the other parts' keys and leave no object that satisfies them all."""
    parts = node.get("allOf")
    if not isinstance(parts, list):
        return
    kept: list[Any] = []
    for part in parts:
        target = resolve_ref(root, part["$ref"]) if isinstance(part, dict) and isinstance(part.get("$ref"), str) \
            and len(part) == 1 else part
        if isinstance(target, dict) and isinstance(target.get("properties"), dict) and \
                set(target) <= {"type", "properties", "required", "title", "description", "additionalProperties"} \
                and target.get("type", "object") == "object" and target is not node:
            props = node.setdefault("properties", {})
            for name, sub in target["properties"].items():
                if name not in props:
                    props[name] = copy.deepcopy(sub)
            required = node.setdefault("required", [])
            have = {r for r in required if isinstance(r, str)}
            required += [r for r in target.get("required", []) if not isinstance(r, str) or r not in have]
        else:
            kept.append(part)
    if len(kept) == len(parts):
        return
    if kept:
        node["allOf"] = kept
        node.setdefault("additionalProperties", True)  # the parts left over may name keys of their own
    else:
        del node["allOf"]


def check_size(schema: Any) -> None:
    """SchemaError naming the limit when an object of `schema` has over MAX_OBJECT_PROPERTIES properties, or the
    whole over MAX_SCHEMA_PROPERTIES: refused in one walk, before a worker spends seconds compiling it."""
    total = 0
    stack = [schema]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        props = node.get("properties")
        if isinstance(props, dict):
            if len(props) > MAX_OBJECT_PROPERTIES:
                raise SchemaError(f"schema too large: an object has {len(props)} properties, the limit is "
                                  f"{MAX_OBJECT_PROPERTIES} in one object ({MAX_SCHEMA_PROPERTIES} in the whole "
                                  f"schema); split it or leave properties out")
            total += len(props)
            if total > MAX_SCHEMA_PROPERTIES:
                raise SchemaError(f"schema too large: over {MAX_SCHEMA_PROPERTIES} properties in all, the limit "
                                  f"for a whole schema ({MAX_OBJECT_PROPERTIES} in one object); split it or leave "
                                  f"properties out")
        stack.extend(_subschemas(node))


def _subschemas(node: dict[str, Any]) -> list[Any]:
    """The schemas directly inside `node` (the places `_rewrite` visits)."""
    out: list[Any] = []
    for key in _SCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            out += node[key].values()
    for key in _SCHEMA_LISTS:
        if isinstance(node.get(key), list):
            out += node[key]
    for key in _SCHEMA_ONE:
        sub = node.get(key)
        out += sub if isinstance(sub, list) else [sub]
    return out


def resolve_ref(root: dict[str, Any], ref: str) -> Any:
    """The schema a local `$ref` ("#", "#/$defs/x") points at; None for a remote or broken one."""
    if not ref.startswith("#"):
        return None
    target: Any = root
    for raw in ref[1:].split("/")[1:] if ref != "#" else []:
        key = unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(target, dict) and key in target:
            target = target[key]
        elif isinstance(target, list) and key.isdigit() and int(key) < len(target):
            target = target[int(key)]
        else:
            return None
    return target


def check_finite(schema: dict[str, Any]) -> None:
    """SchemaError if no finite JSON value satisfies `schema` because it requires itself without end."""
    finder = _FiniteFinder(schema)
    if not finder.finite(schema):
        loop = f' ("$ref": "{finder.cycle}")' if finder.cycle else ""
        raise SchemaError(f"no finite JSON value satisfies this schema: a required property or array item "
                          f"contains the schema itself{loop} with no way to end")


class _FiniteFinder:
    """Whether a schema has a finite instance: a least fixpoint over its local `$ref`s, where a reference back
    into one being resolved is no way out. Only structure is judged; llguidance judges the rest."""

    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root
        self.resolving: list[str] = []
        self.known: set[str] = set()  # refs proven finite (a negative answer may rest on an assumption)
        self.cycle: str | None = None
        self.visits = 0

    def finite(self, node: Any) -> bool:
        self.visits += 1
        if self.visits > _VISIT_BUDGET or node is True or not isinstance(node, dict):
            return node is not False
        if "enum" in node or "const" in node:
            return True
        ref = node.get("$ref")
        if isinstance(ref, str) and not self._ref_finite(ref):
            return False
        if any(not self.finite(part) for part in node.get("allOf") or []):
            return False
        for key in ("anyOf", "oneOf"):
            alts = node.get(key)
            if isinstance(alts, list) and alts and not any(self.finite(alt) for alt in alts):
                return False
        types = set(_types(node)) - {None}
        if not types or types - {"object", "array"}:
            return True  # a scalar (any, when untyped) ends by itself
        return ("object" in types and self._object_finite(node)) or ("array" in types and self._array_finite(node))

    def _ref_finite(self, ref: str) -> bool:
        if ref in self.known:
            return True
        if ref in self.resolving:
            self.cycle = self.cycle or ref
            return False
        target = resolve_ref(self.root, ref)
        if target is None:
            return True  # remote or broken: llguidance reports it
        self.resolving.append(ref)
        try:
            ok = self.finite(target)
        finally:
            self.resolving.pop()
        if ok:
            self.known.add(ref)
        return ok

    def _object_finite(self, node: dict[str, Any]) -> bool:
        props = node.get("properties") if isinstance(node.get("properties"), dict) else {}
        required = node.get("required") if isinstance(node.get("required"), list) else []
        return all(self.finite(props[name]) for name in required if name in props)

    def _array_finite(self, node: dict[str, Any]) -> bool:
        min_items = node.get("minItems", 0)
        if not isinstance(min_items, int) or min_items <= 0:
            return True
        prefix = node.get("prefixItems") if isinstance(node.get("prefixItems"), list) else []
        if not all(self.finite(p) for p in prefix[:min_items]):
            return False
        items = node.get("items")
        return min_items <= len(prefix) or isinstance(items, list) or self.finite(items if items is not None else {})
