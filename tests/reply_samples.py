"""Replies as each model family writes them (thinking and tool calls in its own markup, taken from what its real
chat template renders for an assistant turn), with what they must parse into. Shared by the parser unit tests and
the API tests that send these bytes through a daemon.

Each sample: `family` (formats.py's name), `template` (the fixture whose markup it follows, or None), `markers`
(a stand-in template holding only the markers that identify the family, so the parser tests need no fixtures),
`arch`, `prompt_tail` (how the rendered prompt ends: whether it opened a thinking section), `think` (what the
request asks), `output`, and the expected `thinking`, `content` and `calls`."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

PARIS = {"city": "Paris", "days": 3}
ROME = {"city": "Rome", "days": 1}
_PARAMS = {"type": "object", "required": ["city"],
           "properties": {"city": {"type": "string", "description": "City name"},
                          "days": {"type": "integer", "description": "How many days"}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Get the weather for a city",
                                           "parameters": _PARAMS}},
         {"type": "function", "function": {"name": "get_forecast", "description": "Forecast a city's weather",
                                           "parameters": _PARAMS}}]


def call(args: dict[str, Any], name: str = "get_weather") -> dict[str, Any]:
    return {"function": {"name": name, "arguments": args}}


# a reply's second call is to the other tool: a scripted model (17 tokens of memory) tells two calls apart early
SECOND = call(ROME, "get_forecast")


@dataclass(frozen=True)
class Sample:
    id: str
    family: str
    template: str | None
    markers: str
    output: str
    thinking: str = ""
    content: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)
    arch: str | None = None
    prompt_tail: str = ""
    think: bool | None = None  # what the request asks (None: the model's default, thinking where it can)


_J = json.dumps
SAMPLES: list[Sample] = [
    # --- gpt-oss (harmony): the prompt ends with <|start|>assistant
    Sample("harmony-call", "gpt-oss (harmony)", "openai-gpt-oss-120b.jinja", "<|channel|><|message|>",
           "<|channel|>analysis<|message|>The user wants the weather.<|end|><|start|>assistant<|channel|>commentary "
           f"to=functions.get_weather <|constrain|>json<|message|>{_J(PARIS)}<|call|>",
           thinking="The user wants the weather.", calls=[call(PARIS)], prompt_tail="<|start|>assistant"),
    Sample("harmony-call-in-role", "gpt-oss (harmony)", "openai-gpt-oss-120b.jinja", "<|channel|><|message|>",
           f" to=functions.get_weather<|channel|>commentary json<|message|>{_J(PARIS)}<|call|>",
           calls=[call(PARIS)], prompt_tail="<|start|>assistant"),
    Sample("harmony-final", "gpt-oss (harmony)", "openai-gpt-oss-120b.jinja", "<|channel|><|message|>",
           "<|channel|>analysis<|message|>Say hi.<|end|><|start|>assistant<|channel|>final<|message|>"
           "Hello! <b>Bold</b> 2 < 3<|return|>",
           thinking="Say hi.", content="Hello! <b>Bold</b> 2 < 3", prompt_tail="<|start|>assistant"),
    Sample("harmony-messages", "gpt-oss (harmony)", "openai-gpt-oss-120b.jinja", "<|channel|><|message|>",
           "<|channel|>analysis<|message|>Two steps.<|end|><|start|>assistant<|channel|>commentary<|message|>"
           "Checking. <|end|><|start|>assistant<|channel|>analysis<|message|> Then Rome.<|end|>"
           f"<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{_J(ROME)}"
           "<|call|>",
           thinking="Two steps. Then Rome.", content="Checking. ", calls=[call(ROME)],
           prompt_tail="<|start|>assistant"),
    # --- DeepSeek
    Sample("dsml-v32", "DeepSeek V3.2 (DSML)", "deepseek-ai-DeepSeek-V3.2.jinja", "｜DSML｜ <think>",
           "Need the weather.</think>\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
           "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n"
           "<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
           "<｜DSML｜invoke name=\"get_forecast\">\n<｜DSML｜parameter name=\"city\" string=\"true\">Rome"
           "</｜DSML｜parameter>\n<｜DSML｜parameter name=\"days\" string=\"false\">1</｜DSML｜parameter>\n"
           "</｜DSML｜invoke>\n</｜DSML｜function_calls>",
           thinking="Need the weather.", calls=[call(PARIS), SECOND], prompt_tail="<｜Assistant｜><think>"),
    Sample("dsml-v4", "DeepSeek V3.2 (DSML)", "deepseek-ai-DeepSeek-V4.jinja", "｜DSML｜ <think>",
           "Let me look.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter "
           "name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name=\"days\" "
           "string=\"false\">3</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
           content="Let me look.", calls=[call(PARIS)], prompt_tail="<｜Assistant｜></think>", think=False),
    Sample("deepseek-v31", "DeepSeek R1 / V3 / V3.1", None, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜> <think>",
           f"Think first.</think>Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{_J(PARIS)}"
           "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
           thinking="Think first.", content="Sure.", calls=[call(PARIS)], prompt_tail="<｜Assistant｜><think>"),
    Sample("deepseek-r1", "DeepSeek R1 / V3 / V3.1", "llama-cpp-deepseek-r1.jinja", "tool▁call <think>",
           "\nweather</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
           f"```json\n{_J(PARIS)}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_forecast\n"
           f"```json\n{_J(ROME)}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
           thinking="weather", calls=[call(PARIS), SECOND], prompt_tail="<｜Assistant｜><think>\n"),
    # --- GLM-4.x: the model opens <think> itself
    Sample("glm", "GLM-4.5 / 4.6 / 4.7", "GLM-4.6.jinja", "<tool_call><arg_key> <think>",
           "<think>Paris, three days.</think>\nI'll check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
           "<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
           thinking="Paris, three days.", content="I'll check.", calls=[call(PARIS)], prompt_tail="<|assistant|>"),
    Sample("glm-47-opened", "GLM-4.5 / 4.6 / 4.7", None, "<tool_call><arg_key> <think>",
           "Two cities.</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
           "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call><tool_call>get_forecast<arg_key>city"
           "</arg_key><arg_value>Rome</arg_value><arg_key>days</arg_key><arg_value>1</arg_value></tool_call>",
           thinking="Two cities.", calls=[call(PARIS), SECOND], prompt_tail="<|assistant|><think>"),
    # --- Kimi K2
    Sample("kimi", "Kimi K2", "moonshotai-Kimi-K2.jinja", "<|tool_calls_section_begin|>",
           "Checking both.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
           f"<|tool_call_argument_begin|>{_J(PARIS)}<|tool_call_end|><|tool_call_begin|>functions.get_forecast:1"
           f"<|tool_call_argument_begin|>{_J(ROME)}<|tool_call_end|><|tool_calls_section_end|>",
           content="Checking both.", calls=[call(PARIS), SECOND], prompt_tail="<|im_middle|>"),
    Sample("kimi-thinking-call-inside", "Kimi K2", None, "<|tool_calls_section_begin|> <think>",
           "<think>I need Paris.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
           f"<|tool_call_argument_begin|>{_J(PARIS)}<|tool_call_end|><|tool_calls_section_end|>",
           thinking="I need Paris.", calls=[call(PARIS)], prompt_tail="<|im_middle|>"),
    # --- Gemma 4: thinking channel, its own argument syntax
    Sample("gemma4", "Gemma 4", "google-gemma-4-31B-it.jinja", "<|tool_call> <|channel>",
           "<|channel>thought\nThe user wants weather.<channel|>Let me check.<|tool_call>call:get_weather"
           "{city:<|\"|>Paris<|\"|>,days:3}<tool_call|><|tool_call>call:get_forecast{city:<|\"|>Rome<|\"|>,days:1}"
           "<tool_call|>",
           thinking="The user wants weather.", content="Let me check.", calls=[call(PARIS), SECOND],
           prompt_tail="<|turn>model\n"),
    Sample("gemma4-interleaved", "Gemma 4", "google-gemma-4-31B-it-interleaved.jinja", "<|tool_call> <|channel>",
           "Sunny, 22C. <|channel>thought\nNow a summary.<channel|>Enjoy Paris!",
           thinking="Now a summary.", content="Sunny, 22C.Enjoy Paris!", prompt_tail="<|turn>model\n"),
    # --- LFM2 / LFM2.5: Python call syntax
    Sample("lfm25", "LFM2 / LFM2.5", "LFM2.5-8B-A1B.jinja", "<|tool_call_start|> <think>",
           "<think>Weather for two.</think>Checking.<|tool_call_start|>[get_weather(city='Paris', days=3), "
           "get_forecast(city=\"Rome\", days=1)]<|tool_call_end|>",
           thinking="Weather for two.", content="Checking.", calls=[call(PARIS), SECOND],
           prompt_tail="<|im_start|>assistant\n"),
    Sample("lfm2", "LFM2 / LFM2.5", "LFM2-8B-A1B.jinja", "<|tool_list_start|>",
           "<|tool_call_start|>[get_weather(city=\"Paris\", days=3)]<|tool_call_end|>Let me check.",
           content="Let me check.", calls=[call(PARIS)], prompt_tail="<|im_start|>assistant\n"),
    # --- Granite 4 (<tool_call> JSON), Qwen3, Qwen3-Coder / Nemotron 3 XML
    Sample("granite4", "Qwen / Hermes / Granite 4 (<tool_call> JSON)", "ibm-granite-granite-4.1.jinja",
           "<tool_call>",
           f"<tool_call>\n{_J({'name': 'get_weather', 'arguments': PARIS})}\n</tool_call>",
           calls=[call(PARIS)], prompt_tail="<|start_of_role|>assistant<|end_of_role|>"),
    Sample("qwen3", "Qwen / Hermes / Granite 4 (<tool_call> JSON)", "Qwen-Qwen3-0.6B.jinja", "<tool_call> <think>",
           f"<think>\nTwo calls.\n</think>\n\nOn it.\n<tool_call>\n{_J({'name': 'get_weather', 'arguments': PARIS})}"
           f"\n</tool_call>\n<tool_call>\n{_J({'name': 'get_forecast', 'arguments': ROME})}\n</tool_call>",
           thinking="Two calls.", content="On it.", calls=[call(PARIS), SECOND],
           prompt_tail="<|im_start|>assistant\n"),
    Sample("qwen3-coder", "Qwen3-Coder / Nemotron 3 (XML)", "Qwen3-Coder.jinja", "<tool_call><function=",
           "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n"
           "</parameter>\n</function>\n</tool_call>",
           calls=[call(PARIS)], prompt_tail="<|im_start|>assistant\n"),
    Sample("nemotron3", "Qwen3-Coder / Nemotron 3 (XML)", "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja",
           "<tool_call><function= <think>",
           "Paris it is.\n</think>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
           "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n",
           thinking="Paris it is.", calls=[call(PARIS)], prompt_tail="<|im_start|>assistant\n<think>\n"),
    # --- Nemotron Nano v2: the prompt opened <think>
    Sample("nemotron-v2", "Nemotron Nano v2", "NVIDIA-Nemotron-Nano-v2.jinja", "<TOOLCALL> <think>",
           f"Weather.\n</think>\n\n<TOOLCALL>[{_J({'name': 'get_weather', 'arguments': PARIS})}]</TOOLCALL>",
           thinking="Weather.", calls=[call(PARIS)], prompt_tail="<SPECIAL_11>Assistant\n<think>\n"),
    # --- Seed-OSS
    Sample("seed-oss", "Seed-OSS", "ByteDance-Seed-OSS.jinja", "<seed:tool_call> <seed:think>",
           "<seed:think>Paris weather.</seed:think>Checking.<seed:tool_call>\n<function=get_weather>\n"
           "<parameter=city>Paris</parameter>\n<parameter=days>3</parameter>\n</function>\n</seed:tool_call>",
           thinking="Paris weather.", content="Checking.", calls=[call(PARIS)], prompt_tail="<seed:bos>assistant\n"),
    # --- MiniMax M2 (no template in the fixtures: identified by its markers or its architecture)
    Sample("minimax-m2", "MiniMax M2", None, "<minimax:tool_call> <think>",
           "<think>\nParis.\n</think>\n\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">"
           "Paris</parameter>\n<parameter name=\"days\">3</parameter>\n</invoke>\n</minimax:tool_call>",
           thinking="Paris.", calls=[call(PARIS)], arch="minimax-m2", prompt_tail="]~b]ai\n"),
    Sample("minimax-m1", "MiniMax M1", "MiniMax-M1.jinja", "<tool_calls>",
           f"<tool_calls>\n{_J({'name': 'get_weather', 'arguments': PARIS})}\n"
           f"{_J({'name': 'get_forecast', 'arguments': ROME})}\n</tool_calls>",
           calls=[call(PARIS), SECOND], prompt_tail="ai name=assistant\n"),
    # --- Apriel: the reply starts inside its reasoning
    Sample("apriel-16", "Apriel", "Apriel-1.6-15b-Thinker-fixed.jinja", "[BEGIN FINAL RESPONSE]",
           "The user asks for the weather.\n[BEGIN FINAL RESPONSE]\n"
           f"<tool_calls>[{_J({'name': 'get_weather', 'arguments': PARIS})}]</tool_calls>\n[END FINAL RESPONSE]",
           thinking="The user asks for the weather.", calls=[call(PARIS)],
           prompt_tail="<|begin_assistant|>\nHere are my reasoning steps:\n"),
    Sample("apriel-15-answer", "Apriel", "unsloth-Apriel-1.5.jinja", "[BEGIN FINAL RESPONSE]",
           "Simple greeting.\n[BEGIN FINAL RESPONSE]Hello there.[END FINAL RESPONSE]",
           thinking="Simple greeting.", content="Hello there.", prompt_tail="<|assistant|>\n"),
    # --- the older six and their neighbours
    Sample("llama31", "Llama 3.x", "meta-llama-Llama-3.1-8B-Instruct.jinja", "<|python_tag|>",
           _J({"name": "get_weather", "parameters": PARIS}), calls=[call(PARIS)],
           prompt_tail="<|start_header_id|>assistant<|end_header_id|>\n\n"),
    Sample("mistral-args", "Mistral / Magistral", "mistralai-Ministral-3-14B-Reasoning-2512.jinja",
           "[TOOL_CALLS] [THINK]",
           f"[THINK]Weather twice.[/THINK][TOOL_CALLS]get_weather[ARGS]{_J(PARIS)}[TOOL_CALLS]get_forecast[ARGS]"
           f"{_J(ROME)}",
           thinking="Weather twice.", calls=[call(PARIS), SECOND], prompt_tail="[/INST]"),
    Sample("mistral-list", "Mistral / Magistral", "mistralai-Mistral-Nemo-Instruct-2407.jinja", "[TOOL_CALLS]",
           f"[TOOL_CALLS][{_J({'name': 'get_weather', 'arguments': PARIS})}]", calls=[call(PARIS)],
           prompt_tail="[/INST]"),
    Sample("granite3", "Granite 3", "ibm-granite-granite-3.3-2B-Instruct.jinja", "<|tool_call|>",
           f"<|tool_call|>[{_J({'name': 'get_weather', 'arguments': PARIS})}]", calls=[call(PARIS)],
           prompt_tail="<|start_of_role|>assistant<|end_of_role|>"),
    Sample("cohere", "Command R7B / A", "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja", "<|START_ACTION|>",
           "<|START_THINKING|>I will look it up.<|END_THINKING|><|START_ACTION|>[\n    "
           f"{_J({'tool_call_id': '0', 'tool_name': 'get_weather', 'parameters': PARIS})}\n]<|END_ACTION|>",
           thinking="I will look it up.", calls=[call(PARIS)], prompt_tail="<|CHATBOT_TOKEN|>"),
    Sample("cohere-answer", "Command R7B / A", "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja",
           "<|START_ACTION|>", "<|START_RESPONSE|>It is sunny.<|END_RESPONSE|>", content="It is sunny.",
           prompt_tail="<|CHATBOT_TOKEN|>"),
    Sample("hy3", "Hunyuan 3", "tencent-Hy3.jinja", "<tool_call{}>.format(':opensource')",
           "<tool_calls:opensource>\n<tool_call:opensource>get_weather"
           "<tool_sep:opensource>\n<arg_key:opensource>city</arg_key:opensource>\n<arg_value:opensource>Paris"
           "</arg_value:opensource>\n<arg_key:opensource>days</arg_key:opensource>\n<arg_value:opensource>3"
           "</arg_value:opensource>\n</tool_call:opensource>\n</tool_calls:opensource>",
           calls=[call(PARIS)], prompt_tail="<｜hy_Assistant:opensource｜><think:opensource></think:opensource>"),
]
# A plain answer in each family's markup: no call, the text must come back whole.
PLAIN = [s for s in SAMPLES if not s.calls]
