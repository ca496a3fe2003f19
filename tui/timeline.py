"""The scheduler timeline, drawn with Textual's line API: each row is a Strip of a few same-style runs.

It redraws on every step, so it skips what a Static costs per render (rich Text with a span per cell, converted,
wrapped and divided again, and a layout pass): rows go straight to Segments, and nothing moves the layout.
"""
from __future__ import annotations

from itertools import groupby

from rich.segment import Segment
from rich.style import Style
from textual.strip import Strip
from textual.widget import Widget

from .state import MonitorState, Step, percentile
from .widgets import fmt_ms

Row = list[tuple[str, str]]  # (characters, style name) pieces
_STYLES = {"": Style(), "dim": Style(dim=True), "green": Style(color="green"), "yellow": Style(color="yellow"),
           "blue": Style(color="blue"), "red": Style(color="red")}
_EIGHTHS = " ▁▂▃▄▅▆▇█"


def to_strip(row: Row, width: int) -> Strip:
    """Merge neighbouring pieces of one style into one Segment; crop to the widget's width."""
    segments = [Segment("".join(text for text, _ in group), _STYLES[style])
                for style, group in groupby(row, key=lambda piece: piece[1])]
    return Strip(segments).crop(0, width)


def _ms_label(ms: float) -> str:
    return f"{ms:.0f}ms" if ms < 1000 else f"{ms / 1000:.1f}s"


def tokens_rows(steps: list[Step], rows: int) -> list[Row]:
    """Tokens per step, bottom up: █ decodes, ░ draft tokens verified with them, ▒ prompt-chunk tokens on top."""
    top = max([s.decodes + s.draft_tokens + s.prefill_tokens for s in steps] + [1])
    heights = []
    for s in steps:
        d = max(round(s.decodes / top * rows), 1) if s.decodes else 0
        x = max(round((s.decodes + s.draft_tokens) / top * rows) - d, 1) if s.draft_tokens else 0
        p = max(round((s.decodes + s.draft_tokens + s.prefill_tokens) / top * rows) - d - x, 1) \
            if s.prefill_tokens else 0
        heights.append((d, x, p))
    out = []
    for r in range(rows, 0, -1):
        row: Row = [(f"{top if r == rows else '':>6} ", "dim")]
        row += [("█", "green") if r <= d else ("░", "blue") if r <= d + x else ("▒", "yellow") if r <= d + x + p
                else (" ", "") for d, x, p in heights]
        out.append(row)
    return out


def ms_rows(steps: list[Step], rows: int) -> list[Row]:
    """Step time, bottom up, against the latency target (┄); steps over the target are red."""
    target = next((s.target_ms for s in reversed(steps) if s.target_ms), None)
    # One stalled step must not flatten the rest: the scale tops out at 2x the target (or the 90th
    # percentile when higher); taller steps are drawn full height, in red, and the label says "+".
    p90 = percentile([s.step_ms for s in steps], 90) or 1.0
    top = max(p90 * 1.25, (target or 0) * 2, 1.0)
    clipped = any(s.step_ms > top for s in steps)
    target_row = max(1, round(target / top * rows)) if target else None
    out = []
    for r in range(rows, 0, -1):
        label = _ms_label(top) + ("+" if clipped else "") if r == rows else (
            _ms_label(target) if r == target_row and target else "")
        row: Row = [(f"{label:>6} ", "dim")]
        for s in steps:
            level = s.step_ms / top * rows - (r - 1)
            style = "red" if target and s.step_ms > target else "blue"
            if level >= 1:
                row.append(("█", style))
            elif int(level * 8) >= 1:
                row.append((_EIGHTHS[int(level * 8)], style))
            else:
                row.append(("┄", "dim") if r == target_row else (" ", ""))
        out.append(row)
    return out


class Timeline(Widget):
    """Per engine step, newest on the right: decode vs prompt-chunk tokens, and step time against the target."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._state: MonitorState | None = None
        self._strips: list[Strip] = []
        self._drawn: tuple | None = None

    def on_resize(self) -> None:
        if self._state is not None:
            self.show(self._state)

    def show(self, state: MonitorState) -> None:
        self._state = state
        width, height = self.size.width, self.size.height
        # Tokens and their gaps arrive with steps: when no step came (and the size holds) nothing here moved.
        drawn = (state.steps_seen, len(state.itl), len(state.ttfts), width, height)
        if drawn == self._drawn:
            return
        self._drawn = drawn
        w, h = max(width - 8, 10), max(height, 8)
        steps = list(state.steps)[-w:]
        tok_n = max(2, (h - 2) * 5 // 9)
        rows = tokens_rows(steps, tok_n) + ms_rows(steps, max(2, h - 2 - tok_n))
        drafts = any(s.draft_tokens for s in steps)
        rows.append([("█ decode " + ("░ draft " if drafts else "") + "▒ prompt ▇ step ms ┄ target"
                      + ("  (newest right)" if w > 60 else ""), "dim")])
        lat = state.latency()
        spec = state.speculation(steps[-1].time) if drafts else None
        rows.append([(f"ITL p50 {fmt_ms(lat['itl_p50'], 0)} p99 {fmt_ms(lat['itl_p99'], 0)}  "
                      f"TTFT p50 {fmt_ms(lat['ttft_p50'], 0)} p99 {fmt_ms(lat['ttft_p99'], 0)}"
                      + (f"  drafts kept {spec['acceptance']:.0%}, {spec['tokens_per_forward']:.1f} tok/pass"
                         if spec else "") + ("  (last 60 s)" if w > 70 else ""), "")])
        self._strips = [to_strip(row, width) for row in rows]
        self.refresh()

    def render_line(self, y: int) -> Strip:
        return self._strips[y] if y < len(self._strips) else Strip.blank(self.size.width)
