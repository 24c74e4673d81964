"""What a package computes and stores, as one digest: the bytes of its graphs, weights,
conditioning and tokenizer, and its manifest less what an export measures (each block's
validation error, the end-to-end PSNR: float rounding that may differ from CPU to CPU) and
its own digest. A move of code must leave it unchanged (issue 79: packages byte for byte
before and after); the digests recorded in package_digests.json say what it was.

Record them again only where a change is meant to change packages:
    EDGE_RECORD_DIGESTS=1 python -m pytest tests/test_family_contract.py -k same_bytes -n 0
"""

from __future__ import annotations

import hashlib
import json
import os
from importlib.metadata import version
from pathlib import Path

RECORDED = Path(__file__).with_name("package_digests.json")
CONTENT = ("graphs", "weights", "conditioning", "tokenizer")
MEASURED = {"validation", "storage_error", "manifest_sha256"}
# what the bytes of a graph depend on besides edge's code
TOOLS = ("torch", "onnx", "onnxscript")


def _stable(value):
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if k not in MEASURED}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


def package_digest(root: Path) -> str:
    digest = hashlib.sha256()
    manifest = json.loads((root / "manifest.json").read_text())
    digest.update(json.dumps(_stable(manifest), sort_keys=True).encode())
    for path in sorted(p for d in CONTENT if (root / d).is_dir()
                       for p in (root / d).rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def tool_versions() -> dict[str, str]:
    """The tools' versions, and the CPU kernels torch picks (a table computed at export, e.g.
    RoPE's, may round differently with other vector instructions)."""
    import torch

    return {name: version(name) for name in TOOLS} | {
        "torch_cpu": torch.backends.cpu.get_cpu_capability()}


def recorded() -> dict:
    return json.loads(RECORDED.read_text()) if RECORDED.exists() else {"tools": {},
                                                                       "packages": {}}


def recording() -> bool:
    return os.environ.get("EDGE_RECORD_DIGESTS") == "1"


def record(name: str, digest: str) -> None:
    """Write `name`'s digest (one process at a time: run the recording without xdist)."""
    book = recorded()
    book["tools"] = tool_versions()
    book["packages"][name] = digest
    book["packages"] = dict(sorted(book["packages"].items()))
    RECORDED.write_text(json.dumps(book, indent=1) + "\n")
