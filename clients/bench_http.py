"""Request functions for the load generator: Ollama NDJSON and OpenAI SSE streaming, prompt text, target checks."""
from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import random
import time
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import urlsplit

import httpx

from .bench_metrics import RequestRecord

log = logging.getLogger(__name__)

PROTOCOLS = ("ollama-generate", "ollama-chat", "openai-completions", "openai-chat")
ALIASES = {"generate": "ollama-generate", "ollama": "ollama-generate", "chat": "ollama-chat",
           "completions": "openai-completions", "openai": "openai-completions", "chat-completions": "openai-chat"}
PATHS = {"ollama-generate": "/api/generate", "ollama-chat": "/api/chat",
         "openai-completions": "/v1/completions", "openai-chat": "/v1/chat/completions"}

# Plain, common words: most tokenizers give each one or two tokens, so token count grows ~linearly with words.
_WORDS = (
    "time year people way day man thing woman life child world school state family student group country problem "
    "hand part place case week company system program question work government number night point home water room "
    "mother area money story fact month lot right study book eye job word business issue side kind head house "
    "service friend father power hour game line end member law car city community name president team minute idea "
    "kid body information back parent face others level office door health person art war history party result "
    "change morning reason research girl guy moment air teacher force education river garden window paper music "
    "market table letter green light stone small large early young important public bad same able open short "
    "happy quiet simple strong human local late hard major better economic strong possible whole free military "
    "true federal international full special easy clear recent certain personal red difficult available likely"
).split()


_SYSRAND = random.SystemRandom()


class TargetError(ValueError):
    """The URL is not allowed (non-loopback without --allow-remote) or malformed."""


def normalize_protocol(name: str) -> str:
    p = ALIASES.get(name, name)
    if p not in PROTOCOLS:
        raise ValueError(f"unknown protocol {name!r}: choose one of {', '.join(PROTOCOLS)} "
                         f"(aliases: {', '.join(sorted(ALIASES))})")
    return p


def is_loopback_host(host: str) -> bool:
    """Loopback by literal address or the name localhost; no DNS lookup (a name could resolve anywhere)."""
    h = host.strip("[]").lower()
    if h == "localhost" or h.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def check_target(url: str, allow_remote: bool = False) -> str:
    """Return the base URL without a trailing slash; refuse a non-loopback host unless allow_remote."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TargetError(f"bad target URL {url!r}: expected http(s)://HOST:PORT")
    if not is_loopback_host(parts.hostname) and not allow_remote:
        raise TargetError(f"refusing non-loopback target {parts.hostname!r}: the load generator only talks to "
                          f"127.0.0.1/::1/localhost unless you pass --allow-remote (allow_remote=True) explicitly")
    return f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"


def make_prompt(n_words: int, seed: int, nonce: str | None = None) -> str:
    """A random nonce then `n_words` seeded words: unique from the first token, so no prefix-cache hits.

    The words for one seed are prefix-stable (n+1 words = n words + one more), which calibration relies on.
    """
    rng = random.Random(seed)
    # Nine decimal digits: random per prompt, yet a near-constant token count under any tokenizer (hex is not).
    nonce = nonce or str(_SYSRAND.randrange(10**8, 10**9))
    return f"{nonce}: " + " ".join(rng.choice(_WORDS) for _ in range(max(0, n_words)))


@dataclass
class Chunk:
    """One parsed stream line: text, and the final counts when the server sent them."""

    text: str = ""
    final: bool = False
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    done_reason: str | None = None
    error: str | None = None


def wants_ignore_eos(protocol: str, ignore_eos: bool | None) -> bool:
    """None = auto: ask OpenAI-style servers (llama-server and vLLM honour it), not Ollama (it has no such option)."""
    return protocol.startswith("openai") if ignore_eos is None else ignore_eos


def build_request(protocol: str, model: str, prompt: str, max_tokens: int, seed: int,
                  ignore_eos: bool | None = None) -> tuple[str, dict[str, Any]]:
    """Path and JSON body asking for exactly `max_tokens` at temperature 0, streamed."""
    ignore_eos = wants_ignore_eos(protocol, ignore_eos)
    if protocol.startswith("ollama"):
        # Ollama drops unknown options with a warning, so options.ignore_eos only helps servers that honour it.
        options: dict[str, Any] = {"num_predict": max_tokens, "temperature": 0, "seed": seed}
        if ignore_eos:
            options["ignore_eos"] = True
        body: dict[str, Any] = {"model": model, "stream": True, "options": options}
        if protocol == "ollama-generate":
            body["prompt"] = prompt
        else:
            body["messages"] = [{"role": "user", "content": prompt}]
        return PATHS[protocol], body
    body = {"model": model, "max_tokens": max_tokens, "temperature": 0, "seed": seed, "stream": True,
            "stream_options": {"include_usage": True}}
    if ignore_eos:
        body["ignore_eos"] = True  # llama-server and vLLM honour it
    if protocol == "openai-completions":
        body["prompt"] = prompt
    else:
        body["messages"] = [{"role": "user", "content": prompt}]
    return PATHS[protocol], body


def parse_line(protocol: str, line: str) -> Chunk | None:
    """Parse one NDJSON (Ollama) or SSE (OpenAI) line; None for blank lines, comments and keep-alives."""
    line = line.strip()
    if not line:
        return None
    if protocol.startswith("openai"):
        if line.startswith("error:"):
            return Chunk(final=True, error=line[6:].strip())
        if not line.startswith("data:"):
            return None  # "event:", ": ping" and the like
        line = line[5:].strip()
        if line == "[DONE]":
            return Chunk(final=True)
    try:
        obj = json.loads(line)
    except json.JSONDecodeError:
        return Chunk(final=True, error=f"unparseable stream line: {line[:200]!r}")
    if not isinstance(obj, dict):
        return None
    if "error" in obj:
        err = obj["error"]
        return Chunk(final=True, error=err.get("message", str(err)) if isinstance(err, dict) else str(err))
    if protocol.startswith("ollama"):
        msg = obj.get("message") or {}
        text = obj.get("response") or (msg.get("content") or "") + (msg.get("thinking") or "")
        if obj.get("done"):
            return Chunk(text=text, final=True, prompt_tokens=obj.get("prompt_eval_count"),
                         output_tokens=obj.get("eval_count"), done_reason=obj.get("done_reason"))
        return Chunk(text=text)
    chunk = Chunk()
    for choice in obj.get("choices") or []:
        if protocol == "openai-completions":
            chunk.text += choice.get("text") or ""
        else:
            delta = choice.get("delta") or {}
            chunk.text += (delta.get("content") or "") + (delta.get("reasoning_content") or "")
        chunk.done_reason = choice.get("finish_reason") or chunk.done_reason
    usage = obj.get("usage")
    # Ollama's /v1/completions puts an all-zero usage on every chunk when include_usage is set; only the last
    # one counts
    if isinstance(usage, dict) and (usage.get("prompt_tokens") or usage.get("completion_tokens")):
        chunk.prompt_tokens = usage.get("prompt_tokens")
        chunk.output_tokens = usage.get("completion_tokens")
        chunk.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    return chunk


ProgressFn = Callable[[str, RequestRecord], None]


async def stream_request(client: httpx.AsyncClient, protocol: str, model: str, prompt: str, rec: RequestRecord,
                         t0: float, seed: int = 0, ignore_eos: bool | None = None,
                         progress: ProgressFn | None = None, first_token: asyncio.Event | None = None) -> None:
    """Send one streamed request and fill `rec`; a cancelled task marks it stopped and re-raises."""
    path, body = build_request(protocol, model, prompt, rec.output_len, seed, ignore_eos)
    now = time.perf_counter
    rec.start = now() - t0
    if progress:
        progress("start", rec)
    saw_final = False
    try:
        async with client.stream("POST", path, json=body) as resp:
            if resp.status_code >= 400:
                text = (await resp.aread()).decode("utf-8", "replace")
                rec.error = f"HTTP {resp.status_code} from {path}: {text[:300]}"
                return
            async for line in resp.aiter_lines():
                t = now() - t0
                chunk = parse_line(protocol, line)
                if chunk is None:
                    continue
                if chunk.text:
                    rec.token_times.append(t)
                    if first_token is not None and len(rec.token_times) == 1:
                        first_token.set()
                    if progress:
                        progress("token", rec)
                if chunk.prompt_tokens is not None:
                    rec.prompt_tokens = chunk.prompt_tokens
                if chunk.cached_tokens is not None:
                    rec.cached_tokens = chunk.cached_tokens
                if chunk.output_tokens is not None:
                    rec.server_output_tokens = chunk.output_tokens
                if chunk.done_reason:
                    rec.done_reason = chunk.done_reason
                if chunk.error:
                    rec.error = chunk.error
                    return
                if chunk.final:  # Ollama's done:true, or OpenAI's [DONE] (usage comes in the chunk before it)
                    saw_final = True
                    break
            rec.end = now() - t0
            # A server that closes an OpenAI stream after finish_reason without [DONE] still finished it.
            rec.ok = saw_final or (protocol.startswith("openai") and rec.done_reason is not None)
            if not rec.ok:
                rec.error = "stream ended without a final message"
    except asyncio.CancelledError:
        rec.stopped = True
        raise
    except httpx.HTTPError as e:
        rec.error = f"{type(e).__name__}: {e}"
    finally:
        if first_token is not None:
            first_token.set()  # wake waiters on failure too
        if progress:
            progress("end", rec)


async def detect_model(client: httpx.AsyncClient, protocol: str) -> str:
    """The first model the server lists (OpenAI /v1/models or Ollama /api/tags)."""
    path = "/v1/models" if protocol.startswith("openai") else "/api/tags"
    resp = await client.get(path)
    resp.raise_for_status()
    data = resp.json()
    names = [m.get("id") for m in data.get("data") or []] or [m.get("name") for m in data.get("models") or []]
    names = [n for n in names if n]
    if not names:
        raise ValueError(f"no model given and {path} lists none: pass --model NAME")
    return names[0]
