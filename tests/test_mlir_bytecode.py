"""edge/core/mlir_bytecode.py on bytecode built here by MLIR's encoding rules: whole files pass,
every cut and every broken frame is named (the Core AI test runs it on real programs)."""

from __future__ import annotations

import pytest

from edge.core.mlir_bytecode import MAGIC, PADDING, FramingError, check_framing, sections


def varint(value: int) -> bytes:
    """MLIR's prefix varint: n more bytes are announced by n trailing zero bits."""
    for extra in range(8):
        if value < 1 << (7 * (extra + 1)):
            return ((value << (extra + 1)) | (1 << extra)).to_bytes(extra + 1, "little")
    return b"\0" + value.to_bytes(8, "little")


def section(ident: int, data: bytes, at: int, alignment: int = 0) -> bytes:
    """A section whose header begins at byte `at` of the file."""
    if not alignment:
        return bytes([ident]) + varint(len(data)) + data
    head = bytes([ident | 0x80]) + varint(len(data)) + varint(alignment)
    pad = -(at + len(head)) % alignment
    return head + bytes([PADDING]) * pad + data


def bytecode(version: int = 6, skip: tuple[int, ...] = (), twice: int | None = None) -> bytes:
    # lengths that take one, two and three varint bytes; a 64-byte aligned resource section
    out = MAGIC + varint(version) + b"MLIR22.0.0git\0"
    for ident, size, align in ((1, 44, 0), (3, 300, 0), (2, 20000, 0), (4, 5, 0), (6, 9, 0),
                               (5, 700, 64), (0, 130, 0), (8, 3, 0)):
        if ident in skip:
            continue
        out += section(ident, bytes(range(256)) * (size // 256) + bytes(size % 256), len(out),
                       align)
        if ident == twice:
            out += section(ident, b"x", len(out))
    return out


def test_varints_of_every_width_decode_as_mlir_writes_them(tmp_path):
    path = tmp_path / "main.mlirb"
    for width, value in enumerate((5, 300, 20000, 1 << 40, 1 << 62)):
        path.write_bytes(MAGIC + varint(value) + b"p\0")
        assert sections(path) == (value, []), width


def test_a_whole_file_passes_and_lists_its_sections(tmp_path):
    path = tmp_path / "main.mlirb"
    path.write_bytes(data := bytecode())
    version, found = sections(path)
    assert version == 6 and [s for s, _, _ in found] == [1, 3, 2, 4, 6, 5, 0, 8]
    assert found[-1][2] == len(data)
    check_framing(path)


def test_every_cut_is_refused(tmp_path):
    path = tmp_path / "main.mlirb"
    data = bytecode()
    for cut in range(len(data)):
        path.write_bytes(data[:cut])
        with pytest.raises(FramingError):
            check_framing(path)


@pytest.mark.parametrize(("data", "message"), [
    (b"MLIR" + bytecode()[4:], "magic number"),
    (bytecode(skip=(4,)), r"no IR \(4\) section"),
    (bytecode(skip=(8,)), r"no properties \(8\) section"),
    (bytecode(skip=(6,)), "resources without their offsets"),
    (bytecode(twice=3), "section 3 .* twice"),
    (MAGIC + varint(6) + b"p" * 300, "no producer string"),
    (MAGIC + varint(6) + b"p\0" + bytes([5 | 0x80]) + varint(1) + varint(1 << 40) + b"x",
     "section 5 .* an alignment of 1099511627776"),
], ids=["magic", "no IR", "no properties", "no resource offsets", "twice", "producer",
        "alignment past the file"])
def test_a_broken_frame_is_named(tmp_path, data, message):
    path = tmp_path / "main.mlirb"
    path.write_bytes(data)
    with pytest.raises(FramingError, match=message):
        check_framing(path)


def test_before_version_5_no_properties_section_is_needed(tmp_path):
    path = tmp_path / "main.mlirb"
    path.write_bytes(bytecode(version=4, skip=(8,)))
    check_framing(path)


def test_padding_must_be_mlirs(tmp_path):
    path = tmp_path / "main.mlirb"
    path.write_bytes(whole := bytecode())
    at = next(at for ident, at, _ in sections(path)[1] if ident == 5)
    data = bytearray(whole)
    first_pad = at + 1 + len(varint(700)) + len(varint(64))
    assert data[first_pad] == PADDING
    data[first_pad] = 0
    path.write_bytes(bytes(data))
    with pytest.raises(FramingError, match="pads section 5"):
        check_framing(path)
