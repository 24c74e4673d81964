"""`edge generate`: a video from a prompt, with the PyTorch reference pipeline or an
exported package in the Python runtime (the base install runs the latter)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from edge.commands import common
from edge.commands.declared import with_options
from edge.core.console import echo, fail
from edge.core.noise import MAX_SEED


def _generate(
    first: Annotated[str, typer.Argument(
        metavar="[PACKAGE] PROMPT",
        help='An exported package folder (optional), then what to draw, e.g. '
             '"a red circle moving left". Without a package the PyTorch reference '
             'pipeline runs.')],
    prompt: Annotated[str | None, typer.Argument(hidden=True)] = None,
    output: Annotated[Path, typer.Option(
        "-o", "--output", help="Video file to write (.gif or .mp4).")] = Path("out.gif"),
    seed: Annotated[int, typer.Option(
        min=0, max=MAX_SEED, help="Seed of the initial noise: the noise diffusers draws for "
        "torch.Generator().manual_seed(SEED).")] = 0,
    steps: Annotated[int | None, typer.Option(min=1, help="Denoising steps [default: 30].")] = None,
    guidance: Annotated[float | None, typer.Option(
        help="Classifier-free guidance scale [default: the model's].")] = None,
    scale: Annotated[int, typer.Option(min=1, help="Upscale frames by this factor.")] = 4,
    fps: Annotated[int, typer.Option(min=1)] = 8,
    weights: common.WeightsOption = None,
    memory_budget: Annotated[str | None, typer.Option(
        help="With a package: most bytes of block weights held at once, e.g. 64MB "
             "[default: no limit, every block resident].")] = None,
    threads: Annotated[int | None, typer.Option(
        min=1, max=1024, help="With a package: onnxruntime's threads a block call; fewer than "
        "the cores where other programs share them [default: one a core].")] = None,
    preset: Annotated[str | None, typer.Option(
        help="A set of the speed-ups, measured on tiny-sora (docs/benchmarks.md): quality "
        "(the package's sampler), balanced (the leap rule and token merging: 2.4x fewer "
        "transformer FLOPs), fast (balanced with the step cache and guidance for the first "
        "third of the steps: 4.5x); options given beside it win [default: none].")] = None,
    negative_prompt: Annotated[str | None, typer.Option(
        help="With a package: what the unconditional pass is told [default: the package's "
        "learned null caption or negative prompt].")] = None,
    **sampler,
) -> None:
    """Generate a video from a prompt, with the PyTorch pipeline or an exported package."""
    from tqdm import tqdm

    from edge.core.files import OutputError, check_output_file
    from edge.core.video import FORMATS, write_video

    # every option and the destination before anything is loaded or computed
    if output.suffix.lower() not in FORMATS:
        fail(f"-o {output}: use a {' or '.join(FORMATS)} file name")
    package, text = (Path(first), prompt) if prompt is not None else (None, first)
    if package is None and memory_budget:
        fail("--memory-budget applies to exported packages: give the package folder first")
    if package is None and threads is not None:
        fail("--threads applies to exported packages: give the package folder first")
    if package is None and negative_prompt is not None:
        fail("--negative-prompt applies to exported packages: give the package folder first")
    budget = common.budget_option(memory_budget)
    common.check_texts(text, negative_prompt)
    try:
        check_output_file(output, "-o")
    except OutputError as err:
        fail(str(err))
    overrides = common.sampler_overrides(steps=steps, guidance=guidance, **sampler)
    if package:  # the manifest alone (no file hashed yet) says what the options must fit
        manifest = common.manifest_before_loading(package, output)
        defaults, frame = common.package_sampler(manifest), common.frame_size(manifest)
    else:
        manifest, defaults, frame = None, common.reference_sampler(weights), None
    if preset is not None:
        overrides = common.preset_options(preset, defaults, manifest, overrides) | overrides
    total = common.checked_settings(defaults, overrides).steps
    if frame is not None:
        _check_scale(frame, scale)
    pipe = (common.load_runtime(package, budget, threads) if package
            else common.load_reference_pipeline(weights))
    if frame is None:  # the reference's frame size is known once it is loaded (cheaply)
        _check_scale(pipe.frame_size, scale)
    started = time.perf_counter()
    with tqdm(total=total, desc="denoising", unit="step") as bar:
        try:
            extra = {} if negative_prompt is None else {"negative_prompt": negative_prompt}
            video = pipe.generate(text, seed=seed, on_step=lambda i, n: common.advance(bar, i, n),
                                  **extra, **overrides)
        except (ValueError, FloatingPointError) as err:  # a changed file, NaN
            fail(str(err))
    try:
        path = write_video(output, video[0], fps=fps, scale=scale)
    except OutputError as err:
        fail(str(err))
    echo(f"wrote {path} ({video.shape[1]} frames, {video.shape[2]}x{video.shape[3]} "
         f"upscaled x{scale}) in {time.perf_counter() - started:.1f} s")
    trace = pipe.last_run["sampler"] if package else pipe.last_trace.to_dict()
    leaped = "no leap" if trace["leap_at"] is None else f"leap after step {trace['leap_at']}"
    echo(f"sampler: {trace['calls']} predictions, {trace['transformer_calls']} with the "
         f"transformer pairs run, {trace['merged_calls']} merged (TDTM), {trace['guided_calls']} "
         f"guided, {leaped}")
    if package:
        common.print_run_figures(pipe.last_run)


def _check_scale(frame: tuple[int, int], scale: int) -> None:
    from edge.core.video import check_scale

    try:
        check_scale(frame, scale)
    except ValueError as err:
        fail(str(err))


# its options, then the sampler's (declared once: edge/commands/common.py)
generate = with_options(_generate, common.SAMPLER_OPTIONS)
