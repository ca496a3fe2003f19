"""Tokenizer families of the GGUF-only architectures (archs.py): their special tokens and chat templates.

The BPE itself is the factory's own (tokenizer.py); what differs per family is which control tokens it carries,
where they sit, which end a turn, and the chat template that uses them. The templates are written for evenflow in
each family's wire format (Gemma's turns, gpt-oss's harmony, LFM2's ChatML, DeepSeek's full-width markers), not
copied from the models' own files. Qwen3-MoE and Qwen3.5 use Qwen3's (tokenizer.py).
"""
from __future__ import annotations

from .family import LLAMA3_PATTERN, Family

GEMMA_TEMPLATE = (
    "{{- bos_token }}"
    "{%- set first = messages[0] if messages else none %}"
    "{%- set system = (first.content or '') if first and first.role == 'system' else '' %}"
    "{%- for m in messages if m.role != 'system' %}"
    "{{- '<start_of_turn>' + ('model' if m.role == 'assistant' else 'user') + '\\n' }}"
    "{{- (system + '\\n\\n' if loop.first and system else '') + (m.content or '') | trim }}"
    "{{- '<end_of_turn>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}"
)
# harmony (gpt-oss): a system header, the developer's instructions, turns as <|start|>role<|message|>...<|end|>;
# an assistant answer carries its channel (analysis = reasoning, final = the reply).
HARMONY_TEMPLATE = (
    "{{- '<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\\n"
    "Reasoning: ' + (reasoning_effort or 'medium') + '\\n\\n# Valid channels: analysis, commentary, final. "
    "Channel must be included for every message.<|end|>' }}"
    "{%- for m in messages %}"
    "{%- if m.role == 'system' or m.role == 'developer' %}"
    "{{- '<|start|>developer<|message|># Instructions\\n\\n' + (m.content or '') + '<|end|>' }}"
    "{%- elif m.role == 'user' %}{{- '<|start|>user<|message|>' + (m.content or '') + '<|end|>' }}"
    "{%- elif m.role == 'assistant' %}"
    "{%- if m.thinking and loop.last %}"
    "{{- '<|start|>assistant<|channel|>analysis<|message|>' + m.thinking + '<|end|>' }}{%- endif %}"
    "{{- '<|start|>assistant<|channel|>final<|message|>' + (m.content or '') + '<|end|>' }}"
    "{%- elif m.role == 'tool' %}"
    "{{- '<|start|>functions.' + (m.name or 'tool') + ' to=assistant<|channel|>commentary<|message|>'"
    " + (m.content or '') + '<|end|>' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start|>assistant' }}{%- endif %}"
)
LFM2_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for m in messages %}"
    "{{- '<|im_start|>' + m.role + '\\n' + (m.content or '') + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
DEEPSEEK_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for m in messages if m.role == 'system' %}{{- m.content or '' }}{%- endfor %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'user' %}{{- '<｜User｜>' + (m.content or '') }}"
    "{%- elif m.role == 'assistant' %}"
    "{%- set content = m.content or '' %}"
    "{%- if '</think>' in content %}{%- set content = content.split('</think>')[-1] %}{%- endif %}"
    "{{- '<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<｜Assistant｜><think>\\n' }}{%- endif %}"
)

# Gemma puts its specials first (pad 0, eos 1, bos 2, unk 3) and ends a turn with <end_of_turn>.
GEMMA = Family(("<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"), (), True, "<bos>", "<eos>",
               "<end_of_turn>", "<pad>", "<unk>", ("<eos>", "<end_of_turn>"), True, "llama-bpe", LLAMA3_PATTERN,
               True, GEMMA_TEMPLATE)
# o200k_harmony: an answer ends with <|return|>, a tool call with <|call|>; <|end|> closes a message mid-turn.
HARMONY = Family(("<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>", "<|channel|>", "<|start|>",
                  "<|end|>", "<|message|>", "<|call|>"), (), False, "<|startoftext|>", "<|return|>", None,
                 "<|endoftext|>", None, ("<|return|>", "<|call|>"), False, "llama-bpe", LLAMA3_PATTERN, True,
                 HARMONY_TEMPLATE)
LFM2 = Family(("<|pad|>", "<|startoftext|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"), (), True,
              "<|startoftext|>", "<|im_end|>", "<|im_end|>", "<|pad|>", None, ("<|im_end|>", "<|endoftext|>"), True,
              "llama-bpe", LLAMA3_PATTERN, True, LFM2_TEMPLATE)
DEEPSEEK = Family(("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>", "<｜User｜>", "<｜Assistant｜>"),
                  ("<think>", "</think>"), False, "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", None,
                  "<｜▁pad▁｜>", None, ("<｜end▁of▁sentence｜>",), True, "llama-bpe", LLAMA3_PATTERN, True,
                  DEEPSEEK_TEMPLATE)

# (qwen3moe and qwen35 are Qwen3's family: tokenizer.family_for)
FAMILIES: dict[str, Family] = {"gemma3": GEMMA, "gpt-oss": HARMONY, "lfm2": LFM2, "deepseek2": DEEPSEEK}
