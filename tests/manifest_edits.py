"""Helpers for tests that edit an exported manifest the way a faulty exporter would."""
import json

from edge.core.package import MANIFEST, write_manifest


def block_record(m: dict, comp: str = "transformer", name: str = "pair_1") -> dict:
    """The manifest record of one block."""
    c = next(c for c in m["components"] if c["name"] == comp)
    return next(b for b in c["blocks"] if b["name"] == name)


def rewrite(root, change) -> None:
    """Change the manifest in place; its own digest stays consistent."""
    m = json.loads((root / MANIFEST).read_text())
    change(m)
    write_manifest(root, m)
