"""Run parsed nodes against data; plus the tree queries Ollama needs (identifiers, cut after .Response)."""
from __future__ import annotations

from typing import Any

from .render_budget import Budget, check_size
from .template_error import TemplateError
from .funcs import FUNCS, LAZY_FUNCS, GoValue, go_str, printed_size, truth, _get_field
from .parser import Action, Branch, Loop, Operand, Pipe, parse


class _Break(Exception):
    pass


class _Continue(Exception):
    pass


class _Exec:
    def __init__(self, root: Any, budget: Budget):
        self.root = root
        self.scopes: list[dict[str, Any]] = [{"$": root}]
        self.out: list[str] = []
        self.budget = budget

    def write(self, text: str) -> None:
        self.budget.emit(len(text))
        self.out.append(text)

    def var(self, name: str) -> Any:
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        raise TemplateError(f"undefined variable: {name}")

    def set_var(self, name: str, value: Any, assign: bool) -> None:
        if assign:
            for scope in reversed(self.scopes):
                if name in scope:
                    scope[name] = value
                    return
            raise TemplateError(f"undefined variable: {name}")
        self.scopes[-1][name] = value

    def chain(self, v: Any, chain: list[str]) -> Any:
        for name in chain:
            v = _get_field(v, name)
        return v

    def operand(self, op: Operand, dot: Any) -> Any:
        if op.kind == "lit":
            return op.value
        if op.kind == "field":
            return self.chain(dot, op.chain)
        if op.kind == "var":
            return self.chain(self.var(op.value), op.chain)
        if op.kind == "pipe":
            return self.chain(self.pipe(op.value, dot), op.chain)
        if op.kind == "func":
            return self.call(op.value, [], dot, None, has_final=False)
        raise TemplateError(f"bad operand {op.kind}")

    def call(self, name: str, args: list[Operand], dot: Any, final: Any, has_final: bool) -> Any:
        if name in LAZY_FUNCS:
            values: list[Any] = [lambda a=a: self.operand(a, dot) for a in args]
            if has_final:
                values.append(lambda: final)
            if not values:
                raise TemplateError(f"wrong number of args for {name}: want at least 1 got 0")
            result = None
            for get in values:
                result = get()
                if truth(result) != (name == "and"):
                    return result
            return result
        vals = [self.operand(a, dot) for a in args]
        if has_final:
            vals.append(final)
        try:
            return FUNCS[name](*vals)
        except TypeError as e:
            raise TemplateError(f"error calling {name}: {e}") from None

    def pipe(self, pipe: Pipe, dot: Any) -> Any:
        value, has = None, False
        for cmd in pipe.cmds:
            head = cmd[0]
            if head.kind == "func":
                value = self.call(head.value, cmd[1:], dot, value, has)
            else:
                if len(cmd) > 1 or has:
                    raise TemplateError("can't give argument to non-function; method calls are not supported")
                value = self.operand(head, dot)
            has = True
        if pipe.decl:
            self.set_var(pipe.decl[-1], value, pipe.assign)
        return value

    def run(self, nodes: list[Any], dot: Any) -> None:
        for node in nodes:
            self.budget.step()
            if isinstance(node, str):
                self.write(node)
            elif isinstance(node, Action):
                value = self.pipe(node.pipe, dot)
                if not node.pipe.decl:
                    check_size(printed_size(value), "printing a value")
                    self.write(go_str(value))
            elif isinstance(node, Branch):
                self.branch(node, dot)
            elif isinstance(node, Loop):
                raise _Break() if node.kind == "break" else _Continue()

    def scoped(self, nodes: list[Any], dot: Any, bind: dict[str, Any] | None = None) -> None:
        self.scopes.append(dict(bind or {}))
        try:
            self.run(nodes, dot)
        finally:
            self.scopes.pop()

    def branch(self, node: Branch, dot: Any) -> None:
        if node.kind == "range":
            self.range(node, dot)
            return
        self.scopes.append({})
        try:
            pipe = Pipe([], False, node.pipe.cmds)
            value = self.pipe(pipe, dot)
            if node.pipe.decl:
                self.set_var(node.pipe.decl[-1], value, node.pipe.assign)
            if truth(value):
                self.scoped(node.body, value if node.kind == "with" else dot)
            elif node.else_body is not None:
                self.scoped(node.else_body, dot)
        finally:
            self.scopes.pop()

    def range(self, node: Branch, dot: Any) -> None:
        value = self.pipe(Pipe([], False, node.pipe.cmds), dot)
        if isinstance(value, GoValue):
            value = value.fields
        if isinstance(value, dict):
            pairs = [(k, value[k]) for k in sorted(value, key=str)]
        elif isinstance(value, (list, tuple)):
            pairs = list(enumerate(value))
        elif isinstance(value, int) and not isinstance(value, bool):
            if value > self.budget.max_steps - self.budget.steps:
                self.budget.step(value)  # over budget before a list that large is built
            pairs = [(i, i) for i in range(value)]
        elif value is None:
            pairs = []
        else:
            raise TemplateError(f"range can't iterate over {go_str(value)}")
        if not pairs:
            if node.else_body is not None:
                self.scoped(node.else_body, dot)
            return
        decl = node.pipe.decl
        for k, v in pairs:
            self.budget.step()
            bind = {}
            if len(decl) == 1:
                bind[decl[0]] = v
            elif len(decl) == 2:
                bind[decl[0]], bind[decl[1]] = k, v
            try:
                self.scoped(node.body, v, bind)
            except _Break:
                break
            except _Continue:
                continue


def execute(nodes: list[Any], data: Any, budget: Budget | None = None) -> str:
    """Execute parsed nodes against `data` (the template's dot and `$`) within `budget` (a default one if None)."""
    ex = _Exec(data, budget or Budget())
    try:
        ex.run(nodes, data)
    except (_Break, _Continue):
        raise TemplateError("{{break}} or {{continue}} outside {{range}}") from None
    except RecursionError:
        raise TemplateError("template nesting too deep") from None
    return "".join(ex.out)


def render(src: str, data: Any) -> str:
    """Parse (cached) and execute a Go template."""
    return execute(parse(src), data)


def identifiers(nodes: list[Any]) -> set[str]:
    """Every field name referenced (lower-cased), like Ollama's Template.Vars()."""
    out: set[str] = set()

    def ops(pipe: Pipe) -> None:
        for cmd in pipe.cmds:
            for op in cmd:
                out.update(c.lower() for c in op.chain)
                if op.kind == "pipe":
                    ops(op.value)

    def walk(ns: list[Any]) -> None:
        for n in ns:
            if isinstance(n, Action):
                ops(n.pipe)
            elif isinstance(n, Branch):
                ops(n.pipe)
                walk(n.body)
                walk(n.else_body or [])

    walk(nodes)
    return out


def cut_after_response(nodes: list[Any]) -> list[Any]:
    """Drop everything after the first `{{ .Response }}` action (Ollama's legacy-mode generation prefix)."""
    cut = False

    def is_response(op: Operand) -> bool:
        return op.kind == "field" and "Response" in op.chain

    def walk(ns: list[Any]) -> list[Any]:
        nonlocal cut
        out = []
        for n in ns:
            if cut:
                break
            if isinstance(n, Action):
                if any(is_response(op) for cmd in n.pipe.cmds for op in cmd):
                    cut = True
                out.append(n)
            elif isinstance(n, Branch):
                body = walk(n.body)
                # once the cut happened inside the body, nothing after it (the else branch included) survives
                else_body = None if n.else_body is None else [] if cut else walk(n.else_body)
                out.append(Branch(n.kind, n.pipe, body, else_body))
            else:
                out.append(n)
        return out

    return walk(nodes)
