"""Each model family's real output bytes, through the daemon's real path, on every API: a scripted model per family
(its vocabulary and special tokens, its real chat template; backends/synthetic/scripted.py) writes exactly what a
model of that family writes — tokenizer -> engine -> detokenizer with the format's structure tokens preserved ->
reply parser — and /api/chat, /api/generate, /v1/chat/completions, /v1/responses and /v1/messages must return its
thinking, content and tool calls, streamed and whole, through the official ollama, openai and anthropic clients.
The families and cases are rows in family_cases.py; one daemon holds every family's model."""
from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Iterator

import httpx
import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")

from api_drivers import APIS, FINISH, Answer, Ask, ask  # noqa: E402
from api_harness import Daemon, add_model, start_daemon  # noqa: E402
from family_cases import CASES, FAMILIES, TOOLS, Case, Family, scripted_spec, template_text  # noqa: E402


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, fixtures_dir: Path) -> Iterator[tuple[Daemon, dict[str, str]]]:
    """One daemon; per family one scripted model holding its cases (more where two cases' outputs clash); and which
    model answers which case."""
    from evenflow.backends.synthetic.scripted import cached_scripted, group_replies

    # one llama.cpp thread: on a busy 2-core machine a second one mostly waits for the first
    d = start_daemon(tmp_path_factory.mktemp("families"), backend="llamacpp", num_threads="1")
    model_of: dict[str, str] = {}
    try:
        for family in FAMILIES.values():
            cases = [c for c in CASES if c.family == family.name]
            spec = scripted_spec(fixtures_dir, family, cases)
            for part in group_replies(spec):
                add_model(d, cached_scripted(part), part.name)
                model_of.update({c.id: part.name for c, r in zip(cases, spec.replies) if r in part.replies})
        yield d, model_of
    finally:
        d.stop()


def _expected(case: Case, api: str) -> Answer:
    return Answer(case.thinking, case.content, list(case.calls), FINISH[api][1 if case.calls else 0])


def _seen(a: Answer | Exception) -> Answer | str:
    if isinstance(a, Exception):
        return f"{type(a).__name__}: {a}"
    return Answer(a.thinking.strip(), a.content.strip(), a.calls, a.finish)


def _ask(api: str, url: str, q: Ask) -> Answer | Exception:
    try:
        return ask(api, url, q)
    except Exception as e:  # noqa: BLE001 - reported with the other APIs' results
        return e


def _params() -> list:
    return [pytest.param(c, id=c.id, marks=[pytest.mark.xfail(reason=c.xfail, strict=True)] if c.xfail else [])
            for c in CASES]


@pytest.mark.parametrize("case", _params())
def test_family_output_parses_on_every_api(daemon: tuple[Daemon, dict[str, str]], case: Case,
                                           caplog: pytest.LogCaptureFixture) -> None:
    """Every API, streamed and whole, one request at a time: the format's parsing, nothing else."""
    _check_every_api(daemon, case, caplog, at_once=False)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES if not c.xfail])
def test_family_output_all_apis_at_once(daemon: tuple[Daemon, dict[str, str]], case: Case,
                                        caplog: pytest.LogCaptureFixture) -> None:
    """The same requests all at once: the engine batches them and shares their prompt's cache, while the other
    requests' threads read the tokenizer (one daemon keeps 3 models loaded, so a family's first case here often runs
    on a fresh load with nothing cached yet: how this caught test_llamacpp_tokenizer_threads.py's bug)."""
    _check_every_api(daemon, case, caplog, at_once=True)


def _check_every_api(daemon: tuple[Daemon, dict[str, str]], case: Case, caplog: pytest.LogCaptureFixture,
                     at_once: bool) -> None:
    d, model_of = daemon
    q = Ask(model=model_of[case.id], messages=case.messages(), tools=TOOLS if case.tools else None, think=case.think,
            schema=case.schema)
    runs = [(api, stream) for api in APIS for stream in (False, True)
            if not (api == "ollama_generate" and (case.tools or case.after))]
    with (caplog.at_level(logging.WARNING, logger="evenflow.daemon.prompt.formats"),
          ThreadPoolExecutor(len(runs) if at_once else 1) as pool):
        answers = list(pool.map(lambda r: _ask(r[0], d.url, replace(q, stream=r[1])), runs))
    wrong = {f"{api}{' streamed' if stream else ''}": _seen(a) for (api, stream), a in zip(runs, answers)
             if _seen(a) != _expected(case, api)}
    assert not wrong, f"{case.id}: model output {case.output!r}\n" + "\n".join(
        f"  {k}: {v}\n    expected {_expected(case, k.split()[0])}" for k, v in wrong.items())
    unknown = [r.getMessage() for r in caplog.records if "unknown reply format" in r.getMessage()]
    if at_once:
        return  # the one warning per template was logged by the one-at-a-time run
    if FAMILIES[case.family].format is None:  # said once, naming the template; never an error
        assert len(unknown) == 1 and "sha256:" in unknown[0], unknown
    else:
        assert not unknown


@pytest.mark.parametrize("family", list(FAMILIES.values()), ids=list(FAMILIES))
def test_family_capabilities(daemon: tuple[Daemon, dict[str, str]], family: Family, fixtures_dir: Path) -> None:
    """The reply format the template and architecture pick; /api/show: what the template enables, and the family
    the model stands in for."""
    from evenflow.daemon.prompt import formats

    fmt = formats.detect(template_text(fixtures_dir, family), family.architecture)
    assert (fmt.family if fmt else None) == family.format
    d, model_of = daemon
    model = next(model_of[c.id] for c in CASES if c.family == family.name)
    r = httpx.post(d.url + "/api/show", json={"model": model}, timeout=60)
    assert r.status_code == 200, r.text
    show = r.json()
    assert sorted(show["capabilities"]) == sorted(["completion", *family.capabilities])
    assert show["details"]["family"] == family.architecture
