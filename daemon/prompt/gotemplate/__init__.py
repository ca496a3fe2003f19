"""A Go text/template subset: enough for the TEMPLATEs that Ollama-store models carry.

Supported: text with `{{- -}}` trimming, comments, fields (`.A.B`), variables (`$`, `$x := ...`, `$x = ...`),
pipelines (`a | f b`), parenthesised pipelines, `if`/`else if`/`else`, `range` (lists, maps with sorted keys,
ints; `else`, `break`, `continue`), `with`, string/number/bool/nil literals and the functions real
templates call (and, or, not, eq, ne, lt, le, gt, ge, len, index, slice, print, printf, println, json, html,
js, urlquery, currentDate, yesterdayDate, toTypeScriptType). `define`, `template`, `block` and method calls
raise TemplateError naming the construct. Ollama's chat semantics (messages vs legacy mode) live in
`ollama.py` (render_go_chat); the other modules only parse and execute.
"""
from __future__ import annotations

from .render_budget import Budget, TemplateBudgetExceeded
from .template_error import TemplateError
from .execute import cut_after_response, execute, identifiers, render
from .funcs import FUNCS, GoValue, go_str, truth
from .parser import Action, Branch, Operand, Pipe, parse

__all__ = ["FUNCS", "Action", "Budget", "TemplateBudgetExceeded", "Branch", "GoValue", "Operand", "Pipe", "TemplateError", "cut_after_response", "execute",
           "go_str", "identifiers", "parse", "render", "truth"]
