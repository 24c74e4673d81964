"""What the diffusers families (Wan, CogVideoX, LTX-Video) do alike around their pipeline:
the shapes each target runs their blocks at, a `--steps` given at export, the tokenizer
written into a package, and the pipeline run as the reference video."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

from edge.families import FamilyError, Shapes
from edge.package import file_entry
from edge.sampler import SamplerSettings


def target_shapes(target: str) -> Shapes:
    """A device (iphone, web) encodes one prompt and decodes one video per call; ONNX traces
    two of each, so its dynamic batch is not specialised to one. A chunked decoder takes its
    own piece on every target."""
    if target in ("iphone", "web"):
        return Shapes(prompts=1, guidance_batch=2, videos=1)
    return Shapes(prompts=2, guidance_batch=2, videos=2)


def with_steps(sampler: SamplerSettings, steps: int | None) -> SamplerSettings:
    """The folder's sampler at `--steps` (None: its own), a dynamic leap no sooner than half
    way, checked as the runtimes check it; refused naming the option."""
    if steps is None:
        return sampler
    from edge.options import check_settings

    try:
        return check_settings(replace(sampler, steps=steps, leap_min_steps=max(1, steps // 2)))
    except ValueError as err:
        raise FamilyError(f"--steps {steps}: {err}") from None


def tokenizer_fields(root: Path, tokenizer, max_tokens: int, clean: str) -> dict:
    """Write the pipeline's fast tokenizer as `tokenizer/tokenizer.json` in the package at
    `root`; return the manifest's `tokenizer` entry."""
    folder = root / "tokenizer"
    folder.mkdir(parents=True)
    tokenizer.backend_tokenizer.save(str(folder / "tokenizer.json"))
    return {"files": [file_entry(root, folder / "tokenizer.json")], "max_tokens": max_tokens,
            "pad_token": tokenizer.pad_token, "clean": clean}


def run_pipeline(pipe, prompt: str, steps: int,
                 on_step: Callable[[int, int], None] | None, **options) -> np.ndarray:
    """The diffusers pipeline itself on `prompt` for `steps` steps, reporting each to
    `on_step`; its video as uint8 (B, T, H, W, 3), rounded as the runtimes round."""

    def callback(pipe, i, t, kwargs):
        if on_step is not None:
            on_step(i + 1, steps)
        return {}

    frames = pipe(prompt, num_inference_steps=steps, output_type="np",
                  callback_on_step_end=callback, **options).frames
    return np.round(np.asarray(frames) * 255).astype(np.uint8)
