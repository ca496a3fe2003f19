"""Pull and push over Ollama's registry protocol (OCI distribution: manifests, blobs, blob uploads).

Both are iterators of Ollama's ProgressResponse dicts (`status`, `digest`, `total`, `completed`) so the HTTP
layer streams them as they come; a failure raises RegistryError (or DownloadError) with Ollama's wording.
"""
from __future__ import annotations

import logging
import platform
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator
from urllib.parse import urljoin, urlsplit

import httpx

from .download import BlobDownload, DownloadError
from .store_errors import StoreError
from .manifest import MANIFEST_MEDIA_TYPE, Layer, Manifest, ManifestError
from .names import InvalidName, ModelName, name_scheme, parse_name

if TYPE_CHECKING:
    from .store import ModelStore

log = logging.getLogger(__name__)

PROGRESS_EVERY_S = 0.06  # Ollama's progress tick
UPLOAD_CHUNK = 8 << 20
USER_AGENT = f"evenflow ({platform.machine()} {platform.system().lower()})"


class RegistryError(StoreError):
    """The registry refused or could not be reached; the message names the host."""


def registry_scheme(name: str, insecure: bool) -> str:
    """https, unless the name itself says http:// — which, as in Ollama, needs `insecure`.

    Ollama (server/images.go, makeRequest) also turns every request into plain http when `insecure` is set, even to
    registry.ollama.ai; Open WebUI sends `insecure: true` on every pull, so that would put every pull on the wire
    unauthenticated, where anyone on the path can swap the manifest. Here `insecure` only permits a registry the
    user named with http:// (a plain-HTTP registry in development). It never relaxes certificate checks: Ollama
    has no such switch either."""
    if name_scheme(name) == "http":
        if not insecure:
            raise InvalidName(f"insecure protocol http: {name!r} names a plain-HTTP registry; set insecure "
                              "(--insecure) to use it")
        return "http"
    return "https"


def base_url(name: ModelName, scheme: str) -> str:
    return f"{scheme}://{name.host}"


def _progress(status: str, digest: str | None = None, total: int | None = None,
              completed: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"status": status}
    if digest:
        out["digest"] = digest
    if total:
        out["total"] = total
    if completed:  # omitempty, as Ollama's ProgressResponse
        out["completed"] = completed
    return out


def _client(timeout: float = 30.0) -> httpx.Client:
    return httpx.Client(timeout=httpx.Timeout(timeout), headers={"User-Agent": USER_AGENT}, follow_redirects=True)


def _request(client: httpx.Client, method: str, url: str, what: str, **kw: Any) -> httpx.Response:
    try:
        return client.request(method, url, **kw)
    except httpx.TransportError as e:
        host = urlsplit(url).netloc
        hint = (f" (a plain-HTTP registry is named http://{host}/... and needs insecure)"
                if url.startswith("https:") and isinstance(e, httpx.ConnectError) else "")
        raise RegistryError(f"{what}: cannot reach the registry at {host}: {e or type(e).__name__}{hint}") from e


def _fail(r: httpx.Response, what: str) -> RegistryError:
    if r.status_code == 401:
        return RegistryError(f"{what}: {urlsplit(str(r.url)).netloc} asks for authentication, which evenflow "
                             "does not support yet")
    return RegistryError(f"{what}: {r.status_code}: {r.text.strip()[:300]}")


def fetch_manifest(name: ModelName, scheme: str) -> bytes:
    """GET the manifest bytes (kept verbatim: the model digest is their sha256)."""
    url = f"{base_url(name, scheme)}/v2/{name.namespace}/{name.model}/manifests/{name.tag}"
    with _client() as c:
        r = _request(c, "GET", url, "pull model manifest", headers={"Accept": MANIFEST_MEDIA_TYPE})
    if r.status_code == 404:
        raise RegistryError("pull model manifest: file does not exist")
    if r.status_code >= 400:
        raise _fail(r, "pull model manifest")
    return r.content


def direct_blob_url(name: ModelName, digest: str, scheme: str) -> str:
    """Follow same-host redirects; stop at the first one to another host (a CDN) and use its URL, as Ollama."""
    url = f"{base_url(name, scheme)}/v2/{name.namespace}/{name.model}/blobs/{digest}"
    host = urlsplit(url).netloc
    with httpx.Client(timeout=httpx.Timeout(30.0), headers={"User-Agent": USER_AGENT}) as c:
        for _ in range(10):
            try:
                with c.stream("GET", url) as r:
                    if r.is_redirect:
                        nxt = urljoin(url, r.headers["location"])
                        if urlsplit(nxt).netloc != host:
                            return nxt
                        url = nxt
                        continue
                    if r.status_code >= 400:
                        r.read()
                        raise _fail(r, f"pull blob {digest[7:19]}")
                    return url
            except httpx.TransportError as e:
                raise RegistryError(f"pull blob: cannot reach {urlsplit(url).netloc}: {e}") from e
    raise RegistryError(f"pull blob {digest[7:19]}: too many redirects")


def wait_download(dl: BlobDownload, label: str) -> Iterator[dict[str, Any]]:
    """Progress lines every tick until the (possibly shared) download ends; raises its error. `dl` comes from
    `downloads.get`, which counted this puller: leaving (closing the iterator: the client went away) releases it,
    and the download stops once no puller is left."""
    try:
        while not dl.done.wait(PROGRESS_EVERY_S):
            yield _progress(label, dl.digest, dl.total, dl.completed)
    finally:
        dl.release()
    if dl.error is not None:
        raise dl.error
    yield _progress(label, dl.digest, dl.total, dl.total)


class PullSteps:
    """A pull's progress lines; once its manifest is read, `sizes` holds the size of every blob it needs (so a
    watcher can show one total from the start rather than a sum that grows layer by layer)."""

    def __init__(self, make: Callable[[dict[str, int]], Iterator[dict[str, Any]]]) -> None:
        self.sizes: dict[str, int] = {}
        self._it = make(self.sizes)

    def __iter__(self) -> "PullSteps":
        return self

    def __next__(self) -> dict[str, Any]:
        return next(self._it)

    def close(self) -> None:
        self._it.close()


def pull(store: "ModelStore", name: str, insecure: bool = False) -> PullSteps:
    """Validate the name now; the returned iterator performs the pull, yielding Ollama's progress lines."""
    mn = parse_name(name)
    scheme = registry_scheme(name, insecure)
    return PullSteps(lambda sizes: _pull(store, mn, scheme, sizes))


def _pull(store: "ModelStore", mn: ModelName, scheme: str, sizes: dict[str, int]) -> Iterator[dict[str, Any]]:
    yield _progress("pulling manifest")
    raw = fetch_manifest(mn, scheme)
    try:
        manifest = Manifest.from_bytes(raw)
    except ManifestError as e:
        raise RegistryError(f"pull model manifest: {mn.host} sent an invalid manifest: {e}") from e
    sizes.update({layer.digest: layer.size for layer in [*manifest.layers, manifest.config]})
    for layer in [*manifest.layers, manifest.config]:
        yield from pull_blob(store, mn, layer, scheme)
    yield _progress("verifying sha256 digest")  # each blob was hashed before it got its final name
    yield _progress("writing manifest")
    removed = store.write_manifest_bytes(mn, raw)
    if removed:
        yield _progress("removing unused layers")
    yield _progress("success")


def pull_blob(store: "ModelStore", mn: ModelName, layer: Layer, scheme: str) -> Iterator[dict[str, Any]]:
    label = f"pulling {layer.digest[7:19]}"
    if store.has_blob(layer.digest):
        yield _progress(label, layer.digest, layer.size, layer.size)
        return
    dl = store.downloads.get(layer.digest, layer.size, lambda: direct_blob_url(mn, layer.digest, scheme))
    try:
        yield from wait_download(dl, label)
    except DownloadError as e:
        raise RegistryError(str(e)) from e


def push(store: "ModelStore", name: str, insecure: bool = False) -> Iterator[dict[str, Any]]:
    """Validate now; the iterator uploads missing blobs (HEAD, POST, PATCH, PUT) then PUTs the manifest."""
    mn = parse_name(name)
    scheme = registry_scheme(name, insecure)
    found = store.manifest_bytes(mn)  # ModelNotFound before any network
    return _push(store, mn, found, scheme)


def _push(store: "ModelStore", mn: ModelName, raw: bytes, scheme: str) -> Iterator[dict[str, Any]]:
    yield _progress("retrieving manifest")
    manifest = Manifest.from_bytes(raw)
    repo = f"{base_url(mn, scheme)}/v2/{mn.namespace}/{mn.model}"
    with _client(timeout=300) as c:
        for layer in [*manifest.layers, manifest.config]:
            label = f"pushing {layer.digest[7:19]}"
            r = _request(c, "HEAD", f"{repo}/blobs/{layer.digest}", "push")
            if r.status_code == 200:
                yield _progress(label, layer.digest, layer.size, layer.size)
                continue
            yield _progress(label, layer.digest, layer.size)
            yield from _upload(c, repo, store, layer, label)
        yield _progress("pushing manifest")
        r = _request(c, "PUT", f"{repo}/manifests/{mn.tag}", "push manifest", content=raw,
                     headers={"Content-Type": MANIFEST_MEDIA_TYPE})
        if r.status_code >= 400:
            raise _fail(r, "push manifest")
    yield _progress("success")


def _upload(c: httpx.Client, repo: str, store: "ModelStore", layer: Layer, label: str) -> Iterator[dict[str, Any]]:
    r = _request(c, "POST", f"{repo}/blobs/uploads/", "push")
    if r.status_code >= 400:
        raise _fail(r, "push: start upload")
    loc = r.headers.get("docker-upload-location") or r.headers.get("location")
    if not loc:
        raise RegistryError(f"push: {urlsplit(repo).netloc} gave no upload location")
    loc = urljoin(repo + "/", loc)
    done, last = 0, time.monotonic()
    with open(store.blob_path(layer.digest), "rb") as f:
        while chunk := f.read(UPLOAD_CHUNK):
            r = _request(c, "PATCH", loc, "push", content=chunk, headers={
                "Content-Type": "application/octet-stream",
                "Content-Range": f"{done}-{done + len(chunk) - 1}"})
            if r.status_code >= 400:
                raise _fail(r, f"push blob {layer.digest[7:19]}")
            loc = urljoin(loc, r.headers.get("location") or loc)
            done += len(chunk)
            if time.monotonic() - last >= PROGRESS_EVERY_S:
                last = time.monotonic()
                yield _progress(label, layer.digest, layer.size, done)
    sep = "&" if urlsplit(loc).query else "?"
    r = _request(c, "PUT", f"{loc}{sep}digest={layer.digest}", "push")
    if r.status_code >= 400:
        raise _fail(r, f"push blob {layer.digest[7:19]}")
    yield _progress(label, layer.digest, layer.size, layer.size)
