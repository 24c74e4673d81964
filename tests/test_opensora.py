"""The opensora family against Open-Sora 1.2's own implementation: the fixture
`../shared/fixtures/opensora-1.2-tiny/` holds a tiny random-weight checkpoint in the released
layout and the original code's outputs for it (its README says how they were made). edge's
STDiT3, VAE and RFLOW sampling must give them: the forward and the sampled latents within
float32 rounding, the video at >= 40 dB PSNR and >= 45 dB SNR (against the video's own
spread: the random VAE's video has little contrast, and the test shows a wrong step count is
far below that). Then the folder's bad input, each refused naming the file and field.

The prompt case has a caption mask of 6 of 16 tokens and activations in the thousands: a
finite additive bias of -1e4 on the padding (as some pipelines use) lets the padding leak
there (0.39 off in one forward), so it also holds the mask exact.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from edge.families import FamilyError, family_of, load_model
from edge.video_metrics import psnr, snr

FIXTURE = Path(os.environ.get("EDGE_OPENSORA_FIXTURE", Path(__file__).resolve().parents[2]
                              / "shared" / "fixtures" / "opensora-1.2-tiny"))
SIZE = {"height": 64, "width": 96, "frames": 34}
PROMPT = "a red circle moving left"
PROMPT_SEED = 5

pytestmark = pytest.mark.skipif(not FIXTURE.is_dir(),
                                reason=f"the Open-Sora fixture is not at {FIXTURE} (set "
                                       "EDGE_OPENSORA_FIXTURE)")


def fixture(name: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(FIXTURE / f"{name}.safetensors")


@pytest.fixture(scope="module")
def model():
    return load_model(FIXTURE, **SIZE, steps=2)


def close(got: torch.Tensor, want: torch.Tensor, relative: float = 1e-5) -> float:
    """The largest error over the reference's largest magnitude (float32 rounding through
    a few layers: ~1e-6)."""
    error = float((got - want).abs().max() / want.abs().max())
    assert error < relative, error
    return error


def pixels(video: torch.Tensor) -> np.ndarray:
    """A video about [-1, 1] on the 0..255 scale, unrounded (rounding alone would cap the SNR
    of so flat a video near 27 dB)."""
    return ((video.clamp(-1, 1) + 1) / 2 * 255).numpy().astype(np.float64)


def test_the_folder_is_recognised_as_opensora():
    assert family_of(FIXTURE) == "opensora"


def test_one_forward_is_the_originals(model):
    ref = fixture("reference")
    z, y = ref["z0"], ref["y"][:, 0]
    args = {k: float(ref[f"arg_{k}"]) for k in ("height", "width", "fps")}
    with torch.no_grad():
        out = model.pipe.transformer(torch.cat([z, z]), torch.full((2,), 1000.0), y,
                                     ref["mask"].repeat(2, 1), torch.full((2,), args["fps"]),
                                     args["height"], args["width"])
    close(out, ref["fwd_out_t1000"])


@pytest.mark.parametrize("name", ["reference", "reference-prompt"])
def test_sampled_latents_are_the_originals(model, name):
    ref = fixture(name)
    caption = ref["y"][:1, 0]  # the conditional caption; the null one is the model's own
    z = model.pipe.sample(ref["z0"], caption, ref["mask"], steps=2, guidance=7.0, **SIZE)
    close(z, ref["samples"])


def test_the_decoded_video_is_the_originals(model):
    ref = fixture("reference")
    with torch.no_grad():
        video = model.pipe.vae.decode(ref["samples"])
    got, want = pixels(video), pixels(ref["video"])
    assert psnr(got, want) >= 40 and snr(got, want) >= 45, (psnr(got, want), snr(got, want))


def test_from_the_prompt_the_family_gives_the_originals_latents_and_video(model):
    ref = fixture("reference-prompt")
    caption, mask = model.pipe.encode_prompt([PROMPT])
    close(caption, ref["y"][:, 0])
    assert torch.equal(mask, ref["mask"])
    latents = model.reference(PROMPT, seed=PROMPT_SEED, output_type="latent")
    close(torch.from_numpy(latents), ref["samples"])
    video = model.pipe(PROMPT, **SIZE, steps=2, guidance=7.0,
                       generator=torch.Generator().manual_seed(PROMPT_SEED))
    got, want = pixels(video), pixels(ref["video"])
    assert psnr(got, want) >= 40 and snr(got, want) >= 45, (psnr(got, want), snr(got, want))
    # the check has contrast: a step more is a different video
    other = pixels(model.pipe(PROMPT, **SIZE, steps=3, guidance=7.0,
                              generator=torch.Generator().manual_seed(PROMPT_SEED)))
    assert snr(other, want) < 35, snr(other, want)
    # the family's uint8 video is that video rounded
    frames = model.reference(PROMPT, seed=PROMPT_SEED)
    assert frames.shape == (1, SIZE["frames"], SIZE["height"], SIZE["width"], 3)
    assert np.abs(frames - np.moveaxis(want[0], 0, -1)[None]).max() <= 1.0


def test_rflow_levels_are_opensoras_timesteps():
    """edge's `rflow` scheduler (all runtimes) steps through Open-Sora's transformed times."""
    from edge.models.opensora_pipeline import rflow_timesteps, time_shift
    from edge.schedulers import scheduler_for

    for (h, w, f), steps in (((64, 96, 34), 2), ((240, 432, 51), 30), ((480, 848, 102), 7)):
        shift = time_shift(h, w, f)
        sigmas, times = scheduler_for("rflow", shift, 1000).schedule(steps)
        want = rflow_timesteps(steps, shift).numpy() / 1000
        np.testing.assert_allclose(sigmas[:-1], want, rtol=2e-6)
        assert sigmas[-1] == 0 and np.array_equal(times, sigmas[:-1])


def test_the_aesthetic_suffix_is_asked_for_never_added(model):
    plain = model.reference(PROMPT, seed=0, output_type="latent")
    again = model.reference(PROMPT, seed=0, output_type="latent")
    suffixed = model.reference(PROMPT, seed=0, output_type="latent", aesthetic=True)
    assert np.array_equal(plain, again) and not np.allclose(plain, suffixed)


# ---------------------------------------------------------------- bad input


@pytest.fixture()
def folder(tmp_path) -> Path:
    copy = tmp_path / "opensora"
    shutil.copytree(FIXTURE, copy)
    for path in copy.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return copy


def edit_json(path: Path, **changes) -> None:
    cfg = json.loads(path.read_text())
    cfg.update(changes)
    path.write_text(json.dumps(cfg))


@pytest.mark.parametrize("part", ["transformer", "vae", "text_encoder", "tokenizer"])
def test_a_missing_part_is_named(folder, part):
    if part == "transformer":  # without it the folder is no Open-Sora folder at all
        shutil.rmtree(folder / part)
        with pytest.raises(FamilyError, match="model_type STDiT3"):
            family_of(folder)
        return
    shutil.rmtree(folder / part)
    with pytest.raises(FamilyError, match=f"{folder / part}: missing"):
        load_model(folder, **SIZE)


def test_a_config_of_another_model_is_refused(folder):
    edit_json(folder / "vae" / "config.json", model_type="AutoencoderKL")
    with pytest.raises(FamilyError, match=r"vae/config.json: model_type 'AutoencoderKL'"):
        load_model(folder, **SIZE)


def test_keys_that_do_not_match_the_config_name_the_first(folder):
    edit_json(folder / "transformer" / "config.json", depth=3)
    with pytest.raises(FamilyError, match=r"tensor 'spatial_blocks\.2\.[\w.]+', which the "
                                          r"weights in .*transformer lack"):
        load_model(folder, **SIZE)


def test_a_stored_tensor_the_config_lacks_is_named(folder):
    edit_json(folder / "transformer" / "config.json", depth=1)
    with pytest.raises(FamilyError, match=r"stored tensor '(spatial|temporal)_blocks\.1\."):
        load_model(folder, **SIZE)


def test_a_misshapen_tensor_is_named(folder):
    edit_json(folder / "transformer" / "config.json", mlp_ratio=2.0)
    with pytest.raises(FamilyError, match=r"tensor '\w+_blocks\.0\.mlp\.fc1\.\w+' has shape "
                                          r"\[256.*makes it \[128"):
        load_model(folder, **SIZE)


def test_a_text_encoder_of_another_width_is_refused(folder):
    edit_json(folder / "text_encoder" / "config.json", d_model=48)
    with pytest.raises(FamilyError, match="d_model=48, but .* caption_channels=32"):
        load_model(folder, **SIZE)


@pytest.mark.parametrize(("size", "field"), [({"frames": 33}, "--frames 33"),
                                             ({"frames": 16}, "--frames 16"),
                                             ({"height": 72}, "--height 72"),
                                             ({"width": 100}, "--width 100")])
def test_a_size_off_the_chunks_or_the_grid_is_refused(size, field):
    with pytest.raises(FamilyError, match=field):
        load_model(FIXTURE, **(SIZE | size))


def test_a_field_of_the_wrong_type_is_named(folder):
    edit_json(folder / "transformer" / "config.json", depth=2.5)
    with pytest.raises(FamilyError, match=r"transformer/config.json: depth=2.5"):
        load_model(folder, **SIZE)
