"""Browsing the LAN for daemons (`_ollama._tcp` over zeroconf): `discover()`, `first_daemon()`, `LanBrowser`."""
from __future__ import annotations

import ipaddress
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..daemon.discovery import SERVICE_TYPE

INTERFACES_ENV = "EVENFLOW_DISCOVER_INTERFACES"  # e.g. 127.0.0.1 (tests); default: every interface


class DiscoveryError(RuntimeError):
    """No daemon answered in time."""


@dataclass(frozen=True)
class Found:
    name: str  # the service instance, without the type
    address: str
    port: int
    version: str = ""
    evenflow: str = ""
    api: str = ""
    auth: bool = False
    tls: bool = False
    models: list[str] = field(default_factory=list)
    models_total: int = 0

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"


def _interfaces(interfaces: list[str] | None) -> Any:
    from zeroconf import InterfaceChoice  # noqa: PLC0415 - zeroconf (~0.15 s) only to browse

    chosen = interfaces or [a.strip() for a in os.environ.get(INTERFACES_ENV, "").split(",") if a.strip()]
    for a in chosen:
        ipaddress.ip_address(a)  # a clear ValueError for a typo
    return chosen or InterfaceChoice.All


def _txt_strings(raw: bytes) -> dict[str, str]:
    """DNS TXT wire format (length-prefixed key=value strings) -> dict."""
    out, i = {}, 0
    while i < len(raw):
        n = raw[i]
        k, _, v = raw[i + 1:i + 1 + n].decode("utf-8", "replace").partition("=")
        out.setdefault(k, v)
        i += 1 + n
    return out


def _found(info: Any, txt: bytes | None = None) -> Found | None:
    addrs = info.parsed_addresses()
    if not addrs or not info.port:
        return None
    props = _txt_strings(txt) if txt else {
        k.decode("utf-8", "replace"): (v or b"").decode("utf-8", "replace") for k, v in info.properties.items()}
    v4 = [a for a in addrs if ":" not in a]
    models = [m for m in props.get("models", "").split(",") if m]
    total = int(props["models_total"]) if props.get("models_total", "").isdigit() else len(models)
    return Found(name=info.name.removesuffix("." + SERVICE_TYPE), address=(v4 or addrs)[0], port=info.port,
                 version=props.get("version", ""), evenflow=props.get("evenflow", ""),
                 api=props.get("api", ""), auth=props.get("auth") == "1",
                 tls=props.get("tls") == "1", models=models, models_total=total)


class LanBrowser:
    """A live view of the `_ollama._tcp` daemons; use as a context manager, then `snapshot()` or `wait_for()`."""

    def __init__(self, interfaces: list[str] | None = None) -> None:
        self.interfaces = _interfaces(interfaces)
        self._names: set[str] = set()
        self._cond = threading.Condition()
        self._zc: Any = None

    def __enter__(self) -> "LanBrowser":
        from zeroconf import ServiceBrowser, Zeroconf  # noqa: PLC0415 - zeroconf only to browse

        self._zc = Zeroconf(interfaces=self.interfaces)
        self._browser = ServiceBrowser(self._zc, SERVICE_TYPE, handlers=[self._on_change])
        return self

    def __exit__(self, *exc: object) -> None:
        self._browser.cancel()
        self._zc.close()

    def _on_change(self, zeroconf: Any, service_type: str, name: str, state_change: Any) -> None:
        from zeroconf import ServiceStateChange  # noqa: PLC0415 - zeroconf only to browse

        with self._cond:
            if state_change is ServiceStateChange.Removed:
                self._names.discard(name)
            else:
                self._names.add(name)
            self._cond.notify_all()

    def snapshot(self, resolve_timeout_ms: int = 1500) -> list[Found]:
        """The daemons seen so far, resolved (from the cache when their records are already in)."""
        with self._cond:
            names = sorted(self._names)
        from zeroconf import ServiceInfo  # noqa: PLC0415 - zeroconf only to browse

        out = []
        for name in names:
            # The cache first: just after a TXT update python-zeroconf's query can be answered by nobody (the stale
            # copy is a known answer until it expires), while the cache already holds the new record.
            info = ServiceInfo(SERVICE_TYPE, name)
            ok = info.load_from_cache(self._zc) or info.request(self._zc, resolve_timeout_ms)
            found = _found(info, self._newest_txt(name)) if ok else None
            if found is not None:
                out.append(found)
        return out

    def _newest_txt(self, name: str) -> bytes | None:
        """The TXT most recently received: two updates within a second both stay cached (RFC 6762 §10.2)."""
        from zeroconf import DNSText  # noqa: PLC0415 - zeroconf only to browse
        from zeroconf.const import _CLASS_IN, _TYPE_TXT  # noqa: PLC0415 - zeroconf only to browse

        texts = [r for r in self._zc.cache.get_all_by_details(name, _TYPE_TXT, _CLASS_IN) if isinstance(r, DNSText)]
        return max(texts, key=lambda r: r.created).text if texts else None

    def wait_for(self, predicate: Callable[[list[Found]], bool], timeout: float) -> list[Found]:
        """Re-check `predicate` on every change (and every half second) until it holds; DiscoveryError at timeout."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.snapshot()
            if predicate(found):
                return found
            left = deadline - time.monotonic()
            if left <= 0:
                raise DiscoveryError(f"no matching evenflow/ollama daemon on the LAN within {timeout:g} s")
            with self._cond:
                self._cond.wait(min(left, 0.5))


def discover(timeout: float = 3.0, interfaces: list[str] | None = None) -> list[Found]:
    """Every daemon that answers within `timeout` seconds."""
    with LanBrowser(interfaces) as b:
        time.sleep(timeout)  # discovery is "who answers in this window": there is no event for "that was all"
        return b.snapshot()


def first_daemon(timeout: float = 3.0, interfaces: list[str] | None = None) -> Found:
    with LanBrowser(interfaces) as b:
        try:
            return b.wait_for(bool, timeout)[0]
        except DiscoveryError:
            raise DiscoveryError(f"no evenflow/ollama daemon found on the LAN within {timeout:g} s (is one running "
                                 "with --advertise? is multicast allowed on this network?)") from None
