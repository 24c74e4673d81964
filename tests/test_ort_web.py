"""Where a web package's page gets onnxruntime-web (exporters/web/ort_web.py): the pinned digests,
the URL and bundle checks, and the CLI refusing bad values before any work."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from edge.commands import app
from edge.exporters.web.ort_web import (
    DEFAULT_ORT_URL,
    ORT_FILES,
    OrtLocationError,
    check_bundle,
    check_ort_url,
    ort_location,
)

ORT_DIST = Path(os.environ.get("EDGE_ORT_WEB_DIST", Path(__file__).resolve().parents[2]
                               / "shared" / "vendor" / "onnxruntime-web-1.30"))


def need_dist() -> Path:
    if not (ORT_DIST / "SHA256SUMS").is_file():
        pytest.skip(f"no onnxruntime-web 1.30 dist at {ORT_DIST} (set EDGE_ORT_WEB_DIST)")
    return ORT_DIST


def test_pinned_digests_are_the_release_files():
    sums = dict(reversed(line.split()) for line in
                (need_dist() / "SHA256SUMS").read_text().splitlines() if line.strip())
    for name, (size, sha256) in ORT_FILES.items():
        assert sums[name] == sha256, name
        assert (ORT_DIST / name).stat().st_size == size, name


@pytest.mark.parametrize("url", ["http://cdn.example.com/ort/", "ftp://example.com/ort/",
                                 "cdn.jsdelivr.net/npm/onnxruntime-web/dist/",
                                 "https://example.com/ort/?v=1", "javascript:alert(1)"])
def test_ort_url_refused_names_the_value(url):
    with pytest.raises(OrtLocationError, match="--ort-url") as err:
        check_ort_url(url)
    assert repr(url) in str(err.value)


def test_ort_url_taken_as_a_folder():
    assert check_ort_url("https://example.com/ort") == "https://example.com/ort/"
    assert check_ort_url(DEFAULT_ORT_URL) == DEFAULT_ORT_URL
    # a local test server may be plain http
    assert check_ort_url("http://127.0.0.1:8000/ort/") == "http://127.0.0.1:8000/ort/"
    assert check_ort_url("http://localhost:8000/ort/") == "http://localhost:8000/ort/"


def test_default_location_is_the_pinned_cdn_and_copies_nothing(tmp_path):
    record, copied = ort_location(tmp_path)
    assert record["base"] == DEFAULT_ORT_URL and not record["bundled"] and copied == []
    assert [f["name"] for f in record["files"]] == list(ORT_FILES)
    assert not any(tmp_path.iterdir())


def bundle_copy(tmp_path: Path) -> Path:
    folder = tmp_path / "dist"
    folder.mkdir()
    for name in [*ORT_FILES, "LICENSE"]:
        shutil.copyfile(need_dist() / name, folder / name)
    return folder


def test_bundle_refusals_name_the_file(tmp_path):
    with pytest.raises(OrtLocationError, match="no such folder"):
        check_bundle(tmp_path / "nowhere")
    folder = bundle_copy(tmp_path)
    check_bundle(folder)
    (folder / "LICENSE").unlink()
    with pytest.raises(OrtLocationError, match="LICENSE is missing"):
        check_bundle(folder)
    (folder / "LICENSE").write_text("MIT")
    wasm = folder / "ort-wasm-simd-threaded.wasm"
    data = wasm.read_bytes()
    wasm.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # same size, other bytes
    with pytest.raises(OrtLocationError, match=r"ort-wasm-simd-threaded\.wasm is not "):
        check_bundle(folder)
    wasm.unlink()
    with pytest.raises(OrtLocationError, match=r"ort-wasm-simd-threaded\.wasm is missing"):
        check_bundle(folder)


def test_bundle_is_copied_and_listed(tmp_path):
    folder = bundle_copy(tmp_path)
    root = tmp_path / "pkg"
    root.mkdir()
    record, copied = ort_location(root, bundle=folder)
    assert record["base"] == "ort/" and record["bundled"]
    assert sorted(f["path"] for f in copied) == sorted(f"ort/{n}" for n in [*ORT_FILES,
                                                                             "LICENSE"])
    assert {f["path"]: f["sha256"] for f in copied}["ort/ort.wasm.min.mjs"] == \
        ORT_FILES["ort.wasm.min.mjs"][1]


@pytest.mark.parametrize("args, message", [
    (["--target", "web", "--ort-url", "http://cdn.example.com/ort/"], "not https"),
    (["--target", "web", "--bundle-ort", "/nowhere/ort"], "no such folder"),
    (["--target", "web", "--ort-url", DEFAULT_ORT_URL, "--bundle-ort", "/nowhere"],
     "give one"),
    (["--target", "onnx", "--ort-url", DEFAULT_ORT_URL], "--ort-url applies to --target web"),
])
def test_cli_refuses_before_any_work(tmp_path, args, message):
    dest = tmp_path / "pkg"
    result = CliRunner().invoke(app, ["export", *args, "-o", str(dest)])
    assert result.exit_code == 2 and message in result.output, result.output
    assert not dest.exists()
