"""Model families and what their models write, as data: one FAMILIES row per family (its real chat template, its
vocabulary, the special tokens its real tokenizer has, its GGUF architecture) and CASES rows of (family, exact model
output, expected thinking / content / tool calls). test_family_formats.py builds a scripted model per family holding
all its cases and asks each case on every API, streamed and whole.

Vocabularies: the family's own where the fixtures have it (Qwen2's for Qwen3 and DeepSeek-R1-Distill-Qwen, Llama 3's,
Mistral's SentencePiece); else GPT-2's byte-level BPE stands in (every family here but Mistral's uses a byte-level
BPE), with the family's special tokens added as its GGUF has them: `control` where the Hugging Face tokenizer marks
them special (or llama.cpp's converter takes them for special: `<|…|>`, `<｜…｜>`), which llama.cpp's detokenizer
hides, so only the reply format's preserved tokens carry them to the parser; `user_defined` where they are added but
not special (Qwen's `<think>`, `<tool_call>`; DeepSeek's `<think>`), which it always prints.

Adding a family: a FAMILIES row and a few CASES rows. A case's question is unique to it and ends it (`question()`),
as a scripted model sees only the prompt's last 17 tokens; two replies sharing a stretch of 17 tokens with different
continuations go to two models (group_replies)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "utc": {"type": "boolean"}},
                   "required": ["city"]}}}
TOOLS = [WEATHER, TIME]
TEXT = "Zürich — 東京, naïve café 🌧️ ½"  # multibyte text every family's answers carry
GPT2, QWEN2, LLAMA3, SPM = ("ggml-vocab-gpt-2.gguf", "ggml-vocab-qwen2.gguf", "ggml-vocab-llama-bpe.gguf",
                            "ggml-vocab-llama-spm.gguf")
C, U = "control", "user_defined"


@dataclass(frozen=True)
class Family:
    name: str
    template: str  # a file in fixtures/chat-templates, or (no fixture for the family) a stand-in template's text
    vocab: str  # a file in fixtures/vocab
    architecture: str  # general.architecture of the family's real GGUFs (stored as evenflow.scripted.architecture)
    format: str | None  # the reply format formats.py must pick (None: unknown, replies come back as content)
    special_tokens: dict[str, str] = field(default_factory=dict)  # text -> "control" | "user_defined"
    token_ids: dict[str, str] = field(default_factory=dict)  # bos / eos / eot / eom -> token text
    add_bos: bool | None = None
    call_end: str | None = None  # the token that ends a reply with calls where it is not the EOS (gpt-oss <|call|>)
    capabilities: tuple[str, ...] = ("tools", "thinking")  # what /api/show must report

    @property
    def model(self) -> str:
        """The scripted model's name (-1, -2, ... for more models where cases clash)."""
        return f"scripted-{self.name}"


@dataclass(frozen=True)
class Case:
    family: str
    name: str
    output: str  # exactly what the model writes, special tokens included, before its end token
    thinking: str = ""  # what each API must return (compared stripped of surrounding whitespace)
    content: str = ""
    calls: tuple[tuple[str, dict[str, Any]], ...] = ()
    tools: bool = False  # the request offers TOOLS (and then /api/generate, which has no tools, is left out)
    think: bool | str | None = None  # the request's think / reasoning switch or level; None: not sent
    end: str | None = None  # the token that ends the reply; None: the family's call_end after calls, else its EOS
    after: tuple[dict[str, Any], ...] = ()  # turns after the question (Ollama's shape): a call and its result
    schema: dict[str, Any] | None = None  # structured output asked for
    xfail: str | None = None  # why this case does not parse yet (strict: it must start failing to pass)

    @property
    def id(self) -> str:
        return f"{self.family}-{self.name}"

    def question(self) -> str:
        return f"What now, case {self.id}?"

    def messages(self) -> list[dict[str, Any]]:
        return [{"role": "user", "content": self.question()}, *self.after]


def _standin(text: str) -> str:
    return text.removeprefix("\n")


# DeepSeek V3.1 (no fixture): its prompt's tail and markers; `enable_thinking` picks `<think>` or `</think>`
DEEPSEEK_V31 = _standin("""
{{ bos_token }}{% if tools %}## Tools
You may call functions: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>name<｜tool▁sep｜>{"arg": "value"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>
{{ tools | tojson }}
{% endif %}{% for m in messages %}{% if m.role == 'user' %}<｜User｜>{{ m.content }}{% elif m.role == 'assistant' %}<｜Assistant｜></think>{{ m.content }}<｜end▁of▁sentence｜>{% endif %}{% endfor %}
{%- if add_generation_prompt %}<｜Assistant｜>{{ '<think>' if enable_thinking else '</think>' }}{% endif %}""")
# MiniMax M2 (no fixture), as an Ollama Go template naming none of its markers: the architecture picks the format
MINIMAX_M2 = _standin("""
{{- if or .System .Tools }}]~!b[]~b]system
{{ .System }}{{ range .Tools }}
{{ json .Function }}{{ end }}[e~[
{{ end }}
{{- range .Messages }}{{ if eq .Role "user" }}]~b]user
{{ .Content }}[e~[
{{ else if eq .Role "assistant" }}]~b]ai
{{ if .Thinking }}<think>
{{ .Thinking }}
</think>

{{ end }}{{ .Content }}[e~[
{{ end }}{{ end }}]~b]ai
""")

_QWEN = {t: U for t in ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")}
_DEEPSEEK = {"<｜begin▁of▁sentence｜>": C, "<｜end▁of▁sentence｜>": C, "<｜User｜>": C, "<｜Assistant｜>": C,
             "<think>": U, "</think>": U, **{t: C for t in (
                 "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
                 "<｜tool▁sep｜>", "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>",
                 "<｜tool▁output▁end｜>")}}
_DEEPSEEK_IDS = {"bos": "<｜begin▁of▁sentence｜>", "eos": "<｜end▁of▁sentence｜>"}
_CHATML = {"<|im_start|>": C, "<|im_end|>": C}
FAMILIES = {f.name: f for f in [
    Family("gpt-oss", "openai-gpt-oss-120b.jinja", GPT2, "gpt-oss", "gpt-oss (harmony)",
           {t: C for t in ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>",
                           "<|call|>")}, {"eos": "<|return|>"}, call_end="<|call|>"),
    Family("deepseek-v3.1", DEEPSEEK_V31, GPT2, "deepseek2", "DeepSeek R1 / V3 / V3.1", _DEEPSEEK, _DEEPSEEK_IDS),
    # DSML's markers are text; as tokens of their own (printed like text) they fit the scripted model's 17-token window
    Family("deepseek-v3.2", "deepseek-ai-DeepSeek-V3.2.jinja", GPT2, "deepseek2", "DeepSeek V3.2 (DSML)",
           {**_DEEPSEEK, **{t: U for t in ("<｜DSML｜function_calls>", "</｜DSML｜function_calls>", "<｜DSML｜invoke",
                                            "</｜DSML｜invoke>", "<｜DSML｜parameter", "</｜DSML｜parameter>")}},
           _DEEPSEEK_IDS),
    Family("glm-4.6", "GLM-4.6.jinja", GPT2, "glm4moe", "GLM-4.5 / 4.6 / 4.7",
           {t: C for t in ("[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
                           "<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>",
                           "<arg_value>", "</arg_value>", "<tool_response>", "</tool_response>")},
           {"eos": "<|endoftext|>", "eot": "<|user|>", "eom": "<|observation|>"}, call_end="<|observation|>"),
    Family("kimi-k2", "moonshotai-Kimi-K2.jinja", GPT2, "deepseek2", "Kimi K2",
           {t: C for t in ("<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>",
                           "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
                           "<|tool_call_argument_begin|>", "<|tool_call_end|>")},
           {"eos": "<|im_end|>"}, capabilities=("tools",)),
    Family("gemma4", "google-gemma-4-31B-it.jinja", GPT2, "gemma4", "Gemma 4",
           {t: C for t in ("<bos>", "<eos>", "<|turn>", "<turn|>", "<|tool>", "<tool|>", "<|tool_call>",
                           "<tool_call|>", "<|tool_response>", "<tool_response|>", '<|"|>', "<|channel>",
                           "<channel|>", "<|think|>")},
           {"bos": "<bos>", "eos": "<eos>", "eot": "<turn|>"}, call_end="<|tool_response>"),
    Family("lfm2.5", "LFM2.5-8B-A1B.jinja", GPT2, "lfm2moe", "LFM2 / LFM2.5",
           {**_CHATML, **{t: C for t in ("<|tool_list_start|>", "<|tool_list_end|>", "<|tool_call_start|>",
                                         "<|tool_call_end|>", "<|tool_response_start|>", "<|tool_response_end|>",
                                         "<think>", "</think>")}}, {"eos": "<|im_end|>"}),
    Family("lfm2", "LFM2-8B-A1B.jinja", GPT2, "lfm2moe", "LFM2 / LFM2.5",
           {**_CHATML, **{t: C for t in ("<|tool_list_start|>", "<|tool_list_end|>", "<|tool_call_start|>",
                                         "<|tool_call_end|>", "<|tool_response_start|>", "<|tool_response_end|>")}},
           {"eos": "<|im_end|>"}, capabilities=("tools",)),
    # Granite 4 spells <tool_call> in text: its markers are no special tokens
    Family("granite4", "ibm-granite-granite-4.1.jinja", GPT2, "granitehybrid",
           "Qwen / Hermes / Granite 4 (<tool_call> JSON)",
           {t: C for t in ("<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>")}, {"eos": "<|end_of_text|>"},
           capabilities=("tools",)),
    Family("nemotron-v2", "NVIDIA-Nemotron-Nano-v2.jinja", GPT2, "nemotron_h", "Nemotron Nano v2",
           {t: C for t in ("<SPECIAL_10>", "<SPECIAL_11>", "<SPECIAL_12>", "<think>", "</think>", "<TOOLCALL>",
                           "</TOOLCALL>")}, {"eos": "<SPECIAL_12>"}),
    Family("nemotron3", "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja", GPT2, "nemotron_h_moe",
           "Qwen3-Coder / Nemotron 3 (XML)",
           {**_CHATML, **{t: C for t in ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>",
                                         "</tool_response>")}}, {"eos": "<|im_end|>"}),
    Family("seed-oss", "ByteDance-Seed-OSS.jinja", GPT2, "seed_oss", "Seed-OSS",
           {t: C for t in ("<seed:bos>", "<seed:eos>", "<seed:think>", "</seed:think>", "<seed:tool_call>",
                           "</seed:tool_call>", "<seed:cot_budget_reflect>", "</seed:cot_budget_reflect>")},
           {"bos": "<seed:bos>", "eos": "<seed:eos>"}),
    Family("minimax-m2", MINIMAX_M2, GPT2, "minimax-m2", "MiniMax M2",
           {"]~!b[": C, "]~b]": C, "[e~[": C, "<minimax:tool_call>": C, "</minimax:tool_call>": C, "<think>": U,
            "</think>": U}, {"eos": "[e~["}),
    Family("apriel-1.6", "Apriel-1.6-15b-Thinker-fixed.jinja", GPT2, "llama", "Apriel",
           {t: C for t in ("<|begin_system|>", "<|begin_user|>", "<|begin_assistant|>", "<|end|>")},
           {"eos": "<|end|>"}),
    Family("qwen3", "Qwen-Qwen3-0.6B.jinja", QWEN2, "qwen3", "Qwen / Hermes / Granite 4 (<tool_call> JSON)", _QWEN,
           {"eos": "<|im_end|>"}),
    Family("qwen3-coder", "Qwen3-Coder.jinja", QWEN2, "qwen3moe", "Qwen3-Coder / Nemotron 3 (XML)", _QWEN,
           {"eos": "<|im_end|>"}, capabilities=("tools",)),
    Family("llama3.1", "meta-llama-Llama-3.1-8B-Instruct.jinja", LLAMA3, "llama", "Llama 3.x",
           {"<|python_tag|>": C, "<|eom_id|>": C, "<|finetune_right_pad_id|>": C},
           {"bos": "<|begin_of_text|>", "eos": "<|eot_id|>", "eom": "<|eom_id|>"}, capabilities=("tools",)),
    Family("mistral-small-3.2", "Mistral-Small-3.2-24B-Instruct-2506.jinja", SPM, "llama", "Mistral / Magistral",
           {t: C for t in ("[INST]", "[/INST]", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "[AVAILABLE_TOOLS]",
                           "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[SYSTEM_PROMPT]",
                           "[/SYSTEM_PROMPT]")}, capabilities=("tools",)),
    Family("ministral-3", "mistralai-Ministral-3-14B-Reasoning-2512.jinja", SPM, "mistral3", "Mistral / Magistral",
           {t: C for t in ("[INST]", "[/INST]", "[TOOL_CALLS]", "[ARGS]", "[THINK]", "[/THINK]", "[AVAILABLE_TOOLS]",
                           "[/AVAILABLE_TOOLS]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]")}),
    Family("deepseek-r1", "llama-cpp-deepseek-r1.jinja", QWEN2, "qwen2", "DeepSeek R1 / V3 / V3.1", _DEEPSEEK,
           _DEEPSEEK_IDS, add_bos=True),
    # Gemma 4's interleaved template: a thought may open mid-reply, after text
    Family("gemma4-interleaved", "google-gemma-4-31B-it-interleaved.jinja", GPT2, "gemma4", "Gemma 4",
           {t: C for t in ("<bos>", "<eos>", "<|turn>", "<turn|>", "<|tool>", "<tool|>", "<|tool_call>",
                           "<tool_call|>", "<|tool_response>", "<tool_response|>", '<|"|>', "<|channel>",
                           "<channel|>", "<|think|>")},
           {"bos": "<bos>", "eos": "<eos>", "eot": "<turn|>"}, call_end="<|tool_response>"),
    # four more families the parsers know (not in issue 36's list)
    Family("granite3", "ibm-granite-granite-3.3-2B-Instruct.jinja", GPT2, "granite", "Granite 3",
           {t: C for t in ("<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>", "<|tool_call|>")},
           {"eos": "<|end_of_text|>"}),
    Family("command-r7b", "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja", GPT2, "cohere2", "Command R7B / A",
           {t: C for t in ("<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>", "<|CHATBOT_TOKEN|>", "<|USER_TOKEN|>",
                           "<|SYSTEM_TOKEN|>", "<|START_THINKING|>", "<|END_THINKING|>", "<|START_ACTION|>",
                           "<|END_ACTION|>", "<|START_RESPONSE|>", "<|END_RESPONSE|>", "<|START_TOOL_RESULT|>",
                           "<|END_TOOL_RESULT|>")}, {"eos": "<|END_OF_TURN_TOKEN|>"}),
    Family("minimax-m1", "MiniMax-M1.jinja", GPT2, "minimax", "MiniMax M1",
           {"<beginning_of_sentence>": C, "<end_of_sentence>": C}, {"eos": "<end_of_sentence>"},
           capabilities=("tools",)),
    # Hy3's template closes thinking in every prompt it renders here (its reasoning switch is not `think`)
    Family("hunyuan3", "tencent-Hy3.jinja", GPT2, "hunyuan-moe", "Hunyuan 3",
           {t.replace("{}", ":opensource"): C for t in (
               "<｜hy_begin_of_sentence{}｜>", "<｜hy_User{}｜>", "<｜hy_Assistant{}｜>", "<｜hy_eos{}｜>",
               "<think{}>", "</think{}>", "<tool_calls{}>", "</tool_calls{}>", "<tool_call{}>", "</tool_call{}>",
               "<tool_sep{}>", "<arg_key{}>", "</arg_key{}>", "<arg_value{}>", "</arg_value{}>")},
           {"eos": "<｜hy_eos:opensource｜>"}, capabilities=("tools",)),
    # a family nobody parses (Solar Open's markup, spelled in text here): its replies come back as content
    Family("solar-open", "upstage-Solar-Open-100B.jinja", GPT2, "solar_open", None, {"<|endoftext|>": C},
           {"eos": "<|endoftext|>"}, capabilities=("tools",)),
]}

PARIS = (("get_weather", {"city": "Paris"}),)
TWO = (("get_weather", {"city": "Paris"}), ("get_time", {"city": "東京", "utc": True}))
_J_PARIS, _J_TOKYO = '{"city": "Paris"}', '{"city": "東京", "utc": true}'
_HERMES_TWO = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n'
               '{"name": "get_time", "arguments": {"city": "東京", "utc": true}}\n</tool_call>')
_JSON_LIST_TWO = ('[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": '
                  '{"city": "東京", "utc": true}}]')
_XML_TWO = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>\n"
            "<tool_call>\n<function=get_time>\n<parameter=city>\n東京\n</parameter>\n<parameter=utc>\ntrue\n"
            "</parameter>\n</function>\n</tool_call>")
_HARMONY_CALL = "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
_TOOL_TURN = ({"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather",
                                                                                "arguments": {"city": "Paris"}}}]},
              {"role": "tool", "tool_name": "get_weather", "content": "22C"})
GREETING = {"type": "object", "properties": {"greeting": {"type": "string"}}, "required": ["greeting"]}


def _answers(family: str, thought: str | None, answer: str, off: str | None = None) -> list[Case]:
    """A plain answer (thinking first where the family thinks by default), and where the family can stop
    thinking, the answer with think false (`off`: what the model writes then)."""
    out = [Case(family, "answer", answer.format(thought=thought, text=f"The answer is 4. {TEXT}"),
                thinking=thought or "", content=f"The answer is 4. {TEXT}")]
    if off is not None:
        out.append(Case(family, "think-off", off.format(text=f"Straight: {TEXT}"), content=f"Straight: {TEXT}",
                        think=False))
    return out


CASES = [
    # --- gpt-oss (harmony): the prompt ends with <|start|>assistant; thinking cannot be switched off
    Case("gpt-oss", "think-text-call", "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant"
         f"<|channel|>commentary<|message|>Checking.<|end|>{_HARMONY_CALL}{_J_PARIS}",
         thinking="Need the weather.", content="Checking.", calls=PARIS, tools=True),
    Case("gpt-oss", "call-in-role", f" to=functions.get_time<|channel|>commentary json<|message|>{_J_TOKYO}",
         calls=TWO[1:], tools=True),
    *_answers("gpt-oss", "A greeting.", "<|channel|>analysis<|message|>{thought}<|end|><|start|>assistant"
              "<|channel|>final<|message|>{text}"),
    # several messages: thinking, a comment, more thinking, then the call (thinking joined, content kept)
    Case("gpt-oss", "messages", "<|channel|>analysis<|message|>Two steps.<|end|><|start|>assistant<|channel|>"
         "commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>analysis<|message|> Then Tokyo.<|end|>"
         f"<|start|>assistant<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{_J_TOKYO}",
         thinking="Two steps. Then Tokyo.", content="Checking.", calls=TWO[1:], tools=True),
    Case("gpt-oss", "think-high", "<|channel|>analysis<|message|>Think hard.<|end|><|start|>assistant<|channel|>"
         "final<|message|>Done.", thinking="Think hard.", content="Done.", tools=True, think="high"),
    Case("gpt-oss", "tool-result", "<|channel|>analysis<|message|>It is warm.<|end|><|start|>assistant<|channel|>"
         "final<|message|>Sunny, 22C.", thinking="It is warm.", content="Sunny, 22C.", tools=True, after=_TOOL_TURN),
    # think false: gpt-oss thinks anyway, and a format constrains its final channel only
    Case("gpt-oss", "json-think-off", "<|channel|>analysis<|message|>Say hi as JSON.<|end|><|start|>assistant"
         '<|channel|>final<|message|>{"greeting": "hi"}', thinking="Say hi as JSON.",
         content='{"greeting": "hi"}', think=False, schema=GREETING),
    # --- DeepSeek V3.1: the prompt opens <think> (or closes it: think off)
    Case("deepseek-v3.1", "think-text-calls", "Both cities.</think>Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>"
         f"get_weather<｜tool▁sep｜>{_J_PARIS}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{_J_TOKYO}"
         "<｜tool▁call▁end｜><｜tool▁calls▁end｜>", thinking="Both cities.", content="Sure.", calls=TWO, tools=True),
    *_answers("deepseek-v3.1", "Simple.", "{thought}</think>{text}", off="{text}"),
    # --- DeepSeek V3.2 (DSML)
    Case("deepseek-v3.2", "think-text-calls", "Both cities.</think>On it.\n\n<｜DSML｜function_calls>\n"
         '<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
         '</｜DSML｜invoke>\n<｜DSML｜invoke name="get_time">\n<｜DSML｜parameter name="utc" string="false">true'
         '</｜DSML｜parameter>\n<｜DSML｜parameter name="city" string="true">東京</｜DSML｜parameter>\n</｜DSML｜invoke>\n'
         "</｜DSML｜function_calls>", thinking="Both cities.", content="On it.", calls=TWO, tools=True),
    *_answers("deepseek-v3.2", "Simple.", "{thought}</think>{text}", off="{text}"),
    # --- GLM-4.6: the model opens <think> itself; a call ends with <|observation|>
    Case("glm-4.6", "think-text-calls", "<think>Both cities.</think>\nI'll check.\n<tool_call>get_weather\n"
         "<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>\n<tool_call>get_time\n<arg_key>city"
         "</arg_key>\n<arg_value>東京</arg_value>\n<arg_key>utc</arg_key>\n<arg_value>true</arg_value>\n</tool_call>",
         thinking="Both cities.", content="I'll check.", calls=TWO, tools=True),
    # values are text: the tool's schema types them ("42" stays a string for a string parameter)
    Case("glm-4.6", "typed-args", "<think>Typed.</think>\n<tool_call>get_time\n<arg_key>city</arg_key>\n<arg_value>42"
         "</arg_value>\n<arg_key>utc</arg_key>\n<arg_value>false</arg_value>\n</tool_call>", thinking="Typed.",
         calls=(("get_time", {"city": "42", "utc": False}),), tools=True),
    *_answers("glm-4.6", "Simple.", "<think>{thought}</think>\n{text}", off="\n{text}"),
    # --- Kimi K2 (Instruct: no thinking)
    Case("kimi-k2", "text-calls", "Checking both.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
         f"<|tool_call_argument_begin|>{_J_PARIS}<|tool_call_end|><|tool_call_begin|>functions.get_time:1"
         f"<|tool_call_argument_begin|>{_J_TOKYO}<|tool_call_end|><|tool_calls_section_end|>",
         content="Checking both.", calls=TWO, tools=True),
    *_answers("kimi-k2", None, "{text}"),
    # --- Gemma 4: a thought channel; calls end with <|tool_response>
    Case("gemma4", "think-text-calls", "<|channel>thought\nBoth cities.<channel|>Let me check.<|tool_call>call:"
         'get_weather{city:<|"|>Paris<|"|>}<tool_call|><|tool_call>call:get_time{city:<|"|>東京<|"|>,utc:true}'
         "<tool_call|>", thinking="Both cities.", content="Let me check.", calls=TWO, tools=True),
    *_answers("gemma4", "Simple.", "<|channel>thought\n{thought}<channel|>{text}", off="{text}"),
    # --- LFM2.5 and LFM2: Python call syntax
    Case("lfm2.5", "think-text-calls", "<think>Both cities.</think>Checking.<|tool_call_start|>[get_weather("
         'city="Paris"), get_time(city="東京", utc=True)]<|tool_call_end|>', thinking="Both cities.",
         content="Checking.", calls=TWO, tools=True),
    *_answers("lfm2.5", "Simple.", "<think>{thought}</think>{text}"),
    Case("lfm2", "call-then-text", "<|tool_call_start|>[get_weather(city=\"Paris\")]<|tool_call_end|>Let me check.",
         content="Let me check.", calls=PARIS, tools=True),
    # --- Granite 4
    Case("granite4", "text-calls", f"I'll check.\n{_HERMES_TWO}", content="I'll check.", calls=TWO, tools=True),
    *_answers("granite4", None, "{text}"),
    # --- Nemotron Nano v2: the prompt opens <think> (think false: the model closes it at once)
    Case("nemotron-v2", "think-text-calls", f"Both cities.\n</think>\n\nOn it.\n<TOOLCALL>{_JSON_LIST_TWO}</TOOLCALL>",
         thinking="Both cities.", content="On it.", calls=TWO, tools=True),
    *_answers("nemotron-v2", "Simple.", "{thought}\n</think>\n\n{text}", off="</think>\n\n{text}"),
    # --- Nemotron 3: Qwen3-Coder's XML calls; the prompt opens <think> (think false: <think></think>)
    Case("nemotron3", "think-text-calls", f"Both cities.\n</think>\nOn it.\n{_XML_TWO}\n", thinking="Both cities.",
         content="On it.", calls=TWO, tools=True),
    *_answers("nemotron3", "Simple.", "{thought}\n</think>\n{text}", off="{text}"),
    # --- Seed-OSS
    Case("seed-oss", "think-text-calls", "<seed:think>Both cities.</seed:think>Checking.<seed:tool_call>\n<function="
         "get_weather>\n<parameter=city>Paris</parameter>\n</function>\n</seed:tool_call><seed:tool_call>\n<function="
         "get_time>\n<parameter=city>東京</parameter>\n<parameter=utc>true</parameter>\n</function>\n"
         "</seed:tool_call>", thinking="Both cities.", content="Checking.", calls=TWO, tools=True),
    *_answers("seed-oss", "Simple.", "<seed:think>{thought}</seed:think>{text}"),
    # --- MiniMax M2
    Case("minimax-m2", "think-text-calls", "<think>\nBoth cities.\n</think>\n\nChecking.\n<minimax:tool_call>\n"
         '<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n</invoke>\n<invoke name="get_time">\n'
         '<parameter name="city">東京</parameter>\n<parameter name="utc">true</parameter>\n</invoke>\n'
         "</minimax:tool_call>", thinking="Both cities.", content="Checking.", calls=TWO, tools=True),
    *_answers("minimax-m2", "Simple.", "<think>\n{thought}\n</think>\n\n{text}"),
    # --- Apriel 1.6: the reply starts inside its reasoning
    Case("apriel-1.6", "think-text-calls", "Both cities.\n[BEGIN FINAL RESPONSE]\nI'll check.\n<tool_calls>"
         f"{_JSON_LIST_TWO}</tool_calls>\n[END FINAL RESPONSE]", thinking="Both cities.", content="I'll check.",
         calls=TWO, tools=True),
    *_answers("apriel-1.6", "Simple.", "{thought}\n[BEGIN FINAL RESPONSE]\n{text}\n[END FINAL RESPONSE]"),
    # --- Qwen3
    Case("qwen3", "think-text-calls", f"<think>\nBoth cities.\n</think>\n\nOn it.\n{_HERMES_TWO}",
         thinking="Both cities.", content="On it.", calls=TWO, tools=True, think=True),
    *_answers("qwen3", "Simple.", "<think>\n{thought}\n</think>\n\n{text}", off="{text}"),
    Case("qwen3", "tools-unused", f"<think>\nNo tool needed.\n</think>\n\nIt is 4. {TEXT}",
         thinking="No tool needed.", content=f"It is 4. {TEXT}", tools=True),
    # --- Qwen3-Coder (no thinking)
    Case("qwen3-coder", "call", "<tool_call>\n<function=get_time>\n<parameter=city>\n東京\n</parameter>\n"
         "<parameter=utc>\ntrue\n</parameter>\n</function>\n</tool_call>", calls=TWO[1:], tools=True),
    Case("qwen3-coder", "text-calls", f"I will look it up.\n{_XML_TWO}", content="I will look it up.", calls=TWO,
         tools=True),
    *_answers("qwen3-coder", None, "{text}"),
    # --- Llama 3.1: a bare JSON call, or <|python_tag|> ending with <|eom_id|>
    Case("llama3.1", "call", '{"name": "get_weather", "parameters": {"city": "Paris"}}', calls=PARIS, tools=True),
    Case("llama3.1", "python-tag-call", '<|python_tag|>{"name": "get_time", "parameters": {"city": "東京", "utc": '
         'true}}', calls=TWO[1:], tools=True, end="<|eom_id|>"),
    *_answers("llama3.1", None, "{text}"),
    Case("llama3.1", "tools-unused", f"No tool needed: 2 + 2 = 4. {TEXT}", content=f"No tool needed: 2 + 2 = 4. {TEXT}",
         tools=True),
    # --- Mistral Small 3.2 and Ministral 3 (reasoning: [THINK])
    Case("mistral-small-3.2", "text-calls", f"I'll check.[TOOL_CALLS]get_weather[ARGS]{_J_PARIS}[TOOL_CALLS]get_time"
         f"[ARGS]{_J_TOKYO}", content="I'll check.", calls=TWO, tools=True),
    *_answers("mistral-small-3.2", None, "{text}"),
    Case("ministral-3", "think-calls", f"[THINK]Both cities.[/THINK][TOOL_CALLS]get_weather[ARGS]{_J_PARIS}"
         f"[TOOL_CALLS]get_time[ARGS]{_J_TOKYO}", thinking="Both cities.", calls=TWO, tools=True),
    *_answers("ministral-3", "Simple.", "[THINK]{thought}[/THINK]{text}"),
    # --- DeepSeek R1: the prompt opens <think>
    Case("deepseek-r1", "think-calls", "Both cities.\n</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function"
         f"<｜tool▁sep｜>get_weather\n```json\n{_J_PARIS}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function"
         f"<｜tool▁sep｜>get_time\n```json\n{_J_TOKYO}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
         thinking="Both cities.", calls=TWO, tools=True),
    *_answers("deepseek-r1", "Simple.", "{thought}\n</think>\n\n{text}"),
    # --- Gemma 4 interleaved: after a tool result, text, then a thought, then more text
    Case("gemma4-interleaved", "thought-mid-reply", "Sunny, 22C. <|channel>thought\nNow a summary.<channel|>Enjoy!",
         thinking="Now a summary.", content="Sunny, 22C.Enjoy!", tools=True, after=_TOOL_TURN),
    # --- Granite 3, Command R7B, MiniMax M1, Hunyuan 3
    Case("granite3", "call", '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]', calls=PARIS,
         tools=True),
    *_answers("granite3", "Simple.", "<think>{thought}</think><response>{text}</response>"),
    Case("command-r7b", "think-calls", "<|START_THINKING|>Both cities.<|END_THINKING|><|START_ACTION|>[\n"
         '    {"tool_call_id": "0", "tool_name": "get_weather", "parameters": {"city": "Paris"}},\n'
         '    {"tool_call_id": "1", "tool_name": "get_time", "parameters": {"city": "東京", "utc": true}}\n'
         "]<|END_ACTION|>", thinking="Both cities.", calls=TWO, tools=True),
    *_answers("command-r7b", "Simple.", "<|START_THINKING|>{thought}<|END_THINKING|><|START_RESPONSE|>{text}"
              "<|END_RESPONSE|>", off="<|START_RESPONSE|>{text}<|END_RESPONSE|>"),
    Case("minimax-m1", "calls", '<tool_calls>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
         '{"name": "get_time", "arguments": {"city": "東京", "utc": true}}\n</tool_calls>', calls=TWO, tools=True),
    *_answers("minimax-m1", None, "{text}"),
    Case("hunyuan3", "call", "<tool_calls:opensource>\n<tool_call:opensource>get_weather<tool_sep:opensource>\n"
         "<arg_key:opensource>city</arg_key:opensource>\n<arg_value:opensource>Paris</arg_value:opensource>\n"
         "</tool_call:opensource>\n</tool_calls:opensource>", calls=PARIS, tools=True),
    *_answers("hunyuan3", None, "{text}"),
    # --- an unknown format: the text as it came, as content (and one log line naming the template)
    Case("solar-open", "unknown", "<|think|>Weather.<|end|><|begin|>assistant<|tool_calls|><|tool_call:begin|>c1"
         '<|tool_call:name|>get_weather<|tool_call:args|>{"city": "Paris"}<|tool_call:end|><|calls|>',
         content="<|think|>Weather.<|end|><|begin|>assistant<|tool_calls|><|tool_call:begin|>c1<|tool_call:name|>"
                 'get_weather<|tool_call:args|>{"city": "Paris"}<|tool_call:end|><|calls|>', tools=True),
]


def template_text(fixtures: Path, family: Family) -> str:
    """The family's template: its fixture, or the stand-in text."""
    if family.template.endswith(".jinja") and "\n" not in family.template:
        return (fixtures / "chat-templates" / family.template).read_text(encoding="utf-8")
    return family.template


def resolved_think(template: str, family: Family, think: bool | str | None) -> bool | str | None:
    """What the daemon makes of a request's think: unset is on for a model that can think."""
    from evenflow.daemon.prompt import templates as tpl

    if think is not None:
        return think
    return True if tpl.thinking_tags(template, family.architecture) else None


def rendered_prompt(template: str, family: Family, case: Case) -> str:
    """The prompt the daemon renders for `case`'s conversation."""
    from evenflow.daemon.prompt import templates as tpl

    return tpl.render_messages(template, case.messages(), tools=TOOLS if case.tools else None,
                               think=resolved_think(template, family, case.think), arch=family.architecture)


def case_end(family: Family, case: Case) -> str | None:
    return case.end or (family.call_end if case.calls else None)


def scripted_spec(fixtures: Path, family: Family, cases: list[Case]) -> Any:
    """The ScriptedSpec of one model replying to each of `cases`' conversations with its output."""
    from evenflow.backends.synthetic.scripted import Reply, ScriptedSpec

    template = template_text(fixtures, family)
    return ScriptedSpec(vocab=str(fixtures / "vocab" / family.vocab), chat_template=template,
                        architecture=family.architecture, special_tokens=family.special_tokens,
                        token_ids=family.token_ids, add_bos=family.add_bos, name=family.model,
                        replies=tuple(Reply(prompt=rendered_prompt(template, family, c), text=c.output,
                                            end=case_end(family, c)) for c in cases))
