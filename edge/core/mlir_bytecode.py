"""The framing of an MLIR bytecode file (a Core AI program's `main.mlirb`), checked without
parsing it: the magic number, the version, the producer, then sections that must cover the
file exactly, each present at most once, the ones every module has all there.

Why by hand: Core AI's runtime parses the file in native code and aborts the process (SIGABRT,
nothing said) on one that ends early, so the runtime checks the framing first; no Python
library reads MLIR's bytecode framing. The format is MLIR's (mlir/docs/BytecodeFormat.md):

    file    = "ML\\xefR" varint(version) producer-string-NUL section*
    section = byte(id | aligned << 7) varint(length) [varint(alignment) 0xCB-padding] data
"""

from __future__ import annotations

from pathlib import Path

MAGIC = b"ML\xefR"
PADDING = 0xCB
# section ids every module's bytecode has: strings, dialects, attributes and types, their
# offsets, the IR, and from version 5 (native properties encoding) the properties; resources
# (5) and their offsets (6) come together where a module has any
REQUIRED = {0: "string", 1: "dialect", 2: "attribute/type", 3: "attribute/type offset",
            4: "IR"}
PROPERTIES, PROPERTIES_FROM_VERSION = 8, 5
PAIRED = (5, 6)
MAX_SECTION_ID = 127  # 7 bits
MAX_PRODUCER = 256    # "MLIR22.0.0git": a longer one is not a producer string


class FramingError(ValueError):
    """The bytes are not a whole MLIR bytecode file; the message says where and why."""


def _varint(f, what: str) -> int:
    """MLIR's prefix varint: the first byte's trailing zeros count the bytes that follow (a
    zero first byte: eight follow)."""
    first = f.read(1)
    if not first:
        raise FramingError(f"ends inside {what}")
    if first[0] & 1:
        return first[0] >> 1
    extra = 8 if first[0] == 0 else (first[0] & -first[0]).bit_length() - 1
    rest = f.read(extra)
    if len(rest) != extra:
        raise FramingError(f"ends inside {what}")
    if first[0] == 0:
        return int.from_bytes(rest, "little")
    return int.from_bytes(first + rest, "little") >> (extra + 1)


def sections(path: Path) -> tuple[int, list[tuple[int, int, int]]]:
    """The bytecode's version and its sections as (id, offset of the section's header, offset
    past its data), in file order; raises FramingError where they do not cover the file exactly
    (only the headers are read)."""
    size = path.stat().st_size
    found: list[tuple[int, int, int]] = []
    with open(path, "rb") as f:
        if f.read(4) != MAGIC:
            raise FramingError("does not begin with MLIR bytecode's magic number")
        version = _varint(f, "the version")
        start = f.tell()
        producer = f.read(MAX_PRODUCER)
        if (end := producer.find(b"\0")) < 0:
            raise FramingError("ends inside the producer string" if len(producer) < MAX_PRODUCER
                               else "has no producer string")
        f.seek(start + end + 1)
        while (at := f.tell()) < size:
            header = f.read(1)[0]
            section, aligned = header & MAX_SECTION_ID, header >> 7
            what = f"section {section} (at byte {at})"
            if any(s == section for s, _, _ in found):
                raise FramingError(f"has {what} twice")
            length = _varint(f, f"the length of {what}")
            if aligned:
                alignment = _varint(f, f"the alignment of {what}")
                # bounded by the file, or the padding's read would be unbounded
                if alignment < 1 or alignment & (alignment - 1) or alignment > size:
                    raise FramingError(f"gives {what} an alignment of {alignment}")
                padding = f.read(-f.tell() % alignment)
                if any(b != PADDING for b in padding) or f.tell() % alignment:
                    raise FramingError(f"pads {what} with bytes other than 0xCB")
            if f.tell() + length > size:
                raise FramingError(f"ends {f.tell() + length - size} bytes before the end of "
                                   f"{what} ({length} bytes): truncated")
            f.seek(length, 1)
            found.append((section, at, f.tell()))
    return version, found


def check_framing(path: Path) -> None:
    """Raise FramingError unless `path` is whole MLIR bytecode: sections that cover it exactly,
    every one a module has among them (a cut on a section's boundary leaves whole sections)."""
    version, found = sections(path)
    seen = {section for section, _, _ in found}
    required = REQUIRED | ({PROPERTIES: "properties"}
                           if version >= PROPERTIES_FROM_VERSION else {})
    missing = [f"{name} ({i})" for i, name in required.items() if i not in seen]
    if missing:
        raise FramingError(f"has no {', '.join(missing)} section: truncated")
    if (PAIRED[0] in seen) != (PAIRED[1] in seen):
        raise FramingError("has resources without their offsets (sections 5 and 6): truncated")
