"""`edge eval --sweep` on the exported tiny-sora package, at a CI size (2 prompts, 4 steps)."""
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from edge.commands import app
from edge.eval.sweep import format_table, pooled_psnr, sweep_settings
from edge.eval.sweep_plot import worst_accuracy_change

runner = CliRunner()
ROWS = ["baseline", "2 steps", "3 steps", "2 steps, shift 1.5", "LPL dynamic", "LPL fixed at 2",
        "LPL at 1 + 2 steps", "TDTM first 2", "TDTM all steps",
        "step cache", "guidance cutoff at 1", "LPL + TDTM", "all combined",
        "all combined + cutoff"]


def test_settings_switch_every_technique_explicitly():
    rows = {s.name: s.overrides for s in sweep_settings(30, leap_min_steps=15,
                                                        cache_threshold=0.2, shift=3.0)}
    assert list(rows) == ["baseline", "16 steps", "20 steps", "16 steps, shift 1.5",
                          "LPL dynamic", "LPL fixed at 15", "LPL at 6 + 10 steps",
                          "TDTM first 15", "TDTM all steps", "step cache",
                          "guidance cutoff at 10", "LPL + TDTM", "all combined",
                          "all combined + cutoff"]
    assert rows["baseline"] == {"steps": 30, "shift": 3.0, "leap": False, "leap_after": None,
                                "leap_steps": 1, "merge_steps": 0, "cache_threshold": 0.0,
                                "guidance_steps": None}
    assert rows["guidance cutoff at 10"] == rows["baseline"] | {"guidance_steps": 10}
    assert rows["all combined + cutoff"] == rows["all combined"] | {"guidance_steps": 10}
    assert rows["LPL at 6 + 10 steps"] == rows["baseline"] | {"leap": True, "leap_after": 6,
                                                              "leap_steps": 10}
    # the plain alternatives: fewer uniform steps, a smaller shift, nothing else switched on
    assert rows["16 steps"] == rows["baseline"] | {"steps": 16}
    assert rows["16 steps, shift 1.5"] == rows["baseline"] | {"steps": 16, "shift": 1.5}
    # no shift to halve: no smaller-shift row
    assert not any("shift" in s.name for s in sweep_settings(30, 15, shift=1.0))
    assert rows["LPL fixed at 15"]["leap_after"] == 15
    # the combinations use the tail rule, the one that keeps the video
    assert rows["LPL + TDTM"] == rows["LPL at 6 + 10 steps"] | {"merge_steps": 15}
    # another package's rule, scaled to the sweep's steps
    names = [s.name for s in sweep_settings(15, 15, tail_rule=(8, 9, 30))]
    assert "LPL at 4 + 4 steps" in names
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
    plot = tmp_path / "plots" / "frontier.png"
    res = runner.invoke(app, ["eval", "--sweep", "--package", str(root), "--prompts",
                              str(prompts), "--steps", "4", "--batch", "2", "--threads", "1",
                              "--json", "--plot", str(plot)])
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
        assert rows["LPL at 1 + 2 steps"]["transformer_calls"] == 3
        assert rows["2 steps"]["transformer_calls"] == 2
        assert rows["2 steps"]["calls_ratio"] == 2.0
        assert rows["3 steps"]["transformer_calls"] == 3
        # the same calls, a different schedule: a different video
        assert rows["2 steps, shift 1.5"]["psnr_db"] != rows["2 steps"]["psnr_db"]
        assert rows["LPL fixed at 2"]["calls_ratio"] == pytest.approx(4 / 3)
        assert rows["TDTM first 2"]["merged_calls"] == 2
        assert rows["TDTM all steps"]["merged_calls"] == 4
        assert rows["step cache"]["predictions"] == 4
        assert rows["step cache"]["transformer_calls"] <= 4
        # the work the calls did: the baseline's 4 guided calls against the cutoff's one
        # guided and three of half the batch; a merged call computes less than a full one
        assert base["flops_ratio"] == 1.0 and base["transformer_gflop"] > 0
        assert rows["guidance cutoff at 1"]["transformer_calls"] == 4
        assert rows["guidance cutoff at 1"]["flops_ratio"] == pytest.approx(4 / 2.5, rel=1e-6)
        assert rows["2 steps"]["flops_ratio"] == pytest.approx(2.0, rel=1e-6)
        assert 1.0 < rows["TDTM all steps"]["flops_ratio"] < 2.0
        assert rows["all combined + cutoff"]["flops_ratio"] > rows["all combined"]["flops_ratio"]
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
    # the frontier plot: a PNG with something drawn on it
    assert result["plot"] == str(plot)
    from PIL import Image

    with Image.open(plot) as image:
        assert image.format == "PNG" and image.size == (1080, 540)
        assert len(image.getcolors(maxcolors=1 << 16) or range(1 << 16)) > 20
    assert not list(plot.parent.glob(".*.tmp"))


def test_worst_accuracy_change_takes_the_largest_loss():
    base = {"color_acc": 0.8, "shape_acc": 0.7, "direction_acc": 1.0}
    row = {"color_acc": 0.85, "shape_acc": 0.6, "direction_acc": 0.97}
    assert worst_accuracy_change(row, base) == pytest.approx(-0.1)


def test_cli_plot_needs_a_sweep_and_a_png(tmp_path):
    res = runner.invoke(app, ["eval", "--plot", str(tmp_path / "p.png")])
    assert res.exit_code == 2 and "add --sweep" in res.output
    res = runner.invoke(app, ["eval", "--sweep", "--plot", str(tmp_path / "p.svg")])
    assert res.exit_code == 2 and "p.svg" in res.output and "PNG" in res.output
    assert not (tmp_path / "p.svg").exists()


def test_cli_sweep_names_a_missing_package(tmp_path):
    res = runner.invoke(app, ["eval", "--sweep", "--package", str(tmp_path / "nope")])
    assert res.exit_code == 2 and "edge export" in res.output
