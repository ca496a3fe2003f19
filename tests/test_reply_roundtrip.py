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
