"""Mixed-bit recipes chosen by measurement (exporters/iphone/coreml/recipe.py): the choice on
made-up trials, and the measurement on tiny-sora's transformer, whose prediction (the blocks'
errors added) is held to the recipe rendered whole."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edge.core.video_metrics import psnr
from edge.exporters.iphone.coreml.recipe import (
    FormTrial,
    _hull,
    candidate_forms,
    choose,
    psnr_of,
    recipes,
)


def trial(block: str, form: str, size: int, mse: float, videos: int = 2) -> FormTrial:
    return FormTrial(block, form, size, (mse,) * videos)


# two blocks: "a" is cheap to shrink (its errors stay small), "b" is not
TRIALS = [
    trial("a", "fp16", 1000, 0.001), trial("a", "int8", 500, 0.01),
    trial("a", "lut6", 380, 0.02), trial("a", "lut4", 250, 0.05),
    trial("b", "fp16", 1000, 0.001), trial("b", "int8", 500, 0.1),
    trial("b", "lut6", 380, 0.5), trial("b", "lut4", 250, 4.0),
]


def test_the_hull_keeps_forms_worth_their_bytes():
    """A form with more bytes and no less error than another is dropped (dominated), and so
    is one off the lower convex hull (going past it costs less error per byte saved)."""
    got = _hull([trial("x", "fp16", 1000, 0.0), trial("x", "int8", 500, 1.0),
                 trial("x", "lut6", 400, 2.5), trial("x", "lut4", 250, 3.0),
                 trial("x", "wide", 1200, 0.5)])
    # "wide" is larger and worse than fp16; lut6 lies above the line from int8 to lut4
    assert [t.form for t in got] == ["fp16", "int8", "lut4"]


def test_recipes_step_from_least_error_to_smallest():
    options = recipes(TRIALS)
    assert options[0].forms == {"a": "fp16", "b": "fp16"}
    assert options[-1].forms == {"a": "lut4", "b": "lut4"}
    sizes = [r.weight_bytes for r in options]
    errors = [max(r.mse) for r in options]
    assert sizes == sorted(sizes, reverse=True) and errors == sorted(errors)
    # the cheap block shrinks first: "a" reaches lut4 before "b" leaves int8
    first_b_below_int8 = next(i for i, r in enumerate(options) if r.forms["b"] in ("lut6", "lut4"))
    assert options[first_b_below_int8 - 1].forms["a"] == "lut4"
    # the prediction adds the blocks' errors
    assert options[-1].mse == pytest.approx((4.05, 4.05))


def test_a_size_target_takes_the_least_error_that_fits():
    got = choose(TRIALS, max_bytes=800)
    assert got.weight_bytes <= 800
    assert got.forms == {"a": "lut4", "b": "int8"}
    assert got.psnr_db == pytest.approx(psnr_of(0.15))
    with pytest.raises(ValueError, match="no recipe fits 400 bytes of weights: the smallest "
                                         "is 500"):
        choose(TRIALS, max_bytes=400)


def test_a_psnr_target_takes_the_smallest_above_it():
    target = psnr_of(0.2)  # room for "b" at int8 and "a" at lut4, not for "b" at lut6
    got = choose(TRIALS, min_psnr_db=target)
    assert got.forms == {"a": "lut4", "b": "int8"} and got.psnr_db >= target
    with pytest.raises(ValueError, match="no recipe reaches 80 dB: .* predicted at"):
        choose(TRIALS, min_psnr_db=80)
    with pytest.raises(ValueError, match="give one target"):
        choose(TRIALS)


def test_the_worst_video_decides():
    """The prediction is per video: a form that hurts one video more counts there."""
    uneven = [FormTrial("a", "fp16", 100, (0.0, 0.0)), FormTrial("a", "lut4", 30, (0.1, 3.0))]
    assert choose(uneven, min_psnr_db=psnr_of(1.0)).forms == {"a": "fp16"}
    # the errors are added as MSEs and read as the PSNR video_metrics gives the videos
    want, got = np.zeros((2, 3, 4)), np.full((2, 3, 4), 2.0)
    assert psnr_of(4.0) == pytest.approx(psnr(got, want)) and math.isinf(psnr_of(0.0))


def test_candidates_are_what_the_ios_decompresses():
    assert "lut4-g16" not in candidate_forms(17) and "lut4-g16" in candidate_forms(18)
    with pytest.raises(ValueError, match="stored form 'lut5' is not one of"):
        candidate_forms(18, ["int8", "lut5"])


def test_auto_targets_are_a_psnr_a_size_or_a_ratio():
    from edge.exporters.iphone.coreml.package import auto_target, check_setting, compression

    assert auto_target("4") is None
    assert auto_target("auto").min_psnr_db == 38.0
    assert auto_target("auto:40dB").min_psnr_db == 40.0
    assert auto_target("auto:7x").weight_bytes(70_000) == 10_000
    assert auto_target("auto:14MB").weight_bytes(10**9) == 14 << 20
    for bad in ("auto:fast", "auto:1x", "auto:0dB", "auto:nanx", "auto:"):
        with pytest.raises(ValueError, match=f"--quantize '{bad}': the target after 'auto:'"):
            auto_target(bad)
    check_setting("auto:7x")
    with pytest.raises(ValueError, match=r"'automatic' not understood; use one of .*auto"):
        check_setting("automatic")
    with pytest.raises(ValueError, match="auto:7x is chosen by measurement at export"):
        compression("auto:7x")


def test_dry_run_counts_auto_at_fp16_and_says_how_it_is_chosen():
    from typer.testing import CliRunner

    from edge.commands import app

    result = CliRunner().invoke(app, ["export", "--target", "iphone", "--dry-run",
                                      "--quantize", "auto:7x", "--memory-budget", "24MB"])
    assert result.exit_code == 0, result.output
    assert "of weight files at fp16 (estimate)" in result.output
    assert ("--quantize auto:7x: each block's stored form is chosen at export by measurement "
            "(8 forms x ") in result.output
    assert "residency on the device at 24.0 MiB (stored fp16 bytes" in result.output
    result = CliRunner().invoke(app, ["export", "--target", "iphone", "--dry-run",
                                      "--quantize", "auto:small"])
    assert result.exit_code != 0
    assert "the target after 'auto:' is a worst-video PSNR" in result.output


@pytest.mark.slow  # each transformer block converted and stored 3 ways, 13 short renders
def test_measured_forms_predict_the_recipe_rendered_whole(tiny_sora):
    """tiny-sora's transformer, each block in three forms alone (2 steps, one video): the
    forms shrink the weight files in order of their bits, 4 bits costs more than 8 in
    total, and a recipe between all-int8 and all-lut4 rendered whole lands within 1.5 dB of
    what the blocks' errors added predict."""
    pytest.importorskip("coremltools", reason="coremltools is in the test extras")
    from edge.exporters.iphone.coreml.package import cut_for_device
    from edge.exporters.iphone.coreml.recipe import VIDEOS, check_recipe, measure_forms

    components = {"transformer": cut_for_device(tiny_sora)["transformer"]}
    videos, steps = VIDEOS[:1], 2
    trials = measure_forms(tiny_sora, components, ["fp16", "int8", "lut4"], videos, steps)
    by = {(t.block, t.form): t for t in trials}
    keys = [b.key for b in components["transformer"]]
    assert len(trials) == 3 * len(keys)
    sized = [k for k in keys if by[k, "fp16"].weight_bytes > by[k, "lut4"].weight_bytes]
    assert sized, "no transformer block holds a tensor coremltools compresses"
    for k in sized:
        assert by[k, "fp16"].weight_bytes > by[k, "int8"].weight_bytes > by[k, "lut4"].weight_bytes
    error = {f: sum(by[k, f].mean_mse for k in keys) for f in ("fp16", "int8", "lut4")}
    assert error["fp16"] < error["int8"] < error["lut4"], error
    int8 = sum(by[k, "int8"].weight_bytes for k in keys)
    lut4 = sum(by[k, "lut4"].weight_bytes for k in keys)
    recipe = choose(trials, max_bytes=(int8 + lut4) // 2)
    assert set(recipe.forms.values()) >= {"lut4"} and recipe.weight_bytes <= (int8 + lut4) // 2
    got = check_recipe(tiny_sora, components, recipe, videos, steps)
    assert abs(got[0] - recipe.psnr_db) <= 1.5, (got, recipe.psnr_db)
