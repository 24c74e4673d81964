"""Given noise levels (`sigmas`, issue 41 item 3): a distilled model's own levels in place of
the schedule's spacing, taken as each flow scheduler's diffusers twin takes
set_timesteps(sigmas=...); the settings' checks; the sampler running them."""

import math
import re

import numpy as np
import pytest
from test_sampler import LTX_CONFIG, _diffusers_scheduler, assert_steps_match

from edge.core.options import with_overrides
from edge.core.sampler import SamplerSettings, Trace, model_times, sample, timesteps
from edge.core.schedulers import SCHEDULERS, scheduler_for

TAKERS = [name for name, cls in SCHEDULERS.items() if cls.takes_sigmas]
# from 1, as LTX-Video 0.9.8 distilled's first pass; below 1 throughout; a single level
GIVEN = {"from-one": (1.0, 0.9937, 0.9875, 0.975, 0.9094, 0.725, 0.4219),
         "below-one": (0.95, 0.6, 0.3, 0.1), "one-level": (0.7,)}


def test_the_flows_take_given_levels_and_ddim_does_not():
    assert TAKERS == ["flow_euler", "flow_unipc", "ltx_flow_euler", "rflow"]
    assert not SCHEDULERS["cogvideox_ddim"].takes_sigmas


@pytest.mark.parametrize("name", TAKERS)
@pytest.mark.parametrize("shift", [1.0, 5.0])
@pytest.mark.parametrize("given", list(GIVEN))
def test_given_levels_are_diffusers_set_timesteps_with_sigmas(name, shift, given):
    """Each flow scheduler's schedule of given levels against its diffusers twin's
    set_timesteps(sigmas=...): the levels (shifted, stretched to LTX's terminal) bit for
    bit, the model times, and each solver step on a velocity that depends on the sample."""
    levels = GIVEN[given]
    terminal = LTX_CONFIG["shift_terminal"] if SCHEDULERS[name].takes_shift_terminal else None
    scheduler = scheduler_for(name, shift, 1000, terminal)
    sched = _diffusers_scheduler(name, shift)
    mu = {"mu": math.log(shift)} if name == "ltx_flow_euler" else {}
    sched.set_timesteps(sigmas=np.array(levels), **mu)
    sigmas, times = scheduler.schedule(len(levels), levels)
    assert np.array_equal(sigmas, sched.sigmas.numpy())
    np.testing.assert_allclose(times * 1000, sched.timesteps.numpy(), atol=1e-3)
    if shift == 1.0 and name != "ltx_flow_euler":  # no shift: the levels as given
        np.testing.assert_allclose(sigmas[:-1], levels, rtol=0, atol=1.1e-6)
    assert_steps_match(scheduler.solver(sigmas), sched, seed=len(levels))


def test_the_sampler_steps_through_the_given_levels():
    """A whole run: the model is told the given levels (shift 1: as they are), a straight
    path lands on its target, and a manifest's JSON list round-trips as the same settings."""
    levels = (0.96, 0.8, 0.5, 0.2)
    settings = SamplerSettings(steps=4, shift=1.0, guidance=1.0, sigmas=list(levels))
    assert settings.sigmas == levels
    assert SamplerSettings.from_dict(settings.to_dict()) == settings
    np.testing.assert_allclose(model_times(settings), levels, atol=1e-7)
    assert timesteps(settings)[-1] == 0
    target, told = np.array([[0.25, -0.5]], np.float32), []

    def predict(x, t, step):
        told.append(t)
        v = (x - target) / np.float32(t)  # the velocity of the straight path to `target`
        return v, None

    noise = np.array([[1.0, 2.0]], np.float32)
    trace = Trace()
    out = sample(predict, noise, settings, trace=trace)
    assert trace.calls == 4 and trace.guided_calls == 0
    np.testing.assert_allclose(told, levels, atol=1e-7)
    np.testing.assert_allclose(out, target, atol=1e-5)


def test_a_leap_after_given_levels_replans_the_rest_from_them():
    """A fixed leap after the given levels' third call: the tail runs from that level to the
    schedule's last before 0 (two steps: the two ends)."""
    settings = SamplerSettings(steps=6, shift=3.0, guidance=1.0, leap=True, leap_after=2,
                               leap_steps=2, sigmas=(1.0, 0.9, 0.8, 0.6, 0.4, 0.2))
    levels, told = timesteps(settings), []
    sample(lambda x, t, step: (told.append(t) or x, None), np.ones((1, 2), np.float32),
           settings)
    assert len(told) == 4
    np.testing.assert_allclose(told[:3], levels[:3], atol=1e-7)
    assert abs(told[3] - levels[-2]) < 1e-6 and levels[-2] < levels[2]


@pytest.mark.parametrize("sigmas,message", [
    ((1.0, 0.5), "2 levels for steps=4 (one level a step)"),
    ((1.0, 1.0, 0.5, 0.2), "does not fall: level 1 (1.0) is not below level 0 (1.0)"),
    ((0.9, 0.95, 0.5, 0.2), "does not fall: level 1 (0.95) is not below level 0 (0.9)"),
    ((1.5, 0.9, 0.5, 0.2), "1.5 is outside the schedule's range (0, 1]"),
    ((1.0, 0.9, 0.5, 0.0), "0.0 is outside the schedule's range (0, 1]"),
    ((1.0, float("nan"), 0.5, 0.2), "must be a list of finite numbers"),
    ((1.0, "0.9", 0.5, 0.2), "must be a list of finite numbers"),
])
def test_bad_given_levels_are_refused_naming_the_value(sigmas, message):
    with pytest.raises(ValueError, match=f"^sampler setting sigmas=.*{re.escape(message)}"):
        SamplerSettings(steps=4, sigmas=sigmas)


@pytest.mark.parametrize("sigmas", [[1e-300, 1e-310], [1.0, 0.9999999999]])
def test_levels_that_collapse_once_shifted_are_blamed_not_the_shift(sigmas):
    """Levels that fall but collapse in the schedule's arithmetic: the error names sigmas,
    which the user gave, not the package's shift (item 24)."""
    with pytest.raises(ValueError, match=r"^sampler setting sigmas=\[.*\]: no usable noise "
                       r"schedule") as err:
        with_overrides(SamplerSettings(shift=3.0), {"sigmas": sigmas})
    assert "shift=" not in str(err.value)


def test_given_levels_and_steps_agree_or_are_refused():
    """Levels given alone set the step count; a package's own levels with another step
    count, or a scheduler that takes none, are refused naming the setting."""
    assert with_overrides(SamplerSettings(), {"sigmas": [0.9, 0.5, 0.1]}).steps == 3
    with pytest.raises(ValueError, match="sigmas=.*3 levels for steps=5"):
        with_overrides(SamplerSettings(), {"sigmas": [0.9, 0.5, 0.1], "steps": 5})
    packaged = SamplerSettings(steps=3, sigmas=(0.9, 0.5, 0.1))
    with pytest.raises(ValueError, match=r"^sampler setting steps=8: these settings give 3 "
                                         r"noise levels of their own \(sigmas\)"):
        with_overrides(packaged, {"steps": 8})
    assert with_overrides(packaged, {"steps": 8, "sigmas": None}).sigmas is None
    with pytest.raises(ValueError, match="sigmas='0.9': must be a list of numbers or None"):
        with_overrides(packaged, {"sigmas": "0.9"})
    with pytest.raises(ValueError, match="sigmas=.*cogvideox_ddim takes no given levels"):
        SamplerSettings(scheduler="cogvideox_ddim", steps=2, sigmas=(0.9, 0.5))


def test_a_model_loaded_with_given_levels_exports_and_checks_them(wan_folder, tmp_path):
    """`edge export --sigmas` loads the family's model with them (`accepts`): its sampler,
    which the manifest writes, carries the levels and their step count, and the export's
    end-to-end reference (`generate`) runs WanPipeline through them, not its own spacing."""
    from conftest import WAN_SIZE

    from edge.families import load_model

    levels = (1.0, 0.9, 0.6)
    model = load_model(wan_folder, sigmas=levels, **WAN_SIZE)
    assert model.sampler.sigmas == levels and model.sampler.steps == 3
    fields = model.package_fields(tmp_path)
    assert fields["sampler"]["sigmas"] == list(levels) and fields["sampler"]["steps"] == 3
    checked = model.generate("a red circle moving left", seed=1)
    given = model.reference("a red circle moving left", seed=1, steps=3, sigmas=levels)
    own = model.reference("a red circle moving left", seed=1, steps=3)
    assert np.array_equal(checked, given) and not np.array_equal(checked, own)


def test_an_export_refuses_given_levels_its_scheduler_cannot_take(cog_folders, tmp_path):
    from typer.testing import CliRunner

    from edge.commands import app

    out = tmp_path / "pkg"
    res = CliRunner().invoke(app, ["export", "--model", str(cog_folders["2b"]), "--sigmas",
                                   "0.9,0.5", "-o", str(out)])
    assert res.exit_code != 0
    assert "--sigmas 0.9,0.5: sampler setting sigmas=(0.9, 0.5): cogvideox_ddim takes no " \
           "given levels" in res.output, res.output
    assert not out.exists()
