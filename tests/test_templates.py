"""Chat formatting: 60 real Jinja chat templates, Ollama Go templates, generate/suffix rules, tool-call parsing."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from evenflow.daemon.prompt.templates import (SuffixNotSupported, TemplateError, is_go_template,
                                              prepare_chat_messages, render_chat, render_generate, render_go_chat,
                                              render_messages, template_capabilities, thinking_tags)
from evenflow.daemon.prompt.tools import (TOOL_FORMATS, extract_tool_calls, format_tool_calls, parse_tool_calls,
                                          tool_format_for)

FIXTURES = Path(os.environ.get("EVENFLOW_FIXTURES") or Path(__file__).resolve().parents[2] / "shared" / "fixtures")
TEMPLATE_DIR = FIXTURES / "chat-templates"
TEMPLATE_FILES = sorted(TEMPLATE_DIR.glob("*.jinja")) if TEMPLATE_DIR.is_dir() else []
_NO_FIXTURES = pytest.param(None, marks=pytest.mark.skip(reason=f"shared chat-template fixtures not found at "
                                                                f"{TEMPLATE_DIR} (set EVENFLOW_FIXTURES)"))

CONVERSATION = [
    {"role": "system", "content": "SYS-MARK be brief"},
    {"role": "user", "content": "USER-ONE hello"},
    {"role": "assistant", "content": "ASSIST-ONE hi there"},
    {"role": "user", "content": "USER-TWO how are you"},
]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}},
                   "required": ["city"]}}}]
TOOL_CONVERSATION = [
    {"role": "user", "content": "USER-Q weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "content": "TOOL-RESULT 22C", "tool_name": "get_weather"},
]
# Templates that legitimately refuse the plain system+user+assistant+user shape, with why and the way around.
EXPECTED_FAILURES = {
    # Gemma has no system role and says so with raise_exception; render_messages folds it into the user turn.
    "google-gemma-2-2b-it.jinja": "fold_system",
    # The "tool_use" variants of these templates iterate `tools` unconditionally (HF picks them only with tools).
    "CohereForAI-c4ai-command-r-plus-tool_use.jinja": "with_tools",
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja": "with_tools",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": "with_tools",
    # Fireworks' template reads its own `functions` (JSON text) and `datetime` variables, which callers supply.
    "fireworks-ai-llama-3-firefunction-v2.jinja": "fireworks_vars",
}


def _ids(paths: list[Path]) -> list[str]:
    return [p.name for p in paths]


@pytest.mark.parametrize("path", TEMPLATE_FILES or [_NO_FIXTURES], ids=_ids(TEMPLATE_FILES) or None)
def test_real_chat_template_renders_conversation(path: Path) -> None:
    template = path.read_text(encoding="utf-8")
    assert not is_go_template(template)
    how = EXPECTED_FAILURES.get(path.name)
    if how is None:
        out = render_chat(template, CONVERSATION, bos_token="<s>", eos_token="</s>")
    else:
        with pytest.raises(TemplateError):
            render_chat(template, CONVERSATION, bos_token="<s>", eos_token="</s>")
        if how == "fold_system":
            out = render_messages(template, CONVERSATION, bos_token="<s>", eos_token="</s>")
        elif how == "with_tools":
            out = render_chat(template, CONVERSATION, tools=TOOLS, bos_token="<s>", eos_token="</s>")
        else:
            out = render_chat(template, CONVERSATION, bos_token="<s>", eos_token="</s>", functions="[]",
                              datetime="2025-01-01")
    for m in CONVERSATION:
        assert m["content"] in out, f"{path.name} dropped {m['content']!r}"
    assert out.rfind("USER-TWO") > out.rfind("ASSIST-ONE") > out.rfind("USER-ONE")


TOOL_TEMPLATES = [p for p in TEMPLATE_FILES if "tools" in template_capabilities(p.read_text(encoding="utf-8"))]


def test_most_fixture_templates_are_tool_capable() -> None:
    if not TEMPLATE_FILES:
        pytest.skip(f"shared chat-template fixtures not found at {TEMPLATE_DIR}")
    assert len(TEMPLATE_FILES) == 60 and len(TOOL_TEMPLATES) >= 40


@pytest.mark.parametrize("path", TOOL_TEMPLATES or [_NO_FIXTURES], ids=_ids(TOOL_TEMPLATES) or None)
def test_real_tool_template_renders_tools_and_calls(path: Path) -> None:
    template = path.read_text(encoding="utf-8")
    out = render_chat(template, TOOL_CONVERSATION, tools=TOOLS, bos_token="<s>", eos_token="</s>")
    for needle in ("get_weather", "Paris", "TOOL-RESULT 22C", "USER-Q weather in Paris?"):
        assert needle in out, f"{path.name} lost {needle!r}"
    assert "Get the weather for a city" in out or "get_weather" in out.split("USER-Q")[0]


def test_fixture_tool_formats_detected() -> None:
    if not TEMPLATE_FILES:
        pytest.skip(f"shared chat-template fixtures not found at {TEMPLATE_DIR}")
    expect = {"Qwen-Qwen2.5-7B-Instruct.jinja": "hermes", "meta-llama-Llama-3.1-8B-Instruct.jinja": "llama3",
              "mistralai-Mistral-Nemo-Instruct-2407.jinja": "mistral", "ibm-granite-granite-3.3-2B-Instruct.jinja": "granite",
              "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": "hermes", "microsoft-Phi-3.5-mini-instruct.jinja": None}
    for name, fmt in expect.items():
        assert tool_format_for((TEMPLATE_DIR / name).read_text(encoding="utf-8")) == fmt, name


# ------------------------------------------------------------------------------------------------ Jinja helpers

def test_jinja_helpers_behave_like_hf() -> None:
    t = ("{{ bos_token }}{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}"
         "{{ m | tojson }}|{% endfor %}{{ {'a': [1, 2]} | tojson(indent=2) }}{{ strftime_now('%Y') | length }}"
         "{% generation %}G{% endgeneration %}{{ eos_token }}")
    out = render_chat(t, [{"role": "user", "content": "héllo <b>"}] * 3, bos_token="<s>", eos_token="</s>")
    assert out.startswith('<s>{"role": "user", "content": "héllo <b>"}|{"role"')
    assert out.count("|") == 2 and '{\n  "a": [\n    1,\n    2\n  ]\n}4G</s>' in out
    with pytest.raises(TemplateError, match="nope"):
        render_chat("{{ raise_exception('nope') }}", [])
    with pytest.raises(TemplateError, match="syntax"):
        render_chat("{% if %}", [])
    with pytest.raises(TemplateError, match="unsafe"):
        render_chat("{{ ''.__class__.__mro__ }}", [])
    # trim_blocks / lstrip_blocks as HF sets them
    assert render_chat("  {% if true %}\nX\n  {% endif %}\nY", []) == "X\nY"


def test_gemma_style_system_folding() -> None:
    t = ("{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}"
         "{% endif %}<{{ m.role }}>{{ m.content }}{% endfor %}")
    out = render_messages(t, CONVERSATION)
    assert out.startswith("<user>SYS-MARK be brief\n\nUSER-ONE hello<assistant>")


# ------------------------------------------------------------------------------------------------ Go templates

LLAMA31 = """{{- if or .System .Tools }}<|start_header_id|>system<|end_header_id|>
{{- if .System }}

{{ .System }}
{{- end }}
{{- if .Tools }}

You are a helpful assistant with tool calling capabilities.
{{- end }}<|eot_id|>
{{- end }}
{{- range $i, $_ := .Messages }}
{{- $last := eq (len (slice $.Messages $i)) 1 }}
{{- if eq .Role "user" }}<|start_header_id|>user<|end_header_id|>
{{- if and $.Tools $last }}

Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.

{{ range $.Tools }}
{{- . }}
{{ end }}
Question: {{ .Content }}<|eot_id|>
{{- else }}

{{ .Content }}<|eot_id|>
{{- end }}{{ if $last }}<|start_header_id|>assistant<|end_header_id|>

{{ end }}
{{- else if eq .Role "assistant" }}<|start_header_id|>assistant<|end_header_id|>
{{- if .ToolCalls }}
{{ range .ToolCalls }}
{"name": "{{ .Function.Name }}", "parameters": {{ .Function.Arguments }}}{{ end }}
{{- else }}

{{ .Content }}
{{- end }}{{ if not $last }}<|eot_id|>{{ end }}
{{- else if eq .Role "tool" }}<|start_header_id|>ipython<|end_header_id|>

{{ .Content }}<|eot_id|>{{ if $last }}<|start_header_id|>assistant<|end_header_id|>

{{ end }}
{{- end }}
{{- end }}"""

QWEN25 = """{{- if .Messages }}
{{- if or .System .Tools }}<|im_start|>system
{{- if .System }}
{{ .System }}
{{- end }}
{{- if .Tools }}

<tools>
{{- range .Tools }}
{"type": "function", "function": {{ .Function }}}
{{- end }}
</tools>

For each function call, return a json object within <tool_call></tool_call> XML tags.
{{- end }}<|im_end|>
{{ end }}
{{- range $i, $_ := .Messages }}
{{- $last := eq (len (slice $.Messages $i)) 1 -}}
{{- if eq .Role "user" }}<|im_start|>user
{{ .Content }}<|im_end|>
{{ else if eq .Role "assistant" }}<|im_start|>assistant
{{ if .Content }}{{ .Content }}
{{- else if .ToolCalls }}<tool_call>
{{ range .ToolCalls }}{"name": "{{ .Function.Name }}", "arguments": {{ .Function.Arguments }}}
{{ end }}</tool_call>
{{- end }}{{ if not $last }}<|im_end|>
{{ end }}
{{- else if eq .Role "tool" }}<|im_start|>user
<tool_response>
{{ .Content }}
</tool_response><|im_end|>
{{ end }}
{{- if and (ne .Role "assistant") $last }}<|im_start|>assistant
{{ end }}
{{- end }}
{{- else }}
{{- if .System }}<|im_start|>system
{{ .System }}<|im_end|>
{{ end }}{{ if .Prompt }}<|im_start|>user
{{ .Prompt }}<|im_end|>
{{ end }}<|im_start|>assistant
{{ end }}{{ .Response }}{{ if .Response }}<|im_end|>{{ end }}"""

MISTRAL = """{{- range $i, $_ := .Messages }}
{{- if eq .Role "user" }}
{{- if and $.Tools (le (len (slice $.Messages $i)) 2) }}[AVAILABLE_TOOLS] {{ $.Tools }}[/AVAILABLE_TOOLS]
{{- end }}[INST] {{ if and $.System (eq (len (slice $.Messages $i)) 1) }}{{ $.System }}

{{ end }}{{ .Content }}[/INST]
{{- else if eq .Role "assistant" }}
{{- if .Content }} {{ .Content }}
{{- else if .ToolCalls }}[TOOL_CALLS] [
{{- range .ToolCalls }}{"name": "{{ .Function.Name }}", "arguments": {{ .Function.Arguments }}}
{{- end }}]
{{- end }}</s>
{{- else if eq .Role "tool" }}[TOOL_RESULTS] {"content": {{ .Content }}} [/TOOL_RESULTS]
{{- end }}
{{- end }}"""

CHATML_LEGACY = """{{ if .System }}<|im_start|>system
{{ .System }}<|im_end|>
{{ end }}{{ if .Prompt }}<|im_start|>user
{{ .Prompt }}<|im_end|>
{{ end }}<|im_start|>assistant
{{ .Response }}<|im_end|>
"""

S, U1, A1, U2 = (m["content"] for m in CONVERSATION)


def test_go_llama3_messages_mode_and_tools() -> None:
    assert is_go_template(LLAMA31)
    assert render_messages(LLAMA31, CONVERSATION) == (
        f"<|start_header_id|>system<|end_header_id|>\n\n{S}<|eot_id|>"
        f"<|start_header_id|>user<|end_header_id|>\n\n{U1}<|eot_id|>"
        f"<|start_header_id|>assistant<|end_header_id|>\n\n{A1}<|eot_id|>"
        f"<|start_header_id|>user<|end_header_id|>\n\n{U2}<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n")
    out = render_messages(LLAMA31, TOOL_CONVERSATION[:1], tools=TOOLS)
    assert '{"type":"function","function":{"name":"get_weather"' in out  # a Tool prints as its JSON
    assert out.endswith("Question: USER-Q weather in Paris?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    out = render_messages(LLAMA31, TOOL_CONVERSATION, tools=TOOLS)
    assert '\n{"name": "get_weather", "parameters": {"city":"Paris"}}<|eot_id|>' in out
    assert out.endswith("ipython<|end_header_id|>\n\nTOOL-RESULT 22C<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    assert set(template_capabilities(LLAMA31)) == {"tools"} and tool_format_for(LLAMA31) == "llama3"


def test_go_qwen_chatml_messages_and_legacy_modes() -> None:
    assert render_messages(QWEN25, CONVERSATION) == (
        f"<|im_start|>system\n{S}<|im_end|>\n<|im_start|>user\n{U1}<|im_end|>\n<|im_start|>assistant\n{A1}<|im_end|>\n"
        f"<|im_start|>user\n{U2}<|im_end|>\n<|im_start|>assistant\n")
    out = render_messages(QWEN25, TOOL_CONVERSATION, tools=TOOLS)
    assert '<tools>\n{"type": "function", "function": {"name":"get_weather"' in out
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city":"Paris"}}\n</tool_call><|im_end|>' in out
    assert out.endswith("<tool_response>\nTOOL-RESULT 22C\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert tool_format_for(QWEN25) == "hermes"
    # legacy (.Prompt/.Response) templates run once per turn; the last turn stops at .Response
    assert render_messages(CHATML_LEGACY, CONVERSATION) == (
        f"<|im_start|>system\n{S}<|im_end|>\n<|im_start|>user\n{U1}<|im_end|>\n<|im_start|>assistant\n{A1}<|im_end|>\n"
        f"<|im_start|>user\n{U2}<|im_end|>\n<|im_start|>assistant\n")


def test_go_mistral_inst() -> None:
    assert render_messages(MISTRAL, CONVERSATION) == f"[INST] {U1}[/INST] {A1}</s>[INST] {S}\n\n{U2}[/INST]"
    out = render_messages(MISTRAL, TOOL_CONVERSATION[:1], tools=TOOLS)
    assert out.startswith('[AVAILABLE_TOOLS] [{"type":"function"') and out.endswith("[INST] USER-Q weather in Paris?[/INST]")
    out = render_messages(MISTRAL, TOOL_CONVERSATION, tools=TOOLS)  # tools only shown near the last user turn
    assert "AVAILABLE_TOOLS" not in out
    assert '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city":"Paris"}}]</s>' in out
    assert out.endswith('[TOOL_RESULTS] {"content": TOOL-RESULT 22C} [/TOOL_RESULTS]')
    assert tool_format_for(MISTRAL) == "mistral"


def test_go_template_language_details() -> None:
    data = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}, {"role": "assistant", "content": "c"}]
    t = ('{{ range $i, $m := .Messages }}{{ if $i }},{{ end }}{{ printf "%s=%q" .Role .Content }}{{ end }}'
         '{{/* comment */}} n={{ len .Messages }} {{ with .System }}sys{{ else }}nosys{{ end }}'
         '{{ range .Tools }}x{{ else }} notools{{ end }} {{ index .Messages 1 | json }}'
         ' {{ $x := 1 }}{{ if true }}{{ $x = 2 }}{{ end }}{{ $x }} {{ or "" "dflt" }} {{ and 1 0 }}'
         '{{ range $i, $_ := .Messages }}{{ if eq $i 1 }}{{ break }}{{ end }}[{{ $i }}]{{ end }}')
    # consecutive same-role messages are merged, as Ollama's collate does
    assert render_go_chat(t, data) == ('user="a\\n\\nb",assistant="c" n=2 nosys notools '
                                       '{"Role":"assistant","Content":"c","Thinking":"","Images":[],"ToolCalls":[],'
                                       '"ToolName":"","ToolCallID":""} 2 dflt 0[0]')
    for bad, what in (('{{ template "x" }}', "template"), ('{{ define "x" }}y{{ end }}', "define"),
                      ("{{ if .A }}open", "end"), ("{{ nosuchfunc 1 }}", "nosuchfunc"), ("{{ .A", "unclosed")):
        with pytest.raises(TemplateError, match=what):
            render_go_chat(bad + "{{ .Messages }}", data)


def test_generate_prompt_rules() -> None:
    # system: the request's wins over the model's; the model's MESSAGE history comes before the prompt
    out = render_generate(CHATML_LEGACY, "hi", system="REQ", model_system="MODEL")
    assert out == "<|im_start|>system\nREQ<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert "MODEL" in render_generate(CHATML_LEGACY, "hi", model_system="MODEL")
    assert render_generate(None, "just text") == "just text"  # Ollama's default {{ .Prompt }}
    hist = [{"role": "user", "content": "old"}, {"role": "assistant", "content": "reply"}]
    out = render_generate(QWEN25, "new", model_messages=hist)
    assert out.index("old") < out.index("reply") < out.index("new")
    fim = "{{ if .Suffix }}<PRE> {{ .Prompt }} <SUF>{{ .Suffix }} <MID>{{ else }}{{ .Prompt }}{{ end }}"
    assert template_capabilities(fim) == ["insert"]
    assert render_generate(fim, "def f(", suffix="return x") == "<PRE> def f( <SUF>return x <MID>"
    with pytest.raises(SuffixNotSupported):
        render_generate(CHATML_LEGACY, "x", suffix="y")
    with pytest.raises(SuffixNotSupported):
        render_generate("{% for m in messages %}{{ m.content }}{% endfor %}", "x", suffix="y")
    msgs = prepare_chat_messages([{"role": "user", "content": "q"}], model_system="SYS",
                                 model_messages=[{"role": "user", "content": "m"}])
    assert [m["content"] for m in msgs] == ["SYS", "m", "q"]
    assert prepare_chat_messages([{"role": "system", "content": "own"}], model_system="SYS")[0]["content"] == "own"


def test_thinking_detection() -> None:
    assert thinking_tags("{{ if .Think }}<think>{{ end }}{{ .Prompt }}") == ("<think>", "</think>")
    assert thinking_tags(LLAMA31) is None


# ------------------------------------------------------------------------------------------------ tool calls

CALLS = [{"function": {"name": "get_weather", "arguments": {"city": "Paris", "units": ["c", "f"], "n": 2}}},
         {"function": {"name": "get_time", "arguments": {"tz": "Europe/Paris"}}}]


@pytest.mark.parametrize("fmt", TOOL_FORMATS)
def test_tool_call_round_trip(fmt: str) -> None:
    text = format_tool_calls(CALLS, fmt)
    assert parse_tool_calls(text, fmt) == CALLS
    content, calls = extract_tool_calls(text, fmt)
    assert calls == CALLS and content == ""
    assert parse_tool_calls("The weather is nice today.", fmt) is None


def test_tool_call_variants() -> None:
    assert parse_tool_calls('<|python_tag|>{"name": "f", "parameters": {"a": 1}}', "llama3") == [
        {"function": {"name": "f", "arguments": {"a": 1}}}]
    assert parse_tool_calls('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', "mistral") == [
        {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]
    content, calls = extract_tool_calls('Let me check.\n<tool_call>\n{"name": "f", "arguments": "{\\"a\\": 2}"}\n'
                                        '</tool_call>', "hermes")
    assert content == "Let me check." and calls == [{"function": {"name": "f", "arguments": {"a": 2}}}]
    xml = "<tool_call>\n<function=f>\n<parameter=city>\nParis\n</parameter>\n<parameter=n>\n3\n</parameter>\n</function>\n</tool_call>"
    assert parse_tool_calls(xml, "hermes") == [{"function": {"name": "f", "arguments": {"city": "Paris", "n": 3}}}]
    assert parse_tool_calls("<tool_call>not json</tool_call>", "hermes") is None
    assert parse_tool_calls('{"name": "f", "parameters": {}}', QWEN25) is None  # hermes format: bare JSON is text
    assert parse_tool_calls('{"name": "f", "parameters": {}}', LLAMA31) == [{"function": {"name": "f", "arguments": {}}}]
    assert parse_tool_calls('<tool_call>{"name": "f", "arguments": {}}</tool_call>', "qwen2") == [
        {"function": {"name": "f", "arguments": {}}}]  # a model family picks its format
    assert tool_format_for("{{ .Prompt }}") is None and parse_tool_calls("<tool_call>{}</tool_call>", None) is None
