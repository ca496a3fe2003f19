"""The chat screen (streamed markdown replies, Esc stops) and the ingest dialog (a file or pasted text)."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx

from textual import on, work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Button, Footer, Input, Label, Markdown, Select, Static, TextArea

from .feed import DaemonError

FLUSH_S = 0.05  # a reply's markdown is written at most 20 times a second, tokens batched in between
MAX_DOC_BYTES = 4 * 1024 * 1024


class IngestScreen(ModalScreen["str | None"]):
    """Returns the document's text (read off the UI loop), or None when cancelled."""

    BINDINGS = [("escape", "cancel", "Cancel")]

    def compose(self) -> ComposeResult:
        with Vertical(id="ingest"):
            yield Label("Ingest a document as one long prompt: a file path, or paste below")
            yield Input(placeholder="path/to/file.txt", id="path")
            yield TextArea(id="paste")
            yield Static("", id="ingest-error")
            with Horizontal():
                yield Button("Send", variant="primary", id="send")
                yield Button("Cancel", id="cancel")

    def action_cancel(self) -> None:
        self.dismiss(None)

    @on(Button.Pressed, "#cancel")
    def _cancel(self) -> None:
        self.dismiss(None)

    @on(Input.Submitted, "#path")
    @on(Button.Pressed, "#send")
    async def _send(self) -> None:
        path = self.query_one("#path", Input).value.strip()
        text = self.query_one("#paste", TextArea).text
        error = self.query_one("#ingest-error", Static)
        if path:
            try:
                text = await asyncio.to_thread(_read_doc, Path(path).expanduser())
            except (OSError, ValueError) as e:
                error.update(f"cannot read {path!r}: {e}")
                return
        if not text.strip():
            error.update("nothing to send: give a file path or paste some text")
            return
        self.dismiss(text)


def _read_doc(path: Path) -> str:
    if path.stat().st_size > MAX_DOC_BYTES:
        raise ValueError(f"larger than {MAX_DOC_BYTES // 1024 // 1024} MiB")
    return path.read_text(encoding="utf-8", errors="replace")


class ChatScreen(Screen):
    BINDINGS = [("escape", "stop", "Stop / back"), ("ctrl+o", "app.ingest", "Ingest doc"),
                ("ctrl+n", "clear", "New chat")]

    def __init__(self) -> None:
        super().__init__()
        self.history: list[dict[str, str]] = []
        self.replying = False
        self.options: dict[str, object] = {}  # Ollama options sent with every message (the model's defaults if empty)

    def compose(self) -> ComposeResult:
        yield Static("", id="chat-status")
        yield Select([], prompt="model", id="model", allow_blank=True)
        yield VerticalScroll(id="log")
        yield Input(placeholder="message (Enter sends)", id="prompt")
        yield Footer()

    def on_mount(self) -> None:
        self.app.chat = self
        self.query_one("#prompt", Input).focus()
        self.load_models()

    @work(exclusive=True, group="models")
    async def load_models(self) -> None:
        status = self.query_one("#chat-status", Static)
        try:
            names = await self.app.feed.tags()
        except Exception as e:  # noqa: BLE001 - any failure is shown, the user can retry with ctrl+n
            status.update(f"cannot list models: {e}")
            return
        select = self.query_one("#model", Select)
        select.set_options([(n, n) for n in names])
        if names:
            select.value = names[0] if "demo:latest" not in names else "demo:latest"
            status.update("Enter sends, Esc stops a reply, ctrl+o ingests a document")
        else:
            status.update("the daemon has no models: create one first (evenflow create / pull)")

    @property
    def model(self) -> str | None:
        v = self.query_one("#model", Select).value
        return v if isinstance(v, str) else None

    @on(Input.Submitted, "#prompt")
    def _submit(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        if not text:
            return
        if self.replying:
            self.notify("a reply is streaming: Esc stops it", severity="warning")
            return
        if self.model is None:
            self.notify("pick a model first", severity="warning")
            return
        event.input.value = ""
        self.history.append({"role": "user", "content": text})
        log = self.query_one("#log", VerticalScroll)
        log.mount(Static(f"> {text}", classes="user"))
        reply = Markdown("", classes="assistant")
        log.mount(reply)
        self.replying = True
        self.reply(self.model, reply)

    @work(exclusive=True, group="chat")
    async def reply(self, model: str, md: Markdown) -> None:
        stream = Markdown.get_stream(md)
        log = self.query_one("#log", VerticalScroll)
        status = self.query_one("#chat-status", Static)
        got, pending, last = [], [], 0.0
        status.update(f"{model} is replying... (Esc stops)")
        try:
            async for part in self.app.feed.stream("/api/chat", {"model": model, "messages": self.history,
                                                                      "options": self.options}):
                piece = (part.get("message") or {}).get("content", "")
                got.append(piece)
                pending.append(piece)
                if time.monotonic() - last >= FLUSH_S:
                    await stream.write("".join(pending))
                    pending.clear()
                    last = time.monotonic()
                    log.scroll_end(animate=False)
                if part.get("done"):
                    status.update(f"done ({part.get('done_reason')}): {part.get('eval_count', 0)} tokens")
        except asyncio.CancelledError:
            pending.append("\n\n*(stopped)*")
            status.update("stopped: the daemon frees the sequence")
            raise
        except (DaemonError, httpx.HTTPError, ValueError) as e:
            pending.append(f"\n\n**error:** {e}")
            status.update(f"error: {e}")
        finally:
            if pending:
                await stream.write("".join(pending))
            await stream.stop()
            self.history.append({"role": "assistant", "content": "".join(got)})
            self.replying = False
            log.scroll_end(animate=False)

    def action_stop(self) -> None:
        if self.replying:
            self.workers.cancel_group(self, "chat")
        else:
            self.app.switch_mode("monitor")

    def action_clear(self) -> None:
        self.workers.cancel_group(self, "chat")
        self.history.clear()
        self.query_one("#log", VerticalScroll).remove_children()
        self.load_models()
