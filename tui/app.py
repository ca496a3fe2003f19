"""The Textual app: follows the daemon's feed in async workers and renders the state at most 10 times a second."""
from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable

import httpx
from textual import work
from textual.app import App, ScreenStackError
from textual.css.query import NoMatches

from .chat import ChatScreen, IngestScreen
from .feed import DaemonError, Feed
from .monitor import HelpScreen, MonitorScreen
from .state import MonitorState

RENDER_S = 0.1  # widgets re-render on this tick when the state moved: events are batched, never drawn one by one
POLL_S = 1.0  # /api/ps and /metrics
RETRY_S = (0.5, 1.0, 2.0)  # reconnect backoff
PROBE_S = 0.02  # lag probe interval (bench only)

CSS = """
#status { height: 1; background: $boost; }
#streams { height: 1fr; min-height: 5; border: round $primary; }
#bottom { height: 40%; min-height: 11; }
#timeline { width: 1fr; height: 100%; border: round $primary; }
#resources { width: 30; height: 100%; border: round $primary; }
#help { margin: 2 4; padding: 1 2; border: round $primary; background: $surface; }
#chat-status { height: 1; background: $boost; }
#model { width: 40; }
#log { height: 1fr; }
.user { color: $accent; margin: 1 0 0 0; }
#prompt { dock: bottom; margin-bottom: 1; }
#ingest { margin: 2 4; padding: 1 2; border: round $primary; background: $surface; height: auto; }
#paste { height: 8; }
#ingest-error { color: $error; }
"""


class EvenflowApp(App):
    """`evenflow monitor`: pass `replay` (recorded events) and `clock` to render a fixed feed without a daemon."""

    TITLE = "evenflow"
    CSS = CSS
    MODES = {"monitor": MonitorScreen, "chat": ChatScreen}
    BINDINGS = [("q", "quit", "Quit"), ("m", "switch_mode('monitor')", "Monitor"),
                ("c", "switch_mode('chat')", "Chat"), ("i", "ingest", "Ingest doc"),
                ("question_mark", "help", "Help")]

    def __init__(self, url: str, *, replay: list[dict[str, Any]] | None = None,
                 clock: Callable[[], float] = time.time,
                 workload: Callable[["EvenflowApp"], Awaitable[None]] | None = None,
                 probe_lag: bool = False) -> None:
        super().__init__()
        self.url, self.clock, self.workload, self.replay = url, clock, workload, replay
        self.feed = Feed(url)
        self.state = MonitorState()
        self.status = f"connecting to {url}..."
        self.connected = False
        self.reconnects = 0
        self.ingests: list[dict[str, Any]] = []
        self.lags: list[float] = []  # timer lateness samples, seconds (probe_lag)
        self.lag_cpu: list[float] = []  # the UI thread's CPU seconds over each sample's interval (busy vs starved)
        self.render_s: list[float] = []  # time spent re-rendering widgets per tick (probe_lag)
        self._probe_lag = probe_lag
        self._shown = -1
        self.chat: ChatScreen | None = None  # set by the chat screen once shown: ingest goes to its model

    def on_mount(self) -> None:
        self.switch_mode("monitor")
        if self.replay is not None:
            for ev in self.replay:
                self.state.apply(ev)
            self.status = f"recorded feed: {len(self.replay)} events"
        else:
            self.follow_events()
            self.poll()
            if self.workload is not None:
                self.run_workload()
        self.call_after_refresh(self.tick)
        self.set_interval(RENDER_S, self.tick)
        if self._probe_lag:
            self._last_probe, self._last_cpu = time.perf_counter(), time.thread_time()
            self.set_interval(PROBE_S, self._probe)

    async def on_unmount(self) -> None:
        await self.feed.aclose()

    # ---- rendering ----
    def status_text(self) -> str:
        parts = [self.status]
        if self.state.log_content is False:
            parts.append("counts only: start the daemon with --log-content to see the text")
        if self.state.dropped_total:
            parts.append(f"missed {self.state.dropped_total} events (the feed dropped them)")
        running = [i for i in self.ingests if i["state"] == "sending"]
        if running:
            parts.append(f"ingesting {len(running)} document(s)")
        return "  |  ".join(parts)

    def tick(self) -> None:
        t0 = time.perf_counter()
        now = self.clock()
        if self.replay is None:
            self.state.prune(now)
        try:
            screen = self.screen
        except ScreenStackError:  # the app is closing
            return
        # Resources holds a keep-alive countdown: redraw at least once a second even when no event came.
        if isinstance(screen, MonitorScreen) and screen.ready and (self.state.version != self._shown or int(now) != int(self._last_now)):
            try:
                screen.show(self.state, now, self.status_text())
            except NoMatches:  # the app is closing: the screen's widgets are already gone
                return
            self._shown = self.state.version
        self._last_now = now
        if self._probe_lag:
            self.render_s.append(time.perf_counter() - t0)

    _last_now = 0.0

    def _probe(self) -> None:
        t, cpu = time.perf_counter(), time.thread_time()
        self.lags.append(max(0.0, t - self._last_probe - PROBE_S))
        self.lag_cpu.append(cpu - self._last_cpu)
        self._last_probe, self._last_cpu = t, cpu

    def refresh_status(self, text: str) -> None:
        self.status = text
        self.state.version += 1

    # ---- workers ----
    @work(exclusive=True, group="feed")
    async def follow_events(self) -> None:
        """Follow /api/events forever; when it breaks, say so and reconnect."""
        attempt = 0
        while True:
            try:
                n = 0
                async for ev in self.feed.events():
                    if ev.get("type") == "hello":
                        attempt = 0
                        if not self.connected and self.reconnects:
                            self.notify(f"reconnected to {self.url}")
                        self.connected = True
                        self.refresh_status(f"connected to {self.url}")
                    elif ev.get("type") == "dropped":
                        self.notify(f"the feed dropped {ev.get('count')} events: the monitor fell behind",
                                    severity="warning")
                    self.state.apply(ev)
                    n += 1
                    if n % 256 == 0:
                        await asyncio.sleep(0)  # a burst of buffered lines must not hold the loop
                reason, refused = "the daemon closed the feed", False
            except (httpx.HTTPError, DaemonError, ValueError) as e:
                reason, refused = str(e) or type(e).__name__, isinstance(e, DaemonError)
            if self.connected:
                self.reconnects += 1
                self.notify(f"lost the daemon at {self.url}: {reason}", severity="warning")
            self.connected = False
            self.state.disconnected(self.clock())
            delay = RETRY_S[min(attempt, len(RETRY_S) - 1)]
            attempt += 1
            self.refresh_status(f"the daemon at {self.url} refused the feed: {reason}; retrying (try {attempt})"
                                if refused else
                                f"daemon unreachable at {self.url} ({reason}); reconnecting (try {attempt})")
            await asyncio.sleep(delay)

    @work(exclusive=True, group="poll")
    async def poll(self) -> None:
        while True:
            try:
                self.state.apply_ps(await self.feed.ps())
                self.state.apply_metrics(await self.feed.metrics())
            except (httpx.HTTPError, DaemonError, ValueError):
                pass  # follow_events reports the connection; these panels keep their last values
            await asyncio.sleep(POLL_S)

    @work(group="workload")
    async def run_workload(self) -> None:
        assert self.workload is not None
        await self.workload(self)

    # ---- actions ----
    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_ingest(self) -> None:
        self.push_screen(IngestScreen(), self._ingest_chosen)

    def _ingest_chosen(self, text: str | None) -> None:
        if text:
            self.ingest(text)

    @work(group="ingest")
    async def ingest(self, text: str, model: str | None = None, num_predict: int = 16) -> None:
        """Send `text` as one long prompt; the other streams keep going (watch it on the monitor)."""
        entry = {"chars": len(text), "state": "sending", "tokens": 0, "error": None}
        self.ingests.append(entry)
        try:
            model = model or await self._pick_model()
            self.notify(f"ingesting a {len(text)}-character document into {model}: watch it on the monitor (m)")
            async for part in self.feed.stream("/api/generate", {"model": model, "prompt": text,
                                                                 "options": {"num_predict": num_predict}}):
                entry["tokens"] = part.get("prompt_eval_count", entry["tokens"])
            entry["state"] = "done"
            self.notify(f"document ingested: {entry['tokens']} prompt tokens")
        except (httpx.HTTPError, DaemonError, ValueError) as e:
            entry["state"], entry["error"] = "error", str(e)
            self.notify(f"ingest failed: {e}", severity="error")
        self.state.version += 1

    async def _pick_model(self) -> str:
        if self.chat is not None and self.chat.model:
            return self.chat.model
        loaded = list(self.state.models)
        if loaded:
            return loaded[0]
        names = await self.feed.tags()
        if not names:
            raise DaemonError("the daemon has no models to ingest into")
        return "demo:latest" if "demo:latest" in names else names[0]
