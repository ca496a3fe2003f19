"""Ollama's Template.Execute semantics on top of the Go template engine: the values a chat template sees
(System, Messages, Tools, Response, Think...), messages mode vs per-turn legacy mode, `.Response` auto-append."""
from __future__ import annotations

import json
from typing import Any

from .render_budget import Budget, cache_small
from .execute import cut_after_response, execute, identifiers
from .funcs import GoValue
from .parser import Action, Operand, Pipe, parse

DEFAULT_TEMPLATE = "{{ .Prompt }}"  # Ollama's template when a model has none


def go_nodes(template: str) -> list[Any]:
    """Parsed nodes of an Ollama TEMPLATE (cached), with `{{ .Response }}` appended where Ollama appends it."""
    return _go_parse(template)


@cache_small(maxsize=64)
def _go_parse(template: str) -> list[Any]:
    node_list = parse(template)
    names = identifiers(node_list)
    if "messages" not in names and "response" not in names:
        # Ollama appends `{{ .Response }}` to templates that reference neither
        node_list = node_list + [Action(Pipe([], False, [[Operand("field", chain=["Response"])]]))]
    return node_list


def go_vars(template: str) -> set[str]:
    """Lower-cased field names the template references (Ollama's Template.Vars)."""
    return identifiers(go_nodes(template))

def _go_name(key: str) -> str:
    key = key.lstrip("$")
    return "".join(p[:1].upper() + p[1:] for p in key.split("_"))


def _json_text(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def _go_value(obj: Any, key: str | None = None) -> Any:
    """JSON (tool schemas, tool calls) -> Go-struct-like values whose fields carry Go names."""
    if isinstance(obj, dict):
        if key in ("properties", "$defs", "defs"):  # user-named keys: a Go map
            return {k: _go_value(v) for k, v in obj.items()}
        if key == "arguments":  # ToolCallFunctionArguments: a map that prints as JSON
            return GoValue(dict(obj), _json_text(obj), truthy=bool(obj))
        return GoValue({_go_name(k): _go_value(v, k) for k, v in obj.items()}, _json_text(obj))
    if isinstance(obj, list):
        if key == "type":  # PropertyType prints as "[a b]" when several
            return GoValue({}, "[" + " ".join(map(str, obj)) + "]")
        return [_go_value(v) for v in obj]
    return obj


def _collate(messages: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """Ollama's collate: system texts joined by blank lines; consecutive same-role messages merged (not tool)."""
    system, out = [], []
    for m in messages:
        m = dict(m)
        if m.get("role") == "system":
            system.append(m.get("content") or "")
        if out and out[-1].get("role") == m.get("role") and m.get("role") != "tool":
            out[-1]["content"] = (out[-1].get("content") or "") + "\n\n" + (m.get("content") or "")
        else:
            out.append(m)
    return "\n\n".join(system), out


def _go_message(m: dict[str, Any]) -> dict[str, Any]:
    calls = []
    for i, c in enumerate(m.get("tool_calls") or []):
        fn = c.get("function") or {}
        calls.append(GoValue({"ID": c.get("id", ""), "Function": GoValue(
            {"Index": fn.get("index", i), "Name": fn.get("name", ""), "Arguments": _go_value(fn.get("arguments") or {}, "arguments")},
            _json_text(fn))}, _json_text(c)))
    return {"Role": m.get("role", ""), "Content": m.get("content") or "", "Thinking": m.get("thinking") or "",
            "Images": m.get("images") or [], "ToolCalls": calls, "ToolName": m.get("tool_name") or m.get("name") or "",
            "ToolCallID": m.get("tool_call_id") or ""}


def render_go_chat(template: str | None, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None,
                   think: bool | str | None = None, budget: Budget | None = None) -> str:
    """Ollama's Template.Execute: messages mode if the template uses .Messages, else per-turn legacy mode."""
    template = template or DEFAULT_TEMPLATE
    node_list = go_nodes(template)
    budget = budget or Budget()  # one for every execution below
    think_values = {"Think": bool(think) if think is not None else False,
                    "ThinkLevel": think if isinstance(think, str) else "", "IsThinkSet": think is not None}
    system, collated = _collate(messages)
    if "messages" in identifiers(node_list):
        return execute(node_list, {
            "System": system, "Messages": [_go_message(m) for m in collated],
            "Tools": [_go_value(t) for t in tools or []], "Response": "", **think_values}, budget)
    out: list[str] = []
    turn = {"System": "", "Prompt": "", "Response": ""}

    def flush() -> None:
        out.append(execute(node_list, {**turn, **think_values}, budget))
        turn.update(System="", Prompt="", Response="")

    for m in collated:
        role, content = m.get("role"), m.get("content") or ""
        if role == "system":
            if turn["Prompt"] or turn["Response"]:
                flush()
            turn["System"] = content
        elif role == "user":
            if turn["Response"]:
                flush()
            turn["Prompt"] = content
        elif role == "assistant":
            turn["Response"] = content
    out.append(execute(cut_after_response(node_list), {**turn, **think_values}, budget))
    return "".join(out)
