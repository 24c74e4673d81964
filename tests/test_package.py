"""Bad packages are refused before anything runs, with the file or field named."""
import json
import shutil

import pytest

from edge.core.package import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    PackageError,
    PackageWriteError,
    atomic_directory,
    file_entry,
    read_package,
    weights_layout,
)


@pytest.fixture
def package(tmp_path):
    root = tmp_path / "pkg"
    (root / "tokenizer").mkdir(parents=True)
    (root / "tokenizer" / "tokenizer.json").write_text("{}")
    (root / "weights").mkdir()
    (root / "weights" / "b.bin").write_bytes(bytes(range(256)) * 16)
    (root / "graphs").mkdir()
    (root / "graphs" / "b.onnx").write_bytes(b"graph")
    (root / "null.npy").write_bytes(b"null")
    signature = [{"name": "x", "dtype": "float32", "shape": ["batch", 4]}]
    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "producer": "edge test",
                "target": "onnx", "model": "m", "sampler": {},
                "tokenizer": {"files": [file_entry(root, root / "tokenizer" / "tokenizer.json")],
                              "max_tokens": 16},
                "conditioning": {"null_caption": file_entry(root, root / "null.npy")},
                "components": [{"name": "c", "blocks": [
                    {"name": "b", "files": [file_entry(root, root / "weights" / "b.bin"),
                                            file_entry(root, root / "graphs" / "b.onnx")],
                     "graph": "graphs/b.onnx",
                     "weights": {"path": "weights/b.bin", "tensors": [
                         {"name": "w", "dtype": "float32", "shape": [1024], "offset": 0,
                          "bytes": 4096}]},
                     "inputs": signature, "outputs": signature}]}]}
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root


def rewrite(root, change):
    manifest = json.loads((root / "manifest.json").read_text())
    change(manifest)
    (root / "manifest.json").write_text(json.dumps(manifest))


def test_a_good_package_reads(package):
    assert read_package(package)["model"] == "m"


def test_missing_manifest(tmp_path):
    with pytest.raises(PackageError, match="manifest.json: not found"):
        read_package(tmp_path)


def test_manifest_not_json(package):
    (package / "manifest.json").write_text("{oops")
    with pytest.raises(PackageError, match="not valid JSON"):
        read_package(package)


def test_unknown_format_version(package):
    rewrite(package, lambda m: m.update(format_version=99))
    with pytest.raises(PackageError, match="unknown format_version 99"):
        read_package(package)


def test_wrong_format(package):
    rewrite(package, lambda m: m.update(format="zip"))
    with pytest.raises(PackageError, match="'format'"):
        read_package(package)


@pytest.mark.parametrize("field", ["producer", "target", "model", "sampler", "components"])
def test_missing_field_is_named(package, field):
    rewrite(package, lambda m: m.pop(field))
    with pytest.raises(PackageError, match=f"missing field '{field}'"):
        read_package(package)


def test_mistyped_field_is_named(package):
    rewrite(package, lambda m: m["components"][0]["blocks"][0]["files"][0].update(bytes="4096"))
    with pytest.raises(PackageError, match=r"block c/b files\[0\]: field 'bytes' must be int"):
        read_package(package)


def test_missing_file(package):
    (package / "weights" / "b.bin").unlink()
    with pytest.raises(PackageError, match=r"b\.bin: missing"):
        read_package(package)


def test_truncated_file(package):
    path = package / "weights" / "b.bin"
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(PackageError, match=r"b\.bin: 1000 bytes, manifest says 4096"):
        read_package(package)


def test_altered_file(package):
    path = package / "weights" / "b.bin"
    data = bytearray(path.read_bytes())
    data[7] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(PackageError, match=r"b\.bin: sha256 differs"):
        read_package(package)


@pytest.mark.parametrize("path", ["../outside.bin", "/etc/passwd", "weights/../../x"])
def test_paths_that_escape_the_package(package, path):
    rewrite(package, lambda m: m["components"][0]["blocks"][0]["files"][0].update(path=path))
    with pytest.raises(PackageError, match="escapes the package folder"):
        read_package(package)


def test_symlink_out_of_the_package(package, tmp_path):
    outside = tmp_path / "secret.bin"
    shutil.copy(package / "weights" / "b.bin", outside)
    (package / "weights" / "link.bin").symlink_to(outside)
    rewrite(package, lambda m: m["components"][0]["blocks"][0]["files"][0].update(
        path="weights/link.bin"))
    rewrite(package, lambda m: m["components"][0]["blocks"][0]["weights"].update(
        path="weights/link.bin"))
    with pytest.raises(PackageError, match="escapes the package folder"):
        read_package(package)


def test_atomic_directory_replaces_only_on_success(tmp_path):
    dest = tmp_path / "out"
    ours = lambda d: "a folder this test wrote"  # noqa: E731
    with atomic_directory(dest, ours) as tmp:
        (tmp / "v").write_text("1")
    assert (dest / "v").read_text() == "1"
    with pytest.raises(RuntimeError), atomic_directory(dest, ours) as tmp:
        (tmp / "v").write_text("2")
        raise RuntimeError("interrupted")
    assert (dest / "v").read_text() == "1"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no leftovers
    with atomic_directory(dest, ours) as tmp:
        (tmp / "v").write_text("3")
    assert (dest / "v").read_text() == "3" and [p.name for p in tmp_path.iterdir()] == ["out"]


def test_atomic_directory_never_replaces_a_folder_edge_did_not_write(tmp_path):
    """Whoever the caller: a folder of other files is refused before the body runs."""
    dest = tmp_path / "site"
    (dest / ".git").mkdir(parents=True)
    (dest / MANIFEST).write_text('{"name": "My PWA"}')
    with pytest.raises(PackageWriteError, match=r'site: its manifest\.json is not an edge '
                       r'manifest \(no "format": "edge-package"\); edge replaces only folders '
                       r"it wrote, with or without --force"):
        with atomic_directory(dest):
            pytest.fail("the body ran")
    assert sorted(p.name for p in dest.iterdir()) == [".git", MANIFEST]
    assert [p.name for p in tmp_path.iterdir()] == ["site"]


def test_weights_layout_aligns_tensors_and_pages():
    offsets, size = weights_layout({"a": 10, "b": 100, "c": 4096})
    assert offsets == {"a": 0, "b": 64, "c": 192}
    assert size == 8192 and size % 4096 == 0
