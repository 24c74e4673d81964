import numpy as np
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from edge.sampler import (
    SamplerSettings,
    guided_velocity,
    initial_noise,
    sample,
    timesteps,
)
from edge.schedulers import SCHEDULERS, scheduler_for


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
            }[name]()


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
    scheduler = scheduler_for(name, shift, 1000)
    assert scheduler.name == name
    sched = _diffusers_scheduler(name, shift)
    sched.set_timesteps(steps)
    sigmas, times = scheduler.schedule(steps)
    np.testing.assert_allclose(sigmas, _levels(sched), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(times * 1000, sched.timesteps.numpy(), atol=1e-3)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 4, 3, 8, 8), dtype=np.float32)
    x_ref = torch.from_numpy(x.copy())
    solver = scheduler.solver(sigmas)
    for i, t in enumerate(sched.timesteps):
        v = (0.3 * x + rng.standard_normal(x.shape, dtype=np.float32)).astype(np.float32)
        x = solver.step(v, i, x)
        x_ref = sched.step(torch.from_numpy(v), t, x_ref).prev_sample
        np.testing.assert_allclose(x, x_ref.numpy(), atol=2e-5, rtol=1e-5)


def test_a_scheduler_is_looked_up_by_its_manifest_name():
    assert {name: cls.name for name, cls in SCHEDULERS.items()} == {
        "flow_euler": "flow_euler", "flow_unipc": "flow_unipc",
        "cogvideox_ddim": "cogvideox_ddim"}
    with pytest.raises(ValueError, match="scheduler='ddim'.*flow_euler, flow_unipc, "
                                         "cogvideox_ddim"):
        scheduler_for("ddim", 3.0, 1000)


def test_ddim_leaps_in_one_jump_to_the_predicted_clean_sample():
    """CogVideoX's DDIM with v-prediction: a leap is one jump to sqrt(a) x - sqrt(1 - a) v
    (the clean sample the prediction gives); a re-planned tail is refused with the settings."""
    from edge.sampler import Trace

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
