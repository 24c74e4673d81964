"""`edge generate --preset`: named sets of the speed-ups, relative to the package's steps."""

import pytest
from typer.testing import CliRunner

from edge.commands import app
from edge.core.presets import preset_overrides
from edge.core.sampler import SamplerSettings

PROMPT = "a red circle moving left"


def test_presets_scale_with_the_packages_steps():
    tiny = SamplerSettings(steps=30)
    quality = preset_overrides("quality", tiny, merges=True)
    assert quality == {"leap": False, "leap_after": None, "leap_steps": 1, "merge_steps": 0,
                       "cache_threshold": 0.0, "guidance_steps": None}
    balanced = preset_overrides("balanced", tiny, merges=True)
    assert balanced == quality | {"leap": True, "leap_after": 6, "leap_steps": 10,
                                  "merge_steps": 15}
    assert preset_overrides("fast", tiny, merges=True) == balanced | {
        "cache_threshold": 0.1, "guidance_steps": 10}
    # a package without merged variants merges nothing; Wan's 50 steps scale the rule
    assert preset_overrides("fast", tiny, merges=False)["merge_steps"] == 0
    wan = preset_overrides("fast", SamplerSettings(steps=50, scheduler="flow_unipc"), True)
    assert (wan["leap_after"], wan["leap_steps"], wan["guidance_steps"]) == (10, 17, 16)


def test_a_scheduler_without_a_replanned_tail_gets_no_leap():
    ddim = SamplerSettings(steps=50, scheduler="cogvideox_ddim")
    fast = preset_overrides("fast", ddim, merges=True)
    assert fast["leap"] is False and fast["guidance_steps"] == 16


def test_unknown_presets_are_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="--preset 'turbo': known: quality, balanced, fast"):
        preset_overrides("turbo", SamplerSettings(), merges=True)


def test_cli_preset_runs_fewer_calls_and_given_options_win(exported_package, tmp_path):
    root, _ = exported_package
    runner = CliRunner()

    def calls(*options: str) -> str:
        res = runner.invoke(app, ["generate", str(root), PROMPT, "-o", str(tmp_path / "v.gif"),
                                  *options])
        assert res.exit_code == 0, res.output
        return next(line for line in res.output.splitlines() if line.startswith("sampler:"))

    assert calls("--preset", "quality").startswith("sampler: 30 predictions, 30 with the "
                                                  "transformer pairs run, 0 merged (TDTM), "
                                                  "30 guided")
    assert calls("--preset", "balanced").startswith(
        "sampler: 16 predictions, 16 with the transformer pairs run, 15 merged (TDTM), "
        "16 guided")
    fast = calls("--preset", "fast")
    assert "15 merged" in fast and "10 guided" in fast
    assert "16 guided" in calls("--preset", "fast", "--guidance-steps", "16")
    # the preset scales to the steps given, not the package's 30: 60 steps leap after 12 into
    # 20 and merge 30; 12 steps (merge 6) were refused naming a merge_steps=15 never given
    assert calls("--preset", "balanced", "--steps", "60").startswith(
        "sampler: 32 predictions, 32 with the transformer pairs run, 30 merged (TDTM)")
    assert "6 merged" in calls("--preset", "fast", "--steps", "12")
    res = runner.invoke(app, ["generate", str(root), PROMPT, "--preset", "turbo",
                              "-o", str(tmp_path / "x.gif")])
    assert res.exit_code != 0 and "--preset 'turbo': known: quality, balanced, fast" in res.output
    assert not (tmp_path / "x.gif").exists()
