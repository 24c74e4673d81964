"""The Swift runtime as a package an app adds by URL and version: one manifest, at the
repository's root where SwiftPM finds it, naming every target under runtimes/swift, and the
runtime's version and package format the Python side's."""

from __future__ import annotations

import re
from pathlib import Path

import edge
from edge.core.manifest_schema import FORMAT_VERSION

REPO = Path(__file__).resolve().parents[1]
MANIFEST = (REPO / "Package.swift").read_text()
CORE = REPO / "runtimes" / "swift" / "Sources" / "EdgeCore"


def test_the_manifest_is_at_the_root_and_names_every_target_folder():
    assert not (REPO / "runtimes" / "swift" / "Package.swift").exists()  # one manifest
    sources = re.search(r'let sources = "([^"]+)", tests = "([^"]+)"', MANIFEST)
    assert sources, MANIFEST[:800]
    roots = {"sources": REPO / sources[1], "tests": REPO / sources[2]}
    paths = [roots[var] / name for var, name in
             re.findall(r'path: "\\\((sources|tests)\)/([^"]+)"', MANIFEST)]
    names = re.findall(r'\.(?:target|executableTarget|testTarget)\(name: "([^"]+)"', MANIFEST)
    assert [p.name for p in paths] == names and len(names) == 7
    on_disk = {p.name for root in roots.values() for p in root.iterdir() if p.is_dir()}
    assert on_disk == set(names) and all(p.is_dir() for p in paths)


def test_the_runtime_is_versioned_with_edge_and_reads_its_package_format():
    version = re.search(r'public static let runtime = "([^"]+)"',
                        (CORE / "Version.swift").read_text())
    assert version and version[1] == edge.__version__
    reader = (CORE / "Manifest.swift").read_text()
    assert re.search(rf"public static let formatVersion = {FORMAT_VERSION}\n", reader)
    # a package of another format is refused naming both versions
    assert '"format_version \\(header.formatVersion); " +' in reader
    assert '"this runtime reads version \\(formatVersion)"' in reader
