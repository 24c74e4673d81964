"""Wan 2.1 through `--target iphone`: the same family cut at the device's shapes, one CoreML
program per block (the decoder chunked, its first-frame variants with their own signature),
validated on Linux by reading the stored weights back into PyTorch, per block and end to end
against diffusers' own WanPipeline."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner
from wan_folder import make_wan_folder

from edge.blocks import Block
from edge.cli import app
from edge.families import load_model
from edge.package import read_package

pytest.importorskip("coremltools", reason="coremltools is in the test extras (pip install "
                    "-e '.[test]'); the CoreML exporter needs it")
pytestmark = pytest.mark.slow  # a whole CoreML export of a tiny Wan (about 30 s)

SIZE = {"height": 32, "width": 48, "frames": 9}


@pytest.fixture(scope="module")
def wan_model(tmp_path_factory):
    return load_model(make_wan_folder(tmp_path_factory.mktemp("wan") / "wan"), steps=8, **SIZE)


@pytest.fixture(scope="module")
def wan_iphone(tmp_path_factory, wan_model):
    from exporters.coreml import export_coreml
    from exporters.coreml_check import end_to_end_check

    root = tmp_path_factory.mktemp("wan-iphone") / "pkg"
    return root, export_coreml(wan_model, root,
                               validate_end_to_end=end_to_end_check(wan_model, "fp16"))


def test_wan_exports_to_coreml_and_matches_wan_pipeline(wan_iphone):
    root, manifest = wan_iphone
    assert read_package(root) == manifest  # a whole, verifiable package
    assert (manifest["target"], manifest["family"]) == ("iphone", "wan")
    errors = {f"{c['name']}/{b['name']}": b["validation"]["max_abs_error"]
              for c in manifest["components"] for b in c["blocks"]}
    assert len(errors) == 4 + 4 + 6 and max(errors.values()) <= 5e-3, errors
    check = manifest["validation"]
    # fp16 weights in diffusers' own pipeline against fp32: the video and its spread
    assert check["psnr_db"] >= 35 and check["snr_db"] >= 20, check


def test_the_decoder_is_chunked_with_first_frame_programs(wan_iphone):
    _, manifest = wan_iphone
    decoder = next(c for c in manifest["components"] if c["name"] == "vae_decoder")
    assert decoder["chunked"]["first_variant"] == "first"
    assert decoder["chunked"]["state"][0] == "head_cache_0"
    for block in decoder["blocks"]:
        first = block["variants"]["first"]
        assert first["model"].endswith(".first.mlpackage")
        # the first frame takes no cache: its own, shorter signature
        assert [s["name"] for s in first["inputs"]] == [block["inputs"][0]["name"]]
    # one video, one latent frame per call: 16 channels of 32x48 / 8
    assert decoder["blocks"][0]["inputs"][0] == {"name": "z", "dtype": "float32",
                                                 "shape": [1, 16, 1, 4, 6]}


class NearestExact(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.interpolate(x, scale_factor=2.0, mode="nearest-exact")


def test_a_block_coreml_cannot_take_is_refused_naming_block_and_op(wan_model, tmp_path):
    from exporters import ExportValidationError
    from exporters.coreml import export_coreml

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
