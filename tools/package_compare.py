"""Compare two exported packages file by file, as a refactoring must leave them.

    python tools/package_compare.py OLD_PACKAGE NEW_PACKAGE

Some bytes of a package say when or where it was made, not what it computes, so two exports
of one model differ as files though nothing changed:
- an ONNX graph made before edge stripped it holds each node's Python stack trace (the
  exporting checkout's absolute paths) and its modules' qualified names in node metadata;
- a Core ML program (`model.mlmodel`) holds its conversion date among metadata that
  coremltools serialises in no fixed order, and an `.mlpackage`'s Manifest.json names its
  items by random UUIDs.
- a Core AI model (`.aimodel/`) holds its creation date, and its MLIR bytecode random symbol
  and resource names: no two exports of it are alike, so its files are only counted, and
  what the export measured of them (each block's executed error against PyTorch, the
  end-to-end figures, in the package's manifest) is compared instead.
This compares what a package computes and stores: every file byte for byte, except that a graph is
compared less its metadata (model, graph and node metadata_props, as exporters/shared/onnx_graph.py
clears them), a Core ML program less its conversion date and in a canonical serialisation, an
.mlpackage manifest by its items less their identifiers, and the package's manifest less the sizes
and digests of the files compared so. It prints one line a differing file and a summary; exit status
1 when anything differs.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import onnx


def graph_digest(path: Path) -> str:
    """sha256 of an ONNX graph less the metadata torch.onnx writes: the exporter's own
    digest of what a graph computes, over the graph with its nodes' metadata cleared as
    the exporter now writes it (graphs made before it did still hold theirs)."""
    from edge.exporters.shared.onnx_graph import model_digest, strip_node_metadata

    model = onnx.load(str(path), load_external_data=False)
    strip_node_metadata(model)
    return model_digest(model)


CONVERSION_DATE = "com.github.apple.coremltools.conversion_date"


def coreml_program_digest(path: Path) -> str:
    """sha256 of a Core ML program less its conversion date, serialised deterministically."""
    from coremltools.proto import Model_pb2

    spec = Model_pb2.Model()
    spec.ParseFromString(path.read_bytes())
    spec.description.metadata.userDefined.pop(CONVERSION_DATE, None)
    return hashlib.sha256(spec.SerializeToString(deterministic=True)).hexdigest()


def mlpackage_items(path: Path) -> list:
    """An .mlpackage's Manifest.json as its items (and which is the root), less their random
    identifiers."""
    manifest = json.loads(path.read_text())
    items = manifest.get("itemInfoEntries", {})
    root = items.get(manifest.get("rootModelIdentifier"), {}).get("path")
    return [manifest.get("fileFormatVersion"), root,
            sorted(json.dumps(v, sort_keys=True) for v in items.values())]


def not_compared(path: Path) -> bool:
    return True


# the files compared by what they hold rather than byte for byte, and how
def _comparer(name: str):
    if ".aimodel/" in name:
        return not_compared
    if name.endswith(".onnx"):
        return graph_digest
    if name.endswith(".mlmodel"):
        return coreml_program_digest
    if name.endswith(".mlpackage/Manifest.json"):
        return mlpackage_items
    return None


def manifest_less_graph_digests(path: Path) -> dict:
    """The manifest without its own digest and without the bytes and sha256 of the files
    compared by what they hold (graphs, Core ML programs and package manifests)."""
    manifest = json.loads(path.read_text())
    manifest.pop("manifest_sha256", None)

    def walk(value):
        if isinstance(value, dict):
            if _comparer(str(value.get("path", ""))) is not None:
                value = {k: v for k, v in value.items() if k not in ("bytes", "sha256")}
            # a Core AI block's bytes are its model file's, random names included
            if any(".aimodel/" in str(f.get("path", "")) for f in value.get("files", [])
                   if isinstance(f, dict)):
                value = {k: v for k, v in value.items() if k != "weight_bytes"}
            # how long a step took is never the same twice
            return {k: walk(v) for k, v in value.items() if not k.endswith("_seconds")}
        if isinstance(value, list):
            return [walk(v) for v in value]
        return value

    return walk(manifest)


def differences(old: dict, new: dict, where: str = "") -> list[str]:
    """Key paths at which two JSON values differ."""
    if isinstance(old, dict) and isinstance(new, dict):
        found = []
        for key in sorted(set(old) | set(new), key=str):
            if key not in old or key not in new:
                found.append(f"{where}/{key}: only in {'new' if key in new else 'old'}")
            else:
                found += differences(old[key], new[key], f"{where}/{key}")
        return found
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [d for i, (a, b) in enumerate(zip(old, new, strict=True))
                for d in differences(a, b, f"{where}[{i}]")]
    return [] if old == new else [f"{where}: {old!r:.80} -> {new!r:.80}"]


def compare(old_root: Path, new_root: Path) -> tuple[list[str], dict[str, int]]:
    """(one line per difference, counts of files alike byte for byte and less metadata)."""
    def files(root: Path) -> set[str]:
        return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}

    old_files, new_files = files(old_root), files(new_root)
    lines = [f"{name}: only in {'new' if name in new_files else 'old'}"
             for name in sorted(old_files ^ new_files)]
    counts = {"bytes": 0, "less metadata": 0, "not comparable": 0}
    for name in sorted(old_files & new_files):
        old, new = old_root / name, new_root / name
        if old.read_bytes() == new.read_bytes():
            counts["bytes"] += 1
        elif _comparer(name) is not_compared:
            counts["not comparable"] += 1
        elif (same := _comparer(name)) is not None:
            if same(old) == same(new):
                counts["less metadata"] += 1
            else:
                lines.append(f"{name}: differs in what it holds")
        elif name == "manifest.json":
            found = differences(manifest_less_graph_digests(old),
                                manifest_less_graph_digests(new))
            if found:
                lines += [f"{name}{d}" for d in found]
            else:
                counts["less metadata"] += 1
        else:
            lines.append(f"{name}: differs")
    return lines, counts


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    lines, counts = compare(Path(argv[0]), Path(argv[1]))
    for line in lines:
        print(line)
    print(f"{counts['bytes']} files alike byte for byte, {counts['less metadata']} alike "
          f"less when and where they were made, {counts['not comparable']} Core AI files not "
          f"comparable (their measurements in the manifest are), {len(lines)} differences")
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
