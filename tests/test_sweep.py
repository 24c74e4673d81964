"""`edge eval --sweep` on the exported tiny-sora package, at a CI size (2 prompts, 4 steps)."""
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from edge.cli import app
from edge.sweep import format_table, pooled_psnr, sweep_settings

runner = CliRunner()
ROWS = ["baseline", "LPL dynamic", "LPL fixed at 2", "TDTM first 2", "TDTM all steps",
        "step cache", "LPL + TDTM", "all combined"]


def test_settings_switch_every_technique_explicitly():
    rows = {s.name: s.overrides for s in sweep_settings(30, leap_min_steps=15,
                                                        cache_threshold=0.2)}
    assert list(rows) == ["baseline", "LPL dynamic", "LPL fixed at 15", "TDTM first 15",
                          "TDTM all steps", "step cache", "LPL + TDTM", "all combined"]
    assert rows["baseline"] == {"steps": 30, "leap": False, "leap_after": None,
                                "merge_steps": 0, "cache_threshold": 0.0}
    assert rows["LPL fixed at 15"]["leap_after"] == 15
    assert rows["LPL + TDTM"] == rows["baseline"] | {"leap": True, "leap_min_steps": 15,
                                                          "merge_steps": 15}
    assert rows["all combined"]["cache_threshold"] == 0.2
    assert rows["step cache"]["leap"] is False
    with pytest.raises(ValueError, match="steps=1"):
        sweep_settings(1, 15)


def test_pooled_psnr():
    a = np.zeros((2, 3, 4), np.uint8)
    b = a.copy()
    assert pooled_psnr([a], [b]) is None
    b[0, 0, 0] = 255  # one pixel of 24 off by full scale: MSE = 255² / 24
    assert pooled_psnr([a], [b]) == pytest.approx(10 * np.log10(24))


def test_cli_sweep_runs_every_row_in_both_regimes(exported_package, tmp_path):
    root, _ = exported_package
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle moving left\na blue square moving up\n")
    res = runner.invoke(app, ["eval", "--sweep", "--package", str(root), "--prompts",
                              str(prompts), "--steps", "4", "--batch", "2", "--threads", "1",
                              "--json"])
    assert res.exit_code == 0, res.output
    result = json.loads(res.stdout.strip().splitlines()[-1])  # progress goes to stderr
    assert result["n_prompts"] == 2 and result["steps"] == 4
    for regime in ("resident", "streamed"):
        rows = {r["setting"]: r for r in result["regimes"][regime]}
        assert list(rows) == ROWS
        base = rows["baseline"]
        assert base["transformer_calls"] == 4 and base["speedup"] == 1.0
        assert base["psnr_db"] is None
        assert rows["LPL fixed at 2"]["transformer_calls"] == 3
        assert rows["LPL fixed at 2"]["calls_ratio"] == pytest.approx(4 / 3)
        assert rows["TDTM first 2"]["merged_calls"] == 2
        assert rows["TDTM all steps"]["merged_calls"] == 4
        assert rows["step cache"]["predictions"] == 4
        assert rows["step cache"]["transformer_calls"] <= 4
        for name in ROWS[1:]:
            r = rows[name]
            assert r["wall_s"] > 0 and r["speedup"] > 0
            assert r["psnr_db"] is None or 5 < r["psnr_db"] < 100, name
            for key in ("color_acc", "shape_acc", "direction_acc", "consistency"):
                assert 0.0 <= r[key] <= 1.0
        # merging and leaping change the video; the fixed leap by more than rounding
        assert rows["LPL fixed at 2"]["psnr_db"] is not None
        assert rows["TDTM all steps"]["psnr_db"] is not None
    # resident: every block read once, in the warm-up; streamed: read cold, every step
    assert all(r["bytes_read"] == 0 for r in result["regimes"]["resident"])
    streamed = {r["setting"]: r for r in result["regimes"]["streamed"]}
    assert streamed["baseline"]["bytes_read"] > streamed["LPL fixed at 2"]["bytes_read"] > 0
    table = format_table(result["regimes"]["streamed"])
    assert table.count("\n") == len(ROWS) + 1 and "| LPL + TDTM |" in table


def test_cli_sweep_names_a_missing_package(tmp_path):
    res = runner.invoke(app, ["eval", "--sweep", "--package", str(tmp_path / "nope")])
    assert res.exit_code == 2 and "edge export" in res.output
