"""The access log (issue 27): one INFO line per request, refused ones included, never a body, key or query."""
from __future__ import annotations

import logging
import re
from pathlib import Path

import httpx

from api_harness import serve_daemon, start_daemon

KEY = "ef-access-log-key-0123456789"
LINE = re.compile(r"(\d{3}|---) \| +[0-9.]+(µs|ms|s) \| +127\.0\.0\.1 \| (\S+) +(\".*\")$")


def _lines(caplog) -> list[tuple[str, str, str]]:
    out = []
    for rec in caplog.records:
        if rec.name == "evenflow.access":
            m = LINE.fullmatch(rec.getMessage())
            assert m and rec.levelno == logging.INFO, rec.getMessage()
            out.append((m.group(1), m.group(3), m.group(4)))
    return out


def test_every_request_gets_one_line_refusals_too(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="evenflow.access")
    d = start_daemon(tmp_path, api_key=KEY)
    try:
        with httpx.Client(base_url=d.url, timeout=60) as c:
            auth = {"Authorization": f"Bearer {KEY}"}
            assert c.post("/api/generate", json={"model": "m", "prompt": "my secret prompt"}).status_code == 401
            assert c.post("/api/chat?token=abc", headers=auth, content=b'{"model": ').status_code == 400
            assert c.get("/api/nothing/here", headers=auth).status_code == 404
            assert c.get("/api/version", headers=auth).status_code == 200
            assert c.get("/x%0A200%20%7C%20forged", headers=auth).status_code == 404
    finally:
        d.stop()
    lines = _lines(caplog)
    assert lines == [("401", "POST", '"/api/generate"'), ("400", "POST", '"/api/chat"'),
                     ("404", "GET", '"/api/nothing/here"'), ("200", "GET", '"/api/version"'),
                     ("404", "GET", '"/x\\n200 | forged"')], lines
    text = "\n".join(r.getMessage() for r in caplog.records if r.name == "evenflow.access")
    assert "secret" not in text and KEY not in text and "token" not in text


def test_the_setting_turns_it_off(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="evenflow.access")
    d = start_daemon(tmp_path, no_access_log="1")
    try:
        assert httpx.get(d.url + "/api/nothing", timeout=60).status_code == 404
    finally:
        d.stop()
    assert _lines(caplog) == []


def test_evenflow_serve_writes_it(tmp_path: Path) -> None:
    d = serve_daemon(tmp_path)
    try:
        assert httpx.post(d.url + "/api/show", json={"model": "nope"}, timeout=60).status_code == 404
    finally:
        d.stop()
    assert re.search(r'404 \| +[0-9.]+(µs|ms|s) \| +127\.0\.0\.1 \| POST +"/api/show"', d.log()), d.log()[-2000:]
