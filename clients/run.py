"""`evenflow run MODEL [PROMPT]` as Ollama's: one-shot (a prompt or piped stdin), else the REPL (repl.py).

Streams a reply, shows thinking unless hidden, prints Ollama's `--verbose` timing block, and pulls a missing
model first, as Ollama's run does.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import dataclass, field
from typing import Any, TextIO

import httpx

from .cli import CLIError, _check, _client


def go_duration(ns: int | float) -> str:
    """Go's time.Duration String(): 1.5s, 12.345ms, 1m2.5s (Ollama prints its timings so)."""
    ns = int(ns)
    if ns < 1000:
        return f"{ns}ns"
    for unit, size in (("µs", 1e3), ("ms", 1e6)):
        if ns < size * 1000:
            return f"{ns / size:.6f}".rstrip("0").rstrip(".") + unit
    secs, text = ns / 1e9, ""
    if secs >= 3600:
        text += f"{int(secs // 3600)}h"
        secs %= 3600
    if text or secs >= 60:
        text += f"{int(secs // 60)}m"
        secs %= 60
    return text + (f"{secs:.9f}".rstrip("0").rstrip(".") or "0") + "s"


def print_timings(final: dict[str, Any], out: TextIO = sys.stderr) -> None:
    """Ollama's --verbose block."""
    pe, ped = final.get("prompt_eval_count", 0), final.get("prompt_eval_duration", 0)
    ev, evd = final.get("eval_count", 0), final.get("eval_duration", 0)
    lines = [("total duration", go_duration(final.get("total_duration", 0))),
             ("load duration", go_duration(final.get("load_duration", 0))),
             ("prompt eval count", f"{pe} token(s)"), ("prompt eval duration", go_duration(ped)),
             ("prompt eval rate", f"{pe / ped * 1e9:.2f} tokens/s" if ped else "0.00 tokens/s"),
             ("eval count", f"{ev} token(s)"), ("eval duration", go_duration(evd)),
             ("eval rate", f"{ev / evd * 1e9:.2f} tokens/s" if evd else "0.00 tokens/s")]
    for k, v in lines:
        print(f"{k + ':':<22}{v}", file=out)


class Writer:
    """Streams text to the terminal, wrapping at word boundaries to the terminal width when asked."""

    def __init__(self, wordwrap: bool, out: TextIO = sys.stdout):
        self.out, self.wordwrap = out, wordwrap and out.isatty()
        self.width = shutil.get_terminal_size((80, 24)).columns
        self.col, self.word = 0, ""

    def write(self, text: str) -> None:
        if not self.wordwrap:
            self.out.write(text)
            self.out.flush()
            return
        for ch in text:
            if ch in " \n":
                self._flush_word()
                if ch == "\n":
                    self.out.write("\n")
                    self.col = 0
                elif self.col < self.width:
                    self.out.write(" ")
                    self.col += 1
            else:
                self.word += ch
        self.out.flush()

    def _flush_word(self) -> None:
        if self.word and self.col + len(self.word) > self.width and self.col > 0:
            self.out.write("\n")
            self.col = 0
        self.out.write(self.word)
        self.col += len(self.word)
        self.word = ""

    def end(self) -> None:
        self._flush_word()
        self.out.flush()


@dataclass
class Session:
    model: str
    format: str | None = None
    think: bool | str | None = None
    hidethinking: bool = False
    wordwrap: bool = True
    verbose: bool = False
    keepalive: str | None = None
    system: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    messages: list[dict[str, Any]] = field(default_factory=list)

    def body(self, **kw: Any) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.model, "stream": True, **kw}
        for key, value in (("format", self.format), ("think", self.think), ("keep_alive", self.keepalive),
                           ("options", self.options or None)):
            if value is not None:
                out[key] = value
        return out


def _parse_think(value: str | None) -> bool | str | None:
    if value is None:
        return None
    v = value.lower()
    if v in ("true", "1", ""):
        return True
    if v in ("false", "0"):
        return False
    if v in ("low", "medium", "high"):
        return v
    raise CLIError(f"Error: invalid --think value {value!r}; use true, false, low, medium or high")


def stream_reply(client: httpx.Client, path: str, body: dict[str, Any], sess: Session) -> tuple[str, dict[str, Any]]:
    """Stream one reply; returns (content, final chunk). Thinking is shown dimmed unless hidden."""
    writer = Writer(sess.wordwrap)
    content, thinking_open, final = [], False, {}
    with client.stream("POST", path, json=body) as r:
        if r.status_code >= 400:
            r.read()
            _check(r)
        for line in r.iter_lines():
            if not line.strip():
                continue
            part = json.loads(line)
            if part.get("error"):
                raise CLIError(f"Error: {part['error']}")
            msg = part.get("message") or {}
            thinking = msg.get("thinking") or part.get("thinking") or ""
            text = msg.get("content", "") if "message" in part else part.get("response", "")
            if thinking and not sess.hidethinking:
                if not thinking_open:
                    writer.write("Thinking...\n")
                    thinking_open = True
                writer.write(thinking)
            if text:
                if thinking_open:
                    writer.write("\n...done thinking.\n\n")
                    thinking_open = False
                content.append(text)
                writer.write(text)
            if part.get("done"):
                final = part
    writer.end()
    return "".join(content), final


def ensure_model(client: httpx.Client, model: str, insecure: bool) -> dict[str, Any]:
    """/api/show; a missing model is pulled first, as Ollama's run does."""
    r = client.post("/api/show", json={"model": model})
    if r.status_code == 404:
        from .transfer import pull_model  # noqa: PLC0415

        pull_model(client, model, insecure)
        r = client.post("/api/show", json={"model": model})
    return _check(r).json()


def one_shot(client: httpx.Client, sess: Session, prompt: str) -> None:
    body = sess.body(prompt=prompt)
    if sess.system:
        body["system"] = sess.system
    _, final = stream_reply(client, "/api/generate", body, sess)
    print()
    if sess.verbose and final:
        print_timings(final)


def cmd_run(args: argparse.Namespace) -> None:
    sess = Session(args.model, format=args.format or None, think=_parse_think(args.think),
                   hidethinking=args.hidethinking, wordwrap=not args.nowordwrap, verbose=args.verbose,
                   keepalive=args.keepalive)
    prompt = " ".join(args.prompt) if args.prompt else ""
    piped = not sys.stdin.isatty()
    if piped:
        stdin = sys.stdin.read()
        prompt = f"{stdin}\n\n{prompt}".strip() if prompt else stdin
    with _client() as c:
        ensure_model(c, args.model, args.insecure)
        if prompt or piped:
            if not prompt.strip():
                raise CLIError("Error: the prompt read from stdin is empty")
            one_shot(c, sess, prompt)
            return
        from .repl import Repl  # noqa: PLC0415 - prompt_toolkit only for the interactive loop

        Repl(c, sess).loop()


def add_parser(sub: Any) -> None:
    """Register `run` on the `evenflow` parser."""
    run = sub.add_parser("run", help="run a model: a one-shot PROMPT, piped stdin, or an interactive chat")
    run.add_argument("model")
    run.add_argument("prompt", nargs="*")
    run.add_argument("--keepalive", default=None, help="how long the model stays loaded (e.g. 5m, 0)")
    run.add_argument("--verbose", action="store_true", help="print the timings of each reply")
    run.add_argument("--format", default=None, choices=["json"], help="response format")
    run.add_argument("--think", nargs="?", const="true", default=None, metavar="true|false|low|medium|high",
                     help="thinking (for models that support it)")
    run.add_argument("--hidethinking", action="store_true", help="do not print the thinking")
    run.add_argument("--nowordwrap", action="store_true", help="do not wrap words at the terminal width")
    run.add_argument("--insecure", action="store_true",
                     help="allow a plain-HTTP registry named http://host/... if the model must be pulled")
    run.set_defaults(func=cmd_run)
