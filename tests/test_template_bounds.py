"""Issue 14: a template that builds a huge value in one step (a width, a repeat, a format) is refused before it
allocates, in Jinja and Go; and rendering for a client that has gone stops at its next step."""
from __future__ import annotations

import asyncio
import threading
import tracemalloc

import pytest
from starlette.requests import Request

from evenflow.daemon.api.http.errors import APIError
from evenflow.daemon.api.http.workers import CLIENT_GONE, WorkerPool
from evenflow.daemon.prompt import templates as tpl
from evenflow.daemon.prompt.gotemplate import Budget

MSGS = [{"role": "user", "content": "hi"}]
A = '{% set a = "x" * 30000000 %}'  # 30 MB: allowed on its own, too big twelve times over
JINJA_BOMBS = [
    '{{ "x" * 10**9 }}', '{{ "x"|center(10**9) }}', '{{ "%999999999s"|format("x") }}', '{{ "%999999999s" % "x" }}',
    '{{ "x"|indent(10**9) }}', '{{ "a\nb"|indent(100000000) }}', '{{ "x".center(999999999) }}',
    '{{ "x".zfill(999999999) }}', '{{ "{:>999999999}".format("x") }}', '{{ "{:{}}".format("x", 999999999) }}',
    '{{ "%*s" % (999999999, "x") }}', '{{ "%.999999999f"|format(1.0) }}', '{{ "\t".expandtabs(999999999) }}',
    '{{ "ab"|replace("", "y" * 50000000) }}', '{{ "x"|wordwrap(1, wrapstring="y" * 50000000) }}',
    '{{ [1]|tojson(indent=999999999) }}', '{{ lipsum(1000000) }}', '{{ "xx"|batch(999999999, "y")|list }}',
    '{{ [1, 2]|slice(999999999)|list }}', '{{ 10 ** 10000000 }}', '{{ [1] * 600000000 }}',
    A + '{{ a ~ a ~ a ~ a ~ a ~ a ~ a ~ a ~ a ~ a ~ a ~ a }}',
    A + '{% macro m() %}' + '{{ a }}' * 12 + '{% endmacro %}{{ m()|length }}',
    A + '{% set l = [a, a, a, a, a, a, a, a, a, a, a, a] %}{{ l }}',
    A + '{% set l = [a, a, a, a, a, a, a, a, a, a, a, a] %}{{ l|join }}',
    A + '{% set l = [a, a, a, a, a, a, a, a, a, a, a, a] %}{{ l|tojson }}',
    A + '{% set l = [a, a, a, a, a, a, a, a, a, a, a, a] %}{{ "%s"|format(l) }}',
    '{% set l = [1] %}{% for i in range(30) %}{% set _ = l.extend(l) %}{% endfor %}{{ l|length }}',
]
GO_X8 = '{{ $x = printf "%s%s%s%s%s%s%s%s" $x $x $x $x $x $x $x $x }}'
GO_BOMBS = [
    '{{ printf "%999999999s" "x" }}', '{{ printf "%.999999999f" 1.0 }}',
    '{{ $x := "xxxxxxxx" }}' + GO_X8 * 10 + '{{ len $x }}',
    '{{ $x := "xxxxxxxx" }}' + GO_X8 * 8 + '{{ html $x }}{{ html $x }}',
    '{{ $x := "xxxxxxxx" }}' + GO_X8 * 8 + '{{ print $x $x $x $x $x $x $x $x $x $x }}',
]


@pytest.mark.parametrize("template", JINJA_BOMBS + GO_BOMBS)
def test_width_bombs_are_refused_before_they_allocate(template: str) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(tpl.TemplateBudgetExceeded):
            tpl.render_messages(template, MSGS)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # At most the template's own 30 MB value, a copy and change; the old code allocated 1 GB and more here.
    assert peak < 200 * 2**20, f"peaked at {peak / 2**20:.0f} MB"


@pytest.mark.parametrize("template, expected", [
    ('{{ "%s-%03d"|format("a", 7) }}|{{ "x"|center(5) }}|{{ "a\nb"|indent(2) }}|{{ "{}:{:>4}".format("k", 1) }}',
     "a-007|  x  |a\n  b|k:   1"),
    ('{{ [1, 2, 3]|map("string")|join(",") }}|{{ "a,b".split(",")|join("|") }}|{{ ("ab" * 3)|replace("b", "c") }}',
     "1,2,3|a|b|acacac"),
    ('{{ messages|tojson }}|{{ "%(r)s" % {"r": messages[0].role} }}|{{ 2 ** 10 }}|{{ "x" ~ 1 ~ none }}',
     '[{"role": "user", "content": "hi"}]|user|1024|x1None'),
    ('{{ printf "%s=%5d" "n" 42 }} {{ html "<b>" }} {{ json (index .Messages 0).Content }}', 'n=   42 &lt;b&gt; "hi"'),
])
def test_ordinary_formatting_still_renders(template: str, expected: str) -> None:
    assert tpl.render_messages(template, MSGS) == expected


def _disconnecting_request() -> tuple[Request, asyncio.Event]:
    """A real Starlette request whose client disconnects when the returned event is set."""
    gone = asyncio.Event()

    async def receive() -> dict:
        await gone.wait()
        return {"type": "http.disconnect"}

    return Request({"type": "http", "method": "POST", "path": "/", "headers": []}, receive), gone


def test_rendering_for_a_client_that_has_gone_stops_at_its_next_step() -> None:
    # 10^10 steps: without the request's flag this render would hold its worker for hours.
    endless = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    started = threading.Event()

    def render() -> str:
        started.set()
        return tpl.render_messages(endless, MSGS, budget=Budget(max_steps=10**12))

    async def main() -> None:
        pool = WorkerPool(2)
        request, gone = _disconnecting_request()
        task = asyncio.create_task(pool.run(request, render))
        await asyncio.get_running_loop().run_in_executor(None, started.wait)
        assert pool.running == 1
        gone.set()
        with pytest.raises(APIError) as e:
            await task
        assert e.value.status == CLIENT_GONE
        while pool.running:  # the worker frees itself: no deadline needed, a broken flag hangs the test's timeout
            await asyncio.sleep(0.01)
        assert pool.cancelled == 1
        assert pool.run is not None and await pool.run(None, lambda: "free") == "free"
        pool.shutdown()

    asyncio.run(asyncio.wait_for(main(), 300))


def test_work_outside_a_request_is_not_cancellable() -> None:
    assert Budget().cancel is None
    assert tpl.render_messages("{{ 1 + 1 }}", MSGS) == "2"
