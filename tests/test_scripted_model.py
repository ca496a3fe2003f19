"""The scripted synthetic model (backends/synthetic/scripted.py): its greedy output after a prompt is exactly the
script, token for token, in every fixture vocabulary (plus our trained one, which needs no fixtures), with the
family's special tokens, multibyte text, several replies in one model, chunked prefill, prefix-cache hits and
concurrent requests; through the Engine and through a real daemon."""
from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")

from api_harness import start_daemon, upload_model  # noqa: E402
from conftest import shared_fixtures_path  # noqa: E402
from evenflow.backends.base import RunnerSettings  # noqa: E402
from evenflow.backends.llamacpp.runner import load  # noqa: E402
from evenflow.backends.synthetic import cached_model, make_spec  # noqa: E402
from evenflow.backends.synthetic.scripted import Reply, ScriptedSpec, cached_scripted  # noqa: E402
from evenflow.backends.synthetic.scripted_weights import CONTEXT, compile_neurons  # noqa: E402
from evenflow.daemon.engine import Engine, EngineConfig, SamplingParams  # noqa: E402

FILLER = "Some earlier conversation that the reply does not depend on. " * 6


@dataclass(frozen=True)
class VocabCase:
    """A vocabulary, the special tokens its family adds, its end token and prompts/scripts that use them."""

    vocab: str  # a fixtures/vocab file, or "trained" (our BPE: no fixtures needed)
    special_tokens: dict[str, str]
    eos: str | None
    scripts: tuple[tuple[str, str], ...]  # (prompt tail, script)


MULTIBYTE = "Zürich — 東京, naïve café 🌧️ ½"
CASES = [
    VocabCase("trained", {"<tool_call>": "user_defined"}, None, (
        ("User: weather?\nAssistant:", f' <tool_call>{{"city": "{MULTIBYTE}"}}'),
        ("User: hello?\nAssistant:", " Hi! Hi! Hi! again."))),
    VocabCase("ggml-vocab-qwen2.gguf", {"<think>": "user_defined", "</think>": "user_defined",
                                        "<tool_call>": "user_defined", "</tool_call>": "user_defined"}, "<|im_end|>", (
        ("<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n",
         f'<think>\nCall it.\n</think>\n\n<tool_call>\n{{"name": "w", "arguments": {{"q": "{MULTIBYTE}"}}}}\n</tool_call>'),
        ("<|im_start|>user\nHi?<|im_end|>\n<|im_start|>assistant\n", "Hello — 你好!"))),
    VocabCase("ggml-vocab-llama-bpe.gguf", {"<|python_tag|>": "control", "<|eom_id|>": "control"}, "<|eot_id|>", (
        ("<|start_header_id|>user<|end_header_id|>\n\nWeather?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
         '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Köln"}}'),
        ("<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
         MULTIBYTE))),
    VocabCase("ggml-vocab-llama-spm.gguf", {"[INST]": "control", "[/INST]": "control", "[TOOL_CALLS]": "control",
                                            "[ARGS]": "control"}, None, (
        ("[INST]Weather in Paris?[/INST]", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'),
        ("[INST]Hi[/INST]", f"Bonjour, {MULTIBYTE}"))),
    VocabCase("ggml-vocab-phi-3.gguf", {}, "<|end|>", (
        ("<|user|>\nHi<|end|>\n<|assistant|>\n", f"Hello {MULTIBYTE}"),)),
    VocabCase("ggml-vocab-gpt-2.gguf", {"<|start|>": "control", "<|channel|>": "control", "<|message|>": "control",
                                        "<|end|>": "control", "<|call|>": "control", "<|return|>": "control",
                                        "<|constrain|>": "control"}, "<|return|>", (
        ("<|start|>user<|message|>Weather?<|end|><|start|>assistant",
         "<|channel|>analysis<|message|>Need a tool.<|end|><|start|>assistant<|channel|>final<|message|>It is sunny."),)),
]


def _vocab_path(name: str) -> str:
    if name == "trained":
        return str(cached_model(make_spec("tiny"), formats=("gguf",))["gguf"])  # its tokenizer fields only
    path = shared_fixtures_path() / "vocab" / name
    if not path.is_file():
        pytest.skip(f"shared fixtures not found at {path.parent} (a clone has none)")
    return str(path)


def _spec(case: VocabCase) -> ScriptedSpec:
    return ScriptedSpec(vocab=_vocab_path(case.vocab), special_tokens=case.special_tokens,
                        token_ids={"eos": case.eos} if case.eos else {},
                        replies=tuple(Reply(prompt=p, text=s) for p, s in case.scripts))


def _run(engine: Engine, prompts: list[list[int]], n: int = 200) -> list[tuple[list[int], str, str, int]]:
    """(token ids, text, done_reason, cached tokens) per prompt, all submitted at once, the engine stepped here."""
    streams = [engine.submit(p, SamplingParams(temperature=0, num_predict=n), loop=None) for p in prompts]
    while engine.run_once():
        pass
    out = []
    for s in streams:
        ds = list(s)
        out.append(([t for d in ds for t in d.token_ids], "".join(d.text for d in ds), ds[-1].done_reason,
                    ds[-1].metrics.cached_tokens))
    return out


@pytest.fixture(scope="module", params=CASES, ids=[c.vocab for c in CASES])
def scripted(request) -> Iterator[tuple[VocabCase, object]]:
    case = request.param
    path = cached_scripted(_spec(case))
    runner = load(str(path), RunnerSettings(max_num_seqs=4, block_size=16, max_num_batched_tokens=64, num_threads=1))
    yield case, runner
    runner.close()


def test_greedy_output_is_the_script_chunked_cached_and_concurrent(scripted) -> None:
    case, runner = scripted
    tok = runner.tokenizer
    prompts = [tok.encode(FILLER + p) for p, _ in case.scripts]
    wanted = [tok.encode(s, add_special=False, parse_special=True) for _, s in case.scripts]
    # a 7-token budget: every prompt goes in several chunks; then all at once, each prompt a prefix-cache hit
    engine = Engine(runner, EngineConfig(max_num_batched_tokens=7))
    solo = [_run(engine, [p])[0] for p in prompts]
    together = _run(engine, prompts)
    for (ids, text, reason, _), (ids2, text2, reason2, cached), want, (_, script) in zip(
            solo, together, wanted, case.scripts):
        assert ids == want and reason == "stop", (tok.decode(ids), script)  # (the end token is not streamed)
        assert (ids2, text2, reason2) == (ids, text, reason)
        assert cached > 0  # the same prompt again: its full blocks came from the prefix cache
        # the text is the tokens' pieces: user-defined tokens as their text, control ones as nothing (today)
        assert text == b"".join(tok.token_bytes(t) for t in want).decode("utf-8", "replace")
    engine.shutdown()


def test_an_unknown_prompt_ends_at_once(scripted) -> None:
    case, runner = scripted
    engine = Engine(runner, EngineConfig())
    (ids, text, reason, _), = _run(engine, [runner.tokenizer.encode(FILLER + "something else entirely")])
    assert ids == [] and text == "" and reason == "stop"
    engine.shutdown()


def test_contexts_are_the_shortest_that_tell_the_next_token_apart() -> None:
    prompt, script = [1, 2, 3], [4, 5, 4, 6, 7, 4, 5, 9]
    neurons = compile_neurons([(prompt, script)])
    z = prompt + script
    for q in range(len(prompt) - 1, len(z) - 1):  # exactly one neuron matches each position, the right one
        hits = [n for n in neurons if tuple(z[q - i] for i in range(len(n.context))) == n.context]
        assert {n.target for n in hits} == {z[q + 1]}, q
    assert min(len(n.context) for n in neurons) == 1 and max(len(n.context) for n in neurons) == 3


def test_a_script_the_context_cannot_tell_apart_is_refused() -> None:
    with pytest.raises(ValueError, match=f"sees {CONTEXT} tokens back"):
        compile_neurons([([1, 2], [5] * (CONTEXT + 2) + [6])])
    with pytest.raises(ValueError, match="longer prompt"):  # two replies after the same one-token prompt
        compile_neurons([([1], [5]), ([1], [6])])


def test_clashing_replies_go_to_separate_models() -> None:
    """Two replies sharing a stretch longer than the context with different continuations cannot share a model:
    group_replies puts the second in a model of its own; a third that clashes with neither joins the first."""
    from evenflow.backends.synthetic.scripted import group_replies

    vocab = str(cached_model(make_spec("tiny"), formats=("gguf",))["gguf"])
    same = " one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen"
    replies = (Reply("User: a?\nAssistant:", same + " A."), Reply("User: b?\nAssistant:", same + " B."),
               Reply("User: c?\nAssistant:", " Something else."))
    with pytest.raises(ValueError, match="tokens back"):
        cached_scripted(ScriptedSpec(vocab=vocab, replies=replies))
    parts = group_replies(ScriptedSpec(vocab=vocab, replies=replies, name="m"))
    assert [(p.name, p.replies) for p in parts] == [("m", (replies[0], replies[2])), ("m-1", (replies[1],))]


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts=st.lists(st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1,
                              max_size=40), min_size=1, max_size=3, unique=True),
       seed=st.integers(0, 2**16))
def test_any_text_is_replayed_exactly(texts: list[str], seed: int) -> None:
    """Random unicode scripts in our trained vocab, each after its own question: the output is the script's
    tokens, or the factory refuses the script up front (a repeated stretch longer than the context)."""
    vocab = str(cached_model(make_spec("tiny"), formats=("gguf",))["gguf"])
    questions = [f"User: question {i} {random.Random(seed + i).random()}\nAssistant:" for i in range(len(texts))]
    spec = ScriptedSpec(vocab=vocab, replies=tuple(Reply(prompt=q, text=t) for q, t in zip(questions, texts)))
    try:
        path = cached_scripted(spec)
    except ValueError as e:
        assert "tokens back" in str(e)
        return
    runner = load(str(path), RunnerSettings(max_num_seqs=4, block_size=16, max_num_batched_tokens=64, num_threads=1))
    try:
        engine = Engine(runner, EngineConfig(max_num_batched_tokens=16))
        tok = runner.tokenizer
        got = _run(engine, [tok.encode(q) for q in questions])
        for (ids, _, reason, _), t in zip(got, texts):
            assert ids == tok.encode(t, add_special=False, parse_special=True) and reason == "stop"
        engine.shutdown()
    finally:
        runner.close()


def test_a_daemon_serves_the_script_on_generate_and_chat(tmp_path: Path) -> None:
    """Through the daemon: a raw /api/generate prompt and a chat rendered by the model's template, streamed and
    not, twice (the second one a prefix-cache hit)."""
    template = ("{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    vocab = str(cached_model(make_spec("tiny", architecture="qwen2"), formats=("gguf",))["gguf"])
    answer = f"Sure — {MULTIBYTE}. Done."
    spec = ScriptedSpec(vocab=vocab, chat_template=template, architecture="qwen3", token_ids={"eos": "<|im_end|>"},
                        replies=(Reply(prompt="<|im_start|>user\nTell me.<|im_end|>\n<|im_start|>assistant\n",
                                       text=answer),))
    d = start_daemon(tmp_path, num_threads="1")  # one thread: on a busy 2-core machine two threads mostly wait
    try:
        upload_model(d.url, cached_scripted(spec), "scripted")
        with httpx.Client(base_url=d.url, timeout=300) as c:
            info = c.post("/api/show", json={"model": "scripted"}).json()
            assert info["model_info"]["evenflow.scripted.architecture"] == "qwen3"
            assert info["details"]["family"] == "qwen3"  # the family it stands in for, not llama.cpp's gpt2
            raw = FILLER + "<|im_start|>user\nTell me.<|im_end|>\n<|im_start|>assistant\n"
            for _ in range(2):
                r = c.post("/api/generate", json={"model": "scripted", "prompt": raw, "raw": True, "stream": False,
                                                  "options": {"temperature": 0}}).json()
                assert (r["response"], r["done_reason"]) == (answer, "stop")
                msgs = [{"role": "user", "content": "Tell me."}]
                r = c.post("/api/chat", json={"model": "scripted", "messages": msgs, "stream": False}).json()
                assert (r["message"]["content"], r["done_reason"]) == (answer, "stop")
                with c.stream("POST", "/api/chat", json={"model": "scripted", "messages": msgs}) as s:
                    parts = [json.loads(line) for line in s.iter_lines() if line]
                assert "".join(p["message"]["content"] for p in parts) == answer and parts[-1]["done_reason"] == "stop"
    finally:
        d.stop()
