"""The API key's file under the platformdirs config dir: where it lives, reading it, writing a new one (0600)."""
from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Mapping

KEY_FILE_ENV = "EVENFLOW_API_KEY_FILE"
MIN_KEY_LEN = 16  # shorter keys are refused: a LAN key must not be guessable


def default_key_file(env: Mapping[str, str] | None = None) -> Path:
    """EVENFLOW_API_KEY_FILE, else `<platformdirs user config dir>/evenflow/api_key`."""
    env = os.environ if env is None else env
    if env.get(KEY_FILE_ENV, "").strip():
        return Path(env[KEY_FILE_ENV].strip()).expanduser()
    import platformdirs  # noqa: PLC0415 - the clients' start-up: only when no key file is named

    return Path(platformdirs.user_config_dir("evenflow")) / "api_key"


def check_key(key: str, where: str) -> str:
    """A usable key: printable ASCII without spaces, at least MIN_KEY_LEN characters; ValueError names `where`."""
    if len(key) < MIN_KEY_LEN:
        problem = f"is {len(key)} characters long, at least {MIN_KEY_LEN} are needed"
    elif not (key.isascii() and key.isprintable()) or " " in key:
        problem = "must be printable ASCII without spaces"
    else:
        return key
    raise ValueError(f"the API key{f' in {where}' if where else ''} {problem} (`evenflow key new` makes a good one)")


def read_key_file(path: Path) -> str | None:
    """The key in `path` (first line, stripped), None when the file does not exist."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    return check_key(text.strip().splitlines()[0].strip() if text.strip() else "", str(path))


def new_key() -> str:
    return "ef-" + secrets.token_urlsafe(32)


def write_key_file(path: Path, key: str, overwrite: bool = False) -> None:
    """Write atomically with mode 0600 (the directory 0700 when we create it); refuse to replace unless asked."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} already exists (use --force to replace the key)")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(key + "\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
