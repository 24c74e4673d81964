"""A tiny-sora weights folder edge cannot take is refused in one line naming the file and
the field, before a module is built (edge/models/tiny_sora_folder.py), by every command
that reads one: `generate --weights`, `export --model`."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from typer.testing import CliRunner

from edge.commands import app
from edge.models.tiny_sora import DEFAULT_WEIGHTS


@pytest.fixture
def folder(tmp_path):
    out = tmp_path / "weights"
    shutil.copytree(DEFAULT_WEIGHTS, out)
    return out


def _edit_config(folder, section: str, **changes):
    path = folder / "tiny-sora.json"
    config = json.loads(path.read_text())
    config[section].update(changes)
    path.write_text(json.dumps(config))


def _both_commands(folder, tmp_path) -> list:
    runner = CliRunner()
    return [runner.invoke(app, ["generate", "a red circle moving left", "--weights",
                                str(folder), "-o", str(tmp_path / "out.gif")]),
            runner.invoke(app, ["export", "--model", str(folder), "--dry-run"])]


@pytest.mark.parametrize("section,changes,message", [
    ("transformer", {"hidden": "128"}, 'transformer.hidden is "128"; it must be an integer'),
    ("transformer", {"pairs": None}, "transformer.pairs is null"),
    ("transformer", {"heads": 2.0}, "transformer.heads is 2.0"),
    ("transformer", {"pairs": 10_000_000}, r"transformer.pairs is 10000000; .*\[1, 65536\]"),
    ("transformer", {"mlp_ratio": -1}, "transformer.mlp_ratio is -1"),
    ("transformer", {"heads": 3}, "transformer.heads 3 does not divide transformer.hidden"),
    ("transformer", {"depth": 4}, "transformer field.s. depth are not tiny-sora's"),
    ("sampler", {"steps": "30"}, 'sampler.steps is "30"'),
    ("sampler", {"shift": [3.0]}, "sampler.shift is \\[3.0\\]"),
])
def test_config_fields_are_checked_by_name(folder, tmp_path, section, changes, message):
    _edit_config(folder, section, **changes)
    for result in _both_commands(folder, tmp_path):
        assert result.exit_code == 2, result.output
        assert "tiny-sora.json" in result.output
        assert re.search(message, result.output), result.output
        assert "Traceback" not in result.output
    assert not (tmp_path / "out.gif").exists()


def test_a_truncated_or_mismatched_weights_file_is_named(folder, tmp_path):
    weights = folder / "transformer.safetensors"
    whole = weights.read_bytes()
    weights.write_bytes(whole[: len(whole) // 2])
    for result in _both_commands(folder, tmp_path):
        assert result.exit_code == 2, result.output
        assert "transformer.safetensors: not a readable safetensors file" in result.output
    weights.write_bytes(whole)
    _edit_config(folder, "transformer", pairs=3)  # the file holds 4 pairs
    for result in _both_commands(folder, tmp_path):
        assert result.exit_code == 2, result.output
        assert "transformer.safetensors: its tensors do not fit tiny-sora.json" in result.output


def test_a_config_that_is_not_json_is_named(folder, tmp_path):
    (folder / "tiny-sora.json").write_bytes(b"{\xff")
    for result in _both_commands(folder, tmp_path):
        assert result.exit_code == 2, result.output
        assert "tiny-sora.json: not a JSON file" in result.output


def test_scale_model_refuses_a_model_larger_than_memory_before_building_it(tmp_path):
    """`--hidden 10000000`: counted on the meta device (nothing allocated) and refused with
    the figure, nothing written."""
    result = CliRunner().invoke(app, ["scale-model", str(tmp_path / "huge"), "--hidden",
                                      "10000000", "--heads", "2"])
    assert result.exit_code == 2, result.output
    assert "--hidden 10000000" in result.output and "more than this machine's" in result.output
    assert not (tmp_path / "huge").exists()
