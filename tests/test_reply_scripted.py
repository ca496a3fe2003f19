"""Every family's real reply bytes through the real path — tokenizer, engine, detokenizer with the format's special
tokens preserved, reply parser — to every API, streamed and whole, with the real ollama, openai and anthropic
clients. A scripted model (backends/synthetic/scripted.py) writes each sample of reply_samples.py after its prompt,
in a real vocabulary with the family's special tokens added as the family has them (control tokens llama.cpp hides
unless asked, or user-defined ones it always prints)."""
from __future__ import annotations

import json
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator

import anthropic
import ollama
import openai
import pytest

from api_harness import Daemon, start_daemon, upload_model
from conftest import shared_fixtures_path
from evenflow.daemon.prompt.templates import render_messages, template_capabilities
from reply_samples import SAMPLES, TOOLS, Sample

scripted = pytest.importorskip("evenflow.backends.synthetic.scripted", reason="the scripted synthetic model")
FIXTURES = shared_fixtures_path()
if not (FIXTURES / "vocab").is_dir():
    pytest.skip(f"shared fixtures not found at {FIXTURES} (set EVENFLOW_FIXTURES)", allow_module_level=True)

C, U = "control", "user_defined"
THINK_U = {"<think>": U, "</think>": U}
# per family: its architecture and the special tokens its vocabulary has (kind as in the family's tokenizer)
FAMILY_TOKENS: dict[str, tuple[str | None, dict[str, str]]] = {
    "gpt-oss (harmony)": ("gpt-oss", {t: C for t in ("<|start|>", "<|end|>", "<|message|>", "<|channel|>",
                                                     "<|constrain|>", "<|return|>", "<|call|>")}),
    # DSML's markers as tokens of their own: the scripted model looks back 17 tokens, which spelled byte by byte
    # they would outrun (DeepSeek's own vocabulary spells them in fewer)
    "DeepSeek V3.2 (DSML)": ("deepseek2", {**THINK_U, "<｜Assistant｜>": C, "<｜User｜>": C, **{t: U for t in (
        "<｜DSML｜invoke", "</｜DSML｜invoke>", "<｜DSML｜parameter", "</｜DSML｜parameter>",
        "<｜DSML｜function_calls>", "</｜DSML｜function_calls>", "<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>")}}),
    "DeepSeek R1 / V3 / V3.1": ("deepseek2", {**THINK_U, "<｜Assistant｜>": C, "<｜User｜>": C, **{t: U for t in (
        "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
        "<｜tool▁sep｜>")}}),
    "GLM-4.5 / 4.6 / 4.7": ("glm4moe", {t: C for t in ("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>",
                                                         "<arg_value>", "</arg_value>", "<think>", "</think>",
                                                         "<|assistant|>", "<|user|>")}),
    "Kimi K2": ("deepseek2", {**THINK_U, **{t: C for t in (
        "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
        "<|tool_call_argument_begin|>", "<|tool_call_end|>", "<|im_middle|>")}}),
    "Gemma 4": ("gemma4", {t: C for t in ("<|tool_call>", "<tool_call|>", '<|"|>', "<|channel>", "<channel|>",
                                          "<|tool_response>", "<|turn>", "<turn|>")}),
    "LFM2 / LFM2.5": ("lfm2", {t: C for t in ("<|tool_call_start|>", "<|tool_call_end|>", "<think>", "</think>")}),
    "Qwen / Hermes / Granite 4 (<tool_call> JSON)": ("qwen3", {**THINK_U, "<tool_call>": U, "</tool_call>": U}),
    "Qwen3-Coder / Nemotron 3 (XML)": ("qwen3moe", {**THINK_U, "<tool_call>": U, "</tool_call>": U}),
    "Nemotron Nano v2": ("nemotron_h", {**THINK_U, "<TOOLCALL>": C, "</TOOLCALL>": C}),
    "Seed-OSS": ("seed_oss", {t: C for t in ("<seed:think>", "</seed:think>", "<seed:tool_call>",
                                             "</seed:tool_call>")}),
    "MiniMax M2": ("minimax-m2", {**THINK_U, "<minimax:tool_call>": C, "</minimax:tool_call>": C}),
    "MiniMax M1": ("minimax", {}),
    "Apriel": ("llama", {}),
    "Llama 3.x": ("llama", {}),
    "Mistral / Magistral": ("llama", {t: C for t in ("[TOOL_CALLS]", "[ARGS]", "[THINK]", "[/THINK]")}),
    "Granite 3": ("granite", {"<|tool_call|>": C}),
    "Command R7B / A": ("cohere2", {t: C for t in ("<|START_THINKING|>", "<|END_THINKING|>", "<|START_ACTION|>",
                                                   "<|END_ACTION|>", "<|START_RESPONSE|>", "<|END_RESPONSE|>")}),
    "Hunyuan 3": ("hunyuan", {t: C for t in ("<think:opensource>", "</think:opensource>", "<tool_calls:opensource>",
                                             "</tool_calls:opensource>", "<tool_call:opensource>",
                                             "</tool_call:opensource>", "<tool_sep:opensource>",
                                             "<arg_key:opensource>", "</arg_key:opensource>",
                                             "<arg_value:opensource>", "</arg_value:opensource>")}),
}


def _template(s: Sample) -> str:
    """The family's real template, or for a sample without one a small template with its markers whose
    generation prompt ends as the sample's does."""
    if s.template:
        return (FIXTURES / "chat-templates" / s.template).read_text(encoding="utf-8")
    return ("{# " + s.markers + " #}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
            "{% endfor %}{% if tools %}{{ tools | tojson }}{% endif %}{% if add_generation_prompt %}"
            + s.prompt_tail.replace("{", "{{ '{' }}") + "{% endif %}")


def _question(s: Sample) -> str:
    return f"Sample {s.id.replace('-', ' ')}: what is the weather?"


def _end(s: Sample) -> str | None:
    if s.family.startswith("gpt-oss"):
        return "<|call|>" if s.calls else "<|return|>"
    return None


def _think(s: Sample, template: str) -> bool | None:
    """What the daemon makes of the sample's `think`: unset is on for a model that can think."""
    if s.think is not None:
        return s.think
    return True if "thinking" in template_capabilities(template, FAMILY_TOKENS[s.family][0]) else None


def _spec(samples: list[Sample]) -> Any:
    family = samples[0].family
    arch, specials = FAMILY_TOKENS[family]
    template = _template(samples[0])
    replies = []
    for s in samples:
        q = _question(s)
        prompt = render_messages(template, [{"role": "user", "content": q}], tools=TOOLS, think=_think(s, template),
                                 arch=arch)
        replies.append(scripted.Reply(prompt=prompt[prompt.rindex(q):], text=s.output, end=_end(s)))
    # GPT-2's byte-level BPE: any family's text, and the smallest file (a model per family and template)
    return scripted.ScriptedSpec(vocab=str(FIXTURES / "vocab" / "ggml-vocab-gpt-2.gguf"), replies=tuple(replies),
                                 chat_template=template, architecture=arch, special_tokens=specials,
                                 name=f"scripted {family}")


# every family once (its first sample), and the samples that show what only the real path can: harmony's several
# messages and Gemma 4's thought channel mid-reply, through control tokens, and Qwen3 thinking; the rest are the
# parser tests' business
API_SAMPLES = [s for i, s in enumerate(SAMPLES) if s.family not in {x.family for x in SAMPLES[:i]}
               or s.id in ("harmony-messages", "gemma4-interleaved", "qwen3")]


def _models() -> list[tuple[list[Sample], Any]]:
    """One model per family and template where its samples fit together, else one per sample (a scripted model
    looks 17 tokens back: two replies sharing a longer stretch that goes on differently cannot share one)."""
    groups: dict[tuple[str, str | None], list[Sample]] = defaultdict(list)
    for s in API_SAMPLES:
        groups[(s.family, s.template or s.id)].append(s)
    out = []
    for samples in groups.values():
        try:
            out.append((samples, scripted.cached_scripted(_spec(samples))))
        except ValueError:
            out += [([s], scripted.cached_scripted(_spec([s]))) for s in samples]
    return out


MODEL_OF: dict[str, str] = {}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory) -> Iterator[Daemon]:
    d = start_daemon(tmp_path_factory.mktemp("reply-scripted"), backend="llamacpp", context_length="2048",
                     max_loaded_models="2")
    for i, (samples, path) in enumerate(_models()):
        upload_model(d.url, path, f"s{i}")
        MODEL_OF.update({s.id: f"s{i}" for s in samples})
    yield d
    d.stop()


def _calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"function": {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}} for c in calls]


def _oa_calls(calls: list[Any]) -> list[dict[str, Any]]:
    return [{"function": {"name": c["name"], "arguments": json.loads(c["arguments"])}} for c in calls]


def ollama_chat(url: str, s: Sample, stream: bool) -> tuple[str, str, list]:
    c = ollama.Client(host=url)
    kw = dict(messages=[{"role": "user", "content": _question(s)}], tools=TOOLS, think=s.think,
              options={"temperature": 0})
    if not stream:
        r = c.chat(MODEL_OF[s.id], **kw)
        assert r.done_reason == "stop"
        return r.message.thinking or "", r.message.content, _calls([t.model_dump() for t in r.message.tool_calls or []])
    thinking, content, calls = "", "", []
    for p in c.chat(MODEL_OF[s.id], **kw, stream=True):
        thinking, content = thinking + (p.message.thinking or ""), content + p.message.content
        calls += [t.model_dump() for t in p.message.tool_calls or []]
    return thinking, content, _calls(calls)


def ollama_generate(url: str, s: Sample, stream: bool) -> tuple[str, str, list]:
    """No tools on /api/generate: a reply with calls has them as text, so only answers are compared."""
    c = ollama.Client(host=url)
    kw = dict(think=s.think, options={"temperature": 0})
    if not stream:
        r = c.generate(MODEL_OF[s.id], _question(s), **kw)
        return r.thinking or "", r.response, []
    parts = list(c.generate(MODEL_OF[s.id], _question(s), **kw, stream=True))
    return "".join(p.thinking or "" for p in parts), "".join(p.response for p in parts), []


def openai_chat(url: str, s: Sample, stream: bool) -> tuple[str, str, list]:
    oa = openai.OpenAI(base_url=url + "/v1", api_key="x")
    kw = dict(model=MODEL_OF[s.id], messages=[{"role": "user", "content": _question(s)}], tools=TOOLS,
              temperature=0, **({} if s.think is not False else {"reasoning_effort": "none"}))
    if not stream:
        r = oa.chat.completions.create(**kw)
        m = r.choices[0].message
        assert r.choices[0].finish_reason == ("tool_calls" if s.calls else "stop")
        return ((m.model_extra or {}).get("reasoning") or "", m.content or "",
                _oa_calls([t.function.model_dump() for t in m.tool_calls or []]))
    thinking, content, calls = "", "", defaultdict(lambda: {"name": "", "arguments": ""})
    for ch in oa.chat.completions.create(**kw, stream=True):
        d = ch.choices[0].delta if ch.choices else None
        if d is None:
            continue
        thinking, content = thinking + ((d.model_extra or {}).get("reasoning") or ""), content + (d.content or "")
        for t in d.tool_calls or []:
            calls[t.index]["name"] += t.function.name or ""
            calls[t.index]["arguments"] += t.function.arguments or ""
    return thinking, content, _oa_calls([calls[i] for i in sorted(calls)])


def openai_responses(url: str, s: Sample, stream: bool) -> tuple[str, str, list]:
    oa = openai.OpenAI(base_url=url + "/v1", api_key="x")
    kw = dict(model=MODEL_OF[s.id], input=_question(s), temperature=0,
              tools=[{"type": "function", **t["function"]} for t in TOOLS],
              **({} if s.think is not False else {"reasoning": {"effort": "none"}}))
    if stream:
        with oa.responses.stream(**kw) as events:
            r = events.get_final_response()
    else:
        r = oa.responses.create(**kw)
    thinking = "".join(c.text for o in r.output if o.type == "reasoning" for c in o.content or [])
    content = "".join(c.text for o in r.output if o.type == "message" for c in o.content)
    calls = [{"name": o.name, "arguments": o.arguments} for o in r.output if o.type == "function_call"]
    return thinking, content, _oa_calls(calls)


def anthropic_messages(url: str, s: Sample, stream: bool) -> tuple[str, str, list]:
    an = anthropic.Anthropic(base_url=url, api_key="x")
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in TOOLS]
    kw = dict(model=MODEL_OF[s.id], max_tokens=1024, messages=[{"role": "user", "content": _question(s)}],
              tools=tools, extra_body={"temperature": 0},
              **({} if s.think is None else {"thinking": {"type": "enabled" if s.think else "disabled",
                                                          "budget_tokens": 1024}}))
    if stream:
        with an.messages.stream(**kw) as events:
            m = events.get_final_message()
    else:
        m = an.messages.create(**kw)
        assert m.stop_reason == ("tool_use" if s.calls else "end_turn")
    return ("".join(b.thinking for b in m.content if b.type == "thinking"),
            "".join(b.text for b in m.content if b.type == "text"),
            [{"function": {"name": b.name, "arguments": b.input}} for b in m.content if b.type == "tool_use"])


APIS = {"/api/chat": ollama_chat, "/api/generate": ollama_generate, "/v1/chat/completions": openai_chat,
        "/v1/responses": openai_responses, "/v1/messages": anthropic_messages}


@pytest.mark.parametrize("s", API_SAMPLES, ids=[s.id for s in API_SAMPLES])
def test_reply_on_every_api(daemon: Daemon, s: Sample) -> None:
    """The sample's thinking, content and calls, on each API, whole and streamed, all requests at once (the
    engine batches them; each comes back as if alone)."""
    want = (s.thinking, s.content, s.calls)
    asks = [(api, stream) for api in APIS for stream in (False, True) if not (api == "/api/generate" and s.calls)]
    with ThreadPoolExecutor(len(asks)) as pool:
        got = list(pool.map(lambda a: APIS[a[0]](daemon.url, s, a[1]), asks))
    for (api, stream), answer in zip(asks, got):
        assert answer == want, f"{api} {'streamed' if stream else 'whole'}"


def test_structured_answer_after_thinking_that_cannot_be_off(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """gpt-oss thinks even with think false: a `format` constrains its final channel, not its analysis (a grammar
    from the first token would break the reply's harmony)."""
    s = next(x for x in SAMPLES if x.id == "harmony-final")
    answer = '{"greeting": "hi"}'
    reply = "<|channel|>analysis<|message|>Say hi as JSON.<|end|><|start|>assistant<|channel|>final<|message|>" + answer
    template = _template(s)
    q = "Greet me in JSON."
    prompt = render_messages(template, [{"role": "user", "content": q}], think=False, arch="gpt-oss")
    script = scripted.Reply(prompt=prompt[prompt.rindex(q):], text=reply, end="<|return|>")
    spec = scripted.ScriptedSpec(vocab=str(FIXTURES / "vocab" / "ggml-vocab-gpt-2.gguf"), chat_template=template,
                                 replies=(script,), architecture="gpt-oss", special_tokens=FAMILY_TOKENS[s.family][1])
    d = start_daemon(tmp_path, backend="llamacpp", context_length="2048")
    try:
        upload_model(d.url, scripted.cached_scripted(spec), "gptoss")
        schema = {"type": "object", "properties": {"greeting": {"type": "string"}}, "required": ["greeting"]}
        r = ollama.Client(host=d.url).chat("gptoss", messages=[{"role": "user", "content": q}], think=False,
                                           format=schema, options={"temperature": 0})
        assert (r.message.thinking, r.message.content) == ("Say hi as JSON.", answer)
    finally:
        d.stop()
