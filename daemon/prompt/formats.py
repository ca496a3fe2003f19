"""Which reply format a model writes — thinking markers and tool-call syntax — chosen from its chat template and
its architecture (GGUF `general.architecture`), as llama.cpp's common/chat.cpp and Ollama's model/parsers do:
the template's own markers first (what the template renders for an assistant turn is what the model emits), the
architecture where the template says nothing. One table, most specific first; README's model section lists it."""
from __future__ import annotations

import functools
import hashlib
import logging
from dataclasses import dataclass

from .toolsyntax import SYNTAXES

log = logging.getLogger(__name__)

THINK = ("<think>", "</think>")


@dataclass(frozen=True)
class ReplyFormat:
    """How one family's replies are laid out. `think`: the (open, close) markers of a thinking section;
    `think_implicit`: a reply starts inside it with no open marker written (Apriel); `think_anywhere`: a section
    may open mid-reply (Gemma 4); `harmony`: gpt-oss's channels (harmony.py) instead of all the rest;
    `drop`: markers around the answer that are structure, not content; `structure`: other marker texts that
    must reach the parser (special tokens the detokenizer would otherwise hide)."""

    family: str
    tools: str | None = None  # a key of toolsyntax.SYNTAXES
    think: tuple[str, str] | None = THINK
    think_implicit: bool = False
    think_anywhere: bool = False
    harmony: bool = False
    calls_in_thinking: bool = False  # a call may open inside an unclosed thinking section, ending it (Kimi, Apriel)
    drop: tuple[str, ...] = ()
    structure: tuple[str, ...] = ()

    def markers(self) -> tuple[str, ...]:
        """Every marker text the parser reads (for the engine's preserved special tokens)."""
        out = [*self.drop, *self.structure, *(self.think or ())]
        if self.tools in SYNTAXES:
            s = SYNTAXES[self.tools]
            out += [s.open, *(m for m in (s.close,) if m), *s.sections, *s.inner]
        return tuple(dict.fromkeys(m.strip() for m in out if m.strip()))


HARMONY = ReplyFormat("gpt-oss (harmony)", "harmony", ("<|channel|>analysis<|message|>", "<|channel|>final<|message|>"),
                      harmony=True, structure=("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>",
                                               "<|call|>", "<|return|>"))

# (format, template markers that must all be present, architectures that imply it); first match wins; None: a
# family known to write its own markup that no parser here reads (its replies come back as content)
_TABLE: tuple[tuple[ReplyFormat | None, tuple[str, ...], tuple[str, ...]], ...] = (
    (None, ("]<]minimax[>[",), ()),  # MiniMax M3
    (HARMONY, ("<|channel|>", "<|message|>"), ("gpt-oss", "gptoss")),
    (ReplyFormat("Kimi K2", "kimi", calls_in_thinking=True), ("<|tool_calls_section_begin|>",), ()),
    (ReplyFormat("DeepSeek V3.2 (DSML)", "dsml"), ("｜DSML｜",), ()),
    (ReplyFormat("DeepSeek R1 / V3 / V3.1", "deepseek"), ("tool▁call",), ()),
    (ReplyFormat("Hunyuan 3", "hy3", ("<think:opensource>", "</think:opensource>")), (":opensource", "tool_call"), ()),
    (ReplyFormat("GLM-4.5 / 4.6 / 4.7", "glm"), ("<arg_key>",), ("glm4moe",)),
    (ReplyFormat("Seed-OSS", "seed", ("<seed:think>", "</seed:think>")), ("<seed:",), ("seed_oss",)),
    (ReplyFormat("MiniMax M2", "minimax"), ("<minimax:tool_call>",), ("minimax-m2",)),
    (ReplyFormat("Gemma 4", "gemma4", ("<|channel>thought", "<channel|>"), think_anywhere=True,
                 drop=("<|tool_response>",), structure=('<|"|>', "<|channel>")), ("<|tool_call>",), ("gemma4",)),
    (ReplyFormat("LFM2 / LFM2.5", "lfm2"), ("<|tool_list_start|>",), ("lfm2", "lfm2moe")),
    (ReplyFormat("LFM2 / LFM2.5", "lfm2"), ("<|tool_call_start|>",), ()),
    (ReplyFormat("Nemotron Nano v2", "nemotron"), ("<TOOLCALL>",), ()),
    (ReplyFormat("Apriel", "apriel", ("Here are my reasoning steps:", "[BEGIN FINAL RESPONSE]"), think_implicit=True,
                 calls_in_thinking=True, drop=("[END FINAL RESPONSE]",)), ("[BEGIN FINAL RESPONSE]",), ()),
    (ReplyFormat("MiniMax M1", "apriel"), ("<tool_calls>",), ()),
    (ReplyFormat("Command R7B / A", "cohere", ("<|START_THINKING|>", "<|END_THINKING|>"),
                 drop=("<|START_RESPONSE|>", "<|END_RESPONSE|>", "<|START_TEXT|>", "<|END_TEXT|>")),
     ("<|START_ACTION|>",), ()),
    (ReplyFormat("Qwen3-Coder / Nemotron 3 (XML)", "hermes"), ("<tool_call>", "<function="), ()),
    (ReplyFormat("Qwen / Hermes / Granite 4 (<tool_call> JSON)", "hermes"), ("<tool_call>",),
     ("qwen2", "qwen2moe", "qwen3", "qwen3moe")),
    (ReplyFormat("Mistral / Magistral", "mistral", ("[THINK]", "[/THINK]")), ("[TOOL_CALLS]",), ()),
    (ReplyFormat("Granite 3", "granite", drop=("<response>", "</response>")), ("<|tool_call|>",),
     ("granite", "granitemoe")),
    (ReplyFormat("Firefunction v2", "firefunction"), ("functools[",), ()),
    (ReplyFormat("GigaChat 3", "gigachat"), ("<|function_call|>",), ()),
    (ReplyFormat("Llama 3.x", "llama3"), ("<|python_tag|>",), ()),
    (ReplyFormat("Llama 3.x", "llama3"), ("<|start_header_id|>", '"parameters"'), ()),
)
THINK_ONLY = ReplyFormat("<think> tags")


# A scripted test model (backends/synthetic/scripted.py) runs as llama.cpp's `gpt2` and names here the family whose
# replies it writes: for choosing a reply format it stands in for `general.architecture`.
SCRIPTED_ARCHITECTURE = "evenflow.scripted.architecture"


def family_architecture(arch: str | None, metadata: dict | None) -> str | None:
    """The architecture whose reply format a model writes: its GGUF's, or the family a scripted model names."""
    named = (metadata or {}).get(SCRIPTED_ARCHITECTURE)
    return named if isinstance(named, str) and named else arch


def detect(template: str | None, arch: str | None = None) -> ReplyFormat | None:
    """The reply format of a model with this template and architecture; None when neither says."""
    return _detect(template or "", (arch or "").lower())


@functools.lru_cache(maxsize=64)
def _detect(template: str, arch: str) -> ReplyFormat | None:
    for fmt, needles, archs in _TABLE:
        if needles and all(n in template for n in needles):
            return fmt
    for fmt, _, archs in _TABLE:
        if arch and arch in archs and fmt is not None:
            return fmt
    if "<think>" in template:
        return THINK_ONLY
    return None


def tool_syntax_name(template: str | None, arch: str | None = None) -> str | None:
    """The tool-call syntax (a key of toolsyntax.SYNTAXES) a model writes, None when unknown."""
    fmt = detect(template, arch)
    return fmt.tools if fmt else None


_warned: set[str] = set()


def warn_unknown(template: str | None, arch: str | None, what: str) -> None:
    """One log line per template: its replies are passed through as content (never dropped, never an error)."""
    text = template or ""
    key = hashlib.sha256(f"{arch}\0{text}".encode()).hexdigest()[:12]
    if key in _warned or len(_warned) > 1000:
        return
    _warned.add(key)
    head = " ".join(text.split())[:80]
    log.warning("unknown reply format for template sha256:%s (architecture %s, begins %r): %s come back as content",
                key, arch or "unknown", head, what)
