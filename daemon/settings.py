"""Every daemon setting in one place: Ollama's variables (with an EVENFLOW_ twin that wins), evenflow's own.

`SETTINGS` is the table the CLI turns into `evenflow serve --flags`; `load_settings(env, overrides)` parses
and validates, raising `ConfigError` that names the variable and what it accepts.
"""
from __future__ import annotations

import ipaddress
import logging
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping
from urllib.parse import urlsplit

from ..backends.registry import backend_names
from .apikey import check_key, default_key_file, read_key_file

log = logging.getLogger(__name__)

DEFAULT_PORT = 11434
FOREVER = math.inf  # keep_alive meaning "never unload"


class ConfigError(ValueError):
    """A setting has a bad value; the message names the variable and what it accepts."""


# ---------------------------------------------------------------------------------------------------------
# Value parsers (shared with the HTTP layer: keep_alive has the same grammar in requests)

_DURATION_RE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_go_duration(text: str) -> float:
    """Go's time.ParseDuration ("5m", "1h30m", "-1m", "300ms", "0") -> seconds; ValueError otherwise."""
    s = text.strip()
    sign = 1.0
    if s[:1] in "+-" and s:
        sign = -1.0 if s[0] == "-" else 1.0
        s = s[1:]
    if s == "0":
        return 0.0
    if not s:
        raise ValueError(f"invalid duration {text!r}")
    pos, total = 0, 0.0
    for m in _DURATION_RE.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT_S[m.group(2)]
        pos = m.end()
    if pos != len(s):
        raise ValueError(f"invalid duration {text!r} (expected a Go duration such as 5m, 1h30m, 30s, -1m)")
    return sign * total


def keep_alive_seconds(value: Any) -> float:
    """A request's keep_alive: a number is seconds, a string a Go duration; negative means forever."""
    if isinstance(value, bool):
        raise ValueError(f"keep_alive must be a number of seconds or a duration string, got {value!r}")
    if isinstance(value, (int, float)):
        secs = float(value)
    elif isinstance(value, str):
        secs = parse_go_duration(value)
    else:
        raise ValueError(f"keep_alive must be a number of seconds or a duration string, got {value!r}")
    if math.isnan(secs):
        raise ValueError("keep_alive must not be NaN")
    return FOREVER if secs < 0 else secs


def _env_keep_alive(text: str) -> float:
    """OLLAMA_KEEP_ALIVE: a Go duration or integer seconds (envconfig.KeepAlive)."""
    try:
        return keep_alive_seconds(parse_go_duration(text))
    except ValueError:
        return keep_alive_seconds(int(text))


@dataclass(frozen=True)
class HostPort:
    scheme: str
    host: str
    port: int

    @property
    def url(self) -> str:
        h = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{h}:{self.port}"

    @property
    def is_loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


def parse_host(text: str) -> HostPort:
    """Ollama's OLLAMA_HOST grammar: host, host:port, :port, scheme://host[:port][/path]."""
    s = text.strip().strip("'\"").strip()
    scheme, default_port = "http", DEFAULT_PORT
    if "://" in s:
        scheme, s = s.split("://", 1)
        scheme = scheme.lower()
        if scheme not in ("http", "https"):
            raise ValueError(f"unsupported scheme {scheme!r} (http or https)")
        default_port = 443 if scheme == "https" else 80
    s = s.split("/", 1)[0]
    parts = urlsplit(f"//{s}")
    try:
        port = parts.port
    except ValueError as e:
        raise ValueError(f"invalid port in {text!r}: {e}") from None
    host = parts.hostname or "127.0.0.1"
    if s.startswith(":") and port is None:
        raise ValueError(f"invalid host {text!r}")
    return HostPort(scheme, host, port if port is not None else default_port)


def _parse_bool(text: str) -> bool:
    t = text.strip().lower()
    if t in ("1", "true", "t", "yes", "y", "on"):
        return True
    if t in ("0", "false", "f", "no", "n", "off", ""):
        return False
    raise ValueError("expected a boolean (1/0, true/false)")


def _int_min(lo: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        v = int(text.strip())
        if v < lo:
            raise ValueError(f"must be >= {lo}")
        return v
    return parse


def _target_itl(text: str) -> float | None:
    if text.strip().lower() == "auto":
        return None
    return _float_min(0.0)(text)


def _float_min(lo: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        v = float(text.strip())
        if not math.isfinite(v) or v < lo:
            raise ValueError(f"must be a finite number >= {lo}")
        return v
    return parse


def _fraction(text: str) -> float:
    v = float(text.strip())
    if not (math.isfinite(v) and 0 < v <= 1):
        raise ValueError("must be a number in (0, 1]")
    return v


def _choice(*allowed: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        v = text.strip().lower()
        if v not in allowed:
            raise ValueError(f"must be one of {', '.join(allowed)}")
        return v
    return parse


def _flash_attention(text: str) -> str:
    """auto, on or off; Ollama's 1/0 (true/false) mean on/off, empty means auto."""
    t = text.strip().lower()
    if t in ("", "auto"):
        return "auto"
    return "on" if _parse_bool(t) else "off"


def _kv_cache_type(text: str) -> str:
    """Ollama's OLLAMA_KV_CACHE_TYPE words, plus auto (the default; empty means auto). The same words as
    backends.base.KV_CACHE_TYPES (a test holds them equal; importing it here would load numpy for every CLI call)."""
    return _choice("auto", "f16", "q8_0", "q4_0")(text.strip() or "auto")


def _origins(text: str) -> list[str]:
    return [o.strip() for o in text.split(",") if o.strip()]


def _path(text: str) -> Path:
    return Path(text.strip()).expanduser()


def _api_key(text: str) -> str:
    return check_key(text.strip(), "")


_SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(text: str) -> int:
    """Bytes from `10GiB`, `500 MB`, `1.5gb` or a plain integer."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        raise ValueError("a number of bytes, optionally with a unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])


def _ip_list(text: str) -> list[str]:
    out = [a.strip() for a in text.split(",") if a.strip()]
    for a in out:
        ipaddress.ip_address(a)  # ValueError names the bad address
    return out


# ---------------------------------------------------------------------------------------------------------
# The table of settings


@dataclass(frozen=True)
class SettingSpec:
    name: str  # Settings attribute and --flag name (underscores become dashes)
    envs: tuple[str, ...]  # variables, the first one wins (EVENFLOW_ twin first)
    parse: Callable[[str], Any]
    accepts: str  # what a valid value looks like, for errors and --help
    help: str
    is_flag: bool = False  # boolean switch on the command line


def _twin(var: str) -> tuple[str, ...]:
    return ("EVENFLOW_" + var.removeprefix("OLLAMA_"), var)


SETTINGS: tuple[SettingSpec, ...] = (
    SettingSpec("host", _twin("OLLAMA_HOST"), parse_host, "host, host:port or scheme://host:port",
                "address to bind (default 127.0.0.1:11434)"),
    SettingSpec("models", _twin("OLLAMA_MODELS"), _path, "a directory path", "model store directory"),
    SettingSpec("keep_alive", _twin("OLLAMA_KEEP_ALIVE"), _env_keep_alive,
                "a Go duration (5m, 1h, -1) or integer seconds", "how long an idle model stays loaded (default 5m; 0 unloads; negative = forever)"),
    SettingSpec("num_parallel", _twin("OLLAMA_NUM_PARALLEL"), _int_min(0), "an integer >= 0",
                "concurrent sequences per model (0 = EVENFLOW_MAX_SEQS)"),
    SettingSpec("max_loaded_models", _twin("OLLAMA_MAX_LOADED_MODELS"), _int_min(0), "an integer >= 0",
                "models kept loaded at once, idle ones evicted LRU (0 = 3)"),
    SettingSpec("max_queue", _twin("OLLAMA_MAX_QUEUE"), _int_min(1), "an integer >= 1",
                "pending requests before 503 server busy (default 512)"),
    SettingSpec("origins", _twin("OLLAMA_ORIGINS"), _origins, "comma-separated origins, * wildcards",
                "extra CORS origins allowed besides localhost/app/file/tauri/vscode"),
    SettingSpec("context_length", _twin("OLLAMA_CONTEXT_LENGTH"), _int_min(0), "an integer >= 0",
                "default num_ctx (0 = by the GPU's total memory as Ollama: 4096 under 24 GiB or without a GPU, "
                "32768 up to 48 GiB, 262144 above; clamped to the model's trained context)"),
    SettingSpec("backend", ("EVENFLOW_BACKEND",), _choice("auto", *backend_names()),
                f"auto, {', '.join(backend_names()[:-1])} or {backend_names()[-1]}", "model runner backend"),
    SettingSpec("device", ("EVENFLOW_DEVICE",), lambda s: s.strip() or "auto", "auto, cpu, cuda, cuda:N or mps",
                "torch device"),
    SettingSpec("prefill", ("EVENFLOW_PREFILL",), _choice("chunked", "monolithic"), "chunked or monolithic",
                "prefill scheduling mode"),
    SettingSpec("max_batched_tokens", ("EVENFLOW_MAX_BATCHED_TOKENS",), _int_min(1), "an integer >= 1",
                "token budget per engine step (fixed policy); the largest step (adaptive policy)"),
    SettingSpec("target_itl_ms", ("EVENFLOW_TARGET_ITL_MS",), _target_itl, "auto or a number >= 0 (milliseconds)",
                "inter-token latency target of the adaptive budget (auto = 50 on a GPU, 150 on a CPU; "
                "0 = the fixed budget)"),
    SettingSpec("speculative", ("EVENFLOW_SPECULATIVE",), _choice("ngram", "off"), "ngram or off",
                "speculative decoding: ngram = drafts from the sequence's own prompt and output (prompt lookup), "
                "as many draft tokens per step as pay for themselves; off = none (a request turns it off with "
                "the option draft_num_predict 0)"),
    SettingSpec("max_seqs", ("EVENFLOW_MAX_SEQS",), _int_min(0), "an integer >= 0",
                "sequence slots per loaded model (0 = as many full num_ctx windows as the KV pool holds, at "
                "least 8; the pool is 8 windows in host/unified memory, a share of free memory on a CUDA GPU)"),
    SettingSpec("gpu_kv_fraction", ("EVENFLOW_GPU_KV_FRACTION",), _fraction, "a number in (0, 1]",
                "share of the GPU memory free after the weights that the KV cache may take (CUDA; Metal: of the "
                "recommended working set; default 0.9)"),
    SettingSpec("num_threads", ("EVENFLOW_NUM_THREADS",), _int_min(0), "an integer >= 0 (0 = physical cores)",
                "CPU threads for the backend"),
    SettingSpec("llamacpp_kv", ("EVENFLOW_LLAMACPP_KV",), _choice("auto", "streams", "unified"),
                "auto, streams or unified",
                "llama.cpp KV layout: streams = a KV stream per sequence (a query attends only its own tokens), "
                "unified = one cache, one pass per step, every query attends every occupied cell; auto = streams "
                "when the pool holds a full window per slot"),
    SettingSpec("flash_attention", _twin("OLLAMA_FLASH_ATTENTION"), _flash_attention, "auto, on/1 or off/0",
                "llama.cpp flash attention: auto = llama.cpp's choice on a GPU, off on a CPU (its CPU kernel is "
                "slow for the small prompt chunks of chunked prefill; faster for one long prompt alone)"),
    SettingSpec("kv_cache_type", _twin("OLLAMA_KV_CACHE_TYPE"), _kv_cache_type, "auto, f16, q8_0 or q4_0",
                "llama.cpp KV cache type: a quantized type applies to K always and to V only with flash attention "
                "on (llama.cpp's rule); auto = a q8_0 K on a CPU (attention deep into a long prompt reads half "
                "the bytes), f16 on a GPU; the torch and MLX backends keep their own"),
    SettingSpec("kv_cache_dir", ("EVENFLOW_KV_CACHE_DIR",), _path, "a directory path",
                "where cached prompt prefixes' KV is saved when a model unloads, to be read back after an unload or "
                "a restart (default <user cache dir>/evenflow/kv)"),
    SettingSpec("kv_cache_size", ("EVENFLOW_KV_CACHE_SIZE",), parse_size, "a size such as 10GiB or 500MB; 0 = off",
                "disk budget of the saved KV prefixes, least recently used evicted first (default 10GiB; 0 turns "
                "the disk KV cache off)"),
    SettingSpec("log_content", ("EVENFLOW_LOG_CONTENT",), _parse_bool, "1/0 or true/false",
                "include prompts and outputs in /api/events", is_flag=True),
    SettingSpec("ollama_store", ("EVENFLOW_OLLAMA_STORE",), _path, "a directory path",
                "read-only Ollama store (default ~/.ollama/models if present)"),
    SettingSpec("no_demo", ("EVENFLOW_NO_DEMO",), _parse_bool, "1/0 or true/false",
                "do not create the synthetic demo model in an empty store", is_flag=True),
    SettingSpec("max_body_mb", ("EVENFLOW_MAX_BODY_MB",), _int_min(0), "an integer >= 0 (MiB; 0 = no limit)",
                "largest request body (blob uploads excepted); bigger ones get 413 (default 32)"),
    SettingSpec("noprune", _twin("OLLAMA_NOPRUNE"), _parse_bool, "1/0 or true/false",
                "do not delete unreferenced blobs at start-up", is_flag=True),
    SettingSpec("no_access_log", ("EVENFLOW_NO_ACCESS_LOG",), _parse_bool, "1/0 or true/false",
                "do not log one line per request (status, duration, client, method, path) at INFO", is_flag=True),
    SettingSpec("api_key", ("EVENFLOW_API_KEY",), _api_key, "16 or more printable ASCII characters, no spaces",
                "require `Authorization: Bearer <key>` on every endpoint but GET / (default: the key file's key, "
                "if there is one)"),
    SettingSpec("api_key_file", ("EVENFLOW_API_KEY_FILE",), _path, "a file path",
                "key file read when no key is given (default <config dir>/evenflow/api_key; `evenflow key new`)"),
    SettingSpec("insecure_no_auth", ("EVENFLOW_INSECURE_NO_AUTH",), _parse_bool, "1/0 or true/false",
                "allow binding off loopback without an API key (anyone who can reach the port can use it)",
                is_flag=True),
    SettingSpec("tls_cert", ("EVENFLOW_TLS_CERT",), _path, "a PEM file path", "serve HTTPS with this certificate"),
    SettingSpec("tls_key", ("EVENFLOW_TLS_KEY",), _path, "a PEM file path", "private key of --tls-cert"),
    SettingSpec("advertise", ("EVENFLOW_ADVERTISE",), _parse_bool, "1/0 or true/false",
                "announce the daemon on the LAN with zeroconf (_ollama._tcp)", is_flag=True),
    SettingSpec("advertise_interfaces", ("EVENFLOW_ADVERTISE_INTERFACES",), _ip_list,
                "comma-separated IP addresses", "interfaces to advertise on (default: those the daemon listens on)"),
)
SPEC_BY_NAME = {s.name: s for s in SETTINGS}


def _default_models_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_data_dir("evenflow")) / "models"


def _default_kv_cache_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir("evenflow")) / "kv"


def _default_ollama_store() -> Path | None:
    p = Path("~/.ollama/models").expanduser()
    return p if p.is_dir() else None


@dataclass
class Settings:
    host: HostPort = field(default_factory=lambda: HostPort("http", "127.0.0.1", DEFAULT_PORT))
    models: Path = field(default_factory=_default_models_dir)
    keep_alive: float = 300.0  # seconds; math.inf = forever
    num_parallel: int = 0
    max_loaded_models: int = 0
    max_queue: int = 512
    origins: list[str] = field(default_factory=list)
    context_length: int = 0  # 0 = by total VRAM (backends/common/gpu_plan.default_context_length)
    backend: str = "auto"
    device: str = "auto"
    prefill: str = "chunked"
    max_batched_tokens: int = 512
    target_itl_ms: float | None = None  # None = auto, by device
    speculative: str = "ngram"
    max_seqs: int = 0
    gpu_kv_fraction: float = 0.9
    num_threads: int = 0
    llamacpp_kv: str = "auto"
    flash_attention: str = "auto"
    kv_cache_type: str = "auto"
    kv_cache_dir: Path = field(default_factory=_default_kv_cache_dir)
    kv_cache_size: int = 10 * 2**30
    log_content: bool = False
    ollama_store: Path | None = field(default_factory=_default_ollama_store)
    no_demo: bool = False
    max_body_mb: int = 32
    noprune: bool = False
    no_access_log: bool = False
    api_key: str | None = field(default=None, repr=False)
    api_key_file: Path = field(default_factory=default_key_file)
    insecure_no_auth: bool = False
    tls_cert: Path | None = None
    tls_key: Path | None = None
    advertise: bool = False
    advertise_interfaces: list[str] = field(default_factory=list)
    api_key_source: str = ""  # where the key came from, for the start-up log (never the key itself)

    @property
    def loaded_model_limit(self) -> int:
        return self.max_loaded_models or 3


def load_settings(env: Mapping[str, str] | None = None, overrides: Mapping[str, Any] | None = None) -> Settings:
    """Settings from the environment (EVENFLOW_ twin wins over OLLAMA_), then `overrides` (CLI flags)."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    for spec in SETTINGS:
        for var in spec.envs:
            raw = env.get(var)
            if raw is None:
                continue
            raw = raw.strip().strip("'\"").strip()  # envconfig.Var strips quotes and spaces
            if raw == "" and spec.name not in ("origins",):
                continue  # an empty variable means unset, as in Ollama
            values[spec.name] = _parse(spec, raw, var)
            break
    for name, raw in (overrides or {}).items():
        if raw is None:
            continue
        spec = SPEC_BY_NAME.get(name)
        if spec is None:
            raise ConfigError(f"unknown setting {name!r}; known: {', '.join(SPEC_BY_NAME)}")
        values[name] = _parse(spec, raw, "--" + name.replace("_", "-")) if isinstance(raw, str) else raw
    settings = Settings(**values)
    _finish_security(settings, "api_key" in (overrides or {}) and (overrides or {})["api_key"] is not None)
    return settings


def _finish_security(s: Settings, key_from_flag: bool) -> None:
    """Fill the key from the key file when none was given; check the TLS pair."""
    if s.api_key is not None:
        s.api_key_source = "--api-key" if key_from_flag else "EVENFLOW_API_KEY"
    else:
        try:
            s.api_key = read_key_file(s.api_key_file)
        except (OSError, ValueError) as e:
            raise ConfigError(f"cannot use the key file: {e}") from None
        if s.api_key is not None:
            s.api_key_source = f"key file {s.api_key_file}"
    if (s.tls_cert is None) != (s.tls_key is None):
        raise ConfigError("--tls-cert and --tls-key (EVENFLOW_TLS_CERT / EVENFLOW_TLS_KEY) go together: give both")
    for what, path in (("--tls-cert", s.tls_cert), ("--tls-key", s.tls_key)):
        if path is not None and not path.is_file():
            raise ConfigError(f"{what}={str(path)!r} is invalid: a readable PEM file expected (no such file)")
    if s.tls_cert is not None and s.host.scheme == "http":
        s.host = HostPort("https", s.host.host, s.host.port)


def exposure_error(s: Settings) -> str | None:
    """Why the daemon must not start as configured: off loopback with no key and no explicit opt-out."""
    if s.host.is_loopback or s.api_key or s.insecure_no_auth:
        return None
    return (f"refusing to listen on {s.host.host}:{s.host.port} without an API key: anyone who can reach that "
            "address could use this machine. Create a key with `evenflow key new` (or set EVENFLOW_API_KEY / "
            "--api-key), or bind to 127.0.0.1, or pass --insecure-no-auth (EVENFLOW_INSECURE_NO_AUTH=1) if you "
            "really want an open server.")


def _parse(spec: SettingSpec, raw: str, where: str) -> Any:
    try:
        return spec.parse(raw)
    except (ValueError, TypeError) as e:
        shown = "<hidden>" if spec.name == "api_key" else repr(raw)  # a secret stays out of logs and terminals
        raise ConfigError(f"{where}={shown} is invalid: {spec.accepts} expected ({e})") from None
