"""The monitor screen (streams, scheduler timeline, resources) and the help screen."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Footer, Static

from .state import MonitorState
from .timeline import Timeline
from .widgets import Resources, StreamsTable, update_text

HELP = """\
[b]evenflow monitor[/b]

  m      monitor: streams, scheduler timeline, resources
  c      chat with a model (streamed markdown)
  i      ingest a document (a file or pasted text) as one long prompt; ctrl+o in chat
  Esc    in chat: stop the reply being streamed (the daemon frees its sequence); else back
  ?      this help (Esc closes it)
  q      quit

[b]Streams[/b]: one row per request. STATE is queued, ingesting (PROMPT shows the prompt tokens computed so far), decoding, or done:<reason>; finished rows fade out after a few seconds. The text streams in only when the daemon runs with --log-content (EVENFLOW_LOG_CONTENT=1); otherwise counts only.

[b]Scheduler[/b]: one column per engine step, newest on the right. Top: tokens per step, █ decodes and ▒ prompt-chunk tokens. Bottom: the step's time; ┄ marks the latency target, bars above it are red. ITL and TTFT percentiles cover the last minute.

[b]Resources[/b]: KV blocks in use, queue depth, running sequences, loaded models (backend, slots, context, size, keep-alive countdown), and pulls in progress (bytes so far of the layers started, percent, status).
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [("escape", "dismiss", "Close"), ("question_mark", "dismiss", "Close"), ("q", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):
            yield Static(HELP)


class MonitorScreen(Screen):
    """Attributes down: the app calls `show(state, now)` at most ~10 times a second."""

    def compose(self) -> ComposeResult:
        yield Static("", id="status")
        yield StreamsTable(id="streams")
        with Horizontal(id="bottom"):
            yield Timeline(id="timeline")
            yield Resources(id="resources")
        yield Footer()

    ready = False  # set once composed: the app's render tick may come first

    def on_mount(self) -> None:
        self.ready = True
        self.query_one("#streams").border_title = "streams"
        self.query_one("#timeline").border_title = "scheduler: tokens per step / step time"
        self.query_one("#resources").border_title = "resources"

    def show(self, state: MonitorState, now: float, status: str) -> None:
        update_text(self.query_one("#status", Static), status)
        self.query_one(StreamsTable).show(state)
        self.query_one(Timeline).show(state)
        self.query_one(Resources).show(state, now)
