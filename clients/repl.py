"""The interactive `evenflow run` loop, as Ollama's: `>>> ` with history, slash commands, \"\"\" input.

The chat history is kept client-side and sent to /api/chat each turn; Ctrl-C closes the stream, which makes
the daemon abort the sequence and free its KV.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import httpx

from .common import CLIError, check, print_show_info
from .session import Session, ensure_model, print_timings, stream_reply

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
            import platformdirs  # noqa: PLC0415 - only with the history on

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
        head = ""
        if body.lower().startswith("/set system") and body.count('"""') == 1:  # /set system \"\"\"multi-line
            head, body = body[: body.index('"""')], body[body.index('"""'):]
        if not body.startswith('"""'):
            return line
        body = body[3:]
        if head:
            return head + self._read_more(body)
        if body.rstrip().endswith('"""'):  # \"\"\"all on one line\"\"\"
            return body.rstrip()[:-3]
        return self._read_more(body)

    def _read_more(self, first: str) -> str:
        """Continuation lines (`... `) until one ends with \"\"\"; returns them joined, quotes removed."""
        lines = [first] if first else []
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
        check(self.client.post("/api/generate", json=body))

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
            text = text.strip()
            for q in ('"""', '"'):
                if len(text) >= 2 * len(q) and text.startswith(q) and text.endswith(q):
                    text = text[len(q):-len(q)]
                    break
            s.system = text or None
            print("Set system message.")
        elif what == "parameter":
            self._set_parameter(rest[1:])
        else:
            print(f"Unknown command '/set {what}'. Type /? for help")

    def _set_parameter(self, args: list[str]) -> None:
        from ..daemon.store.modelfile import InvalidParameter, format_params  # noqa: PLC0415 - daemon.store: ~0.3 s

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
        info = check(self.client.post("/api/show", json={"model": self.sess.model})).json()
        if what == "info":
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
        check(self.client.post("/api/create", json=body))
        print(f"Created new model '{rest[0]}'")
