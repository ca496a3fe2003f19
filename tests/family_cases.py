"""Model families and what their models write, as data: one FAMILIES row per family (its real chat template and
vocabulary from ../shared/fixtures, the special tokens its vocabulary has, its GGUF architecture) and CASES rows of
(family, exact model output, expected thinking / content / tool calls). test_family_formats.py builds one scripted
model per family holding all its cases, and asks each case on every API, streamed and whole.

Adding a family: a FAMILIES row and a few CASES rows. A case's question is unique to it (`question()`), so one model
holds a family's replies; two replies sharing a stretch of 17 tokens with different continuations go to two models
(group_replies), and one reply repeating such a stretch itself is refused with the stretch named."""
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


@dataclass(frozen=True)
class Family:
    name: str
    template: str  # a file in fixtures/chat-templates
    vocab: str  # a file in fixtures/vocab
    architecture: str  # general.architecture of the family's real GGUFs (stored as evenflow.scripted.architecture)
    special_tokens: dict[str, str] = field(default_factory=dict)  # text -> "control" | "user_defined"
    token_ids: dict[str, str] = field(default_factory=dict)  # bos / eos / eot / eom -> token text
    add_bos: bool | None = None

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
    think: bool | None = None  # the request's think / reasoning switch; None: not sent
    end: str | None = None  # the token that ends the reply; None: the family's EOS
    xfail: str | None = None  # why this case does not parse yet (strict: it must start failing to pass)

    @property
    def id(self) -> str:
        return f"{self.family}-{self.name}"

    def question(self) -> str:
        return f"Case {self.id}: what now?"


_QWEN_TOKENS = {t: "user_defined" for t in ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>",
                                            "</tool_response>")}
FAMILIES = {f.name: f for f in [
    Family("qwen3", "Qwen-Qwen3-0.6B.jinja", "ggml-vocab-qwen2.gguf", "qwen3", _QWEN_TOKENS, {"eos": "<|im_end|>"}),
    Family("qwen3-coder", "Qwen3-Coder.jinja", "ggml-vocab-qwen2.gguf", "qwen3moe", _QWEN_TOKENS,
           {"eos": "<|im_end|>"}),
    Family("llama3.1", "meta-llama-Llama-3.1-8B-Instruct.jinja", "ggml-vocab-llama-bpe.gguf", "llama",
           {"<|python_tag|>": "control", "<|eom_id|>": "control", "<|finetune_right_pad_id|>": "control"},
           {"bos": "<|begin_of_text|>", "eos": "<|eot_id|>", "eom": "<|eom_id|>"}),
    Family("mistral-small-3.2", "Mistral-Small-3.2-24B-Instruct-2506.jinja", "ggml-vocab-llama-spm.gguf", "llama",
           {t: "control" for t in ("[INST]", "[/INST]", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "[AVAILABLE_TOOLS]",
                                   "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[SYSTEM_PROMPT]",
                                   "[/SYSTEM_PROMPT]")}),
    Family("deepseek-r1", "llama-cpp-deepseek-r1.jinja", "ggml-vocab-qwen2.gguf", "qwen2",
           {"<｜begin▁of▁sentence｜>": "control", "<｜end▁of▁sentence｜>": "control", "<｜User｜>": "user_defined",
            "<｜Assistant｜>": "user_defined", "<think>": "user_defined", "</think>": "user_defined"},
           {"bos": "<｜begin▁of▁sentence｜>", "eos": "<｜end▁of▁sentence｜>"}, add_bos=True),
]}

_PARIS = (("get_weather", {"city": "Paris"}),)
CASES = [
    Case("qwen3", "think-call", '<think>\nThe user wants the weather in Paris, so I call the tool.\n</think>\n\n'
         '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
         thinking="The user wants the weather in Paris, so I call the tool.", calls=_PARIS, tools=True),
    Case("qwen3", "two-calls", '<think>\nTwo tools.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": '
         '{"city": "London"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"city": "東京", "utc": true}}'
         '\n</tool_call>', thinking="Two tools.",
         calls=(("get_weather", {"city": "London"}), ("get_time", {"city": "東京", "utc": True})), tools=True, think=True),
    Case("qwen3", "think-answer", f"<think>\nA greeting: answer kindly.\n</think>\n\nBonjour ! {TEXT}",
         thinking="A greeting: answer kindly.", content=f"Bonjour ! {TEXT}", think=True),
    Case("qwen3", "tools-unused", f"<think>\nNo tool needed.\n</think>\n\nIt is 4. {TEXT}",
         thinking="No tool needed.", content=f"It is 4. {TEXT}", tools=True),
    Case("qwen3", "no-think", f"Straight to the answer: {TEXT}", content=f"Straight to the answer: {TEXT}",
         think=False),
    Case("qwen3-coder", "call", "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
         "</function>\n</tool_call>", calls=_PARIS, tools=True),
    Case("qwen3-coder", "text-then-call", "I will look it up.\n<tool_call>\n<function=get_time>\n<parameter=city>\n"
         "東京\n</parameter>\n<parameter=utc>\ntrue\n</parameter>\n</function>\n</tool_call>",
         content="I will look it up.", calls=(("get_time", {"city": "東京", "utc": True}),), tools=True),
    Case("qwen3-coder", "answer", f"def hello():\n    return \"{TEXT}\"",
         content=f"def hello():\n    return \"{TEXT}\""),
    Case("llama3.1", "call", '{"name": "get_weather", "parameters": {"city": "Paris"}}', calls=_PARIS, tools=True),
    Case("llama3.1", "python-tag-call", '<|python_tag|>{"name": "get_time", "parameters": {"city": "Köln"}}',
         calls=(("get_time", {"city": "Köln"}),), tools=True, end="<|eom_id|>"),
    Case("llama3.1", "answer", f"Paris is the capital of France. {TEXT}",
         content=f"Paris is the capital of France. {TEXT}"),
    Case("llama3.1", "tools-unused", f"No tool needed: 2 + 2 = 4. {TEXT}", content=f"No tool needed: 2 + 2 = 4. {TEXT}",
         tools=True),
    Case("mistral-small-3.2", "call", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', calls=_PARIS, tools=True),
    Case("mistral-small-3.2", "answer", f"Bonjour ! {TEXT}", content=f"Bonjour ! {TEXT}"),
    Case("deepseek-r1", "think-call", "The user wants Paris weather.\n</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>"
         "function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
         thinking="The user wants Paris weather.", calls=_PARIS, tools=True),
    Case("deepseek-r1", "think-answer", f"Simple arithmetic.\n</think>\n\nThe answer is 4. {TEXT}",
         thinking="Simple arithmetic.", content=f"The answer is 4. {TEXT}"),
]


def fixtures_template(fixtures: Path, family: Family) -> str:
    return (fixtures / "chat-templates" / family.template).read_text()


def rendered_prompt(template: str, case: Case) -> str:
    """The prompt the daemon renders for `case`'s question (thinking on by default where the template thinks)."""
    from evenflow.daemon.prompt import templates as tpl

    think = case.think if case.think is not None else (True if tpl.thinking_tags(template) else None)
    return tpl.render_messages(template, [{"role": "user", "content": case.question()}],
                               tools=TOOLS if case.tools else None, think=think)


def scripted_spec(fixtures: Path, family: Family, cases: list[Case]) -> Any:
    """The ScriptedSpec of one model replying to each of `cases`' questions with its output."""
    from evenflow.backends.synthetic.scripted import Reply, ScriptedSpec

    template = fixtures_template(fixtures, family)
    return ScriptedSpec(vocab=str(fixtures / "vocab" / family.vocab), chat_template=template,
                        architecture=family.architecture, special_tokens=family.special_tokens,
                        token_ids=family.token_ids, add_bos=family.add_bos, name=family.model,
                        replies=tuple(Reply(prompt=rendered_prompt(template, c), text=c.output, end=c.end)
                                      for c in cases))
