"""Tokens -> nodes: text, actions (pipelines), if/with/range branches, break/continue."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .render_budget import cache_small
from .template_error import TemplateError
from .funcs import FUNCS, LAZY_FUNCS
from .lexer import Tok, _Raw, _lex


@dataclass
class Operand:
    kind: str  # lit, field, var, func, pipe
    value: Any = None
    chain: list[str] = field(default_factory=list)


@dataclass
class Pipe:
    decl: list[str]
    assign: bool  # `=` rather than `:=`
    cmds: list[list[Operand]]


@dataclass
class Action:
    pipe: Pipe


@dataclass
class Branch:
    kind: str  # if | with | range
    pipe: Pipe
    body: list[Any]
    else_body: list[Any] | None = None


@dataclass
class Loop:
    kind: str  # break | continue


MAX_NESTING = 100  # if/with/range blocks or parentheses inside one another; real templates nest a handful


class _Parser:
    def __init__(self, items: list[str | _Raw]):
        self.items, self.i = items, 0
        self.depth = 0  # the parser recurses per level: a crafted template must end in an error, not a RecursionError

    def _enter(self, pos: int) -> None:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise TemplateError(f"template nesting deeper than {MAX_NESTING} levels at offset {pos}")

    def parse_list(self, stop: tuple[str, ...]) -> tuple[list[Any], _Raw | None]:
        out: list[Any] = []
        while self.i < len(self.items):
            item = self.items[self.i]
            self.i += 1
            if isinstance(item, str):
                out.append(item)
                continue
            toks = item.toks
            if not toks:
                raise TemplateError(f"missing value for command at offset {item.pos}")
            head = toks[0].value if toks[0].kind == "ident" else None
            if head in ("end", "else"):
                if head not in stop:
                    raise TemplateError(f"unexpected {{{{{head}}}}} at offset {item.pos}")
                return out, item
            if head in ("if", "with", "range"):
                out.append(self.parse_branch(head, toks[1:], item.pos))
            elif head in ("break", "continue"):
                out.append(Loop(head))
            elif head in ("define", "template", "block"):
                raise TemplateError(f"{{{{{head}}}}} is not supported in templates (offset {item.pos})")
            else:
                out.append(Action(self.parse_pipe(toks, item.pos, allow_decl=True)))
        if stop:
            raise TemplateError(f"unexpected EOF: missing {{{{end}}}} (expected one of {', '.join(stop)})")
        return out, None

    def parse_branch(self, kind: str, toks: list[Tok], pos: int) -> Branch:
        self._enter(pos)
        try:
            return self._parse_branch(kind, toks, pos)
        finally:
            self.depth -= 1

    def _parse_branch(self, kind: str, toks: list[Tok], pos: int) -> Branch:
        pipe = self.parse_pipe(toks, pos, allow_decl=True, range_decl=kind == "range")
        body, term = self.parse_list(("else", "end"))
        node = Branch(kind, pipe, body)
        assert term is not None
        if term.toks[0].value == "else":
            rest = term.toks[1:]
            if rest and rest[0].kind == "ident" and rest[0].value in ("if", "with"):
                node.else_body = [self.parse_branch(rest[0].value, rest[1:], term.pos)]
            elif rest:
                raise TemplateError(f"unexpected tokens after {{{{else}}}} at offset {term.pos}")
            else:
                node.else_body, end = self.parse_list(("end",))
                assert end is not None
        return node

    def parse_pipe(self, toks: list[Tok], pos: int, allow_decl: bool = False, range_decl: bool = False) -> Pipe:
        decl: list[str] = []
        assign = False
        # declarations: `$x :=`, `$x =`, and in range `$i, $e :=`
        if allow_decl and toks and toks[0].kind == "var" and not toks[0].value[1]:
            if len(toks) > 1 and toks[1].kind in (":=", "="):
                decl, assign, toks = [toks[0].value[0]], toks[1].kind == "=", toks[2:]
            elif (range_decl and len(toks) > 3 and toks[1].kind == "," and toks[2].kind == "var"
                  and not toks[2].value[1] and toks[3].kind == ":="):
                decl, toks = [toks[0].value[0], toks[2].value[0]], toks[4:]
        cmds: list[list[Operand]] = [[]]
        k = 0
        while k < len(toks):
            t = toks[k]
            if t.kind == "|":
                if not cmds[-1]:
                    raise TemplateError(f"missing command before '|' at offset {pos}")
                cmds.append([])
                k += 1
                continue
            op, k = self.parse_operand(toks, k, pos)
            cmds[-1].append(op)
        if not cmds[-1]:
            raise TemplateError(f"missing value in pipeline at offset {pos}")
        return Pipe(decl, assign, cmds)

    def parse_operand(self, toks: list[Tok], k: int, pos: int) -> tuple[Operand, int]:
        t = toks[k]
        if t.kind in ("str", "num", "bool", "nil"):
            op = Operand("lit", t.value)
        elif t.kind == "field":
            op = Operand("field", chain=list(t.value))
        elif t.kind == "var":
            op = Operand("var", t.value[0], list(t.value[1]))
        elif t.kind == "ident":
            if t.value not in FUNCS and t.value not in LAZY_FUNCS:
                raise TemplateError(f'function "{t.value}" not defined (offset {pos})')
            op = Operand("func", t.value)
        elif t.kind == "(":
            depth, end = 0, k
            while end < len(toks):
                depth += {"(": 1, ")": -1}.get(toks[end].kind, 0)
                if depth == 0:
                    break
                end += 1
            if end >= len(toks):
                raise TemplateError(f"unclosed '(' at offset {pos}")
            self._enter(pos)
            try:
                op = Operand("pipe", self.parse_pipe(toks[k + 1 : end], pos))
            finally:
                self.depth -= 1
            k = end
            if k + 1 < len(toks) and toks[k + 1].kind == "field" and toks[k + 1].adjacent:
                op.chain = list(toks[k + 1].value)
                k += 1
        else:
            raise TemplateError(f"unexpected {t.kind!r} in pipeline at offset {pos}")
        return op, k + 1


@cache_small(maxsize=128)
def parse(src: str) -> list[Any]:
    """Parse template text into a node list (cached; the nodes are never mutated)."""
    parser = _Parser(_lex(src))
    nodes, _ = parser.parse_list(())
    return nodes
