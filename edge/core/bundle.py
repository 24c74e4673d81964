"""Conformance bundles: one generation of a package written down call by call, so another
runtime can check itself against it (`edge record`; the Swift runtime's `Pipeline` and
`edge-sample --bundle` read it). A bundle is a folder:

    bundle.json   what ran and what came of it (below)
    tensors.bin   every array bundle.json refers to, little-endian, back to back

bundle.json:

    {"format": "edge-bundle", "format_version": 1, "producer": "edge X.Y.Z",
     "package": {"target", "model", "manifest_sha256"},   # the package it was recorded from
     "recorded_with": "onnxruntime" | "pytorch (the package's stored weights, fp32)",
     "prompt", "negative_prompt" (null: the learned null caption), "seed" (null: given
     latents), "settings": the sampler settings as run (every field),
     "latents": ref, "frames": ref (uint8 (T, H, W, 3)),
     "trace": {"calls", "transformer_calls", "leap_at", "merged_calls"},
     "calls": [{"key", "inputs": {name: ref}, "outputs": {name: ref}}, ...],
     "tensors": {"path": "tensors.bin", "bytes", "sha256"}}

    ref = {"dtype": "float32" | "int32" | "uint8", "shape": [...], "offset": bytes into
           tensors.bin}

A call's key is the runtime loader's: "component/block", with "#variant" where a variant's
program ran (e.g. "transformer/block_0#tdtm", "vae_decoder/head#first"). An array handed
from one call to the next is stored once, so refs may repeat. A bundle is checked before it
is used: its format, the size and sha256 of tensors.bin, every ref inside it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from edge.core.files import kind_of

FORMAT = "edge-bundle"
FORMAT_VERSION = 1
BUNDLE_JSON = "bundle.json"
TENSORS = "tensors.bin"
DTYPES = ("float32", "int32", "uint8")
MAX_BUNDLE_JSON_BYTES = 256 << 20


class BundleError(ValueError):
    """A folder that is not a usable bundle; the message names the file and what is wrong."""


class TensorFile:
    """Arrays appended to one buffer; an array object seen before (a block's output fed on
    to the next block) is stored once. Integer arrays are kept as int32, the rest as
    float32, uint8 as it is."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.size = 0
        self.seen: dict[int, tuple[np.ndarray, dict]] = {}

    def ref(self, array: np.ndarray) -> dict:
        if id(array) in self.seen:
            return self.seen[id(array)][1]
        if array.dtype == np.uint8:
            dtype = "uint8"
        elif np.issubdtype(array.dtype, np.integer) or array.dtype == np.bool_:
            dtype = "int32"
        else:
            dtype = "float32"
        data = np.ascontiguousarray(array, dtype=np.dtype(dtype).newbyteorder("<")).tobytes()
        ref = {"dtype": dtype, "shape": list(array.shape), "offset": self.size}
        self.parts.append(data)
        self.size += len(data)
        self.seen[id(array)] = (array, ref)  # keeps `array` alive, so its id stays unique
        return ref

    def write(self, path: Path) -> dict:
        """Write the buffer to `path`; returns bundle.json's "tensors" entry."""
        digest = hashlib.sha256()
        with open(path, "wb") as f:
            for part in self.parts:
                f.write(part)
                digest.update(part)
        return {"path": TENSORS, "bytes": self.size, "sha256": digest.hexdigest()}


def write_bundle(folder: Path, fields: dict, tensors: TensorFile) -> None:
    """Write a bundle into `folder` (an empty folder: the caller makes the write atomic)."""
    entry = tensors.write(folder / TENSORS)
    body = {"format": FORMAT, "format_version": FORMAT_VERSION, **fields, "tensors": entry}
    (folder / BUNDLE_JSON).write_text(json.dumps(body))


def identify_bundle(folder: Path) -> str:
    """What the bundle at `folder` is, for a write that would replace it; anything else is
    refused (edge replaces only folders it wrote)."""
    from edge.core.package import not_edges

    try:
        bundle = read_bundle_json(folder)
    except BundleError as err:
        raise not_edges(folder, f"holds files but is not an edge bundle ({err})") from None
    extra = sorted(p.name for p in folder.iterdir() if p.name not in (BUNDLE_JSON, TENSORS))
    if extra:
        raise not_edges(folder, f"an edge bundle, but it also holds {', '.join(extra[:3])}")
    return f"the edge bundle of {bundle['package'].get('model', '?')!s:.80}"


def read_bundle_json(folder: Path) -> dict:
    path = folder / BUNDLE_JSON
    kind = kind_of(path)
    if kind != "a file":
        raise BundleError(f"{path}: is {kind}; a bundle folder holds {BUNDLE_JSON}")
    if path.stat().st_size > MAX_BUNDLE_JSON_BYTES:
        raise BundleError(f"{path}: larger than any bundle description")
    try:
        bundle = json.loads(path.read_bytes())
    except (ValueError, RecursionError) as err:
        raise BundleError(f"{path}: not JSON ({err})") from None
    if not isinstance(bundle, dict) or bundle.get("format") != FORMAT:
        raise BundleError(f'{path}: not an edge bundle (no "format": "{FORMAT}")')
    if bundle.get("format_version") != FORMAT_VERSION:
        raise BundleError(f"{path}: format_version {bundle.get('format_version')!r}; this edge "
                          f"reads version {FORMAT_VERSION}")
    return bundle


class Bundle:
    """A verified bundle: its description and its arrays."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.info = read_bundle_json(self.folder)
        entry = self.info.get("tensors") or {}
        path = self.folder / TENSORS
        if kind_of(path) != "a file":
            raise BundleError(f"{path}: is {kind_of(path)}; the bundle's arrays are missing")
        size = path.stat().st_size
        if size != entry.get("bytes"):
            raise BundleError(f"{path}: {size} bytes, {BUNDLE_JSON} says {entry.get('bytes')} "
                              "(a truncated or changed bundle)")
        self.data = path.read_bytes()
        if hashlib.sha256(self.data).hexdigest() != entry.get("sha256"):
            raise BundleError(f"{path}: sha256 differs from {BUNDLE_JSON}'s (a changed bundle)")
        for where, ref in self._refs():
            self._check(ref, where)

    def _refs(self):
        yield "latents", self.info["latents"]
        yield "frames", self.info["frames"]
        for i, call in enumerate(self.info["calls"]):
            for side in ("inputs", "outputs"):
                for name, ref in call[side].items():
                    yield f"call {i} ({call['key']}) {side[:-1]} {name}", ref

    def _check(self, ref: dict, where: str) -> None:
        if ref.get("dtype") not in DTYPES:
            raise BundleError(f"{self.folder / BUNDLE_JSON} {where}: dtype {ref.get('dtype')!r}")
        count = int(np.prod(ref["shape"], dtype=np.int64))
        end = ref["offset"] + count * np.dtype(ref["dtype"]).itemsize
        if ref["offset"] < 0 or end > len(self.data):
            raise BundleError(f"{self.folder / BUNDLE_JSON} {where}: bytes {ref['offset']}..{end} "
                              f"lie outside {TENSORS} ({len(self.data)} bytes)")

    def array(self, ref: dict) -> np.ndarray:
        dtype = np.dtype(ref["dtype"]).newbyteorder("<")
        count = int(np.prod(ref["shape"], dtype=np.int64))
        flat = np.frombuffer(self.data, dtype=dtype, count=count, offset=ref["offset"])
        return flat.reshape(ref["shape"])

    @property
    def calls(self) -> list[dict]:
        return self.info["calls"]

    @property
    def frames(self) -> np.ndarray:
        return self.array(self.info["frames"])
