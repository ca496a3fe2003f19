"""Round trip through each family's real chat template (../shared/fixtures/chat-templates): render a conversation
whose last turn is the model's own thinking and tool calls, take the assistant part the template wrote, and parse
it back into the same thinking and calls. What a template renders for an assistant turn is what the model emits,
so this checks the parser against every family's real markup, and the prompt side against the parser."""
from __future__ import annotations

import pytest

from conftest import shared_fixtures_path
from evenflow.daemon.prompt import formats
from evenflow.daemon.prompt.reply import ReplyParser
from evenflow.daemon.prompt.templates import render_messages
from reply_samples import PARIS, ROME, SAMPLES, TOOLS, call

TEMPLATE_DIR = shared_fixtures_path() / "chat-templates"
FAMILY_TEMPLATES = sorted({s.template for s in SAMPLES if s.template} | {
    "Qwen-QwQ-32B.jinja", "MiMo-VL.jinja", "Reka-Edge.jinja", "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
    "inclusionai-ling-3.0-flash.jinja", "poolside-Laguna-XS-2.1.jinja", "Spark2.5.jinja", "Kimi-K2-Instruct.jinja",
    "deepseek-ai-DeepSeek-V4-Flash-0731.jinja", "unsloth-mistral-Devstral-Small-2507.jinja",
    "Mistral-Small-3.2-24B-Instruct-2506.jinja", "GigaChat3.1-10B-A1.8B.jinja", "Cohere2MoE.jinja",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"})
# what ends an assistant turn in the rendered text: the model emits it as its end-of-generation token
END_OF_TURN = ("<|im_end|>", "<｜end▁of▁sentence｜>", "<|end|>", "<|eot_id|>", "<turn|>", "<|end_of_text|>", "</s>",
               "<seed:eos>", "<|END_OF_TURN_TOKEN|>", "<|return|>", "<|call|>", "<end_of_sentence>", "<|eom_id|>",
               "<SPECIAL_12>", "<|role_end|>", "</assistant>", "<|message_sep|>", "<｜hy_eos:opensource｜>",
               "<|user|>", "<|observation|>", "<sep>", "<|START_OF_TURN_TOKEN|>", "<|CHATBOT_TOKEN|>",
               "<｜Assistant｜>")
# templates that take one call per turn (they refuse or drop a second)
# templates whose past answer turn sits where generation would still be thinking: Nemotron v2 shows the last turn
# after an unclosed <think>, Apriel 1.5 drops the reasoning and its [BEGIN FINAL RESPONSE] from history
ANSWER_INSIDE_THINKING = {"NVIDIA-Nemotron-Nano-v2.jinja", "unsloth-Apriel-1.5.jinja"}
SINGLE_CALL = {"meta-llama-Llama-3.1-8B-Instruct.jinja", "GigaChat3.1-10B-A1.8B.jinja"}
USER = {"role": "user", "content": "What is the weather in Paris and Rome?"}


def _template(name: str) -> str:
    path = TEMPLATE_DIR / name
    if not path.is_file():
        pytest.skip(f"shared chat-template fixtures not found at {TEMPLATE_DIR} (set EVENFLOW_FIXTURES)")
    return path.read_text(encoding="utf-8")


def _assistant_part(template: str, turn: dict) -> tuple[str, str]:
    """(the prompt that the template's rendering of `turn` continues, what it wrote for the turn after it)."""
    kw = dict(tools=TOOLS, think=True, bos_token="<s>", eos_token="</s>")
    base = render_messages(template, [USER], add_generation_prompt=False, **kw)
    header = render_messages(template, [USER], **kw)[len(base):]
    full = render_messages(template, [USER, turn], add_generation_prompt=False, **kw)
    assert full.startswith(base), "the template rewrote the earlier turns"
    rest = full[len(base):]
    # the generation prompt as far as the rendered turn follows it (a template may open <think> when it
    # generates but not when it shows a past turn): back to the last whole marker or line they share
    n = 0
    while n < min(len(header), len(rest)) and header[n] == rest[n]:
        n += 1
    while 0 < n < len(header) and header[n - 1] not in ">\n":
        n -= 1
    part = rest[n:]
    changed = True
    while changed:
        changed = False
        stripped = part.rstrip()
        for end in END_OF_TURN:
            if stripped.endswith(end):
                part, changed = stripped[:-len(end)], True
    return base + rest[:n], part


@pytest.mark.parametrize("name", FAMILY_TEMPLATES)
def test_model_turn_parses_back(name: str) -> None:
    template = _template(name)
    fmt = formats.detect(template)
    assert fmt is not None and fmt.tools, name
    want = [call(PARIS)] if name in SINGLE_CALL else [call(PARIS), call(ROME)]
    turn = {"role": "assistant", "content": "", "thinking": "THOUGHT-MARK two cities", "tool_calls": want}
    prompt, part = _assistant_part(template, turn)
    assert all(c["function"]["arguments"]["city"] in part for c in want), (name, part)
    for pieces in ([part], list(part)):
        p = ReplyParser(template, prompt, True, TOOLS)
        thinking, content, calls = "", "", []
        for i, piece in enumerate(pieces):
            t, c, k = p.feed(piece, i == len(pieces) - 1)
            thinking, content, calls = thinking + t, content + c, calls + k
        assert [{"function": {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}}
                for c in calls] == want, (name, part)
        assert content.strip() == "", (name, content)
        assert thinking == ("THOUGHT-MARK two cities" if "THOUGHT-MARK" in part else ""), (name, thinking)


@pytest.mark.parametrize("name", FAMILY_TEMPLATES)
def test_answer_turn_parses_back(name: str) -> None:
    template = _template(name)
    turn = {"role": "assistant", "content": "It is sunny in Paris.", "thinking": "THOUGHT-MARK easy"}
    prompt, part = _assistant_part(template, turn)
    p = ReplyParser(template, prompt, True, TOOLS)
    thinking, content, calls = p.parse_all(part)
    if name in ANSWER_INSIDE_THINKING:  # not the shape the model generates; the text must still come back
        assert calls == [] and "It is sunny in Paris." in thinking + content, (name, part)
        return
    assert calls == [] and content.strip() == "It is sunny in Paris.", (name, part, content)
    assert thinking == ("THOUGHT-MARK easy" if "THOUGHT-MARK" in part else ""), (name, part)


def test_thinking_round_trips_where_families_render_it() -> None:
    """The families that show the model its own thinking in a tool-calling turn get it under the name their
    template reads (`reasoning_content`, `thinking`, `reasoning`), so the model sees what it thought."""
    shown = {"deepseek-ai-DeepSeek-V3.2.jinja", "GLM-4.6.jinja", "ByteDance-Seed-OSS.jinja", "Qwen-Qwen3-0.6B.jinja",
             "google-gemma-4-31B-it.jinja", "LFM2.5-8B-A1B.jinja", "openai-gpt-oss-120b.jinja",
             "Cohere2MoE.jinja", "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja"}
    for name in sorted(shown):
        template = _template(name)
        turn = {"role": "assistant", "content": "", "thinking": "THOUGHT-MARK", "tool_calls": [call(PARIS)]}
        _, part = _assistant_part(template, turn)
        assert "THOUGHT-MARK" in part, name


# every fixture template -> the family formats.py picks (None: not parsed, its replies come back as content)
FAMILIES = {
    "Apriel-1.6-15b-Thinker-fixed.jinja": "Apriel", "unsloth-Apriel-1.5.jinja": "Apriel",
    "ByteDance-Seed-OSS.jinja": "Seed-OSS", "GLM-4.6.jinja": "GLM-4.5 / 4.6 / 4.7",
    "Cohere2MoE.jinja": "Command R7B / A", "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja": "Command R7B / A",
    "CohereForAI-c4ai-command-r-plus-tool_use.jinja": None, "GigaChat3-10B-A1.8B.jinja": None,
    "GigaChat3.1-10B-A1.8B.jinja": "GigaChat 3", "HuggingFaceTB-SmolLM3-3B.jinja": "<think> tags",
    "Kimi-K2-Instruct.jinja": "Kimi K2", "moonshotai-Kimi-K2.jinja": "Kimi K2", "Kimi-K3.jinja": None,
    "LFM2-8B-A1B.jinja": "LFM2 / LFM2.5", "LFM2.5-8B-A1B.jinja": "LFM2 / LFM2.5",
    "MiMo-VL.jinja": "Qwen / Hermes / Granite 4 (<tool_call> JSON)", "MiniMax-M1.jinja": "MiniMax M1",
    "MiniMax-M3.jinja": None, "Mistral-Small-3.2-24B-Instruct-2506.jinja": "Mistral / Magistral",
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja": "Qwen3-Coder / Nemotron 3 (XML)",
    "NVIDIA-Nemotron-Nano-v2.jinja": "Nemotron Nano v2",
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja": "Qwen / Hermes / Granite 4 (<tool_call> JSON)",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": "Qwen / Hermes / Granite 4 (<tool_call> JSON)",
    "Qwen-QwQ-32B.jinja": "Qwen / Hermes / Granite 4 (<tool_call> JSON)",
    "Qwen-Qwen2.5-7B-Instruct.jinja": "Qwen / Hermes / Granite 4 (<tool_call> JSON)",
    "Qwen-Qwen3-0.6B.jinja": "Qwen / Hermes / Granite 4 (<tool_call> JSON)",
    "Qwen3-Coder.jinja": "Qwen3-Coder / Nemotron 3 (XML)",
    "Reka-Edge.jinja": "Qwen / Hermes / Granite 4 (<tool_call> JSON)", "Spark2.5.jinja": "GLM-4.5 / 4.6 / 4.7",
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja": "DeepSeek R1 / V3 / V3.1",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": "DeepSeek R1 / V3 / V3.1",
    "llama-cpp-deepseek-r1.jinja": "DeepSeek R1 / V3 / V3.1",
    "deepseek-ai-DeepSeek-V3.2.jinja": "DeepSeek V3.2 (DSML)", "deepseek-ai-DeepSeek-V4.jinja": "DeepSeek V3.2 (DSML)",
    "deepseek-ai-DeepSeek-V4-Flash-0731.jinja": "DeepSeek V3.2 (DSML)",
    "fireworks-ai-llama-3-firefunction-v2.jinja": "Firefunction v2", "google-gemma-2-2b-it.jinja": None,
    "google-gemma-4-31B-it.jinja": "Gemma 4", "google-gemma-4-31B-it-interleaved.jinja": "Gemma 4",
    "ibm-granite-granite-3.3-2B-Instruct.jinja": "Granite 3",
    "ibm-granite-granite-4.1.jinja": "Qwen / Hermes / Granite 4 (<tool_call> JSON)",
    "inclusionai-ling-3.0-flash.jinja": "GLM-4.5 / 4.6 / 4.7", "llama-cpp-rwkv-world.jinja": "<think> tags",
    "meetkai-functionary-medium-v3.1.jinja": "Llama 3.x", "meetkai-functionary-medium-v3.2.jinja": None,
    "meta-llama-Llama-3.1-8B-Instruct.jinja": "Llama 3.x", "meta-llama-Llama-3.2-3B-Instruct.jinja": "Llama 3.x",
    "meta-llama-Llama-3.3-70B-Instruct.jinja": "Llama 3.x", "microsoft-Phi-3.5-mini-instruct.jinja": None,
    "mistralai-Ministral-3-14B-Reasoning-2512.jinja": "Mistral / Magistral",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": "Mistral / Magistral", "muse-glimmer.jinja": None,
    "openai-gpt-oss-120b.jinja": "gpt-oss (harmony)", "openbmb-MiniCPM5-1B.jinja": "<think> tags",
    "poolside-Laguna-S-2.1.jinja": "GLM-4.5 / 4.6 / 4.7", "poolside-Laguna-XS-2.1.jinja": "GLM-4.5 / 4.6 / 4.7",
    "poolside-Laguna-XS.2.jinja": "GLM-4.5 / 4.6 / 4.7", "tencent-Hy3.jinja": "Hunyuan 3",
    "unsloth-mistral-Devstral-Small-2507.jinja": "Mistral / Magistral", "upstage-Solar-Open-100B.jinja": None,
}


def test_every_fixture_template_gets_its_family() -> None:
    if not TEMPLATE_DIR.is_dir():
        pytest.skip(f"shared chat-template fixtures not found at {TEMPLATE_DIR} (set EVENFLOW_FIXTURES)")
    got = {p.name: getattr(formats.detect(p.read_text(encoding="utf-8")), "family", None)
           for p in sorted(TEMPLATE_DIR.glob("*.jinja"))}
    assert got == FAMILIES


# ------------------------------------------------------------------------------------------ gpt-oss prompt side

def test_harmony_think_levels_become_reasoning_effort() -> None:
    """As Ollama: a level is gpt-oss's reasoning effort ("max" is "high"); true, false or nothing leave medium."""
    t = _template("openai-gpt-oss-120b.jinja")
    for think, effort in ((None, "medium"), (True, "medium"), (False, "medium"), ("low", "low"),
                          ("medium", "medium"), ("high", "high"), ("max", "high")):
        out = render_messages(t, [USER], think=think)
        assert f"Reasoning: {effort}\n" in out and out.endswith("<|start|>assistant"), think


def test_harmony_go_template_gets_the_level_too() -> None:
    go = "{{ .ThinkLevel }}|{{ range .Messages }}{{ .Content }}{{ end }}"
    assert render_messages(go, [USER], think="max", arch="gpt-oss").startswith("high|")
    assert render_messages(go, [USER], think="max", arch="llama").startswith("max|")


def test_harmony_renders_each_call_with_its_result() -> None:
    """Harmony has one call per assistant message, answered by a `functions.NAME to=assistant` message; a turn
    with two calls (and results in another order, matched by id) comes out as call, result, call, result."""
    t = _template("openai-gpt-oss-120b.jinja")
    turn = {"role": "assistant", "content": "", "thinking": "Both cities.",
            "tool_calls": [{"id": "c1", **call(PARIS)}, {"id": "c2", **call(ROME)}]}
    msgs = [USER, turn, {"role": "tool", "tool_call_id": "c2", "content": "RESULT-ROME"},
            {"role": "tool", "tool_call_id": "c1", "content": "RESULT-PARIS"}]
    out = render_messages(t, msgs, tools=TOOLS)
    head = "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
    result = "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"
    paris, rome = '{"city": "Paris", "days": 3}', '{"city": "Rome", "days": 1}'
    expect = (f"<|start|>assistant<|channel|>analysis<|message|>Both cities.<|end|>{head}{paris}<|call|>"
              f'{result}"RESULT-PARIS"<|end|>{head}{rome}<|call|>{result}"RESULT-ROME"<|end|><|start|>assistant')
    assert out.endswith(expect), out[-600:]
    # a tool-calling turn with both text and thinking: the template refuses both, the text joins the thinking
    both = dict(turn, content="Let me check.", tool_calls=[call(PARIS)])
    out = render_messages(t, [USER, both, {"role": "tool", "content": "R"}], tools=TOOLS)
    assert "<|channel|>analysis<|message|>Both cities.\n\nLet me check.<|end|>" in out


def test_lfm2_sees_its_own_calls() -> None:
    """LFM2's first template never renders an assistant's tool_calls: they are written into the content the way
    the model writes them, so the next turn's prompt holds them."""
    t = _template("LFM2-8B-A1B.jinja")
    out = render_messages(t, [USER, {"role": "assistant", "content": "", "tool_calls": [call(PARIS)]},
                              {"role": "tool", "content": "22C"}], tools=TOOLS)
    assert "<|im_start|>assistant\n<|tool_call_start|>[get_weather(city='Paris', days=3)]<|tool_call_end|>" in out
