"""Announcing the daemon on the LAN with zeroconf (mDNS/DNS-SD `_ollama._tcp`), and withdrawing it on shutdown."""
from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import time
from importlib import metadata
from typing import Any, Callable

from .settings import Settings

log = logging.getLogger(__name__)

SERVICE_TYPE = "_ollama._tcp.local."
TXT_STRING_MAX = 255  # one DNS TXT string (key=value) holds at most 255 bytes
MODEL_CHANGING = frozenset({"/api/create", "/api/copy", "/api/delete", "/api/pull"})
# A browser keeps every version of a record it received within the last second (RFC 6762 §10.2 cache flush), so
# two announcements closer than that would leave the stale TXT cached next to the new one: space them out.
ANNOUNCE_SPACING_S = 1.2


def package_version() -> str:
    try:
        return metadata.version("evenflow")
    except metadata.PackageNotFoundError:
        return "unknown"


def models_txt(names: list[str]) -> str:
    """As many whole names as fit in one TXT string after `models=` (the count goes in `models_total`)."""
    room, out = TXT_STRING_MAX - len(b"models="), []
    for name in names:
        if len(",".join(out + [name]).encode()) > room:
            break
        out.append(name)
    return ",".join(out)


def txt_record(settings: Settings, api_version: str, models: list[str]) -> dict[str, str]:
    return {"version": api_version, "evenflow": package_version(), "api": "ollama,openai",
            "auth": "1" if settings.api_key else "0", "tls": "1" if settings.host.scheme == "https" else "0",
            "models": models_txt(models), "models_total": str(len(models))}


def advertised_addresses(settings: Settings) -> list[str]:
    """The addresses to announce: the setting, else the bound address, else (0.0.0.0/::) every non-loopback one."""
    if settings.advertise_interfaces:
        return list(settings.advertise_interfaces)
    host = settings.host.host
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:  # a host name: what it resolves to
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        return sorted({str(i[4][0]) for i in infos if not ipaddress.ip_address(i[4][0]).is_loopback})
    if ip.is_loopback:
        return []
    if not ip.is_unspecified:
        return [host]
    import ifaddr  # noqa: PLC0415 - zeroconf's own dependency

    out = []
    for adapter in ifaddr.get_adapters():
        for a in adapter.ips:
            addr = a.ip if isinstance(a.ip, str) else a.ip[0]
            parsed = ipaddress.ip_address(addr)
            if parsed.is_loopback or parsed.is_link_local or (parsed.version == 6 and ip.version == 4):
                continue
            out.append(addr)
    return out


class Advertiser:
    """One `_ollama._tcp` record for this daemon; `refresh()` re-reads the model list and updates the TXT."""

    def __init__(self, settings: Settings, api_version: str, list_models: Callable[[], list[str]]) -> None:
        self.settings = settings
        self.api_version = api_version
        self.list_models = list_models
        self.addresses = advertised_addresses(settings)
        self._zc: Any = None
        self._info: Any = None
        self._lock = asyncio.Lock()
        self._announced = 0.0  # monotonic time the last announcement finished

    async def start(self) -> bool:
        """Register (probing for a unique name); False, with a logged reason, when nothing is advertised."""
        from zeroconf import IPVersion  # noqa: PLC0415 - only daemons that advertise need zeroconf loaded
        from zeroconf.asyncio import AsyncZeroconf  # noqa: PLC0415

        if not self.addresses:
            log.warning("not advertising on the LAN: the daemon listens on loopback only (%s); set "
                        "EVENFLOW_ADVERTISE_INTERFACES to announce on chosen interfaces", self.settings.host.host)
            return False
        v6 = any(ipaddress.ip_address(a).version == 6 for a in self.addresses)
        v4 = any(ipaddress.ip_address(a).version == 4 for a in self.addresses)
        ipv = IPVersion.All if v4 and v6 else IPVersion.V6Only if v6 else IPVersion.V4Only
        self._zc = AsyncZeroconf(interfaces=self.addresses, ip_version=ipv)
        try:
            models = await asyncio.to_thread(self.list_models)
            self._info = self._service_info(models)
            await (await self._zc.async_register_service(self._info, allow_name_change=True))
            self._announced = time.monotonic()
        except BaseException:
            self._info = None
            await self.close()
            raise
        log.info("advertising %s on %s (port %d)", self._info.name, ", ".join(self.addresses),
                 self.settings.host.port)
        return True

    def _service_info(self, models: list[str], name: str | None = None) -> Any:
        from zeroconf.asyncio import AsyncServiceInfo  # noqa: PLC0415

        host = socket.gethostname().split(".")[0] or "host"
        port = self.settings.host.port
        return AsyncServiceInfo(SERVICE_TYPE, name or f"evenflow on {host} ({port}).{SERVICE_TYPE}", port=port,
                                properties=txt_record(self.settings, self.api_version, models),
                                server=f"evenflow-{host}-{port}.local.", parsed_addresses=self.addresses)

    async def refresh(self) -> None:
        """Re-announce when the model list changed (after a create, copy, delete)."""
        async with self._lock:
            if self._info is None:
                return
            await asyncio.sleep(max(0.0, self._announced + ANNOUNCE_SPACING_S - time.monotonic()))
            models = await asyncio.to_thread(self.list_models)
            info = self._service_info(models, self._info.name)
            if info.properties == self._info.properties:
                return
            self._info = info
            await (await self._zc.async_update_service(info))
            self._announced = time.monotonic()
            log.info("advertised model list updated (%d models)", len(models))

    async def close(self) -> None:
        """Withdraw the record (goodbye packets, so browsers drop it at once) and stop zeroconf."""
        async with self._lock:
            if self._zc is None:
                return
            try:
                if self._info is not None:
                    await (await self._zc.async_unregister_service(self._info))
            finally:
                await self._zc.async_close()
                self._zc = self._info = None
