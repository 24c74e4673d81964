"""`edge record`: one generation of a package, every block call, as a conformance bundle."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from edge.commands import common
from edge.console import echo, fail
from edge.noise import MAX_SEED


def record(
    package: Annotated[Path, typer.Argument(help="An exported package folder (onnx or iphone).")],
    prompt: Annotated[str, typer.Argument(help='What to draw, e.g. "a red circle moving left".')],
    output: Annotated[Path, typer.Option(
        "-o", "--output", help="Bundle folder to write (replaces only a bundle, with --force).")],
    seed: Annotated[int | None, typer.Option(
        min=0, max=MAX_SEED, help="Seed of the initial noise [default: 0].")] = None,
    latents: Annotated[Path | None, typer.Option(
        help="Initial noise from a .npy file, (1, C, T, h, w) in diffusers' layout, instead "
             "of the seed's.")] = None,
    steps: Annotated[int | None, typer.Option(min=1, help="Denoising steps [default: the "
                                              "package's].")] = None,
    guidance: Annotated[float | None, typer.Option(
        help="Classifier-free guidance scale [default: the package's].")] = None,
    negative_prompt: Annotated[str | None, typer.Option(
        help="What the unconditional pass is told [default: the package's learned null "
             "caption or negative prompt].")] = None,
    model: Annotated[Path | None, typer.Option(
        help="An iphone package's source model folder, whose family builds the blocks its "
             "stored weights run in [default: the shipped tiny-sora].")] = None,
    leap: common.LeapOption = None,
    leap_after: common.LeapAfterOption = None,
    leap_min_steps: common.LeapMinStepsOption = None,
    leap_patience: common.LeapPatienceOption = None,
    leap_tol: common.LeapTolOption = None,
    leap_steps: common.LeapStepsOption = None,
    merge_steps: common.MergeStepsOption = None,
    cache_threshold: common.CacheOption = None,
    dynamic_guidance: common.DynamicGuidanceOption = None,
    guidance_rescale: common.GuidanceRescaleOption = None,
    force: Annotated[bool, typer.Option(
        "--force", help="Replace a bundle written before (never another folder).")] = False,
) -> None:
    """Record one generation of a package, every block call's inputs and outputs, as a
    conformance bundle another runtime checks itself against (the Swift runtime's
    `edge-sample --bundle`). An onnx package runs in the Python runtime; an iphone package's
    blocks run in PyTorch with the weights stored in its programs, at its static shapes."""
    import numpy as np

    from edge.bundle import identify_bundle
    from edge.package import PackageWriteError
    from edge.record import RecordError
    from edge.record import record as record_bundle

    if seed is not None and latents is not None:
        fail("--seed and --latents: give one (the latents are the initial noise)")
    common.check_destination(output, force, identify_bundle)
    noise = None
    if latents is not None:
        try:
            noise = np.load(latents, allow_pickle=False)
        except (OSError, ValueError, EOFError) as err:
            fail(f"--latents {latents}: not a NumPy array file ({err})")
    overrides = common.sampler_overrides(
        steps=steps, guidance=guidance, leap=leap, leap_after=leap_after,
        leap_min_steps=leap_min_steps, leap_patience=leap_patience, leap_tol=leap_tol,
        leap_steps=leap_steps, merge_steps=merge_steps, cache_threshold=cache_threshold,
        dynamic_guidance=dynamic_guidance, guidance_rescale=guidance_rescale)
    started = time.perf_counter()
    try:
        info = record_bundle(package, prompt, output, seed=seed or 0, latents=noise,
                             negative_prompt=negative_prompt, overrides=overrides,
                             model_folder=model)
    except (RecordError, PackageWriteError, ValueError, FloatingPointError) as err:
        fail(str(err))
    from edge.budget import format_size

    echo(f"wrote {output} in {time.perf_counter() - started:.1f} s: {info['call_count']} "
         f"block calls, {format_size(info['tensor_bytes'])} of arrays, recorded with "
         f"{info['recorded_with']}")
