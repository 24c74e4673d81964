import json
import math
import re

import numpy as np
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from edge.core.options import check_settings, with_overrides
from edge.core.sampler import (
    SamplerSettings,
    guided_velocity,
    initial_noise,
    rescaled_guidance,
    sample,
    timesteps,
)
from edge.core.schedulers import SCHEDULERS, ltx_mu, scheduler_for

# LTX-Video 0.9.x's scheduler_config.json (diffusers format); time_shift_type is not in it,
# diffusers' default "exponential" applies
LTX_CONFIG = {"base_image_seq_len": 1024, "base_shift": 0.95, "max_image_seq_len": 4096,
              "max_shift": 2.05, "num_train_timesteps": 1000, "shift": 1.0,
              "shift_terminal": 0.1, "use_dynamic_shifting": True}


@pytest.mark.parametrize("steps,shift", [(30, 3.0), (30, 1.0), (8, 2.0)])
def test_timesteps_match_diffusers(steps, shift):
    ours = timesteps(SamplerSettings(steps=steps, shift=shift))
    sched = FlowMatchEulerDiscreteScheduler(shift=shift)
    sched.set_timesteps(steps)
    np.testing.assert_allclose(ours, sched.sigmas.numpy(), atol=1e-6)
    assert ours[0] == 1.0 and ours[-1] == 0.0 and np.all(np.diff(ours) < 0)


@pytest.mark.parametrize("scheduler", ["flow_euler", "flow_unipc"])
def test_straight_path_reaches_its_target_exactly(scheduler):
    # a perfect velocity model on a straight path lands on x0 whatever the schedule
    x0 = np.random.default_rng(1).standard_normal((1, 4, 2, 4, 4), dtype=np.float32)
    noise = initial_noise(x0.shape[1:], [5])

    def predict(x, t, step):
        v = noise - x0
        return v, v

    out = sample(predict, noise, SamplerSettings(steps=7, guidance=3.0, scheduler=scheduler))
    np.testing.assert_allclose(out, x0, atol=1e-5)


def test_guidance_extrapolates_from_unconditional():
    c, u = np.ones(3, np.float32), np.zeros(3, np.float32)
    np.testing.assert_allclose(guided_velocity(c, u, 5.0), 5.0)
    np.testing.assert_allclose(guided_velocity(c, u, 1.0), c)


def test_guidance_rescale_is_diffusers_rescale_noise_cfg():
    """Each sample's guided velocity scaled to its conditional velocity's spread (torch.std:
    Bessel's correction), mixed by the setting; 0 leaves it; out of [0, 1] is refused."""
    from diffusers.pipelines.ltx.pipeline_ltx import rescale_noise_cfg

    rng = np.random.default_rng(0)
    v_cond, v_uncond = (rng.standard_normal((2, 4, 3, 5, 6)).astype(np.float32)
                        for _ in range(2))
    v_cond[1] *= 3  # the two samples' spreads differ: the rescale is per sample
    guided = guided_velocity(v_cond, v_uncond, 7.0)
    for r in (0.3, 1.0):
        want = rescale_noise_cfg(torch.from_numpy(guided), torch.from_numpy(v_cond), r).numpy()
        got = rescaled_guidance(guided, v_cond, r)
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert np.allclose(rescaled_guidance(guided, v_cond, 1.0).std(axis=(1, 2, 3, 4), ddof=1),
                       v_cond.std(axis=(1, 2, 3, 4), ddof=1), rtol=1e-5)
    for bad in (-0.1, 1.5, True, float("nan")):
        with pytest.raises(ValueError, match=r"guidance_rescale=.*from 0 \(off\) to 1"):
            SamplerSettings(guidance_rescale=bad)


def test_noise_is_per_seed_and_deterministic():
    a = initial_noise((4, 2, 2), [1, 2])
    b = initial_noise((4, 2, 2), [2])
    np.testing.assert_array_equal(a[1], b[0])
    assert not np.allclose(a[0], a[1])


def test_on_step_reports_progress():
    seen = []
    sample(lambda x, t, step: (x, x), np.zeros((1, 2), np.float32), SamplerSettings(steps=4),
           on_step=lambda i, n: seen.append((i, n)))
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4)]


def _diffusers_scheduler(name: str, shift: float):
    """The diffusers scheduler each of ours mirrors, configured as its families ship it."""
    from diffusers import CogVideoXDDIMScheduler, UniPCMultistepScheduler

    return {"flow_euler": lambda: FlowMatchEulerDiscreteScheduler(shift=shift),
            "flow_unipc": lambda: UniPCMultistepScheduler(
                prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=shift),
            "cogvideox_ddim": lambda: CogVideoXDDIMScheduler(
                prediction_type="v_prediction", rescale_betas_zero_snr=True,
                timestep_spacing="trailing", snr_shift_scale=shift, set_alpha_to_one=True,
                clip_sample=False),
            "ltx_flow_euler": lambda: FlowMatchEulerDiscreteScheduler(**LTX_CONFIG),
            # Open-Sora's RFLOW is no diffusers scheduler; this one set to its levels is it
            "rflow": lambda: FlowMatchEulerDiscreteScheduler(shift=shift),
            }[name]()


def _set_timesteps(name: str, sched, steps: int, shift: float) -> None:
    """As each family's pipeline sets its schedule: LTXPipeline gives its own sigmas and the
    mu whose exp is our shift; RFLOW's levels are given as such."""
    if name == "ltx_flow_euler":
        sched.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=math.log(shift))
    elif name == "rflow":  # Open-Sora's (1 - i/N), shifted by the static shift
        sched.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps))
    else:
        sched.set_timesteps(steps)


def _levels(sched) -> np.ndarray:
    """The levels our scheduler steps through, as its diffusers twin holds them: a flow's
    sigmas; DDIM's timesteps, then -1 for the clean end."""
    if hasattr(sched, "sigmas"):
        return sched.sigmas.numpy()
    return np.append(sched.timesteps.numpy(), -1)


@pytest.mark.parametrize("name", list(SCHEDULERS))
@pytest.mark.parametrize("steps,shift", [(30, 3.0), (10, 5.0), (4, 1.0)])
def test_each_scheduler_matches_diffusers_step_by_step(name, steps, shift):
    """Every scheduler object (looked up by its manifest name) against its diffusers twin:
    the noise levels, the timesteps handed to the model, and each solver step on a velocity
    that depends on the sample, as a model's does."""
    terminal = LTX_CONFIG["shift_terminal"] if SCHEDULERS[name].takes_shift_terminal else None
    scheduler = scheduler_for(name, shift, 1000, terminal)
    assert scheduler.name == name
    sched = _diffusers_scheduler(name, shift)
    _set_timesteps(name, sched, steps, shift)
    sigmas, times = scheduler.schedule(steps)
    np.testing.assert_allclose(sigmas, _levels(sched), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(times * 1000, sched.timesteps.numpy(), atol=1e-3)
    assert_steps_match(scheduler.solver(sigmas), sched, seed=0)


def assert_steps_match(solver, sched, seed: int) -> None:
    """Each step of our `solver` against the diffusers scheduler `sched` (set to the same
    schedule), on a velocity that depends on the sample, as a model's does."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, 4, 3, 8, 8), dtype=np.float32)
    x_ref = torch.from_numpy(x.copy())
    for i, t in enumerate(sched.timesteps):
        v = (0.3 * x + rng.standard_normal(x.shape, dtype=np.float32)).astype(np.float32)
        x = solver.step(v, i, x)
        x_ref = sched.step(torch.from_numpy(v), t, x_ref).prev_sample
        np.testing.assert_allclose(x, x_ref.numpy(), atol=2e-5, rtol=1e-5)


def test_a_scheduler_is_looked_up_by_its_manifest_name():
    assert {name: cls.name for name, cls in SCHEDULERS.items()} == {
        "flow_euler": "flow_euler", "flow_unipc": "flow_unipc",
        "cogvideox_ddim": "cogvideox_ddim", "ltx_flow_euler": "ltx_flow_euler", "rflow": "rflow"}
    with pytest.raises(ValueError, match="scheduler='ddim'.*flow_euler, flow_unipc, "
                                         "cogvideox_ddim, ltx_flow_euler, rflow"):
        scheduler_for("ddim", 3.0, 1000)


# latent token counts (frames x height x width): under, at and past LTX's two config points,
# and LTXPipeline's default 161 frames of 512 x 704 (21 x 16 x 22)
LTX_TOKENS = [256, 1024, 2000, 4096, 7392]


@pytest.mark.parametrize("tokens", LTX_TOKENS)
@pytest.mark.parametrize("steps", [2, 3, 8, 30, 50])
def test_ltx_flow_euler_is_ltx_pipelines_schedule_bit_for_bit(tokens, steps):
    """ltx_flow_euler, its shift exp(mu) read back from a manifest's JSON, against the
    scheduler LTX-Video ships set as LTXPipeline sets it (its sigmas, calculate_shift's mu,
    retrieve_timesteps): the levels, the timesteps (model times x 1000) and every Euler step
    on a velocity that depends on the sample are equal bit for bit."""
    from diffusers.pipelines.ltx.pipeline_ltx import calculate_shift, retrieve_timesteps

    config = (LTX_CONFIG["base_image_seq_len"], LTX_CONFIG["max_image_seq_len"],
              LTX_CONFIG["base_shift"], LTX_CONFIG["max_shift"])
    mu = calculate_shift(tokens, *config)
    assert ltx_mu(tokens, *config) == mu
    sampler = json.loads(json.dumps({"scheduler": "ltx_flow_euler", "shift": math.exp(mu),
                                     "shift_terminal": 0.1, "steps": steps}))
    settings = check_settings(SamplerSettings.from_dict(sampler))
    sigmas, times = scheduler_for(settings.scheduler, settings.shift, 1000,
                                  settings.shift_terminal).schedule(steps)
    sched = FlowMatchEulerDiscreteScheduler(**LTX_CONFIG)
    timesteps_ref, _ = retrieve_timesteps(sched, steps, "cpu",
                                          sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)
    assert np.array_equal(sigmas, sched.sigmas.numpy())
    assert np.array_equal(times * np.float32(1000), timesteps_ref.numpy())
    assert sigmas[0] == 1 and abs(sigmas[-2] - 0.1) < 1e-6 and sigmas[-1] == 0
    rng = np.random.default_rng(tokens + steps)
    x = rng.standard_normal((1, 8, 3, 4, 4), dtype=np.float32)
    x_ref = torch.from_numpy(x.copy())
    solver = scheduler_for("ltx_flow_euler", settings.shift, 1000, 0.1).solver(sigmas)
    for i, t in enumerate(sched.timesteps):
        v = (0.3 * x + rng.standard_normal(x.shape, dtype=np.float32)).astype(np.float32)
        x = solver.step(v, i, x)
        x_ref = sched.step(torch.from_numpy(v), t, x_ref).prev_sample
        assert np.array_equal(x, x_ref.numpy()), i


def test_ltx_flow_euler_edges():
    """One step keeps its level 1 (diffusers' stretch divides 0 by 0 there: NaN); without a
    terminal the schedule is the shift alone; the shift is the exponential time shift by mu;
    a leap's tail is flow_euler's with the same shift (evenly spaced before it, not stretched
    again), from the leap's level down to the terminal."""
    shift = math.exp(ltx_mu(4096, 1024, 4096, 0.95, 2.05))
    ltx = scheduler_for("ltx_flow_euler", shift, 1000, 0.1)
    assert ltx.schedule(1)[0].tolist() == [1.0, 0.0]
    sched = FlowMatchEulerDiscreteScheduler(**LTX_CONFIG)
    with np.errstate(invalid="ignore"):
        sched.set_timesteps(sigmas=np.linspace(1.0, 1.0, 1), mu=math.log(shift))
    assert np.isnan(sched.sigmas[0].item())
    unstretched = scheduler_for("ltx_flow_euler", shift, 1000).schedule(10)[0]
    sched = FlowMatchEulerDiscreteScheduler(**{**LTX_CONFIG, "shift_terminal": None})
    sched.set_timesteps(sigmas=np.linspace(1.0, 0.1, 10), mu=math.log(shift))
    assert np.array_equal(unstretched, sched.sigmas.numpy())
    even = np.linspace(1.0, 0.1, 10)
    np.testing.assert_allclose(unstretched[:-1], shift * even / (1 + (shift - 1) * even),
                               rtol=1e-6)
    sigmas, _ = ltx.schedule(30)
    tail, tail_times = ltx.tail(float(sigmas[12]), float(sigmas[-2]), 4)
    flow = scheduler_for("flow_euler", shift, 1000).tail(float(sigmas[12]), float(sigmas[-2]), 4)
    assert np.array_equal(tail, flow[0]) and np.array_equal(tail_times, tail[:-1])
    assert tail[0] == sigmas[12] and abs(tail[-2] - sigmas[-2]) < 1e-6 and tail[-1] == 0


@pytest.mark.parametrize("values,message", [
    ({"scheduler": "ltx_flow_euler", "shift_terminal": 1.0},
     "shift_terminal=1.0: must be a number between 0 and 1"),
    ({"scheduler": "ltx_flow_euler", "shift_terminal": 0},
     "shift_terminal=0: must be a number between 0 and 1"),
    ({"scheduler": "ltx_flow_euler", "shift_terminal": -0.1},
     "shift_terminal=-0.1: must be a number between 0 and 1"),
    ({"scheduler": "ltx_flow_euler", "shift_terminal": float("nan")},
     "shift_terminal=nan: must be a number between 0 and 1"),
    ({"scheduler": "ltx_flow_euler", "shift_terminal": "0.1"},
     "shift_terminal='0.1': must be a number between 0 and 1"),
    ({"scheduler": "flow_euler", "shift_terminal": 0.1},
     "shift_terminal=0.1: flow_euler takes none (only ltx_flow_euler stretches"),
    ({"scheduler": "flow_unipc", "shift_terminal": 0.5},
     "shift_terminal=0.5: flow_unipc takes none"),
])
def test_a_bad_shift_terminal_is_refused_by_name(values, message):
    with pytest.raises(ValueError, match=f"^sampler setting {re.escape(message)}"):
        SamplerSettings.from_dict(values)


def test_shift_terminal_kinds_and_schedules_are_checked():
    """A shift_terminal override of the wrong kind is refused naming it (check_settings'
    kinds: a finite number or None); None turns the stretch off; a shift whose schedule
    breaks is refused naming the terminal too; packages without the field keep loading."""
    ltx = SamplerSettings(scheduler="ltx_flow_euler", shift=7.77, shift_terminal=0.1)
    for value, kind in (("0.1", "'0.1'"), (float("inf"), "inf"), (True, "True")):
        with pytest.raises(ValueError, match=f"^sampler setting shift_terminal={kind}: must "
                                             "be a finite number or None$"):
            with_overrides(ltx, {"shift_terminal": value})
    assert with_overrides(ltx, {"shift_terminal": None}).shift_terminal is None
    assert with_overrides(ltx, {"shift_terminal": 0.05}).shift_terminal == 0.05
    with pytest.raises(ValueError, match="shift=1e.39, num_train_timesteps=1000, "
                                         "shift_terminal=0.1: no usable noise schedule"):
        check_settings(SamplerSettings(scheduler="ltx_flow_euler", shift=1e39,
                                       shift_terminal=0.1))
    old = SamplerSettings.from_dict({"steps": 20, "shift": 3.0, "scheduler": "flow_euler"})
    assert check_settings(old).shift_terminal is None


def test_ddim_leaps_in_one_jump_to_the_predicted_clean_sample():
    """CogVideoX's DDIM with v-prediction: a leap is one jump to sqrt(a) x - sqrt(1 - a) v
    (the clean sample the prediction gives); a re-planned tail is refused with the settings."""
    from edge.core.sampler import Trace

    with pytest.raises(ValueError, match="leap_steps=3: cogvideox_ddim leaps in one step"):
        SamplerSettings(scheduler="cogvideox_ddim", leap=True, leap_steps=3)
    settings = SamplerSettings(scheduler="cogvideox_ddim", steps=10, leap=True, leap_after=4,
                               guidance=1.0)
    rng = np.random.default_rng(1)
    noise = rng.standard_normal((1, 2, 3), dtype=np.float32)
    v = rng.standard_normal((10, 1, 2, 3), dtype=np.float32)
    xs = []

    def predict(x, t, step):
        xs.append((x, t))
        return v[step.index], v[step.index]

    trace = Trace()
    out = sample(predict, noise, settings, trace=trace)
    assert trace.leap_at == 4 and trace.calls == 5
    scheduler = scheduler_for("cogvideox_ddim", settings.shift, 1000)
    x, t = xs[-1]
    a = scheduler.alphas_cumprod[round(t * 1000)]
    np.testing.assert_allclose(out, np.sqrt(a) * x - np.sqrt(1 - a) * v[4], atol=1e-6)


def test_unknown_scheduler_is_refused_by_name():
    with pytest.raises(ValueError, match="scheduler='ddim'.*flow_euler, flow_unipc"):
        SamplerSettings(scheduler="ddim")
