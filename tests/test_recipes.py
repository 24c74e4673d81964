"""Distilled recipes (`edge export --recipe NAME|FILE`): a distilled model's steps, guidance,
noise levels, shift and flow scheduler as the package's defaults, and the reference pipeline
sampling the same way, so the export's check holds the package to the recipe's video."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import WAN_SIZE

from edge.core.sampler import SamplerSettings
from edge.families.recipes import NAMED, RecipeError, recipe_from

LIGHTX2V = NAMED["lightx2v-4step"]


def test_the_named_recipe_says_what_its_source_samples():
    assert (LIGHTX2V.steps, LIGHTX2V.guidance, LIGHTX2V.shift, LIGHTX2V.scheduler) == (
        4, 1.0, 5.0, "flow_euler")
    # denoising_step_list [1000, 750, 500, 250] as levels t / 1000, shifted by the sampler
    assert LIGHTX2V.sigmas == (1.0, 0.75, 0.5, 0.25)
    assert "wan_t2v_distill_4step_cfg.json" in LIGHTX2V.source
    assert recipe_from("lightx2v-4step") is LIGHTX2V and recipe_from(LIGHTX2V) is LIGHTX2V
    sampler = LIGHTX2V.sampler(SamplerSettings(steps=50, guidance=5.0, shift=3.0,
                                               scheduler="flow_unipc"))
    assert (sampler.steps, sampler.guidance, sampler.shift, sampler.scheduler,
            sampler.sigmas) == (4, 1.0, 5.0, "flow_euler", (1.0, 0.75, 0.5, 0.25))
    assert "steps 4, guidance 1.0, sigmas 1.0,0.75,0.5,0.25" in LIGHTX2V.summary()


def test_a_recipe_file_is_read_and_checked_field_by_field(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"steps": 3, "guidance": 1, "sigmas": [1, 0.8, 0.4],
                                "shift": 3, "source": "my distillation"}))
    mine = recipe_from(str(path))
    assert (mine.name, mine.steps, mine.guidance, mine.sigmas, mine.shift, mine.scheduler) == (
        "mine.json", 3, 1.0, (1.0, 0.8, 0.4), 3.0, None)
    assert isinstance(mine.guidance, float) and mine.source == "my distillation"
    for data, said in [({"steps": 3, "guidance": 1, "cfg": 0}, "unknown field(s) cfg"),
                       ({"guidance": 1}, "no steps"),
                       ({"steps": "4", "guidance": 1}, "steps='4'; give an int"),
                       ({"steps": 2, "guidance": 1, "sigmas": [1.0]}, "1 sigmas for steps=2"),
                       ({"steps": 2, "guidance": 1, "scheduler": "ddim"}, "scheduler='ddim'"),
                       ([4, 1], "a recipe is a JSON object")]:
        path.write_text(json.dumps(data))
        with pytest.raises(RecipeError, match=str(path)) as err:
            recipe_from(str(path))
        assert said in str(err.value), (data, str(err.value))
    with pytest.raises(RecipeError, match="not a recipe name .*lightx2v-4step.* nor a JSON"):
        recipe_from("lightx2v-8step")


def test_a_recipe_is_refused_where_the_model_is_not_a_flow_model():
    ddim = SamplerSettings(scheduler="cogvideox_ddim", shift=1.0)
    with pytest.raises(RecipeError, match="recipe lightx2v-4step: asks for the flow_euler "
                                          "scheduler, but the model samples with "
                                          "cogvideox_ddim"):
        LIGHTX2V.sampler(ddim)


def test_the_folders_sampler_becomes_the_recipes_and_given_steps_win(wan_folder):
    from edge.families.pipeline_run import accepted_with_recipe
    from edge.families.wan.family import accepts

    own = accepts(wan_folder, **WAN_SIZE).sampler
    sampler = accepted_with_recipe(accepts, wan_folder, recipe=LIGHTX2V, **WAN_SIZE).sampler
    assert own.scheduler == "flow_unipc" and sampler == LIGHTX2V.sampler(own)
    # --steps given: the recipe's guidance, shift and scheduler at those steps, its levels
    # left (they are one a step)
    six = accepted_with_recipe(accepts, wan_folder, recipe=LIGHTX2V, steps=6,
                               **WAN_SIZE).sampler
    assert (six.steps, six.sigmas, six.guidance, six.shift) == (6, None, 1.0, 5.0)


@pytest.mark.slow  # a tiny Wan loaded, and two 4-step generations
def test_the_package_at_the_recipe_is_diffusers_at_the_recipe(wan_folders, wan_packages):
    """The runtime sampling as the recipe says (the defaults an export with it writes) gives
    the video of diffusers' WanPipeline with the scheduler the recipe asks for (flow-match
    Euler at shift 5 through the given levels) and no guidance: what the export's check
    compares."""
    from dataclasses import asdict

    from edge.core.video_metrics import psnr, snr
    from edge.families import load_model
    from edge.runtimes.python import Pipeline

    model = load_model(wan_folders["euler"], recipe=LIGHTX2V, **WAN_SIZE)
    assert type(model.pipe.scheduler).__name__ == "FlowMatchEulerDiscreteScheduler"
    assert model.pipe.scheduler.config.shift == 5.0
    assert any(note.startswith("recipe lightx2v-4step") for note in model.notes)
    latents = np.random.default_rng(4).standard_normal((1, *model.latent_shape),
                                                       dtype=np.float32)
    want = model.reference("a red circle moving left", latents=latents)[0]
    defaults = {k: v for k, v in asdict(model.sampler).items()
                if k in ("steps", "guidance", "shift", "scheduler", "sigmas")}
    runtime = Pipeline.load(wan_packages["euler"][0])
    try:
        got = runtime.generate("a red circle moving left", latents=latents, **defaults)[0]
        assert runtime.last_run["sampler"]["calls"] == 4
    finally:
        runtime.close()
    other = load_model(wan_folders["euler"], **WAN_SIZE).reference(
        "a red circle moving left", latents=latents, steps=4, guidance=1.0)[0]
    assert psnr(got, want) >= 40.0 and snr(got, want) >= 25.0, (psnr(got, want),
                                                                snr(got, want))
    # the recipe's levels and shift make another video than the folder's own at 4 steps
    assert snr(other, want) < snr(got, want) - 10
