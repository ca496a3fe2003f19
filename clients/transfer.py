"""`evenflow pull`, `push` and `create -f`: the daemon's progress lines drawn as Ollama's bars (rich)."""
from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import Any, Iterable, Iterator

import httpx

from .common import CLIError, check, daemon_client

# Files of a safetensors model folder that `create` uploads (Ollama's createBlobs list, roughly).
HF_FILES = ("*.safetensors", "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "tokenizer.model", "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt")


BAR_WIDTH = 20


def _bar(fraction: float) -> str:
    filled = int(round(BAR_WIDTH * max(0.0, min(1.0, fraction))))
    return "▕" + "█" * filled + " " * (BAR_WIDTH - filled) + "▏"


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


class ProgressView:
    """Ollama's look: one bar per digest (`pulling 1a2b3c4d5e6f: 100% ▕███▏ 4.7 MB`), other statuses as lines.

    On a terminal the bars are live (rich); otherwise each bar is printed once, when it completes."""

    def __init__(self) -> None:
        from rich.console import Console  # noqa: PLC0415 - only the transfer verbs draw bars
        from rich.progress import DownloadColumn, Progress, ProgressColumn, TextColumn, TimeRemainingColumn
        from rich.progress import TransferSpeedColumn
        from rich.text import Text

        class BarColumn(ProgressColumn):
            def render(self, task: Any) -> Any:
                return Text(_bar(task.completed / task.total if task.total else 0.0))

        self.console = Console(stderr=True, highlight=False, soft_wrap=True)
        self.live = self.console.is_terminal
        self._columns = (TextColumn("{task.description}:"), TextColumn("{task.percentage:>3.0f}%"), BarColumn(),
                         DownloadColumn(binary_units=False), TransferSpeedColumn(), TimeRemainingColumn())
        self._progress_cls = Progress
        self.progress: Any = None  # the live bars since the last plain status line
        self.tasks: dict[str, Any] = {}
        self.printed: set[str] = set()
        self.last_status = ""

    def __enter__(self) -> "ProgressView":
        return self

    def __exit__(self, *exc: Any) -> None:
        self._freeze()

    def _freeze(self) -> None:
        """Stop the live bars where they are, so the next status line prints below them (Ollama's order)."""
        if self.progress is not None:
            self.progress.stop()
            self.progress = None

    def update(self, item: dict[str, Any]) -> None:
        status = item.get("status", "")
        digest, total = item.get("digest"), item.get("total")
        if digest and total:
            done = item.get("completed", 0)
            if self.live:
                if self.progress is None:
                    self.progress = self._progress_cls(*self._columns, console=self.console, transient=False)
                    self.progress.start()
                    self.tasks.clear()
                task = self.tasks.get(digest)
                if task is None:
                    task = self.tasks[digest] = self.progress.add_task(status, total=total)
                self.progress.update(task, description=status, completed=done)
            elif done >= total and digest not in self.printed:
                self.printed.add(digest)
                self.console.print(f"{status}: 100% {_bar(1.0)} {_human(total)}")
        elif status and status != self.last_status:
            self._freeze()
            self.console.print(status)
        self.last_status = status


def show_progress(lines: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Draw every progress line; raise CLIError on an error line; return the last line."""
    last: dict[str, Any] = {}
    with ProgressView() as view:
        for item in lines:
            if item.get("error"):
                raise CLIError(f"Error: {item['error']}")
            view.update(item)
            last = item
    return last


def stream_lines(client: httpx.Client, path: str, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """POST and yield the NDJSON lines of the answer (a non-200 status becomes a CLIError)."""
    with client.stream("POST", path, json=body) as r:
        if r.status_code >= 400:
            r.read()
            check(r)
        for line in r.iter_lines():
            if line.strip():
                yield json.loads(line)


def pull_model(client: httpx.Client, model: str, insecure: bool = False) -> None:
    show_progress(stream_lines(client, "/api/pull", {"model": model, "insecure": insecure}))


def cmd_pull(args: argparse.Namespace) -> None:
    with daemon_client() as c:
        pull_model(c, args.model, args.insecure)


def cmd_push(args: argparse.Namespace) -> None:
    with daemon_client() as c:
        show_progress(stream_lines(c, "/api/push", {"model": args.model, "insecure": args.insecure}))


# ------------------------------------------------------------------------------------------------- create

def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def _model_files(path: Path) -> dict[str, Path]:
    """A GGUF file, or the files of a safetensors folder, by the name the daemon will see."""
    if path.is_file():
        return {path.name: path}
    files = {p.name: p for pattern in HF_FILES for p in sorted(path.glob(pattern)) if p.is_file()}
    files.update({p.name: p for p in sorted(path.glob("*.gguf"))})
    if not files:
        raise CLIError(f"Error: no model files in {path} (need a .gguf file, or config.json and *.safetensors)")
    return files


def upload_files(client: httpx.Client, files: dict[str, Path], view: ProgressView) -> dict[str, str]:
    """Hash each file, upload the blobs the daemon lacks (HEAD first); return name -> digest."""
    out = {}
    for name, path in files.items():
        digest = _sha256_file(path)
        out[name] = digest
        if client.head(f"/api/blobs/{digest}").status_code == 200:
            view.update({"status": f"using existing blob {digest[7:19]}"})
            continue
        size = path.stat().st_size
        label = f"copying file {digest[7:19]}"
        view.update({"status": label, "digest": digest, "total": size})

        def body(path: Path = path, digest: str = digest, size: int = size, label: str = label) -> Iterator[bytes]:
            sent = 0
            with open(path, "rb") as f:
                while chunk := f.read(1 << 20):
                    sent += len(chunk)
                    view.update({"status": label, "digest": digest, "total": size, "completed": sent})
                    yield chunk

        check(client.post(f"/api/blobs/{digest}", content=body(), headers={"Content-Length": str(size)}))
    return out


def create_request(args: argparse.Namespace, view: ProgressView, client: httpx.Client) -> dict[str, Any]:
    """Parse the Modelfile here (as Ollama's CLI does) and turn FROM/ADAPTER paths into uploaded blobs."""
    from ..daemon.store.modelfile import ModelfileError, parse_modelfile  # noqa: PLC0415 - daemon.store: ~0.3 s

    mf = Path(args.file).expanduser()
    try:
        spec = parse_modelfile(mf.read_text(encoding="utf-8"))
    except OSError as e:
        raise CLIError(f"Error: cannot read the Modelfile {mf}: {e.strerror}") from None
    except ModelfileError as e:
        raise CLIError(f"Error: {mf}: {e}") from None
    body: dict[str, Any] = {"model": args.model}
    src = Path(spec.from_ or "").expanduser()
    src = src if src.is_absolute() else mf.parent / src
    if spec.from_ and (spec.from_.startswith((".", "/", "~")) or src.exists()):
        if not src.exists():
            raise CLIError(f"Error: FROM {spec.from_}: no such file or directory ({src})")
        view.update({"status": "gathering model components"})
        body["files"] = upload_files(client, _model_files(src), view)
    else:
        body["from"] = spec.from_
    for extra in spec.extra_from:  # a second FROM: the vision projector GGUF, uploaded beside the model's files
        p = Path(extra).expanduser()
        p = p if p.is_absolute() else mf.parent / p
        if "files" not in body or not p.is_file():
            raise CLIError(f"Error: FROM {extra}: a further FROM must name a GGUF file (a vision projector) and "
                           "follow a FROM that names the model's file")
        body["files"].update(upload_files(client, _model_files(p), view))
    if spec.adapters:
        adapters: dict[str, str] = {}
        for a in spec.adapters:
            p = Path(a).expanduser()
            adapters.update(upload_files(client, _model_files(p if p.is_absolute() else mf.parent / p), view))
        body["adapters"] = adapters
    for key, value in (("template", spec.template), ("system", spec.system), ("parameters", spec.parameters),
                       ("messages", spec.messages), ("license", spec.license), ("quantize", args.quantize)):
        if value:
            body[key] = value
    return body


def cmd_create(args: argparse.Namespace) -> None:
    with daemon_client() as c, ProgressView() as view:
        body = create_request(args, view, c)
        for item in stream_lines(c, "/api/create", body):
            if item.get("error"):
                raise CLIError(f"Error: {item['error']}")
            view.update(item)


def add_parsers(sub: Any) -> None:
    """Register pull, push and create on the `evenflow` parser."""
    for verb, helptext, func in (("pull", "pull a model from a registry", cmd_pull),
                                 ("push", "push a model to a registry", cmd_push)):
        p = sub.add_parser(verb, help=helptext)
        p.add_argument("model")
        p.add_argument("--insecure", action="store_true",
                       help="allow a plain-HTTP registry, named http://host/namespace/model (https is never downgraded)")
        p.set_defaults(func=func)
    cr = sub.add_parser("create", help="create a model from a Modelfile")
    cr.add_argument("model")
    cr.add_argument("-f", "--file", default="Modelfile", help="the Modelfile (default ./Modelfile)")
    cr.add_argument("-q", "--quantize", default=None, help="quantize the model (e.g. q4_K_M)")
    cr.set_defaults(func=cmd_create)
