"""What a reply reads, the same whether the model runs in our engine (engine_stream.py) or in an upstream engine
(upstream_stream.py): a stream of `Delta`s (text read back as thinking, content and tool calls; usage and the done
reason on a choice's last one; errors raised as APIError), a whole answer as one `Generation` per choice, and the
`Facts` of the run a reply needs besides. A reply never knows which source it reads."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Protocol


@dataclass
class Delta:
    """One streamed increment of choice `index`; `final` (done_reason + Ollama's metrics) only on its last one."""

    index: int = 0
    text: str = ""  # the raw output text (what /v1/completions shows, what a stop sequence is read after)
    thinking: str = ""
    content: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)  # finished tool calls, Ollama's shape
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[Any] | None = None  # engine TokenLogprob per token, when asked
    final: dict[str, Any] | None = None
    cached_tokens: int = 0  # with `final`: prompt tokens served from the prefix cache
    truncated: dict[str, Any] | None = None  # with `final`: the `truncated` report (overflow.report), if any
    reasoning_tokens: int | None = None  # with `final`: the thinking's tokens, when the source counted them
    progress: dict[str, Any] | None = None  # a prompt progress report (nothing else): the request asked for them


@dataclass
class Generation:
    """The collected result of one choice (`stream: false`)."""

    text: str = ""
    thinking: str = ""
    content: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    done_reason: str | None = None
    metrics: dict[str, int] = field(default_factory=dict)
    logprobs: list[Any] = field(default_factory=list)  # engine TokenLogprob per token, when asked
    offsets: list[int] = field(default_factory=list)  # character offset in `text` where each of those starts
    cached_tokens: int = 0  # prompt tokens served from the prefix cache
    truncated: dict[str, Any] | None = None  # what the prompt lost to fit the window, and context shifts
    reasoning_tokens: int | None = None


@dataclass
class Facts:
    """What a reply needs of the run besides its deltas. An upstream engine tells less than ours: no prompt ids
    (no `context`, the prompt's size comes with the usage at the end), no tokenizer (no logprobs)."""

    n: int = 1  # choices
    prompt_ids: list[int] | None = None
    logprobs: int | None = None  # None: not asked; k: each token's logprob and k alternatives
    tokenizer: Any = None  # the model's Tokenizer: logprob pieces, token bytes, counting the thinking's tokens
    stops: list[str] = field(default_factory=list)  # the stop sequences the run was given

    @property
    def prompt_tokens(self) -> int:
        """The prompt's size when known before the output (0: the final metrics will say)."""
        return len(self.prompt_ids) if self.prompt_ids is not None else 0


class Output(Protocol):
    """One request's running output: its facts, its deltas (streamed) or its generations (whole), and `close()`,
    which frees what it holds (engine sequences and lease, or the upstream response) however the request ends."""

    facts: Facts

    def deltas(self) -> AsyncIterator[Delta]: ...

    async def whole(self) -> list[Generation]: ...

    def close(self) -> Any: ...


async def collect(deltas: AsyncIterator[Delta], n: int) -> list[Generation]:
    """Every choice's whole output from its deltas."""
    gens = [Generation() for _ in range(n)]
    async for d in deltas:
        if d.progress is not None:
            continue
        g = gens[d.index]
        if d.logprobs:
            g.logprobs.extend(d.logprobs)
            g.offsets.extend([len(g.text)] * len(d.logprobs))
        g.text += d.text
        g.thinking += d.thinking
        g.content += d.content
        g.calls += d.calls
        g.token_ids += d.token_ids
        if d.final is not None:
            final = dict(d.final)
            g.done_reason, g.metrics = final.pop("done_reason"), final
            g.cached_tokens, g.truncated, g.reasoning_tokens = d.cached_tokens, d.truncated, d.reasoning_tokens
    return gens
