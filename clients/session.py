"""An `evenflow run` session and its replies, for the one-shot run (run.py) and the REPL (repl.py): the Session's
settings, stream_reply (thinking dimmed, words wrapped), Ollama's `--verbose` timings, ensure_model (pull if missing).
"""
from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass, field
from typing import Any, TextIO

import httpx

from .common import CLIError, check
from .transfer import pull_model


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
    format: str | dict[str, Any] | None = None  # "json" or a JSON schema
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


def stream_reply(client: httpx.Client, path: str, body: dict[str, Any], sess: Session) -> tuple[str, dict[str, Any]]:
    """Stream one reply; returns (content, final chunk). Thinking is shown dimmed unless hidden."""
    writer = Writer(sess.wordwrap)
    content, thinking_open, final = [], False, {}
    with client.stream("POST", path, json=body) as r:
        if r.status_code >= 400:
            r.read()
            check(r)
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
        pull_model(client, model, insecure)
        r = client.post("/api/show", json={"model": model})
    return check(r).json()
