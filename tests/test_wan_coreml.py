"""Wan 2.1 through `--target iphone`: the same family cut at the device's shapes, one CoreML
program per block (the decoder chunked, its first-frame variants with their own signature;
for iOS 18 a block and its variants are the functions of one program, for iOS 17 programs of
their own), validated on Linux by reading the stored weights back into PyTorch, per block
and function and end to end against diffusers' own WanPipeline."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import chunked_attention_for_tests
from typer.testing import CliRunner

from edge.commands import app
from edge.core.manifest_schema import PackageError, check_manifest
from edge.core.package import read_package
from edge.graph.blocks import Block

pytest.importorskip("coremltools", reason="coremltools is in the test extras (pip install "
                    "-e '.[test]'); the CoreML exporter needs it")
pytestmark = pytest.mark.slow  # whole CoreML exports of a tiny Wan (about 40 s each)

SIZE = {"height": 32, "width": 48, "frames": 9}   # conftest.py's wan_model's


@pytest.fixture(scope="module")
def wan_iphone(wan_iphone_package):
    """The session's tiny Wan package (conftest.py: fp16, iOS 18, multifunction)."""
    return wan_iphone_package


@pytest.fixture(scope="module")
def wan_iphone_ios17(tmp_path_factory, wan_model):
    """The tiny Wan exported for iOS 17: each variant a program of its own."""
    from edge.exporters.iphone.coreml.check import end_to_end_check
    from edge.exporters.iphone.coreml.package import export_coreml

    root = tmp_path_factory.mktemp("wan-iphone-ios17") / "pkg"
    with chunked_attention_for_tests():  # as the iOS 18 package it is compared with
        return root, export_coreml(wan_model, root, min_ios=17,
                                   validate_end_to_end=end_to_end_check(wan_model, "fp16"))


def _weight_file(root, model: str) -> int:
    return sum(f.stat().st_size for f in (root / model).rglob("weight.bin"))


def test_wan_exports_to_coreml_and_matches_wan_pipeline(wan_iphone):
    root, manifest = wan_iphone
    assert read_package(root) == manifest  # a whole, verifiable package
    assert (manifest["target"], manifest["family"]) == ("iphone", "wan")
    errors = {f"{c['name']}/{b['name']}": b["validation"]["max_abs_error"]
              for c in manifest["components"] for b in c["blocks"]}
    assert len(errors) == 4 + 4 + 6 and max(errors.values()) <= 5e-3, errors
    check = manifest["validation"]
    # fp16 weights in diffusers' own pipeline against fp32: the video and its spread
    assert check["identical"] or (check["psnr_db"] >= 35 and check["snr_db"] >= 20), check


def test_the_decoder_is_chunked_with_first_frame_programs(wan_iphone):
    _, manifest = wan_iphone
    decoder = next(c for c in manifest["components"] if c["name"] == "vae_decoder")
    assert decoder["chunked"]["first_variant"] == "first"
    assert decoder["chunked"]["state"][0] == "head_cache_0"
    for block in decoder["blocks"]:
        first = block["variants"]["first"]
        # a function of the stage's own program, sharing its weight file
        assert (first["model"], first["function"]) == (block["model"], "first")
        assert block["function"] == "main"
        # the first frame takes no cache: its own, shorter signature
        assert [s["name"] for s in first["inputs"]] == [block["inputs"][0]["name"]]
        assert first["validation"]["max_abs_error"] <= 5e-3  # its weights, read back
    # one video, one latent frame per call: 16 channels of 32x48 / 8
    assert decoder["blocks"][0]["inputs"][0] == {"name": "z", "dtype": "float32",
                                                 "shape": [1, 16, 1, 4, 6]}


def test_the_ios17_layout_exports_and_variants_share_weights_in_the_ios18_one(
        wan_iphone_ios17, wan_iphone):
    from edge.exporters.iphone.coreml.check import check_structure
    from edge.exporters.iphone.target import package_bytes, summary

    root, manifest = wan_iphone_ios17
    assert read_package(root) == manifest
    assert (manifest["coreml"]["layout"], manifest["coreml"]["minimum_deployment_target"]) == (
        "separate", "iOS17")
    assert check_structure(root, manifest) == []
    check = manifest["validation"]
    assert check["identical"] or (check["psnr_db"] >= 35 and check["snr_db"] >= 20), check
    mf_root, mf = wan_iphone
    blocks = {f"{c['name']}/{b['name']}": b for c in manifest["components"]
              for b in c["blocks"]}
    shared = {f"{c['name']}/{b['name']}": b for c in mf["components"] for b in c["blocks"]}
    with_variants = [k for k, b in blocks.items() if b.get("variants")]
    assert len(with_variants) == 2 + 6  # the transformer's TDTM blocks, the decoder's stages
    for key in with_variants:
        block, one = blocks[key], shared[key]
        separate = [_weight_file(root, r["model"])
                    for r in [block, *block["variants"].values()]]
        assert len({r["model"] for r in [block, *block["variants"].values()]}) == 2
        together = _weight_file(mf_root, one["model"])
        # one program, its tensors once: no more than the larger of the two programs
        # (a `first` variant stores constants of its own, e.g. the zero frame it pads with)
        assert together <= 1.02 * max(separate) + 1024, (key, together, separate)
        if key.startswith("transformer/"):  # a TDTM variant: the very same tensors
            assert 0.49 < together / sum(separate) < 0.51, (key, together, separate)
    # the summary: the whole package against the fp32 tensors it stores (each once), not
    # against the fp32 parameters alone (which left out UMT5's position-bias tables and made
    # the fp16 package look "0.1x smaller")
    for r, m in ((root, manifest), (mf_root, mf)):
        fp32 = sum(b["reference_weight_bytes"] for c in m["components"] for b in c["blocks"])
        assert 1.5 < fp32 / package_bytes(r) < 2.0, fp32 / package_bytes(r)
        assert f"{fp32 / package_bytes(r):.2f}x smaller than the fp32 tensors" in summary(
            m, r, 1.0)
    # the weights: the iOS 18 package also holds the caption-half functions (program text
    # of their own over the same tensors), which the iOS 17 one has not
    assert sum(_weight_file(mf_root, b["model"]) for b in shared.values()) < sum(
        _weight_file(root, r["model"]) for b in blocks.values()
        for r in [b, *b.get("variants", {}).values()])


def test_the_transformer_has_caption_half_functions_sharing_its_weights(wan_iphone):
    """`unguided` on every transformer block and `tdtm_unguided` beside each TDTM variant:
    functions of the block's program at a batch of one (the caption's rows), their weights
    read back and run against PyTorch as every function's are."""
    _, manifest = wan_iphone
    dit = next(c for c in manifest["components"] if c["name"] == "transformer")
    for block in dit["blocks"]:
        variants = block["variants"]
        want = {"unguided"} | ({"tdtm", "tdtm_unguided"} if "tdtm" in variants else set())
        assert set(variants) == want, block["name"]
        for name in want - {"tdtm"}:
            half = variants[name]
            assert (half["model"], half["function"]) == (block["model"], name)
            # the first input and output (latent or tokens in, tokens or velocity out)
            assert [half["inputs"][0]["shape"][0], half["outputs"][0]["shape"][0]] == [1, 1]
            assert block["inputs"][0]["shape"][0] == 2
            assert half["validation"]["max_abs_error"] <= 5e-3
    assert sum("tdtm" in b["variants"] for b in dit["blocks"]) == 2


def test_a_variant_the_manifest_misplaces_is_refused(wan_iphone):
    _, manifest = wan_iphone
    m = copy.deepcopy(manifest)
    m.pop("manifest_sha256")
    decoder = next(c for c in m["components"] if c["name"] == "vae_decoder")
    del decoder["blocks"][0]["variants"]["first"]["function"]
    with pytest.raises(PackageError, match="block vae_decoder/head variant first: missing "
                       "field 'function'"):
        check_manifest(m)


class NearestExact(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.interpolate(x, scale_factor=2.0, mode="nearest-exact")


def test_a_block_coreml_cannot_take_is_refused_naming_block_and_op(wan_model, tmp_path):
    from edge.exporters import ExportValidationError
    from edge.exporters.iphone.coreml.package import export_coreml

    block = Block("vae_decoder", "upsample", NearestExact(), ["h"], ["h"],
                  (torch.randn(1, 4, 8, 8),), [False])
    with pytest.raises(ExportValidationError, match=r"block vae_decoder/upsample: CoreML "
                       r"cannot take it: Unsupported fx node _upsample_nearest_exact2d"):
        export_coreml(wan_model, tmp_path / "pkg", components={"vae_decoder": [block]})
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_dry_run_lists_the_device_cut(wan_model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["export", "--model", str(wan_model.folder), "--target",
                                   "iphone", "--dry-run", "--steps", "8",
                                   *[f"--{k}={v}" for k, v in SIZE.items()]])
    assert res.exit_code == 0, res.output
    assert "vae_decoder/up_0" in res.output and "(+first variant)" in res.output
    assert "input_ids [1, 512]" in res.output  # one prompt on the device
    assert list(tmp_path.iterdir()) == []


def test_wan_words_its_own_4_bit_setting(wan_model, tmp_path, monkeypatch):
    """Wan's --quantize 4 (edge/families/wan/family.py STORAGE_4, measured at 1.3B's shapes): the
    text encoder and the transformer at int4 with block scales, the decoder at int8; it needs
    iOS 18, so --min-ios 17 is refused naming the blocks, nothing written."""
    from edge.exporters.iphone.coreml.package import INT8, STORAGES, compression

    int4 = STORAGES["int4-b32"]

    setting = compression("4", wan_model)
    assert {key: setting.storage(key) for key in (
        "text_encoder/layer_0", "transformer/block_0", "transformer/prologue",
        "vae_decoder/up_0")} == {"text_encoder/layer_0": int4, "transformer/block_0": int4,
                                 "transformer/prologue": int4, "vae_decoder/up_0": INT8}
    assert setting.min_ios == 18 and setting.psnr_floor_db == 35.0
    monkeypatch.chdir(tmp_path)
    options = ["--model", str(wan_model.folder), "--target", "iphone", "--quantize", "4",
               "--steps", "8", *[f"--{k}={v}" for k, v in SIZE.items()]]
    res = CliRunner().invoke(app, ["export", *options, "--min-ios", "17"])
    assert res.exit_code == 2, res.output
    assert ("--quantize 4 stores text_encoder/*, transformer/* in forms iOS 18 decompresses; "
            "--min-ios 17 "
            "cannot load them: use --min-ios 18 or --quantize fp16 / 8 / 6") in res.output
    res = CliRunner().invoke(app, ["export", *options, "--dry-run"])
    assert res.exit_code == 0 and "~4 MiB" in res.output, res.output
    assert list(tmp_path.iterdir()) == []
