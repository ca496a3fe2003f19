"""`evenflow run MODEL [PROMPT]` as Ollama's: one-shot (prompt or piped stdin) or an interactive REPL.

The REPL keeps the chat history client-side and sends it to /api/chat each turn; Ctrl-C closes the
stream, which makes the daemon abort the sequence and free its KV.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TextIO

import httpx

from .cli import CLIError, _check, _client

HELP = """Available Commands:
  /set            Set session variables
  /show           Show model information
  /load <model>   Load a session or model
  /save <model>   Save your current session
  /clear          Clear session context
  /bye            Exit
  /?, /help       Help for a command

Use \"\"\" to begin a multi-line message.
"""
SET_HELP = """Available Commands:
  /set parameter ...     Set a parameter
  /set system <string>   Set system message
  /set history           Enable history
  /set nohistory         Disable history
  /set wordwrap          Enable wordwrap
  /set nowordwrap        Disable wordwrap
  /set format json       Enable JSON mode
  /set noformat          Disable formatting
  /set verbose           Show LLM stats
  /set quiet             Disable LLM stats
  /set think             Enable thinking
  /set nothink           Disable thinking
"""
SHOW_HELP = """Available Commands:
  /show info         Show details for this model
  /show license      Show model license
  /show modelfile    Show Modelfile for this model
  /show parameters   Show parameters for this model
  /show system       Show system message
  /show template     Show prompt template
"""


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
        Repl(c, sess).loop()


class Repl:
    """The interactive loop: `>>> ` prompt with history, slash commands, multi-line input."""

    def __init__(self, client: httpx.Client, sess: Session):
        self.client, self.sess = client, sess
        self.history_on = not os.environ.get("OLLAMA_NOHISTORY")
        self.prompt = self._make_prompt()

    def _make_prompt(self) -> Any:
        from prompt_toolkit import PromptSession  # noqa: PLC0415 - only the REPL needs a line editor
        from prompt_toolkit.history import FileHistory, InMemoryHistory

        history: Any = InMemoryHistory()
        if self.history_on:
            import platformdirs  # noqa: PLC0415

            path = Path(platformdirs.user_data_dir("evenflow")) / "history"
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                history = FileHistory(str(path))
            except OSError:
                pass
        return PromptSession(history=history)

    def read(self) -> str:
        """One message; a line starting with \"\"\" continues until a line ending with \"\"\"."""
        line = self.prompt.prompt(">>> ", placeholder="Send a message (/? for help)")
        body = line.lstrip()
        if not body.startswith('"""'):
            return line
        body = body[3:]
        if body.rstrip().endswith('"""'):  # \"\"\"all on one line\"\"\"
            return body.rstrip()[:-3]
        lines = [body] if body else []
        while True:
            nxt = self.prompt.prompt("... ")
            if nxt.rstrip().endswith('"""'):
                lines.append(nxt.rstrip()[:-3])
                return "\n".join(lines)
            lines.append(nxt)

    def loop(self) -> None:
        self._preload()
        while True:
            try:
                text = self.read()
            except KeyboardInterrupt:
                print("Use Ctrl + d or /bye to exit.")
                continue
            except EOFError:
                print()
                return
            stripped = text.strip()
            if not stripped:
                continue
            if stripped.startswith("/") and not stripped.startswith('/"""'):
                if self.command(stripped) == "bye":
                    return
                continue
            self.chat(text)

    def _preload(self) -> None:
        body: dict[str, Any] = {"model": self.sess.model, "stream": False}
        if self.sess.keepalive is not None:
            body["keep_alive"] = self.sess.keepalive
        _check(self.client.post("/api/generate", json=body))

    def chat(self, text: str) -> None:
        messages = ([{"role": "system", "content": self.sess.system}] if self.sess.system else []) + \
            self.sess.messages + [{"role": "user", "content": text}]
        try:
            content, final = stream_reply(self.client, "/api/chat", self.sess.body(messages=messages), self.sess)
        except KeyboardInterrupt:  # the stream is closed: the daemon aborts the sequence and frees its KV
            print()
            return
        except CLIError as e:
            print(f"\n{e}")
            return
        print("\n")
        self.sess.messages += [{"role": "user", "content": text}, {"role": "assistant", "content": content}]
        if self.sess.verbose and final:
            print_timings(final)

    # --------------------------------------------------------------------------------- commands

    def command(self, line: str) -> str | None:
        words = line.split()
        cmd, rest = words[0].lower(), words[1:]
        handlers: dict[str, Callable[[list[str], str], str | None]] = {
            "/bye": lambda r, l: "bye", "/exit": lambda r, l: "bye", "/set": self.cmd_set, "/show": self.cmd_show,
            "/clear": self.cmd_clear, "/load": self.cmd_load, "/save": self.cmd_save,
            "/?": self.cmd_help, "/help": self.cmd_help}
        handler = handlers.get(cmd)
        if handler is None:
            print(f"Unknown command '{cmd}'. Type /? for help")
            return None
        try:
            return handler(rest, line)
        except CLIError as e:
            print(e)
            return None

    def cmd_help(self, rest: list[str], line: str) -> None:
        print({"set": SET_HELP, "show": SHOW_HELP}.get(rest[0] if rest else "", HELP))

    def cmd_clear(self, rest: list[str], line: str) -> None:
        self.sess.messages.clear()
        print("Cleared session context")

    def cmd_set(self, rest: list[str], line: str) -> None:
        s = self.sess
        if not rest:
            print(SET_HELP)
            return
        what = rest[0].lower()
        flags = {"verbose": ("verbose", True), "quiet": ("verbose", False), "wordwrap": ("wordwrap", True),
                 "nowordwrap": ("wordwrap", False), "think": ("think", True), "nothink": ("think", False)}
        if what in flags:
            attr, value = flags[what]
            setattr(s, attr, value)
            print(f"Set '{what}' mode.")
        elif what in ("history", "nohistory"):
            self.history_on = what == "history"
            print(f"Set '{what}' mode.")
        elif what == "format":
            if rest[1:] != ["json"]:
                raise CLIError("Invalid or missing format. For 'json' mode use '/set format json'")
            s.format = "json"
            print("Set format to 'json' mode.")
        elif what == "noformat":
            s.format = None
            print("Disabled format.")
        elif what == "system":
            text = line.split(None, 2)[2] if len(rest) > 1 else ""
            s.system = text.strip().strip('"') or None
            print("Set system message.")
        elif what == "parameter":
            self._set_parameter(rest[1:])
        else:
            print(f"Unknown command '/set {what}'. Type /? for help")

    def _set_parameter(self, args: list[str]) -> None:
        from ..daemon.store.modelfile import InvalidParameter, format_params  # noqa: PLC0415

        if len(args) < 2:
            raise CLIError("Usage:\n  /set parameter <name> <value>")
        key, values = args[0], args[1:]
        try:
            typed = format_params({key: values if key == "stop" else " ".join(values)})
        except InvalidParameter as e:
            raise CLIError(f"Couldn't set parameter: {e}") from None
        self.sess.options.update(typed)
        shown = ", ".join(values) if key == "stop" else " ".join(values)
        print(f"Set parameter '{key}' to '{shown}'")

    def cmd_show(self, rest: list[str], line: str) -> None:
        if not rest:
            print(SHOW_HELP)
            return
        what = rest[0].lower()
        info = _check(self.client.post("/api/show", json={"model": self.sess.model})).json()
        if what == "info":
            from .cli import print_show_info  # noqa: PLC0415

            print_show_info(info)
        elif what == "parameters":
            print("Model defined parameters:")
            print(info.get("parameters") or "No parameters were specified for this model.")
            if self.sess.options:
                print("\nUser defined parameters:")
                for k, v in self.sess.options.items():
                    print(f"{k:<30} {' '.join(map(str, v)) if isinstance(v, list) else v}")
        elif what == "system":
            print(self.sess.system or info.get("system") or "No system message was specified for this model.")
        elif what == "template":
            print(info.get("template") or "No prompt template was specified for this model.")
        elif what == "license":
            print(info.get("license") or "No license was specified for this model.")
        elif what == "modelfile":
            print(info.get("modelfile", ""))
        else:
            print(f"Unknown command '/show {what}'. Type /? for help")

    def cmd_load(self, rest: list[str], line: str) -> None:
        if len(rest) != 1:
            raise CLIError("Usage:\n  /load <modelname>")
        print(f"Loading model '{rest[0]}'")
        ensure_model(self.client, rest[0], False)
        self.sess.model = rest[0]
        self.sess.messages.clear()
        self._preload()

    def cmd_save(self, rest: list[str], line: str) -> None:
        if len(rest) != 1:
            raise CLIError("Usage:\n  /save <modelname>")
        body: dict[str, Any] = {"model": rest[0], "from": self.sess.model, "stream": False}
        if self.sess.system:
            body["system"] = self.sess.system
        if self.sess.options:
            body["parameters"] = self.sess.options
        if self.sess.messages:
            body["messages"] = self.sess.messages
        _check(self.client.post("/api/create", json=body))
        print(f"Created new model '{rest[0]}'")


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
    run.add_argument("--insecure", action="store_true", help="use plain http if the model must be pulled")
    run.set_defaults(func=cmd_run)
