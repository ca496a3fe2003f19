"""Split Go template source into text and action tokens, applying `{{- -}}` trimming and dropping comments."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from .template_error import TemplateError
from .funcs import FUNCS


@dataclass
class Tok:
    kind: str  # str, num, bool, nil, field, var, ident, (, ), |, ",", :=, =, char
    value: Any
    adjacent: bool = False  # no whitespace before this token (a field chained onto ")")


@dataclass
class _Raw:
    """A lexed action before parsing, with its position for error messages."""

    toks: list[Tok]
    pos: int


_NUM_RE = re.compile(r"[+-]?(0[xX][0-9a-fA-F_]+|(\d[\d_]*)?\.?\d[\d_]*([eE][+-]?\d+)?)")
_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FIELD_RE = re.compile(r"(\.[A-Za-z_][A-Za-z0-9_]*)+")
_VAR_RE = re.compile(r"\$[A-Za-z0-9_]*")
_SPACE = " \t\r\n"


def _unquote(body: str, pos: int) -> str:
    try:
        return json.loads('"' + body.replace("\\'", "'").replace("\\a", "\\u0007").replace("\\v", "\\u000b") + '"')
    except ValueError:
        raise TemplateError(f"bad string literal at offset {pos}: \"{body}\"") from None


def _lex(src: str) -> list[str | _Raw]:
    """Split into text and actions, applying `{{-`/`-}}` trimming and dropping comments."""
    items: list[str | _Raw] = []
    pos, n = 0, len(src)
    trim_next = False
    while pos < n:
        start = src.find("{{", pos)
        text = src[pos:] if start == -1 else src[pos:start]
        if trim_next:
            text = text.lstrip(_SPACE)
        if start == -1:
            items.append(text)
            break
        p = start + 2
        if src.startswith("-", p) and p + 1 < n and src[p + 1] in _SPACE:
            text = text.rstrip(_SPACE)
            p += 2
        items.append(text)
        toks, p, trim_next = _lex_action(src, p, start)
        if toks is not None:
            items.append(_Raw(toks, start))
        pos = p
    return [i for i in items if not (isinstance(i, str) and i == "")]


def _lex_action(src: str, p: int, start: int) -> tuple[list[Tok] | None, int, bool]:
    n = len(src)
    while p < n and src[p] in _SPACE:
        p += 1
    if src.startswith("/*", p):
        end = src.find("*/", p + 2)
        if end == -1:
            raise TemplateError(f"unclosed comment at offset {start}")
        p = end + 2
        trim = False
        if src.startswith(" -}}", p):
            trim, p = True, p + 4
        elif src.startswith("}}", p):
            p += 2
        else:
            raise TemplateError(f"comment ends before closing delimiter at offset {start}")
        return None, p, trim
    toks: list[Tok] = []
    while True:
        ws = p
        while p < n and src[p] in _SPACE:
            p += 1
        if p >= n or src.startswith("{{", p):
            raise TemplateError(f"unclosed action starting at offset {start}")
        if src.startswith("}}", p):
            return toks, p + 2, False
        if src.startswith("-}}", p) and p > ws:
            return toks, p + 3, True
        adjacent = p == ws
        c = src[p]
        if c == '"':
            q = p + 1
            while q < n and src[q] != '"':
                q += 2 if src[q] == "\\" else 1
            if q >= n:
                raise TemplateError(f"unterminated string at offset {p}")
            toks.append(Tok("str", _unquote(src[p + 1 : q], p), adjacent))
            p = q + 1
        elif c == "`":
            q = src.find("`", p + 1)
            if q == -1:
                raise TemplateError(f"unterminated raw string at offset {p}")
            toks.append(Tok("str", src[p + 1 : q], adjacent))
            p = q + 1
        elif c == "'":
            q = src.find("'", p + 2 if src[p + 1 : p + 2] == "\\" else p + 1)
            if q == -1:
                raise TemplateError(f"unterminated character constant at offset {p}")
            ch = _unquote(src[p + 1 : q].replace('"', '\\"'), p)
            toks.append(Tok("num", ord(ch[0]) if ch else 0, adjacent))
            p = q + 1
        elif c == "." and (m := _FIELD_RE.match(src, p)):
            toks.append(Tok("field", m.group(0)[1:].split("."), adjacent))
            p = m.end()
        elif c == ".":
            toks.append(Tok("field", [], adjacent))
            p += 1
        elif c == "$":
            m = _VAR_RE.match(src, p)
            assert m
            chain = _FIELD_RE.match(src, m.end())
            toks.append(Tok("var", (m.group(0), chain.group(0)[1:].split(".") if chain else []), adjacent))
            p = chain.end() if chain else m.end()
        elif src.startswith(":=", p):
            toks.append(Tok(":=", None, adjacent))
            p += 2
        elif c in "()|,=":
            toks.append(Tok(c, None, adjacent))
            p += 1
        elif (c.isdigit() or (c in "+-" and p + 1 < n and (src[p + 1].isdigit() or src[p + 1] == "."))) and (
            m := _NUM_RE.match(src, p)
        ):
            text = m.group(0).replace("_", "")
            try:
                value: Any = int(text, 0) if re.fullmatch(r"[+-]?(0[xX][0-9a-fA-F]+|\d+)", text) else float(text)
            except ValueError:
                raise TemplateError(f"bad number {text!r} at offset {p}") from None
            toks.append(Tok("num", value, adjacent))
            p = m.end()
        elif m := _IDENT_RE.match(src, p):
            word = m.group(0)
            if word in ("true", "false"):
                toks.append(Tok("bool", word == "true", adjacent))
            elif word == "nil":
                toks.append(Tok("nil", None, adjacent))
            else:
                toks.append(Tok("ident", word, adjacent))
            p = m.end()
            if p < n and src[p] == "." and (chain := _FIELD_RE.match(src, p)) and word not in FUNCS:
                raise TemplateError(f"method or field call on {word!r} is not supported (offset {p})")
        else:
            raise TemplateError(f"unexpected character {c!r} in action at offset {p}")
