"""`edge export --check` (edge/commands/export_check.py): how much of the end-to-end check
runs, chosen from the estimate of its cost, and recorded in the manifest as it ran."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from edge.commands import app
from edge.families import check_size

runner = CliRunner()
SIZE = ["--height", "32", "--width", "48", "--frames", "9", "--steps", "2"]


def export(args: list[str]):
    res = runner.invoke(app, ["export", *args])
    assert res.exit_code == 0, res.output
    return res.output


@pytest.mark.slow
def test_the_small_check_exports_and_generates_at_the_familys_small_size(wan_folder, tmp_path,
                                                                         monkeypatch):
    import tempfile

    from edge.commands.export_check import end_to_end_result
    from edge.exporters import ExportOptions, target
    from edge.families import load_model

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where its temporary package goes
    model = load_model(wan_folder, steps=2, height=32, width=48, frames=9)
    result = end_to_end_result("small", "wan", wan_folder, {"steps": 2}, model,
                               target("onnx"), ExportOptions())
    assert result["size"] == check_size("wan", wan_folder) == {"height": 32, "width": 32,
                                                                "frames": 5}
    assert result["prompt"] and (result["identical"] or result["psnr_db"] >= 40)
    assert "the family's small size" in result["note"]
    assert list(tmp_path.iterdir()) == []  # the temporary package is gone


@pytest.mark.slow
def test_blocks_only_records_that_no_generation_ran(wan_folder, tmp_path):
    """--check blocks, with --execute distinct: Wan's repeated transformer blocks are
    written unrun, naming the block whose graph (the same but for metadata) was validated."""
    out = export(["--model", str(wan_folder), *SIZE, "--check", "blocks",
                  "--execute", "distinct", "-o", str(tmp_path / "pkg")])
    assert "no end-to-end check (--check blocks)" in out
    assert "not run: --execute distinct" in out
    manifest = json.loads((tmp_path / "pkg" / "manifest.json").read_text())
    validation = manifest["validation"]
    assert validation["skipped"] is True
    assert "one block of each distinct graph validated" in validation["note"]
    blocks = {b["name"]: b["validation"] for c in manifest["components"]
              if c["name"] == "transformer" for b in c["blocks"]}
    assert blocks["block_0"]["max_abs_error"] <= 1e-4
    assert blocks["block_1"]["executed"] is False
    assert "its graph is transformer/block_0's but for metadata" in blocks["block_1"]["why"]


def test_auto_checks_in_full_only_where_the_estimate_allows(wan_folder, monkeypatch, capsys):
    from edge.commands import export_check
    from edge.families import load_model

    model = load_model(wan_folder, height=32, width=48, frames=9, steps=2)
    prepared = type("P", (), {"components": model.cut()})()
    assert export_check.check_level("auto", "wan", wan_folder, model, prepared) == "full"
    assert capsys.readouterr().out == ""
    monkeypatch.setattr(export_check, "CHECK_SECONDS", 0.0)  # any full check costs too much
    assert export_check.check_level("auto", "wan", wan_folder, model, prepared) == "small"
    assert re.search(r"note: a full end-to-end check at this size takes at least "
                     r"(under )?[\d.]+ s here \(two generations of 2 steps\); checking end "
                     r"to end at the family's small size instead", capsys.readouterr().out)
    assert export_check.check_level("full", "wan", wan_folder, model, prepared) == "full"
    # a family without a small size keeps the full check whatever it costs
    assert export_check.check_level("auto", "tiny-sora", None, model, prepared) == "full"


@pytest.mark.parametrize("args, message", [
    (["--check", "some"], "--check 'some': one of auto, full, small, blocks"),
    (["--check", "small", "--target", "web"], "--check applies to --target onnx, not web"),
    (["--check", "blocks", "--target", "iphone"], "--check applies to --target onnx, not "
     "iphone"),
    (["--check", "small"], "--check small: tiny-sora's size is fixed"),
])
def test_check_levels_a_target_or_family_cannot_take_are_refused(args, message, tmp_path):
    res = runner.invoke(app, ["export", *args, "-o", str(tmp_path / "pkg")])
    assert res.exit_code == 2 and message in res.output, res.output
    assert not (tmp_path / "pkg").exists()


def test_a_model_at_another_size_shares_its_weights_and_is_what_a_load_at_that_size_is(
        cog_folders):
    """The small check's model: the export's own at the small size, not a second copy of
    the weights; its sampler and its size-derived fields (CogVideoX's decoder chunking) as a
    load at that size makes them."""
    from edge.families import load_model, model_at_size

    folder = cog_folders["5b"]
    big = load_model(folder, steps=3, height=64, width=96, frames=13)
    small_size = check_size("cogvideox", folder)
    small = model_at_size(big, folder, steps=3, out_of_core=None, **small_size)
    loaded = load_model(folder, steps=3, **small_size)
    assert small.pipe is big.pipe
    assert small.latent_shape == loaded.latent_shape != big.latent_shape
    assert small.sampler == loaded.sampler
    assert small.chunked == loaded.chunked != big.chunked
    assert (big.height, big.width, big.frames) == (64, 96, 13)  # the export's model unchanged
