"""Where a web package's page gets onnxruntime-web, the engine of its wasm path, pinned by
digest.

The page runs blocks through onnxruntime-web's wasm provider where that beats our WebGPU
kernels (no WebGPU at all, or a software adapter). It needs three files of one release: the
entry module `ort.wasm.min.mjs`, and the glue module and WebAssembly binary that module
loads. The manifest records where they are and each one's size and SHA-256; the page fetches
each, checks it, and only then imports from the checked bytes. (Subresource Integrity by
hand: a dynamic `import()` and onnxruntime's own fetch of its .wasm take no integrity
attribute.)

By default the files come from the official CDN URL of the pinned version; `--ort-url` names
another https location, and `--bundle-ort DIR` copies them into the package (`ort/`) so the
page works offline. Plain http is taken only for a loopback host (a local test server).
"""

from __future__ import annotations

import hashlib
import ipaddress
import shutil
from pathlib import Path
from urllib.parse import urlsplit

from edge.core.package import file_entry

ORT_VERSION = "1.30.0"
DEFAULT_ORT_URL = f"https://cdn.jsdelivr.net/npm/onnxruntime-web@{ORT_VERSION}/dist/"
# file name -> (bytes, sha256) in onnxruntime-web 1.30.0's npm dist
ORT_FILES = {
    "ort.wasm.min.mjs": (
        50126, "219e6a1fc8a9938268d18efca3c91d310bd2f4a59bbd13744df5b2b7fc6cee3b"),
    "ort-wasm-simd-threaded.mjs": (
        24381, "e13f7f94fc51b4ca72b12faeb1ee95f4ace6dfbc8939bc718aabdc0a27c4299b"),
    "ort-wasm-simd-threaded.wasm": (
        14239897, "3398c10d07d229bd91b364548e130e0e51a8e5704b88c7c083ebbeb78842dee2"),
}
LICENSE = "LICENSE"             # onnxruntime-web's MIT license, shipped beside a bundled copy
BUNDLE_DIR = "ort"              # where --bundle-ort puts the files inside the package


class OrtLocationError(ValueError):
    """An --ort-url or --bundle-ort the page could not use; the message names the value or
    file."""


def _loopback(host: str | None) -> bool:
    if host == "localhost":
        return True
    try:
        return host is not None and ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_ort_url(url: str) -> str:
    """`url` as the folder URL the page resolves file names against (with a trailing
    slash), or OrtLocationError: not https (http only on a loopback host), or no host."""
    parts = urlsplit(url)
    if not parts.netloc or parts.scheme not in ("https", "http"):
        raise OrtLocationError(f"--ort-url {url!r}: expected an https URL of onnxruntime-web "
                               f"{ORT_VERSION}'s dist folder, e.g. {DEFAULT_ORT_URL}")
    if parts.scheme == "http" and not _loopback(parts.hostname):
        raise OrtLocationError(f"--ort-url {url!r}: not https; a page would run code fetched "
                               "in the clear (plain http is taken only for localhost)")
    if parts.query or parts.fragment:
        raise OrtLocationError(f"--ort-url {url!r}: a folder URL takes no query or fragment")
    return url if url.endswith("/") else url + "/"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_bundle(folder: Path) -> None:
    """Refuse a --bundle-ort folder that lacks a file the page needs, or holds another
    version's (size or sha256 differs), naming the file."""
    if not folder.is_dir():
        raise OrtLocationError(f"--bundle-ort {folder}: no such folder (give onnxruntime-web "
                               f"{ORT_VERSION}'s dist folder)")
    for name, (size, sha256) in ORT_FILES.items():
        path = folder / name
        if not path.is_file():
            raise OrtLocationError(f"--bundle-ort {folder}: {name} is missing; the page needs "
                                   f"{', '.join(ORT_FILES)} of onnxruntime-web {ORT_VERSION}")
        if path.stat().st_size != size or _sha256(path) != sha256:
            raise OrtLocationError(f"--bundle-ort {folder}: {path} is not onnxruntime-web "
                                   f"{ORT_VERSION}'s {name} (size or sha256 differs)")
    if not (folder / LICENSE).is_file():
        raise OrtLocationError(f"--bundle-ort {folder}: {LICENSE} is missing; onnxruntime-web's "
                               "license must ship with a copy of it")


def ort_location(root: Path, url: str | None = None,
                 bundle: Path | None = None) -> tuple[dict, list[dict]]:
    """The manifest's `web.ort` record and the file records of what was copied into `root`
    (a bundled copy: verified like every other file of the package)."""
    files = [{"name": n, "bytes": size, "sha256": sha} for n, (size, sha) in ORT_FILES.items()]
    record = {"version": ORT_VERSION, "files": files}
    if bundle is None:
        return record | {"base": check_ort_url(url or DEFAULT_ORT_URL), "bundled": False}, []
    check_bundle(bundle)
    dest = root / BUNDLE_DIR
    dest.mkdir(parents=True)
    copied = []
    for name in [*ORT_FILES, LICENSE]:
        shutil.copyfile(bundle / name, dest / name)
        copied.append(file_entry(root, dest / name))
    return record | {"base": f"{BUNDLE_DIR}/", "bundled": True}, copied
