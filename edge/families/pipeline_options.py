"""The export options every diffusers family (Wan, CogVideoX, LTX-Video) takes, declared once
as data (edge/core/declared.py): `edge export` makes them --options, and a family's `load`
takes them by name. Light: no torch, so the command line reads them at start."""

from __future__ import annotations

from edge.core.declared import Option
from edge.core.sampler import levels_from_text
from edge.families.recipes import recipe_from

HEIGHT = Option("height", int, "Video height of the package (static) [default: the family's; "
                "Wan: 480].", group="Video size")
WIDTH = Option("width", int, "Video width [default: the family's; Wan: 832].",
               group="Video size")
FRAMES = Option("frames", int, "Frame count [default: the family's; Wan: 81, and it takes "
                "4k + 1].", group="Video size")
STEPS = Option("steps", int, "Denoising steps the package defaults to [default: the family's; "
               "50 for Wan, CogVideoX and LTX-Video].", minimum=1, group="Sampler")
SIGMAS = Option(
    "sigmas", str, "Given noise levels, one a step (sets --steps), falling in (0, 1], e.g. a "
    "distilled model's 1,0.94,0.75,0.4: the schedule's own spacing replaced as diffusers' "
    "set_timesteps(sigmas=...) replaces it (shifted as the schedule shifts its own); flow "
    "schedulers only (not CogVideoX's DDIM) [default: the model's spacing].",
    parse=levels_from_text, group="Sampler")
OUT_OF_CORE = Option(
    "out_of_core", bool, "Build the models without weights and read each block's from the "
    "folder's safetensors files only while it is exported, so memory holds one block, never "
    "the model; the end-to-end check then streams the PyTorch blocks under the budget "
    "[default: out of core when the float32 weights exceed half this machine's memory].",
    switch="--out-of-core/--in-memory", group="Model")
LORA = Option(
    "lora", list, "A LoRA adapter (a .safetensors file diffusers' load_lora_weights reads for "
    "the family) fused into the transformer before the export, at SCALE if given as "
    "FILE:SCALE [default scale: 1]; repeatable. The manifest records each file's name, "
    "SHA-256 and scale.", group="Model")

RECIPE = Option(
    "recipe", str, "A distilled model's sampling as the package's defaults: its steps, "
    "guidance, noise levels, shift and flow scheduler, by name (lightx2v-4step: LightX2V's "
    "4-step Wan 2.1 distillation) or from a JSON file of those fields (edge/families/"
    "recipes.py); --steps and --sigmas given win over its own [default: the folder's "
    "scheduler and the family's steps and guidance].", parse=recipe_from, group="Sampler")

SIZE_OPTIONS = (HEIGHT, WIDTH, FRAMES, STEPS)
# what every diffusers family's `load` takes, beside any of its own
PIPELINE_OPTIONS = (*SIZE_OPTIONS, SIGMAS, RECIPE, OUT_OF_CORE, LORA)
