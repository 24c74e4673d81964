"""Exporting a model larger than memory (edge/graph/lazy_weights.py): the model built on the meta
device, each block's weights read from the folder's safetensors files while that block is
exported, then dropped. On a tiny Wan folder: the package is the in-memory export's, file for
file; at no time is more than one block's weights read; the check's streamed reference (the
PyTorch blocks, fed the package's weights by the runtime's loader) is diffusers' video; bad
shards are named before any work."""

from __future__ import annotations

import json
import shutil
import struct

import numpy as np
import pytest
import torch
from conftest import WAN_SIZE, chunked_attention_for_tests
from tiny_parts import package_files

from edge.core.video_metrics import psnr, snr
from edge.families import FamilyError, load_model
from edge.graph.lazy_weights import RESIDENCY, FolderWeights, ShardError, read_header


@pytest.fixture(scope="module")
def out_of_core_export(wan_folders, wan_packages, tmp_path_factory):
    """The unipc folder exported out of core with its end-to-end check, at wan_packages'
    settings; the peak of read weights during the export."""
    from edge.exporters.onnx.package import end_to_end_check, export_onnx

    model = load_model(wan_folders["unipc"], steps=12, out_of_core=True, **WAN_SIZE)
    components = model.cut()
    RESIDENCY.reset()
    root = tmp_path_factory.mktemp("wan-ooc") / "pkg"
    with chunked_attention_for_tests():  # as wan_packages were
        manifest = export_onnx(model, root, components=components,
                               validate_end_to_end=end_to_end_check(model,
                                                                    components=components))
    return model, components, root, manifest, RESIDENCY.peak


def test_out_of_core_export_writes_the_in_memory_package(out_of_core_export, wan_packages):
    model, _, _, manifest, _ = out_of_core_export
    assert model.out_of_core
    assert all(p.is_meta for p in model.pipe.transformer.parameters())
    _, resident = wan_packages["unipc"]
    # every graph and weights file, byte for byte
    assert package_files(manifest) == package_files(resident)
    assert manifest["validation"]["reference"].startswith("the family's PyTorch blocks")
    assert manifest["validation"]["identical"] or manifest["validation"]["psnr_db"] >= 40


def test_one_block_of_weights_is_read_at_a_time(out_of_core_export):
    model, components, _, _, peak = out_of_core_export
    largest = max(b.weight_bytes() for bs in components.values() for b in bs)
    total = sum(b.weight_bytes() for bs in components.values() for b in bs)
    assert 0 < peak <= largest < total / 4
    # and nothing stays read after the export
    assert all(p.is_meta for c in (model.pipe.transformer, model.pipe.text_encoder,
                                   model.pipe.vae) for p in c.parameters())


def test_the_streamed_reference_is_diffusers_video(out_of_core_export, wan_models):
    """The check's reference computes the video itself (PyTorch blocks, the package's weights
    fed by the loader), not the graphs again: it reproduces WanPipeline."""
    from edge.exporters.shared.package_run import streamed_reference
    from edge.exporters.shared.validation import VALIDATION_PROMPT

    _, components, root, manifest, _ = out_of_core_export
    largest = max(b["weight_bytes"] for c in manifest["components"] for b in c["blocks"])
    got = streamed_reference(root, components, 2 * largest, seed=3, on_step=None)
    want = wan_models["unipc"].generate(VALIDATION_PROMPT, seed=3)
    assert psnr(got, want) >= 40.0
    assert snr(got, want) >= 25.0
    other = wan_models["unipc"].generate(VALIDATION_PROMPT, seed=4)
    assert snr(other, want) < snr(got, want) - 15


def test_weights_are_read_as_float32_whatever_their_stored_dtype(tmp_path):
    from safetensors.torch import save_file

    tensors = {"a": torch.randn(3, 5), "b": torch.randn(7).half(),
               "c": torch.randn(2, 2, 2).bfloat16()}
    save_file(tensors, tmp_path / "model.safetensors")
    weights = FolderWeights(tmp_path)
    for name, t in tensors.items():
        got = weights.read(name)
        assert got.dtype == torch.float32 and torch.equal(got, t.float())


def _sharded_copy(folder, dest):
    """`folder` with its transformer saved in several shards and an index."""
    from diffusers import WanTransformer3DModel

    copy = shutil.copytree(folder, dest)
    shutil.rmtree(copy / "transformer")
    WanTransformer3DModel.from_pretrained(folder / "transformer").save_pretrained(
        copy / "transformer", max_shard_size="20KB")
    return copy


def test_bad_shards_are_named_before_any_work(wan_folders, tmp_path):
    folder = _sharded_copy(wan_folders["euler"], tmp_path / "wan")
    transformer = folder / "transformer"
    index = json.loads((transformer / "diffusion_pytorch_model.safetensors.index.json")
                       .read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2
    model = load_model(folder, out_of_core=True, **WAN_SIZE)   # sharded, whole: loads
    assert model.out_of_core

    # a truncated shard: named with its size and what its header describes
    last = transformer / shards[-1]
    data = last.read_bytes()
    last.write_bytes(data[:-10])
    with pytest.raises(FamilyError, match=rf"{last}: truncated: {len(data) - 10} bytes, its "
                                          rf"header describes {len(data)}"):
        load_model(folder, out_of_core=True, **WAN_SIZE)
    last.write_bytes(data)

    # a shard the index lists, missing
    first = transformer / shards[0]
    first.rename(tmp_path / "aside")
    with pytest.raises(FamilyError, match=rf"{first}: missing \(a shard "
                                          r"diffusion_pytorch_model.safetensors.index.json"):
        load_model(folder, out_of_core=True, **WAN_SIZE)
    (tmp_path / "aside").rename(first)

    # a header that is not one
    first.write_bytes(struct.pack("<Q", 12) + b"not json at all")
    with pytest.raises(ShardError, match=rf"{first}: not a safetensors header"):
        read_header(first)


def test_a_tensor_of_another_shape_is_named(wan_folders, tmp_path):
    folder = shutil.copytree(wan_folders["euler"], tmp_path / "wan")
    config = folder / "transformer" / "config.json"
    config.write_text(json.dumps(json.loads(config.read_text()) | {"ffn_dim": 64}))
    with pytest.raises(FamilyError, match=r"transformer/diffusion_pytorch_model.safetensors: "
                       r"tensor 'blocks.0.ffn.net.0.proj.weight' has shape \[48, 24\], but "
                       r".*transformer/config.json makes it \[64, 24\]"):
        load_model(folder, out_of_core=True, **WAN_SIZE)


def test_out_of_core_is_chosen_for_a_model_over_half_the_memory(wan_folders, monkeypatch):
    from edge.families import folder as folder_module

    weights = folder_module.weights_bytes_float32(wan_folders["euler"])
    monkeypatch.setattr(folder_module, "physical_memory_bytes", lambda: 2 * weights - 2)
    model = load_model(wan_folders["euler"], **WAN_SIZE)
    assert model.out_of_core
    assert any("exported out of core" in n for n in model.notes)
    monkeypatch.setattr(folder_module, "physical_memory_bytes", lambda: 2 * weights + 2)
    assert not load_model(wan_folders["euler"], **WAN_SIZE).out_of_core


def test_core_ml_alone_refuses_a_model_out_of_core(wan_folders, tmp_path):
    """Core ML converts whole programs with their weights: --out-of-core on its layouts is
    refused at once, and a model loaded out of core is refused before any work, naming the
    targets that take it; its plan (a dry run, shapes only) goes on, saying so. Core AI,
    onnx and the web take it."""
    from typer.testing import CliRunner

    from edge.commands import app
    from edge.exporters import ExportOptionError, ExportOptions
    from edge.exporters import target as target_module
    from edge.graph.shapes_only import shapes_only

    runner = CliRunner()
    dest = tmp_path / "pkg"
    result = runner.invoke(app, ["export", "--model", str(wan_folders["euler"]), "--target",
                                 "iphone", "--out-of-core", "-o", str(dest)])
    assert result.exit_code != 0
    assert ("--out-of-core applies to --target onnx or iphone --min-ios 27 or web, not iphone"
            in result.output), result.output
    assert not dest.exists()
    model = load_model(wan_folders["euler"], out_of_core=True, **WAN_SIZE)
    with pytest.raises(ExportOptionError, match=r"--target iphone --min-ios 18 \(Core ML\): .* "
                       "only --target onnx, --target iphone --min-ios 27, --target web export "
                       "a model block by block"):
        target_module("iphone").prepare(model, ExportOptions())
    # the plans need the shapes alone; the Core ML one says the export would be refused
    assert target_module("web").prepare(model, ExportOptions()).held_bytes
    assert target_module("iphone").prepare(model, ExportOptions(min_ios=27)).held_bytes
    with shapes_only():
        plan = target_module("iphone").prepare(model, ExportOptions())
    assert plan.held_bytes and any(n.startswith("a plan only: --target iphone --min-ios 18")
                                   for n in plan.notes)


@pytest.mark.slow
def test_core_ai_exports_out_of_core_what_it_exports_in_memory(wan_folders,
                                                             wan_tiled_coreai_package,
                                                             tmp_path):
    """The tiled tiny Wan through Core AI with its weights read block by block: the end-to-end
    check streams the PyTorch blocks (reading the folder) against the package through Core
    AI, and the package generates, through Core AI, the in-memory package's video (Core AI's
    programs are not byte-for-byte the same from one conversion to the next: the videos
    are compared)."""
    from conftest import WAN_TILING, coreai_export

    from edge.exporters.shared.package_run import STREAMED_FROM_FOLDER
    from edge.runtimes.python import Pipeline

    model = load_model(wan_folders["unipc"], steps=12, out_of_core=True,
                       vae_tiles=WAN_TILING, **WAN_SIZE)
    manifest = coreai_export(model, tmp_path / "pkg")
    check = manifest["validation"]
    assert check["reference"] == STREAMED_FROM_FOLDER and check["identical"], check

    def video(root):
        pipe = Pipeline.load(root)
        try:
            return pipe.generate("a blue dog", seed=5, steps=3)[0]
        finally:
            pipe.close()

    got, want = video(tmp_path / "pkg"), video(wan_tiled_coreai_package[0])
    assert np.array_equal(got, want)


def test_tiny_sora_refuses_the_option(tmp_path):
    """tiny-sora's weights come with edge (no diffusers folder to read block by block):
    --out-of-core is refused by name, naming the families that take it, before any work."""
    from typer.testing import CliRunner

    from edge.commands import app

    result = CliRunner().invoke(app, ["export", "--out-of-core", "-o", str(tmp_path / "pkg")])
    assert result.exit_code != 0
    assert ("--out-of-core: tiny-sora models do not take it (an export option of cogvideox, "
            "ltx, wan models)") in result.output
    assert not (tmp_path / "pkg").exists()


def test_a_folder_without_safetensors_loads_whole(wan_folders, tmp_path):
    """PyTorch .bin weights cannot be read block by block here: such a folder is loaded whole
    by diffusers (and --out-of-core refuses it, naming the folder)."""
    from diffusers import WanTransformer3DModel

    folder = shutil.copytree(wan_folders["euler"], tmp_path / "wan")
    transformer = WanTransformer3DModel.from_pretrained(folder / "transformer")
    shutil.rmtree(folder / "transformer")
    transformer.save_pretrained(folder / "transformer", safe_serialization=False)
    assert not load_model(folder, **WAN_SIZE).out_of_core
    with pytest.raises(FamilyError, match=r"wan/transformer: no .safetensors weights"):
        load_model(folder, out_of_core=True, **WAN_SIZE)


@pytest.fixture(scope="module")
def out_of_core_web_export(wan_folders, tmp_path_factory):
    """The unipc folder exported for the web out of core, its end-to-end check run after the
    blocks are written; the peak of read weights during the export."""
    pytest.importorskip("tvm", reason="apache-tvm (test extra) is not installed")
    from edge.exporters.web.package import export_web, web_blocks

    model = load_model(wan_folders["unipc"], steps=12, out_of_core=True, **WAN_SIZE)
    components = web_blocks(model)
    RESIDENCY.reset()
    root = tmp_path_factory.mktemp("wan-web-ooc") / "pkg"
    with chunked_attention_for_tests():
        manifest = export_web(model, root, components=components, variants=False,
                              check=False, validate_end_to_end=True)
    return model, components, root, manifest, RESIDENCY.peak


@pytest.mark.slow  # a Wan web export (TVM plans and wasm graphs) and two generations
def test_out_of_core_web_export_stores_the_in_memory_weights(out_of_core_web_export,
                                                            wan_models):
    """Each block's weights files hold the stored form of the in-memory model's weights,
    byte for byte; at most one block's float32 weights were read at a time, none are left;
    the check ran after the blocks were written, against the float32 PyTorch blocks."""
    import hashlib

    from edge.exporters.web.package import web_blocks
    from edge.exporters.web.storage import stored_weights, web_storage, write_stored

    model, components, root, manifest, peak = out_of_core_web_export
    storage = web_storage("fp16", wan_models["unipc"])
    resident = {b.key: b for bs in web_blocks(wan_models["unipc"]).values() for b in bs}
    for c in manifest["components"]:
        for b in c["blocks"]:
            key = f"{c['name']}/{b['name']}"
            got = b"".join((root / p).read_bytes() for p in b["weights"]["shards"])
            scratch = root.parent / "resident.bin"
            table = write_stored(scratch, stored_weights(resident[key], storage))
            assert table == b["weights"]["tensors"], key
            assert hashlib.sha256(got).digest() == \
                hashlib.sha256(scratch.read_bytes()).digest(), key
    largest = max(b.weight_bytes() for bs in components.values() for b in bs)
    total = sum(b.weight_bytes() for bs in components.values() for b in bs)
    assert 0 < peak <= largest < total / 4
    assert all(p.is_meta for c in (model.pipe.transformer, model.pipe.text_encoder,
                                   model.pipe.vae) for p in c.parameters())
    validation = manifest["validation"]
    assert validation["measures"].startswith("the package's wasm graphs")
    assert validation["psnr_db"] is None or validation["psnr_db"] >= validation["psnr_floor_db"]
    assert validation["budget"] == 2 * largest


@pytest.mark.slow
def test_the_streamed_web_check_fails_a_package_whose_weights_differ(out_of_core_web_export,
                                                                    tmp_path):
    """The check compares the package's video with PyTorch's: the same package with the
    transformer's output projection zeroed (the latents never move from the noise) misses
    the floor, naming the stored form."""
    from edge.core.package import file_entry, write_manifest
    from edge.exporters import ExportValidationError
    from edge.exporters.web.check import streamed_check
    from edge.exporters.web.storage import web_storage

    model, components, root, manifest, _ = out_of_core_web_export
    broken = tmp_path / "pkg"
    shutil.copytree(root, broken)
    edited = json.loads((broken / "manifest.json").read_text())
    last = next(c for c in edited["components"] if c["name"] == "transformer")["blocks"][-1]
    for path in last["weights"]["shards"]:
        (broken / path).write_bytes(bytes((broken / path).stat().st_size))
    last["files"] = [file_entry(broken, broken / f["path"]) for f in last["files"]]
    write_manifest(broken, edited)
    with pytest.raises(ExportValidationError, match="with weights stored as fp16 the video "
                                                    "differs from fp32 PyTorch"):
        streamed_check(broken, components, web_storage("fp16", model), model.sampler.steps)
