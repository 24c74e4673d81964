"""The edge package: a folder with `manifest.json` and the files it lists.

One format for every target (ONNX, CoreML, WebGPU); docs/package-format.md is its reference.
This module reads and verifies a package (before anything runs) and writes one atomically.
It imports neither torch nor onnx, so runtimes can use it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

FORMAT = "edge-package"
TENSOR_ALIGN = 64          # tensors start 64-byte aligned: NumPy views stay SIMD-friendly
FILE_ALIGN = 4096          # weight files are whole pages: O_DIRECT needs aligned lengths
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
READ_CHUNK = 8 << 20


class PackageError(ValueError):
    """A package that must not run; the message names the file and the problem."""


def align(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def weights_layout(sizes: dict[str, int]) -> tuple[dict[str, int], int]:
    """Offsets of tensors of the given byte sizes packed into one weights file, and the
    file's size: the flash layout every target shares."""
    offsets, offset = {}, 0
    for name, n in sizes.items():
        offsets[name] = offset
        offset = align(offset + n, TENSOR_ALIGN)
    return offsets, align(max(offset, 1), FILE_ALIGN)


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(READ_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def file_entry(root: Path, path: Path) -> dict:
    """The manifest record of one file: package-relative POSIX path, byte size, sha256."""
    return {"path": path.relative_to(root).as_posix(), "bytes": path.stat().st_size,
            "sha256": sha256_of(path)}


def resolve_inside(root: Path, relative: str, where: str) -> Path:
    """`root/relative`, refusing absolute paths and any path that escapes `root`."""
    rel = PurePosixPath(relative)
    if rel.is_absolute() or ".." in rel.parts or not rel.parts:
        raise PackageError(f"{where}: file path {relative!r} escapes the package folder")
    path = (root / rel).resolve()
    if not path.is_relative_to(root.resolve()):
        raise PackageError(f"{where}: file path {relative!r} escapes the package folder")
    return path


def _require(obj: dict, key: str, kind: type | tuple[type, ...], where: str):
    if not isinstance(obj, dict) or key not in obj:
        raise PackageError(f"{where}: missing field {key!r}")
    if not isinstance(obj[key], kind):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise PackageError(f"{where}: field {key!r} must be {names}, got "
                           f"{type(obj[key]).__name__}")
    return obj[key]


def iter_files(manifest: dict) -> Iterator[tuple[str, dict]]:
    """Every file record in the manifest, with where it sits (for error messages)."""
    tok = _require(manifest, "tokenizer", dict, MANIFEST)
    for i, f in enumerate(_require(tok, "files", list, f"{MANIFEST} tokenizer")):
        yield f"{MANIFEST} tokenizer.files[{i}]", f
    for name, f in manifest.get("conditioning", {}).items():
        yield f"{MANIFEST} conditioning.{name}", f
    for comp in _require(manifest, "components", list, MANIFEST):
        cname = _require(comp, "name", str, f"{MANIFEST} components[]")
        for block in _require(comp, "blocks", list, f"{MANIFEST} component {cname}"):
            bname = _require(block, "name", str, f"{MANIFEST} component {cname} blocks[]")
            where = f"{MANIFEST} block {cname}/{bname}"
            for i, f in enumerate(_require(block, "files", list, where)):
                yield f"{where} files[{i}]", f


def validate_manifest(manifest: dict) -> None:
    """Structure and version checks; raises PackageError naming the field."""
    if _require(manifest, "format", str, MANIFEST) != FORMAT:
        raise PackageError(f"{MANIFEST}: field 'format' is {manifest['format']!r}, "
                           f"expected {FORMAT!r}")
    version = _require(manifest, "format_version", int, MANIFEST)
    if version != FORMAT_VERSION:
        raise PackageError(f"{MANIFEST}: unknown format_version {version} (this edge reads "
                           f"version {FORMAT_VERSION}); re-export the package with this edge")
    for key in ("producer", "target", "model"):
        _require(manifest, key, str, MANIFEST)
    _require(manifest, "sampler", dict, MANIFEST)
    for where, f in iter_files(manifest):
        _require(f, "path", str, where)
        _require(f, "bytes", int, where)
        digest = _require(f, "sha256", str, where)
        if len(digest) != 64:
            raise PackageError(f"{where}: field 'sha256' is not a sha256 hex digest")


def verify_files(root: Path, manifest: dict, check_hashes: bool = True) -> None:
    """Every listed file exists inside the package with the listed size and sha256."""
    for where, f in iter_files(manifest):
        path = resolve_inside(root, f["path"], where)
        if not path.is_file():
            raise PackageError(f"{path}: missing (listed in {where})")
        size = path.stat().st_size
        if size != f["bytes"]:
            raise PackageError(f"{path}: {size} bytes, manifest says {f['bytes']} "
                               "(truncated or altered)")
        if check_hashes and sha256_of(path) != f["sha256"]:
            raise PackageError(f"{path}: sha256 differs from the manifest (altered or corrupt)")


def read_package(root: str | Path, check_hashes: bool = True) -> dict:
    """Load and fully verify a package's manifest; returns the manifest."""
    root = Path(root)
    path = root / MANIFEST
    if not path.is_file():
        raise PackageError(f"{path}: not found; is {root} an edge package?")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise PackageError(f"{path}: not valid JSON ({err})") from None
    validate_manifest(manifest)
    verify_files(root, manifest, check_hashes)
    return manifest


@contextmanager
def atomic_directory(dest: str | Path) -> Iterator[Path]:
    """Yield a temporary folder beside `dest`; on success it replaces `dest` in one rename.

    On any error the temporary folder is removed and an existing `dest` is left untouched."""
    dest = Path(dest).resolve()
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".partial", dir=dest.parent))
    try:
        yield tmp
        old = None
        if dest.exists():
            old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
            os.rename(dest, old)
        os.rename(tmp, dest)
        if old is not None:
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
