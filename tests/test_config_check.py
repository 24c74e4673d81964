"""The second probe's items 8, 9 and 17 for diffusers folders (docs/reliability.md): a
component config whose field types, layer counts or sizes disagree with its class or with the
weights stored beside it is refused in one line naming the file and the field or tensors,
before diffusers or transformers builds anything, and in well under a second even where the
config asks for ten million layers or a million heads."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from edge.commands import app
from edge.families.config_check import numbered_layers

sys.path.insert(0, str(Path(__file__).parent))
from cogvideox_folder import make_cogvideox_folder  # noqa: E402
from ltx_folder import make_ltx_folder  # noqa: E402
from tiny_parts import edited_copy  # noqa: E402
from wan_folder import make_wan_folder  # noqa: E402

runner = CliRunner()
MAKERS = {"wan": make_wan_folder, "cogvideox": make_cogvideox_folder, "ltx": make_ltx_folder}
SIZE = {"wan": ["--height", "32", "--width", "48", "--frames", "9"],
        "cogvideox": ["--height", "32", "--width", "64", "--frames", "17"],
        "ltx": ["--height", "32", "--width", "64", "--frames", "17"]}
LAYERS = 2  # every tiny folder's transformer and text encoder


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {name: make(root / name) for name, make in MAKERS.items()}


def refused_dry_run(folder: Path, message: str) -> str:
    """`edge export --model FOLDER --dry-run`: exit status 2, one error line, no traceback,
    the line containing `message`; returns it."""
    start = time.perf_counter()
    res = runner.invoke(app, ["export", "--model", str(folder), "--dry-run", *SIZE[folder.name]])
    took = time.perf_counter() - start
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), res.output
    assert "Traceback" not in res.output
    errors = [line for line in res.output.splitlines() if "error:" in line]
    assert len(errors) == 1 and message in errors[0], res.output
    # a loose bound: a meta build of 10^7 layers (what the checks prevent) takes minutes
    assert took < 30, f"refused after {took:.0f} s"
    return errors[0]


@pytest.mark.parametrize("family", list(MAKERS))
@pytest.mark.parametrize("value, why", [
    ("2", "num_layers='2'; must be an integer"),
    (2.0, "num_layers=2.0; must be an integer"),
    (None, "num_layers=None; must be an integer"),
    (-1, "num_layers=-1; must be at least 1"),
    (-3, "num_layers=-3; must be at least 1"),
    (LAYERS + 1, f"num_layers={LAYERS + 1}, but the weights beside it number at most "
                 f"{LAYERS} layers"),
    (10_000_000, "num_layers=10000000, but the weights beside it number at most"),
])
def test_transformer_layer_counts_are_checked(folders, tmp_path, family, value, why):
    folder = edited_copy(folders[family], tmp_path / family, "transformer/config.json",
                         num_layers=value)
    line = refused_dry_run(folder, why)
    assert str(folder / "transformer" / "config.json") in line


@pytest.mark.parametrize("family", list(MAKERS))
def test_fewer_layers_than_stored_names_the_unused_tensors(folders, tmp_path, family):
    folder = edited_copy(folders[family], tmp_path / family, "transformer/config.json",
                         num_layers=LAYERS - 1)
    line = refused_dry_run(folder, "stored tensors the model")
    assert f"blocks.{LAYERS - 1}." in line  # the last stored layer, which nothing would use


@pytest.mark.parametrize("family", list(MAKERS))
def test_text_encoder_fields_are_checked(folders, tmp_path, family):
    config = "text_encoder/config.json"
    refused_dry_run(edited_copy(folders[family], tmp_path / "a" / family, config,
                                num_layers="2"),
                    "text_encoder/config.json: num_layers='2'; must be an integer")
    refused_dry_run(edited_copy(folders[family], tmp_path / "b" / family, config,
                                num_layers=LAYERS + 1),
                    f"num_layers={LAYERS + 1}, but the weights beside it")


@pytest.mark.parametrize("family", ["wan", "cogvideox"])
def test_a_million_heads_is_refused_by_shape_without_allocating(folders, tmp_path, family):
    folder = edited_copy(folders[family], tmp_path / family, "transformer/config.json",
                         num_attention_heads=1_048_576)
    refused_dry_run(folder, "safetensors: tensor ")


@pytest.mark.parametrize("family, fields, why", [
    ("wan", {"num_res_blocks": "2"}, "vae/config.json: num_res_blocks='2'; must be an integer"),
    ("ltx", {"layers_per_block": 3}, "vae/config.json: layers_per_block=3; must be a list"),
    ("ltx", {"layers_per_block": [1, 0, 1, 1, 1]}, "layers_per_block=[1, 0, 1, 1, 1]; must "
     "hold integers of at least 1"),
])
def test_vae_fields_are_checked(folders, tmp_path, family, fields, why):
    refused_dry_run(edited_copy(folders[family], tmp_path / family, "vae/config.json",
                                **fields), why)


def test_numbered_layers_counts_the_largest_repeated_module():
    names = ["blocks.0.attn.q.weight", "blocks.1.attn.q.weight", "blocks.1.ffn.0.weight",
             "blocks.1.ffn.2.weight", "head.weight",
             "decoder.up.0.resnets.0.w", "decoder.up.0.resnets.1.w", "decoder.up.0.resnets.2.w"]
    assert numbered_layers(names) == 3       # decoder.up.0.resnets: 0, 1, 2
    assert numbered_layers(names[:2]) == 2
    assert numbered_layers(["head.weight"]) == 0
