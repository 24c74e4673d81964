"""CogVideoX's dynamic classifier-free guidance (`dynamic_guidance`, CogVideoXPipeline's
use_dynamic_cfg) in edge/core/sampler.py: `sample()` against diffusers' own CogVideoXPipeline
loop, driven with a stand-in transformer that returns fixed velocities, and the settings'
refusals. The JS and Swift mirrors replay tests/fixtures/swift/dynamic_guidance.json
(tests/test_web_mirrors.py, runtimes/swift/Tests/EdgeCoreTests/DynamicGuidanceTests.swift);
this file also checks the condition under which they agree bit for bit."""

from __future__ import annotations

import contextlib
import json
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from edge.core.options import with_overrides
from edge.core.sampler import SamplerSettings, Trace, dynamic_guidance, sample
from edge.core.schedulers import SCHEDULERS

FIXTURE = Path(__file__).parent / "fixtures" / "swift" / "dynamic_guidance.json"
SHAPE = (1, 2, 3, 4, 4)    # CogVideoX's latent layout (B, F, C, h, w), tiny


class FixedTransformer(torch.nn.Module):
    """Stands in for CogVideoXTransformer3DModel: call i returns (uncond, cond) of step i,
    stacked as diffusers' guidance batch holds them, and records what it was given."""

    device, dtype = torch.device("cpu"), torch.float32   # what the pipeline asks of it

    def __init__(self, cond: np.ndarray, uncond: np.ndarray) -> None:
        super().__init__()
        self.config = SimpleNamespace(patch_size_t=None, in_channels=SHAPE[2],
                                      use_rotary_positional_embeddings=False)
        self.cond, self.uncond = cond, uncond
        self.latents: list[np.ndarray] = []
        self.timesteps: list[int] = []

    def cache_context(self, name):
        return contextlib.nullcontext()

    def forward(self, hidden_states, timestep, **_):
        i = len(self.latents)
        self.latents.append(hidden_states[:1].numpy().copy())
        self.timesteps.append(int(timestep[0]))
        return (torch.from_numpy(np.concatenate([self.uncond[i], self.cond[i]])),)


def cogvideox_ddim(shift: float):
    from diffusers import CogVideoXDDIMScheduler

    return CogVideoXDDIMScheduler(
        prediction_type="v_prediction", beta_schedule="scaled_linear", clip_sample=False,
        rescale_betas_zero_snr=True, timestep_spacing="trailing", snr_shift_scale=shift,
        set_alpha_to_one=True)


def velocities(steps: int, seed: int):
    rng = np.random.default_rng(seed)
    noise = rng.standard_normal(SHAPE, dtype=np.float32)
    cond = rng.standard_normal((steps, *SHAPE), dtype=np.float32)
    uncond = (cond + 0.3 * rng.standard_normal(cond.shape)).astype(np.float32)
    return noise, cond, uncond


def run_diffusers(steps: int, guidance: float, shift: float, seed: int, dynamic: bool = True):
    """CogVideoXPipeline.__call__ itself (no text encoder, no VAE: prompt embeddings given,
    latents out) on the fixed velocities; returns the stand-in (what each call was given),
    the final latents and each scheduler step's predicted clean sample."""
    from diffusers import CogVideoXPipeline

    noise, cond, uncond = velocities(steps, seed)
    scheduler = cogvideox_ddim(shift)
    predicted = []
    step = scheduler.step

    def recording_step(*args, **kwargs):
        out = step(*args, **kwargs)
        predicted.append(out[1].numpy().copy())
        return out

    scheduler.step = recording_step
    transformer = FixedTransformer(cond, uncond)
    pipe = CogVideoXPipeline(tokenizer=None, text_encoder=None, vae=None,
                             transformer=transformer, scheduler=scheduler)
    pipe.set_progress_bar_config(disable=True)
    embeddings = torch.zeros(1, 2, 4)
    out = pipe(prompt_embeds=embeddings, negative_prompt_embeds=embeddings,
               latents=torch.from_numpy(noise.copy()), num_inference_steps=steps,
               guidance_scale=guidance, use_dynamic_cfg=dynamic, output_type="latent",
               height=8 * SHAPE[3], width=8 * SHAPE[4], num_frames=4 * SHAPE[1] - 3)
    return transformer, out.frames.numpy(), predicted


def run_edge(settings: SamplerSettings, seed: int):
    noise, cond, uncond = velocities(settings.steps, seed)
    seen: list[tuple[np.ndarray, float]] = []

    def predict(x, t, step):
        seen.append((x.copy(), t))
        return cond[step.index], uncond[step.index]

    trace = Trace()
    return sample(predict, noise, settings, trace=trace), seen, trace


@pytest.mark.parametrize("steps,guidance,shift", [(8, 6.0, 3.0), (50, 6.0, 3.0),
                                                  (7, 7.5, 3.0), (1, 6.0, 1.0)])
def test_sample_is_cogvideox_pipelines_loop_bit_for_bit(steps, guidance, shift):
    """Each step's latents and the timestep the model is told, and the final latents, equal
    CogVideoXPipeline's with use_dynamic_cfg bit for bit (50 steps: CogVideoX's default,
    where most timesteps exceed the step count; 7: a stride that skips timesteps)."""
    reference, final, _ = run_diffusers(steps, guidance, shift, seed=steps)
    settings = SamplerSettings(scheduler="cogvideox_ddim", steps=steps, guidance=guidance,
                               shift=shift, dynamic_guidance=True)
    out, seen, _ = run_edge(settings, seed=steps)
    assert len(seen) == len(reference.latents) == steps
    for i, ((x, t), x_ref) in enumerate(zip(seen, reference.latents, strict=True)):
        assert round(t * 1000) == reference.timesteps[i], i
        assert np.array_equal(x, x_ref), f"step {i}"
    assert np.array_equal(out, final)
    # the dynamic scale is not the fixed one: the run differs from a fixed-scale run
    fixed, _, _ = run_edge(SamplerSettings(scheduler="cogvideox_ddim", steps=steps,
                                           guidance=guidance, shift=shift), seed=steps)
    assert not np.array_equal(out, fixed)


def test_a_leap_jumps_with_its_steps_dynamic_guidance():
    """A leap after k steps (cogvideox_ddim leaps in one jump) lands on the clean sample
    diffusers' step k predicts: the jump's velocity is guided with step k's dynamic scale,
    as CogVideoXPipeline guides that step."""
    steps, k = 12, 5
    reference, _, predicted = run_diffusers(steps, 6.0, 3.0, seed=4)
    settings = SamplerSettings(scheduler="cogvideox_ddim", steps=steps, guidance=6.0,
                               dynamic_guidance=True, leap=True, leap_after=k)
    out, seen, trace = run_edge(settings, seed=4)
    assert trace.leap_at == k and trace.calls == k + 1
    for (x, _), x_ref in zip(seen, reference.latents, strict=False):
        assert np.array_equal(x, x_ref)
    assert np.array_equal(out, predicted[k])


@pytest.mark.parametrize("guidance", [1.0, 0.5])
def test_at_or_below_one_the_plain_scale_stays(guidance):
    """diffusers runs no guidance for a guidance_scale of 1 or less, so its dynamic scale is
    never used; edge keeps its plain scale there (at 1: the conditional velocity)."""
    plain = SamplerSettings(scheduler="cogvideox_ddim", steps=8, guidance=guidance)
    dynamic = SamplerSettings(scheduler="cogvideox_ddim", steps=8, guidance=guidance,
                              dynamic_guidance=True)
    assert np.array_equal(run_edge(plain, seed=1)[0], run_edge(dynamic, seed=1)[0])


def test_only_cogvideox_ddim_takes_it():
    """Every scheduler whose levels are not training timesteps refuses dynamic_guidance,
    naming the field and the scheduler that takes it: made directly, from a manifest and as
    a generate-time override; a value that is not true or false is refused by kind."""
    assert [n for n, c in SCHEDULERS.items() if c.takes_dynamic_guidance] == ["cogvideox_ddim"]
    for name in ("flow_euler", "flow_unipc", "ltx_flow_euler"):
        want = (f"sampler setting dynamic_guidance=True: {name} steps through no training "
                "timesteps (only cogvideox_ddim does; CogVideoX's dynamic guidance is a "
                "function of them)")
        with pytest.raises(ValueError) as err:
            SamplerSettings(scheduler=name, dynamic_guidance=True)
        assert str(err.value) == want
        with pytest.raises(ValueError, match="dynamic_guidance=True"):
            SamplerSettings.from_dict({"scheduler": name, "dynamic_guidance": True})
        with pytest.raises(ValueError, match="dynamic_guidance=True"):
            with_overrides(SamplerSettings(scheduler=name), {"dynamic_guidance": True})
        assert not with_overrides(SamplerSettings(scheduler=name),
                                  {"dynamic_guidance": False}).dynamic_guidance
    cog = SamplerSettings(scheduler="cogvideox_ddim")
    assert with_overrides(cog, {"dynamic_guidance": True}).dynamic_guidance
    with pytest.raises(ValueError, match="dynamic_guidance=1: must be true or false"):
        with_overrides(cog, {"dynamic_guidance": 1})
    # packages from before the field load with the fixed scale
    assert not SamplerSettings.from_dict({"scheduler": "cogvideox_ddim"}).dynamic_guidance


def test_edge_generate_takes_it_as_an_option():
    """`edge generate --dynamic-guidance` reaches the settings by name: tiny-sora's
    flow_euler refuses it with the settings' message, before any step runs."""
    from typer.testing import CliRunner

    from edge.commands import app

    result = CliRunner().invoke(app, ["generate", "a red circle", "--dynamic-guidance",
                                      "-o", "/tmp/edge-dynamic-guidance-unused.gif"])
    assert result.exit_code != 0
    assert "dynamic_guidance=True: flow_euler steps through no training timesteps" in \
        result.output


def test_fixture_scales_are_the_formulas_and_their_powers_correctly_rounded():
    """The fixture's table is `dynamic_guidance` of each pair, each between 1 and
    1 + guidance; and for every (timestep, steps) of the table and of the runs, this
    machine's `x ** 5.0` (glibc's pow) is the correctly rounded fifth power, which is what
    the JS and Swift mirrors compute (glibc's is not for about 1 in 1,200 of all CogVideoX
    pairs up to 10,000 steps; where |x| is large the cosine then differs, so those pairs stay
    out of the fixtures)."""
    from edge.core.schedulers import scheduler_for

    fixture = json.loads(FIXTURE.read_text())
    pairs = set()
    for case in fixture["scales"]:
        g, steps = case["guidance"], case["steps"]
        for t, scale in zip(case["timesteps"], case["scales"], strict=True):
            assert scale == dynamic_guidance(g, t, steps)
            assert 1 <= scale <= 1 + g
            pairs.add((t, steps))
    for run in fixture["runs"]:
        s = run["settings"]
        scheduler = scheduler_for(s["scheduler"], s["shift"], s["num_train_timesteps"])
        pairs |= {(int(t), s["steps"]) for t in scheduler.timesteps(s["steps"])}
    for t, steps in sorted(pairs):
        x = (steps - t) / steps
        assert x ** 5.0 == float(Fraction(x) ** 5), (t, steps)
