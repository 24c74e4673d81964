"""Hardening of package reading: every fault is refused before any block runs, with an error
naming the file or field and the problem. Cases run on copies of the exported tiny-sora."""
import copy
import json
import os
import shutil

import numpy as np
import pytest
from manifest_edits import block_record as block
from manifest_edits import rewrite

from edge.core.manifest_schema import check_manifest
from edge.core.package import MANIFEST, PackageError, read_package

BLOCK = ("transformer", "pair_1")


@pytest.fixture
def pkg(exported_package, tmp_path):
    """A private copy of the exported package, safe to damage."""
    root, _ = exported_package
    dest = tmp_path / "pkg"
    shutil.copytree(root, dest)
    return dest


@pytest.fixture
def manifest(exported_package):
    """The exported manifest without its digest, so each test reaches the check it aims at."""
    m = copy.deepcopy(exported_package[1])
    m.pop("manifest_sha256")
    return m


class NoBlockRuns:
    """Pipeline.load with block runs and weight reads recorded: a refusal must come before
    either."""

    def __init__(self, monkeypatch):
        import edge.runtimes.python.loader as loader
        import edge.runtimes.python.pipeline as pipeline

        self.calls = []
        monkeypatch.setattr(pipeline.Pipeline, "_run_blocks",
                            lambda *a, **k: self.calls.append(("run", a)))
        monkeypatch.setattr(loader, "read_file", lambda *a, **k: self.calls.append(("read", a)))

    def load(self, root):
        from edge.runtimes.python import Pipeline

        try:
            Pipeline.load(root)
        finally:
            assert self.calls == [], "a block was touched before the package was refused"


def weights_path(root, comp="transformer", name="pair_1"):
    m = json.loads((root / MANIFEST).read_text())
    return root / block(m, comp, name)["weights"]["path"]


# --- damaged files ---------------------------------------------------------------------------

@pytest.mark.parametrize("where", ["weights", "graph", "tokenizer", "null_caption"])
@pytest.mark.parametrize("offset", [0, 1000, -1])
def test_flipped_byte_is_refused(pkg, monkeypatch, where, offset):
    m = json.loads((pkg / MANIFEST).read_text())
    path = pkg / {"weights": block(m)["weights"]["path"], "graph": block(m)["graph"],
                  "tokenizer": m["tokenizer"]["files"][0]["path"],
                  "null_caption": m["conditioning"]["null_caption"]["path"]}[where]
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(PackageError, match=f"{path.name}: sha256 differs"):
        NoBlockRuns(monkeypatch).load(pkg)


@pytest.mark.parametrize("keep", [0, 4095, 4096])
def test_truncated_file_is_refused(pkg, monkeypatch, keep):
    path = weights_path(pkg)
    path.write_bytes(path.read_bytes()[:keep])
    with pytest.raises(PackageError, match=rf"pair_1\.bin: {keep} bytes, manifest says \d+"):
        NoBlockRuns(monkeypatch).load(pkg)


def test_grown_file_is_refused(pkg, monkeypatch):
    path = weights_path(pkg)
    with open(path, "ab") as f:
        f.write(b"\0")
    with pytest.raises(PackageError, match=r"pair_1\.bin: \d+ bytes, manifest says"):
        NoBlockRuns(monkeypatch).load(pkg)


def test_missing_file_is_refused(pkg, monkeypatch):
    weights_path(pkg, "vae_decoder", "up_2_out").unlink()
    with pytest.raises(PackageError, match=r"up_2_out\.bin: missing \(listed in manifest\.json "
                                           r"block vae_decoder/up_2_out"):
        NoBlockRuns(monkeypatch).load(pkg)


def test_missing_manifest_is_refused(pkg, monkeypatch):
    (pkg / MANIFEST).unlink()
    with pytest.raises(PackageError, match="manifest.json: not found"):
        NoBlockRuns(monkeypatch).load(pkg)


def test_listed_path_that_is_a_folder_is_refused(pkg, monkeypatch):
    path = weights_path(pkg)
    path.unlink()
    path.mkdir()
    with pytest.raises(PackageError, match=r"pair_1\.bin: is a folder, not a regular file"):
        NoBlockRuns(monkeypatch).load(pkg)


def test_a_manifest_holding_infinity_is_refused_by_name(pkg):
    """The file's reader refuses `Infinity` (no JSON has it); a manifest handed over as a dict
    holding one (a program's own edit) is refused by check_manifest too, naming the
    manifest, not a traceback from its digest's JSON."""
    with pytest.raises(PackageError, match="Infinity is not a JSON number"):
        text = (pkg / MANIFEST).read_text()
        (pkg / MANIFEST).write_text(text.replace('"format_version": 1,',
                                                 '"format_version": 1, "edited": Infinity,', 1))
        read_package(pkg)
    m = json.loads(text)
    m["edited"] = float("inf")
    with pytest.raises(PackageError, match="manifest.json: holds NaN or Infinity"):
        check_manifest(m)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_null_caption_that_is_not_finite_is_refused_at_load(pkg, monkeypatch, bad):
    """A consistent package (sizes and digests rewritten) whose learned null caption holds NaN
    or infinity: refused at load, not after a generation of NaN frames."""
    from edge.core.package import file_entry

    m = json.loads((pkg / MANIFEST).read_text())
    path = pkg / m["conditioning"]["null_caption"]["path"]
    null = np.load(path)
    null[0, 0] = bad
    np.save(path, null)

    def change(m):
        entry = file_entry(pkg, path)
        m["conditioning"]["null_caption"] = entry
        m["files"] = [entry if f["path"] == entry["path"] else f for f in m.get("files", [])]
    rewrite(pkg, change)
    with pytest.raises(PackageError, match=r"conditioning.null_caption: 1 of its \d+ values "
                                           "are not finite"):
        NoBlockRuns(monkeypatch).load(pkg)


@pytest.mark.parametrize("extra", ["weights/transformer/pair_9.bin", "notes.txt",
                                   "graphs/new/x.onnx"])
def test_unlisted_file_is_named_and_left_alone(pkg, extra):
    """A file the manifest does not list (a README someone added) is named in a notice and
    neither checked nor used: the package loads and runs what its manifest lists."""
    from edge.core.files import EdgeNotice

    (pkg / extra).parent.mkdir(parents=True, exist_ok=True)
    (pkg / extra).write_bytes(b"x")
    with pytest.warns(EdgeNotice, match=f"files not listed in manifest.json: {extra}; they "
                                        "are not checked and not used"):
        assert read_package(pkg, check_hashes=False)["target"] == "onnx"


def test_operating_system_noise_is_ignored(pkg):
    for noise in (".DS_Store", "weights/._pair_1.bin", "__MACOSX/weights/x", "Thumbs.db"):
        (pkg / noise).parent.mkdir(parents=True, exist_ok=True)
        (pkg / noise).write_bytes(b"\0")
    assert read_package(pkg, check_hashes=False)["target"] == "onnx"


# --- paths -----------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/etc/passwd", "../outside.bin", "weights/../../x.bin",
                                  "weights/./pair_1.bin", "C:/x.bin", "weights\\pair_1.bin",
                                  "", "weights//pair_1.bin"])
def test_path_that_escapes_or_is_not_plain_is_refused(pkg, monkeypatch, path):
    def change(m):
        b = block(m)
        b["files"][1]["path"] = b["weights"]["path"] = path
    rewrite(pkg, change)
    with pytest.raises(PackageError, match=r"block transformer/pair_1 files\[1\]: file path "
                                           r".* escapes the package folder"):
        NoBlockRuns(monkeypatch).load(pkg)


def test_symlinked_file_leaving_the_package_is_refused(pkg, monkeypatch, tmp_path):
    path = weights_path(pkg)
    outside = tmp_path / "outside.bin"
    shutil.move(path, outside)
    path.symlink_to(outside)  # same bytes, same sha256: only the path check can catch it
    with pytest.raises(PackageError, match="escapes the package folder"):
        NoBlockRuns(monkeypatch).load(pkg)


def test_symlinked_folder_leaving_the_package_is_refused(pkg, monkeypatch, tmp_path):
    shutil.move(pkg / "weights", tmp_path / "weights")
    (pkg / "weights").symlink_to(tmp_path / "weights")
    with pytest.raises(PackageError, match="escapes the package folder"):
        NoBlockRuns(monkeypatch).load(pkg)


def test_symlinked_manifest_leaving_the_package_is_refused(pkg, monkeypatch, tmp_path):
    shutil.move(pkg / MANIFEST, tmp_path / MANIFEST)
    (pkg / MANIFEST).symlink_to(tmp_path / MANIFEST)
    with pytest.raises(PackageError, match="escapes the package folder"):
        NoBlockRuns(monkeypatch).load(pkg)


def test_symlink_inside_the_package_is_allowed(pkg):
    path = weights_path(pkg)
    real = path.with_name("real.bin")
    shutil.move(path, real)
    path.symlink_to("real.bin")
    rewrite(pkg, lambda m: m.setdefault("files", []).append(
        {"path": "weights/transformer/real.bin", "bytes": real.stat().st_size,
         "sha256": block(m)["files"][1]["sha256"]}))
    assert read_package(pkg)["model"] == "tiny-sora"


# --- the manifest ----------------------------------------------------------------------------

@pytest.mark.parametrize("text,message", [
    (b"{oops", "not valid JSON"),
    (b"", "not valid JSON"),
    (b"[]", "must be a JSON object, got list"),
    (b"\xff\xfe{}", "not UTF-8 text"),
    (b"[" * 100_000 + b"]" * 100_000, "not valid JSON"),
    (b'{"format": NaN}', "NaN is not a JSON number"),
    (b'{"a": 1, "a": 2}', "key 'a' appears twice"),
    (b'{"format_version": 1' + b"0" * 5000 + b"}", "not valid JSON"),
])
def test_manifest_that_is_not_a_json_object_is_refused(pkg, monkeypatch, text, message):
    (pkg / MANIFEST).write_bytes(text)
    with pytest.raises(PackageError, match=f"manifest.json: {message}"):
        NoBlockRuns(monkeypatch).load(pkg)


def test_flipped_byte_in_the_manifest_is_refused(pkg, monkeypatch):
    """Flip one bit at many positions: each manifest must be refused (a flip inside a hex
    digest changes the sha256 a file must have; elsewhere it breaks JSON or a field)."""
    good = (pkg / MANIFEST).read_bytes()
    step = max(1, len(good) // 97)
    for i in range(0, len(good), step):
        bad = bytearray(good)
        bad[i] ^= 0x02
        (pkg / MANIFEST).write_bytes(bytes(bad))
        try:
            NoBlockRuns(monkeypatch).load(pkg)
        except PackageError:
            continue
        # a flip that only changes a name or a number nobody checks still yields a runnable
        # package; the flip must then have hit such a value, not a path, size or digest
        m = json.loads(bad)
        assert json.loads(good)["tokenizer"]["files"] == m["tokenizer"]["files"], i


@pytest.mark.parametrize("change,message", [
    (lambda m: m.update(format_version=2), "unknown format_version 2 .written by a newer edge"),
    (lambda m: m.update(format_version=0), "unknown format_version 0; this edge reads"),
    (lambda m: m.update(format_version="1"), "'format_version' must be int, got str"),
    (lambda m: m.update(format_version=True), "'format_version' must be int, got bool"),
    (lambda m: m.update(format_version=1.0), "'format_version' must be int, got float"),
    (lambda m: m.update(target="tv"), "unknown target 'tv'"),
    (lambda m: m.update(format="zip"), "field 'format' is 'zip'"),
    (lambda m: m.pop("components"), "missing field 'components'"),
    (lambda m: m.update(components={}), "'components' must be list, got dict"),
    (lambda m: m["tokenizer"].update(max_tokens=-1), "'max_tokens' is -1, must be at least 1"),
    (lambda m: m["tokenizer"].update(files=[]), "tokenizer: field 'files' is empty"),
    (lambda m: m["sampler"].update(steps=0), "sampler: field 'steps' is 0"),
    (lambda m: m["sampler"].update(guidance=[5]), "sampler: field 'guidance' must be a number"),
    (lambda m: m.update(latent_shape=[4, 16, 8]), "'latent_shape' .* must be four"),
    (lambda m: block(m)["files"][0].update(bytes=-5), r"files\[0\]: field 'bytes' is -5"),
    (lambda m: block(m)["files"][0].update(sha256="ab"), "not a lowercase sha256"),
    (lambda m: block(m)["files"][0].update(path=7), "field 'path' must be str, got int"),
    (lambda m: block(m).update(files=None), "field 'files' must be list, got NoneType"),
    (lambda m: block(m)["inputs"][0].update(dtype="complex256"), "unknown dtype 'complex256'"),
    (lambda m: block(m)["inputs"][0].update(shape=[-1]), "shape entry -1 must be a size"),
    (lambda m: block(m).update(graph="graphs/other.onnx"), "graph 'graphs/other.onnx' is not"),
    (lambda m: m["components"][0].update(blocks=["layer"]), "must be an object, got str"),
])
def test_wrong_field_is_refused_by_name(manifest, change, message):
    change(manifest)
    with pytest.raises(PackageError, match=message):
        check_manifest(manifest)


def test_the_exported_manifest_passes(exported_package, manifest):
    """Every file the exporter wrote (bar the manifest) is listed, and nothing else."""
    root = exported_package[0]
    on_disk = {p.relative_to(root).as_posix() for p in root.rglob("*")
               if p.is_file() and p.name != MANIFEST}
    assert set(check_manifest(manifest)) == on_disk


def test_duplicate_block_id_is_refused(manifest):
    comp = manifest["components"][1]
    comp["blocks"].insert(2, copy.deepcopy(comp["blocks"][1]))
    with pytest.raises(PackageError, match="block id transformer/pair_0 appears twice"):
        check_manifest(manifest)


def test_duplicate_component_is_refused(manifest):
    manifest["components"].append(copy.deepcopy(manifest["components"][0]))
    with pytest.raises(PackageError, match="component 'text_encoder' appears twice"):
        check_manifest(manifest)


def test_blocks_out_of_order_are_refused(manifest):
    blocks = manifest["components"][1]["blocks"]
    blocks[0], blocks[1] = blocks[1], blocks[0]   # pair_0 before the prologue it needs
    with pytest.raises(PackageError, match="comes only from the later block "
                                           "transformer/prologue .blocks out of order"):
        check_manifest(manifest)


def test_cycle_between_blocks_is_refused(manifest):
    vae = manifest["components"][2]["blocks"]
    vae[0]["inputs"] = vae[0]["inputs"] + [dict(vae[1]["outputs"][0], name="from_up_0")]
    vae[1]["outputs"].append(dict(vae[1]["outputs"][0], name="from_up_0"))
    with pytest.raises(PackageError, match="input 'from_up_0' comes only from the later block "
                                           "vae_decoder/up_0"):
        check_manifest(manifest)


def test_gap_in_the_chain_is_refused(manifest):
    manifest["components"][1]["blocks"].pop(0)  # without the prologue, no block makes t_mod
    with pytest.raises(PackageError, match="block transformer/epilogue: input 'c' is neither "
                                           "an input of component 'transformer' nor an output"):
        check_manifest(manifest)


@pytest.mark.parametrize("change,message", [
    (lambda t, f: t.update(offset=f["bytes"]), "ends at byte .* beyond"),
    (lambda t, f: t.update(bytes=t["bytes"] + 4), "bytes disagree with shape"),
    (lambda t, f: t.update(shape=[*t["shape"], 2]), "bytes disagree with shape"),
])
def test_tensor_table_that_disagrees_with_the_file_is_refused(manifest, change, message):
    b = block(manifest)
    change(b["weights"]["tensors"][-1], b["files"][1])
    with pytest.raises(PackageError, match=f"block transformer/pair_1 weights.tensors.*{message}"):
        check_manifest(manifest)


def test_one_file_listed_twice_with_different_sizes_is_refused(manifest):
    other = copy.deepcopy(block(manifest)["files"][1])
    other["bytes"] += 4096
    manifest.setdefault("files", []).append(other)
    with pytest.raises(PackageError, match="is also listed by .* another size"):
        check_manifest(manifest)


def test_oversized_manifest_is_refused_without_reading_it(pkg, monkeypatch):
    import edge.core.package

    monkeypatch.setattr(edge.core.package, "MAX_MANIFEST_BYTES", 1000)
    with pytest.raises(PackageError, match=r"manifest.json: \d+ bytes, more than any manifest"):
        read_package(pkg)


def test_runtime_refuses_packages_of_other_targets(pkg, monkeypatch):
    rewrite(pkg, lambda m: m.update(target="web"))
    with pytest.raises(PackageError, match="target 'web'.*Python runtime runs 'onnx'"):
        NoBlockRuns(monkeypatch).load(pkg)


def test_runtime_refuses_a_package_without_a_component_it_needs(pkg, monkeypatch):
    def drop_decoder(m):
        for blk in m["components"].pop(2)["blocks"]:
            for f in blk["files"]:
                (pkg / f["path"]).unlink()
    rewrite(pkg, drop_decoder)
    with pytest.raises(PackageError, match="no component 'vae_decoder'"):
        NoBlockRuns(monkeypatch).load(pkg)


def test_runtime_refuses_a_component_that_needs_inputs_it_does_not_give(pkg, monkeypatch):
    def change(m):
        head = m["components"][2]["blocks"][0]
        head["inputs"][0]["name"] = "latents"
        head.get("flops", {})["rows_input"] = "latents"  # consistent within the block
    rewrite(pkg, change)
    with pytest.raises(PackageError, match="vae_decoder/head: input 'latents' is neither"):
        NoBlockRuns(monkeypatch).load(pkg)


def test_unknown_sampler_field_is_refused_by_the_runtime(pkg, monkeypatch):
    rewrite(pkg, lambda m: m["sampler"].update(warp_factor=9))
    with pytest.raises(PackageError, match="sampler: unknown sampler setting.*warp_factor"):
        NoBlockRuns(monkeypatch).load(pkg)


def test_unreadable_file_is_refused(pkg, monkeypatch):
    if os.geteuid() == 0:
        pytest.skip("root reads files whatever their mode; the check needs an ordinary user")
    weights_path(pkg).chmod(0)
    with pytest.raises(PackageError, match="pair_1.bin"):
        NoBlockRuns(monkeypatch).load(pkg)


def test_a_tokenizer_larger_than_the_embedding_table_is_refused_at_load(pkg, monkeypatch):
    """Probe item 11: a consistent package (every digest right) whose tokenizer gives ids
    past the text encoder's embedding table failed inside onnxruntime's Gather."""
    from hashlib import sha256

    from tokenizers import Tokenizer

    m = json.loads((pkg / MANIFEST).read_text())
    rows = m["tokenizer"]["embedding_rows"]
    path = pkg / m["tokenizer"]["files"][0]["path"]
    tok = Tokenizer.from_file(str(path))
    assert tok.get_vocab_size(with_added_tokens=True) <= rows  # as exported: loads
    tok.add_tokens([f"extra{i}" for i in range(rows)])
    tok.save(str(path))
    data = path.read_bytes()
    rewrite(pkg, lambda m: m["tokenizer"]["files"][0].update(
        bytes=len(data), sha256=sha256(data).hexdigest()))
    with pytest.raises(PackageError, match=rf"tokenizer.json: a vocabulary of \d+ tokens, but "
                                           rf"the text encoder's embedding table has {rows} rows"):
        NoBlockRuns(monkeypatch).load(pkg)
