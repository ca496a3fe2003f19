"""Snapshots of the TUI's screens rendered from a recorded /api/events feed (tests/data/tui_feed.ndjson).

The feed was recorded from a daemon serving the synthetic `demo` model with --log-content: three chats
streaming while a 3563-token document is ingested (the prompt cut to 60 characters to keep the file small; it was
recorded when every request event repeated `user.prompt`, and converted to today's format: the prompt once, on
`queued`).
Update after an intended change: `python -m pytest tests/test_tui_snapshots.py --snapshot-update`.
"""
from __future__ import annotations

import json
from pathlib import Path

from evenflow.tui.app import EvenflowApp

FEED = Path(__file__).parent / "data" / "tui_feed.ndjson"


def recorded_app() -> EvenflowApp:
    events = [json.loads(line) for line in FEED.read_text(encoding="utf-8").splitlines() if line.strip()]
    # Nothing listens on port 9: the replayed app never connects; its clock stops at the last event.
    return EvenflowApp("http://127.0.0.1:9", replay=events, clock=lambda: events[-1]["time"])


def test_monitor_80x24(snap_compare) -> None:
    assert snap_compare(recorded_app(), terminal_size=(80, 24))


def test_monitor_large_terminal(snap_compare) -> None:
    assert snap_compare(recorded_app(), terminal_size=(140, 40))


def test_help_screen(snap_compare) -> None:
    assert snap_compare(recorded_app(), press=["question_mark"], terminal_size=(100, 30))
