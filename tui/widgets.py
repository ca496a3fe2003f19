"""The monitor's widgets; each takes a MonitorState down (`show(state, now)`) and renders from it, never per event."""
from __future__ import annotations

import re
from datetime import datetime, timezone

from rich.text import Text
from textual.widgets import DataTable, Static

from .state import MonitorState, Stream

# (name, width); ENDPOINT is left out below WIDE columns, TEXT takes what is left (at least MIN_TEXT).
STREAM_COLUMNS = (("ID", 3), ("MODEL", 10), ("ENDPOINT", 12), ("STATE", 11), ("PROMPT", 14), ("TTFT", 6),
                  ("TOK/S", 5), ("OUT", 4), ("TEXT", 0))
WIDE = 110
MIN_TEXT = 8
_BAR = 4


def bar(fraction: float, width: int = _BAR) -> str:
    """A text progress bar that reads without colour: '█████░░░░░'."""
    full = max(0, min(width, round(fraction * width)))
    return "█" * full + "░" * (width - full)


def fmt_ms(seconds: float | None, sep: int = 1) -> str:
    """'412 ms', '12.3 s' ('412ms' with sep=0)."""
    gap = " " * sep
    return "-" if seconds is None else f"{seconds * 1e3:.0f}{gap}ms" if seconds < 1 else f"{seconds:.1f}{gap}s"


def fmt_size(n: int | None) -> str:
    if not n:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def fmt_until(expires_at: str | None, now: float) -> str:
    """keep-alive countdown from /api/ps's RFC3339 `expires_at` (Go writes 9 fractional digits)."""
    if not expires_at:
        return "-"
    try:
        ts = datetime.fromisoformat(re.sub(r"\.\d+", "", expires_at).replace("Z", "+00:00"))
    except ValueError:
        return expires_at
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=timezone.utc)
    left = ts.timestamp() - now
    if left > 86400 * 365:
        return "forever"
    return "now" if left <= 0 else f"{int(left // 60)}m{int(left % 60):02d}s"


def stream_row(s: Stream, log_content: bool | None, columns: list[str], text_width: int) -> list[Text]:
    dim = "dim" if s.state in ("done", "lost") else ""
    state = {"done": f"done:{s.done_reason}", "lost": "lost"}.get(s.state, s.state)
    if s.wait and s.state in ("queued", "ingesting"):
        state = f"{state} {s.wait}"
    prompt = f"{bar(s.progress)} {s.computed if s.state == 'ingesting' else 0}/{s.prompt_tokens or '?'}" \
        if s.state in ("queued", "ingesting") else f"{s.prompt_tokens}"
    tps = s.tok_per_s
    if not log_content:
        text = "(counts only)"
    elif s.text or not s.prompt:
        text = s.text.replace("\n", "⏎").replace("\r", "")[-text_width:]
    else:  # nothing generated yet: the prompt's end says which request this is
        text = "prompt: …" + s.prompt.replace("\n", "⏎").replace("\r", "")[-max(1, text_width - 9):]
    values = {"ID": str(s.seq_id), "MODEL": s.model.removesuffix(":latest"),
              "ENDPOINT": s.endpoint.removeprefix("/api/"), "STATE": state, "PROMPT": prompt,
              "TTFT": fmt_ms(s.ttft), "TOK/S": f"{tps:.1f}" if tps else "-", "OUT": str(s.output_tokens),
              "TEXT": text}
    out = [Text(values[c], style=dim, no_wrap=True, overflow="ellipsis") for c in columns]
    if "STATE" in columns and not dim:
        out[columns.index("STATE")].stylize({"ingesting": "yellow", "decoding": "green", "queued": "cyan"}.get(
            s.state, ""))
    return out


class StreamsTable(DataTable):
    """One row per request; rows are updated in place and removed once faded."""

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.zebra_stripes = True
        self.columns_for: int | None = None
        self._rows: dict[str, list[str]] = {}
        self._state: MonitorState | None = None
        self._layout(self.size.width)

    def _layout(self, width: int) -> None:
        """(Re)build the columns for this width: ENDPOINT only when wide, TEXT fills the rest."""
        names = [(n, w) for n, w in STREAM_COLUMNS if n != "ENDPOINT" or width >= WIDE]
        fixed = sum(w + 2 * self.cell_padding for n, w in names if n != "TEXT")
        self.text_width = max(MIN_TEXT, width - fixed - 2 * self.cell_padding - 1)
        self.clear(columns=True)
        for n, w in names:
            self.add_column(n, key=n, width=w or self.text_width)
        self.names = [n for n, _ in names]
        self._rows.clear()
        self.columns_for = width
        if self._state is not None:
            self.show(self._state)

    def on_resize(self, event) -> None:
        if event.size.width != self.columns_for:
            self._layout(event.size.width)

    def show(self, state: MonitorState) -> None:
        self._state = state
        live = sorted(state.streams.values(), key=lambda s: (s.t_queued, s.seq_id))
        keys = {s.key for s in live}
        for k in [k for k in self._rows if k not in keys]:
            self.remove_row(k)
            del self._rows[k]
        for s in live:
            cells = stream_row(s, state.log_content, self.names, self.text_width)
            plain = [f"{c.plain}|{c.style}" for c in cells]
            old = self._rows.get(s.key)
            if old is None:
                self.add_row(*cells, key=s.key)
            else:
                for col, cell, before, now_ in zip(self.names, cells, old, plain):
                    if before != now_:
                        self.update_cell(s.key, col, cell)
            self._rows[s.key] = plain


class Resources(Static):
    """KV, queue, running sequences, loaded models (`/api/ps`: backend, slots, size, keep-alive countdown)."""

    def show(self, state: MonitorState, now: float) -> None:
        t = state.totals()
        kv = t["kv_used"] / t["kv_total"] if t["kv_total"] else 0.0
        out = Text()
        out.append(f"KV   {bar(kv, 12)} {kv:4.0%}\n     {t['kv_used']}/{t['kv_total']} blocks\n")
        out.append(f"queue {t['waiting']}  running {t['running']}\n")
        if state.dropped_total:
            out.append(f"feed dropped {state.dropped_total} events\n", style="bold red")
        if state.metrics.get("evenflow_kv_disk_entries"):  # prefixes saved on disk, for after an unload
            out.append(f"disk KV {fmt_size(int(state.metrics.get('evenflow_kv_disk_bytes', 0)))} "
                       f"({int(state.metrics['evenflow_kv_disk_entries'])} prefixes)\n")
        out.append("\nmodels\n", style="bold")
        if not state.models:
            out.append("  none loaded\n", style="dim")
        for m in state.models.values():
            out.append(f"  {m.name}\n", style="bold")
            out.append(f"   {m.backend or '?'} slots {m.slots if m.slots is not None else '?'}"
                       f" ctx {m.context_length}\n   size {fmt_size(m.size)} until {fmt_until(m.expires_at, now)}\n")
        if state.pulls:
            out.append("\npulls\n", style="bold")
        for p in state.pulls.values():
            out.append(f"  {p.model}\n", style="bold")
            sizes = f"{fmt_size(p.completed) if p.completed else '0 B'}/{fmt_size(p.total)}"
            if p.error:
                out.append(f"   failed: {p.error}\n", style="red")
            elif p.t_done is not None:
                out.append(f"   done {sizes}\n", style="dim")
            else:
                out.append(f"   {bar(p.fraction, 10)} {p.fraction:4.0%}\n   {sizes}\n   {p.status[:25]}\n")
        update_text(self, out)


def update_text(widget: Static, text: Text | str) -> None:
    """Update a fixed-size Static only when its text changed, and without a layout pass (its size cannot move)."""
    key = (text.plain, tuple(text.spans)) if isinstance(text, Text) else text
    if getattr(widget, "_shown_key", None) != key:
        widget._shown_key = key  # type: ignore[attr-defined]
        widget.update(text, layout=False)
