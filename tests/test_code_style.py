"""The project's own JavaScript and Swift stay within 100 columns, the limit ruff holds the
Python to (pyproject.toml: line-length = 100).

A line rule in place of a formatter. The JavaScript has none to run here: prettier and eslint
come from the npm registry, which this project's machines do not reach. The Swift toolchain
does ship one (`swift format`, swift-format, in /opt/swift/usr/bin), but it rewrites every file
to its own layout (indentation, wrapping, spacing); adopting it is a change of its own, and
this test holds the one rule both languages' files were reflowed to (by hand, no behaviour
changed).

Columns are characters, not bytes: Python's len() of the decoded line without its newline.
Checked: runtimes/web/ and web_demo/ (.js, .mjs), runtimes/swift/ and ios_demo/ (.swift).
Not checked: third-party files vendored as they ship (runtimes/web/vendor/) and build outputs
(.build/, node_modules/). Generated files are checked like the rest: their generators wrap at
100 columns (tests/test_web_mirrors.py for prompt_clean_tables.js, tools/noise_wasm.py for
noise_wasm.js, tests/swift_html_entities.py for HTMLEntities.swift).
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LIMIT = 100
# folder -> the suffixes of the project's own code in it
ROOTS = {
    "runtimes/web": (".js", ".mjs"),
    "web_demo": (".js", ".mjs"),
    "runtimes/swift": (".swift",),
    "ios_demo": (".swift",),
}
# folders holding code that is not the project's: vendored libraries, build outputs
NOT_OURS = {"vendor", ".build", "node_modules"}


def project_files() -> list[Path]:
    files = []
    for folder, suffixes in ROOTS.items():
        for path in sorted((REPO / folder).rglob("*")):
            parts = path.relative_to(REPO).parts
            if path.suffix in suffixes and path.is_file() and not NOT_OURS.intersection(parts):
                files.append(path)
    return files


def long_lines(path: Path) -> list[tuple[int, int]]:
    """(line number, columns) of each line of `path` longer than LIMIT characters."""
    lines = path.read_text(encoding="utf-8").split("\n")
    widths = (len(line.removesuffix("\r")) for line in lines)
    return [(number, width) for number, width in enumerate(widths, 1) if width > LIMIT]


def test_the_checked_folders_hold_javascript_and_swift():
    """A moved or renamed folder fails here rather than leaving the rule checking nothing."""
    files = project_files()
    suffixes = {path.suffix for path in files}
    assert {".js", ".swift"} <= suffixes, suffixes
    assert not any("vendor" in path.parts for path in files)
    for folder in ROOTS:
        assert any(path.is_relative_to(REPO / folder) for path in files), folder


def test_no_javascript_or_swift_line_is_longer_than_100_columns():
    too_long = [f"{path.relative_to(REPO)}:{number}: {width} columns"
                for path in project_files() for number, width in long_lines(path)]
    assert not too_long, (
        f"{len(too_long)} lines over {LIMIT} columns (break them at commas, operators or "
        "arguments; split strings by concatenation; for a generated file, change its "
        "generator):\n" + "\n".join(too_long))
