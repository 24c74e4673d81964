"""What the diffusers families (Wan, CogVideoX, LTX-Video) do alike around their pipeline:
the shapes each target runs their blocks at, a `--steps` given at export, the tokenizer
written into a package, the pipeline run as the reference video, and the closing code of
every family (`PipelineModel`: package fields, reference, generate; `Accepted`, what
`accepts` returns; `load_family`). A family fills in small hooks: its prompt cleaner, its
own manifest fields, how its pipeline starts from latents or a seed, its own pipeline
options."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import KW_ONLY, dataclass, field, replace
from pathlib import Path
from typing import ClassVar, NamedTuple

import numpy as np
import torch

from edge.core.package import file_entry
from edge.core.sampler import SamplerSettings
from edge.families import FamilyError
from edge.graph.blocks import Chunking
from edge.graph.family_model import Shapes, StorageRule


def target_shapes(target: str) -> Shapes:
    """A device (iphone, web) encodes one prompt and decodes one video per call; ONNX traces
    two of each, so its dynamic batch is not specialised to one. A chunked decoder takes its
    own piece on every target."""
    if target in ("iphone", "web"):  # static shapes: a decoder's programs per tile size
        return Shapes(prompts=1, guidance_batch=2, videos=1, tiled_decoder=True,
                      static_tiles=True)
    return Shapes(prompts=2, guidance_batch=2, videos=2, tiled_decoder=True)


def resolved_recipe(recipe):
    """--recipe's value (a Recipe, a name or a file: edge/families/recipes.py) as a Recipe,
    or None; one it refuses is a FamilyError naming it."""
    if recipe is None:
        return None
    from edge.families.recipes import RecipeError, recipe_from

    try:
        return recipe_from(recipe)
    except RecipeError as err:
        raise FamilyError(f"--recipe {err}") from None


def accepted_with_recipe(accepts: Callable[..., Accepted], folder: Path,
                         recipe=None, **options) -> Accepted:
    """What the family's `accepts` makes of `folder` and `options`, sampled as `recipe`
    (`resolved_recipe` takes it) says where one is given; given --steps or --sigmas win
    over its steps and levels."""
    accepted = accepts(folder, **options)
    recipe = resolved_recipe(recipe)
    if recipe is None:
        return accepted
    from edge.families.recipes import RecipeError

    try:
        sampler = recipe.sampler(accepted.sampler)
    except RecipeError as err:
        raise FamilyError(f"--recipe {err}") from None
    steps, sigmas = options.get("steps"), options.get("sigmas")
    if steps is not None or sigmas is not None:
        sampler = with_steps(replace(sampler, sigmas=None), steps, sigmas)
    return accepted._replace(sampler=sampler)


def reference_scheduler(current, sampler: SamplerSettings):
    """The diffusers scheduler that samples as `sampler` does, for the reference pipeline
    of a model given a recipe: `current` (the folder's) where it already does, else the
    sampler's flow scheduler at its shift, with `current`'s settings where it is of that
    kind."""
    from diffusers import FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler

    kind, shift_field = {"flow_euler": (FlowMatchEulerDiscreteScheduler, "shift"),
                         "flow_unipc": (UniPCMultistepScheduler, "flow_shift")}[sampler.scheduler]
    config = dict(current.config) if isinstance(current, kind) else (
        {"prediction_type": "flow_prediction", "use_flow_sigmas": True}
        if kind is UniPCMultistepScheduler else {})
    if isinstance(current, kind) and config.get(shift_field) == sampler.shift:
        return current
    return kind.from_config(config | {shift_field: sampler.shift,
                                      "num_train_timesteps": sampler.num_train_timesteps})


def with_steps(sampler: SamplerSettings, steps: int | None,
               sigmas: tuple[float, ...] | None = None) -> SamplerSettings:
    """The folder's sampler at `--steps` (None: its own, or as many as `--sigmas` gives) and
    the given noise levels `--sigmas` (None: the schedule's own), a dynamic leap no sooner
    than half way, checked as the runtimes check it; refused naming the option."""
    if steps is None and sigmas is None:
        return sampler
    from edge.core.options import check_settings

    steps = len(sigmas) if steps is None else steps
    try:
        return check_settings(replace(sampler, steps=steps, leap_min_steps=max(1, steps // 2),
                                      sigmas=sigmas))
    except ValueError as err:
        given = f"--sigmas {','.join(map(str, sigmas))}" if sigmas else f"--steps {steps}"
        raise FamilyError(f"{given}: {err}") from None


@contextmanager
def given_levels(scheduler, sigmas: tuple[float, ...] | None):
    """For one run, the pipeline's scheduler set to the given noise levels as its
    set_timesteps(sigmas=...) takes them, whatever spacing the pipeline asks for: WanPipeline
    and LTXPipeline take no list (WanPipeline calls set_timesteps(steps); LTXPipeline passes
    its own linspace as sigmas, and its `timesteps` argument collides with those in
    retrieve_timesteps). A pipeline's `mu` (LTX's shift) is passed on. None: as it is."""
    if sigmas is None:
        yield
        return
    own = scheduler.set_timesteps
    levels = np.array(sigmas, np.float64)  # UniPC shifts the array itself: not a list

    def set_given(num_inference_steps=None, device=None, sigmas=None, mu=None, **_):
        return own(sigmas=levels, device=device, **({} if mu is None else {"mu": mu}))

    scheduler.set_timesteps = set_given  # the instance's attribute hides the method
    try:
        yield
    finally:
        del scheduler.set_timesteps


def tokenizer_fields(root: Path, tokenizer, max_tokens: int, clean: str,
                     embedding_rows: int) -> dict:
    """Write the pipeline's fast tokenizer as `tokenizer/tokenizer.json` in the package at
    `root`; return the manifest's `tokenizer` entry. `embedding_rows`: the text encoder's
    embedding table, which every id the tokenizer gives must index (the runtimes check)."""
    folder = root / "tokenizer"
    folder.mkdir(parents=True)
    tokenizer.backend_tokenizer.save(str(folder / "tokenizer.json"))
    return {"files": [file_entry(root, folder / "tokenizer.json")], "max_tokens": max_tokens,
            "pad_token": tokenizer.pad_token, "clean": clean, "embedding_rows": embedding_rows}


def run_pipeline(pipe, prompt: str, steps: int,
                 on_step: Callable[[int, int], None] | None, **options) -> np.ndarray:
    """The diffusers pipeline itself on `prompt` for `steps` steps, reporting each to
    `on_step`; its video as uint8 (B, T, H, W, 3), rounded as the runtimes round. It runs
    where the reference does (`edge export --device`): the pipeline runs on the device its
    modules are on, and draws its noise from a CPU generator there as here."""
    from edge.graph.reference_device import modules_on

    def callback(pipe, i, t, kwargs):
        if on_step is not None:
            on_step(i + 1, steps)
        return {}

    modules = [m for m in pipe.components.values() if isinstance(m, torch.nn.Module)]
    with modules_on(*modules):
        frames = pipe(prompt, num_inference_steps=steps, output_type="np",
                      callback_on_step_end=callback, **options).frames
    return np.round(np.asarray(frames) * 255).astype(np.uint8)


class Accepted(NamedTuple):
    """What a family's `accepts` makes of a folder and options, the same for every family:
    the video size (height, width, frames), the sampler, and the family's own settings,
    keyword arguments of its model (LTX-Video: frame_rate and decode)."""

    size: dict[str, int]
    sampler: SamplerSettings
    own: dict = {}


@dataclass
class PipelineModel:
    """The fields and closing code every diffusers family's model shares (the base of its
    dataclass; a family adds its own fields, e.g. LTX-Video's frame rate, and sets `family`
    and `clean` as class attributes). Hooks: `clean`, `start` and `pipeline_options`; a family
    adds manifest fields by extending `package_fields`."""

    pipe: object                    # the family's pipeline (diffusers' for a diffusers folder)
    folder: Path
    _: KW_ONLY
    height: int
    width: int
    frames: int
    sampler: SamplerSettings
    notes: list[str]
    name: str                       # the folder's name: the package's default name
    # components run piece by piece, state carried (edge/graph/blocks.py Chunking)
    chunked: dict[str, Chunking] = field(default_factory=dict)
    # the family's --quantize rules beside the target's own ("4": StorageRule)
    device_storage: dict[str, StorageRule] = field(default_factory=dict)
    out_of_core: bool = False       # weights read block by block (edge/graph/lazy_weights.py)

    family: ClassVar[str]
    clean: ClassVar[str] = "none"  # the prompt cleaner the runtimes apply (edge/core/tokenizer.py)
    # the LoRA adapters fused into the transformer (edge/families/adapters.py): their records
    adapters: ClassVar[tuple[dict, ...]] = ()

    def shapes(self, target: str) -> Shapes:
        return target_shapes(target)

    def package_fields(self, root: Path, raw_null_caption: bool = False) -> dict:
        rows = self.pipe.text_encoder.get_input_embeddings().num_embeddings
        return {"tokenizer": tokenizer_fields(root, self.pipe.tokenizer, self.text_tokens,
                                              clean=self.clean, embedding_rows=rows),
                "conditioning": {}, "negative_prompt": "",
                "sampler": self.sampler.to_dict(), "latent_shape": list(self.latent_shape),
                "latent_layout": "video",
                "video": {"height": self.height, "width": self.width, "frames": self.frames},
                **({"adapters": list(self.adapters)} if self.adapters else {})}

    def start(self, latents: np.ndarray | None, seed: int | None) -> dict:
        """The pipeline's start: these initial latents, or what it draws for
        `generator=torch.Generator().manual_seed(seed)`; exactly one of them."""
        if (latents is None) == (seed is None):
            raise ValueError("give the reference either latents or a seed")
        return ({"latents": torch.from_numpy(latents)} if seed is None
                else {"generator": torch.Generator("cpu").manual_seed(seed)})

    def pipeline_options(self, seed: int | None) -> dict:
        """The family's own arguments of its pipeline's call (a family's hook takes its own
        keywords of `reference`)."""
        return {}

    @torch.no_grad()
    def reference(self, prompt: str, latents: np.ndarray | None = None,
                  negative_prompt: str = "", steps: int | None = None,
                  guidance: float | None = None,
                  on_step: Callable[[int, int], None] | None = None,
                  seed: int | None = None, sigmas: tuple[float, ...] | None = None,
                  **options) -> np.ndarray:
        """diffusers' pipeline itself: uint8 video (B, T, H, W, 3) from these initial latents
        (the package's layout) or from those it draws for `seed` (`start`), through the given
        noise levels `sigmas` (`given_levels`; without `steps`, the sampler's own steps and
        levels); `options`: the family's own (`pipeline_options`)."""
        start = self.start(latents, seed)
        if steps is None:
            steps, sigmas = self.sampler.steps, self.sampler.sigmas
        with given_levels(self.pipe.scheduler, sigmas):
            return run_pipeline(
                self.pipe, prompt, steps, on_step,
                negative_prompt=negative_prompt, height=self.height, width=self.width,
                num_frames=self.frames,
                guidance_scale=self.sampler.guidance if guidance is None else guidance,
                max_sequence_length=self.text_tokens, **start,
                **self.pipeline_options(seed, **options))

    def generate(self, prompt: str, seed: int = 0,
                 on_step: Callable[[int, int], None] | None = None,
                 steps: int | None = None) -> np.ndarray:
        return self.reference(prompt, seed=seed, steps=steps, on_step=on_step)


def load_family(folder: Path, accepts: Callable[..., Accepted], load_pipeline: Callable,
                model_class: type, out_of_core: bool | None = None,
                lora: list | None = None, **options):
    """A family's model of `folder`: what `accepts` makes of the options (from the JSON files,
    before anything loads), then the pipeline (`load_pipeline(folder, out_of_core)` ->
    pipeline, notes, out_of_core), with the `lora` adapters (`FILE[:SCALE]` or `Adapter`s)
    fused into its transformer."""
    from edge.families.adapters import Adapter, check_adapter_file, fuse_adapters

    adapters = [Adapter.parse(a) for a in lora or ()]
    if adapters:
        from edge.families.folder import larger_than_memory

        if out_of_core or (out_of_core is None and larger_than_memory(folder)):
            raise FamilyError("--lora: adapters are fused into the weights in memory, and "
                              "this export is out of core (--out-of-core, or float32 weights "
                              "over half this machine's memory)")
        out_of_core = False
    for adapter in adapters:
        check_adapter_file(adapter)
    recipe = resolved_recipe(options.pop("recipe", None))   # a file read once
    accepted = accepted_with_recipe(accepts, folder, recipe, **options)
    pipe, notes, out_of_core = load_pipeline(folder, out_of_core)
    if recipe is not None:  # the reference samples as the package will
        pipe.scheduler = reference_scheduler(pipe.scheduler, accepted.sampler)
        notes = [*notes, recipe.summary()]
    model = model_class(pipe, folder, sampler=accepted.sampler, notes=notes,
                        name=folder.resolve().name, out_of_core=out_of_core, **accepted.size,
                        **accepted.own)
    if adapters:
        model.adapters = tuple(fuse_adapters(pipe, adapters))
        model.notes = [*notes, *(f"{a.path}: LoRA fused into the transformer at scale "
                                 f"{a.scale:g}" for a in adapters)]
    return model
