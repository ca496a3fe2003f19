"""`evenflow run`'s flags as Ollama's (cobra/pflag) parse them: a bare `--think` never eats the prompt, `--think=max`,
`--format` with a JSON schema, `--keepalive` as a Go duration, and an embedding model's `--truncate`/`--dimensions`."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx
import jsonschema
import numpy as np
import pytest

from api_harness import BACKENDS, Daemon, start_daemon, upload_model
from evenflow.clients.cli import build_parser, main
from evenflow.clients.common import CLIError
from evenflow.clients.run import go_bool, ollama_argv, parse_format, parse_keepalive, parse_think
from gguf_edit import U32, edit_gguf, typed


def parse(*argv: str):
    return build_parser().parse_args(["run", *ollama_argv(list(argv))])


@pytest.mark.parametrize("argv,expected", [
    (["m", "--think", "why is the sky blue"], ["--think=true", "--", "m", "why is the sky blue"]),
    (["m", "--think=max", "hi"], ["--think=max", "--", "m", "hi"]),
    (["--verbose", "m", "why", "--format", "json", "is"], ["--verbose=true", "--format=json", "--", "m", "why", "is"]),
    (["m", "--keepalive=5m", "x", "--dimensions", "8"], ["--keepalive=5m", "--dimensions=8", "--", "m", "x"]),
    (["m", "--format", "-x"], ["--format=-x", "--", "m"]),  # a value flag takes the next word, dash or not
    (["m", "--", "-5 degrees", "--verbose"], ["--", "m", "-5 degrees", "--verbose"]),
    (["m", "-"], ["--", "m", "-"]),
])
def test_ollama_argv(argv: list[str], expected: list[str]) -> None:
    assert ollama_argv(argv) == expected


def test_bare_think_keeps_the_prompt_and_flags_mix_with_words() -> None:
    ns = parse("m", "--think", "why is the sky blue")
    assert (ns.model, ns.prompt, parse_think(ns.think)) == ("m", ["why is the sky blue"], True)
    ns = parse("m", "why", "--think=low", "is", "--hidethinking", "the", "--nowordwrap=false", "sky")
    assert ns.prompt == ["why", "is", "the", "sky"] and parse_think(ns.think) == "low"
    assert ns.hidethinking is True and ns.nowordwrap is False
    ns = parse("--verbose", "m", "--insecure=1", "--truncate=false", "--dimensions", "16", "text")
    assert (ns.verbose, ns.insecure, ns.truncate, ns.dimensions, ns.prompt) == (True, True, False, 16, ["text"])
    ns = parse("m")
    assert (ns.think, ns.truncate, ns.dimensions, ns.verbose, ns.format) == (None, None, 0, False, None)


@pytest.mark.parametrize("value,expected", [("", True), ("true", True), ("false", False), ("low", "low"),
                                            ("medium", "medium"), ("high", "high"), ("max", "max"), (None, None)])
def test_think_values(value, expected) -> None:
    assert parse_think(value) == expected


@pytest.mark.parametrize("value", ["True", "yes", "1", "extreme"])
def test_think_values_ollama_refuses(value: str) -> None:
    with pytest.raises(CLIError, match=f'invalid value for --think: "{value}" \\(must be true, false, high, medium, '
                                       'low, or max\\)'):
        parse_think(value)


def test_bool_format_and_keepalive_values() -> None:
    assert [go_bool(v) for v in ("1", "t", "T", "TRUE", "true", "True")] == [True] * 6
    assert [go_bool(v) for v in ("0", "f", "F", "FALSE", "false", "False")] == [False] * 6
    with pytest.raises(SystemExit):
        parse("m", "--verbose=yes")
    schema = '{"type": "object", "properties": {"a": {"type": "integer"}}}'
    assert parse_format("json") == "json" and parse_format(schema) == json.loads(schema) and parse_format("") is None
    with pytest.raises(CLIError, match="expected json or a JSON schema"):
        parse_format("xml")
    assert parse_keepalive("5m") == "5m" and parse_keepalive("-1m") == "-1m" and parse_keepalive("0") == "0"
    with pytest.raises(CLIError, match='time: invalid duration "5"'):
        parse_keepalive("5")


def test_unknown_flags_are_refused(capsys) -> None:
    for argv in (["run", "m", "--bogus"], ["run", "m", "-5", "degrees"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 1
        assert f"Error: unknown flag: {argv[2]}" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ against a daemon

SCHEMA = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}, "sure": {"type": "boolean"}},
          "required": ["answer", "sure"], "additionalProperties": False}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, synthetic_model) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("cli-flags")
    d = start_daemon(tmp / "d", backend=BACKENDS[0], no_demo=False)
    tiny = Path(synthetic_model("tiny", formats=("gguf",))["gguf"])
    upload_model(d.url, tiny, "tiny")
    # an embedding model: the same weights declaring a pooling type (Ollama's rule for the capability)
    upload_model(d.url, edit_gguf(tiny, tmp / "emb.gguf", set_={"llama.pooling_type": typed(U32, 1)}), "emb")
    r = httpx.post(d.url + "/api/create", json={"model": "tiny300", "from": "tiny", "stream": False,
                                                "parameters": {"num_predict": 300}}, timeout=120)
    assert r.status_code == 200, r.text
    yield d
    d.stop()


def run(daemon: Daemon, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "EVENFLOW_HOST": daemon.url.removeprefix("http://"), "HOME": str(tmp_path),
           "XDG_DATA_HOME": str(tmp_path / "data")}
    return subprocess.run([sys.executable, "-m", "evenflow.clients.cli", "run", *args], env=env, capture_output=True,
                          text=True, timeout=600, stdin=subprocess.DEVNULL)


def prompt_eval_count(stderr: str) -> int:
    line = next(x for x in stderr.splitlines() if x.startswith("prompt eval count:"))
    return int(line.split()[3])


def api_prompt_count(daemon: Daemon, model: str, prompt: str, think) -> int:
    body = {"model": model, "prompt": prompt, "stream": False, "options": {"num_predict": 1}, "think": think}
    r = httpx.post(daemon.url + "/api/generate", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()["prompt_eval_count"]


def test_run_think_flags_reach_the_daemon(daemon: Daemon, tmp_path: Path) -> None:
    question = "why is the sky blue"
    on, off = (api_prompt_count(daemon, "demo", question, think) for think in (True, False))
    assert off > on  # think=false closes an empty <think> block in the prompt
    for flags, expected in ((["--think"], on), (["--think=high"], on), (["--think=max"], on), (["--think=false"], off),
                            ([], on)):  # no flag: a thinking model thinks (Ollama's run sends think=true)
        out = run(daemon, tmp_path, "demo", *flags, question, "--verbose")
        assert out.returncode == 0, out.stderr
        assert prompt_eval_count(out.stderr) == expected, (flags, out.stderr)
    out = run(daemon, tmp_path, "demo", "--think=extreme", question)
    assert out.returncode == 1 and 'invalid value for --think: "extreme"' in out.stderr
    out = run(daemon, tmp_path, "tiny", "--think", question)  # as Ollama's server: refused for a model without it
    assert out.returncode == 1 and 'does not support thinking' in out.stderr
    out = run(daemon, tmp_path, "tiny", "--think=false", "--hidethinking", question)
    assert out.returncode == 0 and out.stdout.strip(), out.stderr


def test_run_format_schema_output_validates(daemon: Daemon, tmp_path: Path) -> None:
    out = run(daemon, tmp_path, "tiny300", "--format", json.dumps(SCHEMA), "Answer as JSON.")
    assert out.returncode == 0, out.stderr
    jsonschema.validate(json.loads(out.stdout), SCHEMA)
    out = run(daemon, tmp_path, "tiny300", "--format", "not json", "hi")
    assert out.returncode == 1 and "expected json or a JSON schema" in out.stderr


def test_run_embedding_model_prints_the_vector(daemon: Daemon, tmp_path: Path) -> None:
    out = run(daemon, tmp_path, "emb", "--dimensions", "8", "some text to embed")
    assert out.returncode == 0, out.stderr
    vec = json.loads(out.stdout)
    api = httpx.post(daemon.url + "/api/embed", json={"model": "emb", "input": "some text to embed", "dimensions": 8},
                     timeout=300).json()["embeddings"][0]
    assert len(vec) == 8 and np.allclose(vec, api, atol=1e-6) and abs(np.linalg.norm(vec) - 1) < 1e-4
    full = json.loads(run(daemon, tmp_path, "emb", "some text to embed").stdout)
    assert len(full) == 64  # tiny's hidden size: --dimensions cut it
    long = "word " * 3000
    out = run(daemon, tmp_path, "emb", "--truncate=false", long)
    assert out.returncode == 1 and "exceeds the context length" in out.stderr
    out = run(daemon, tmp_path, "emb", "--truncate", long)
    assert out.returncode == 0 and len(json.loads(out.stdout)) == 64, out.stderr
    out = run(daemon, tmp_path, "emb")
    assert out.returncode == 1 and 'embedding models require input text. Usage: evenflow run emb "your text here"' \
        in out.stderr


def test_run_keepalive(daemon: Daemon, tmp_path: Path) -> None:
    out = run(daemon, tmp_path, "tiny", "--keepalive", "5", "hi")
    assert out.returncode == 1 and 'time: invalid duration "5"' in out.stderr

    def loaded() -> list[str]:
        return [m["name"] for m in httpx.get(daemon.url + "/api/ps", timeout=30).json()["models"]]

    httpx.post(daemon.url + "/api/generate", json={"model": "tiny300", "keep_alive": "1h"}, timeout=300)
    assert "tiny300:latest" in loaded()
    out = run(daemon, tmp_path, "tiny300", "--keepalive", "0", "hi")
    assert out.returncode == 0, out.stderr
    deadline = time.monotonic() + 120
    while "tiny300:latest" in loaded():  # keep_alive 0: unloaded once the reply is done
        assert time.monotonic() < deadline, "--keepalive 0 did not unload the model"
        time.sleep(0.1)
