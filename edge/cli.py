"""The `edge` command line. Heavy imports (torch, diffusers) happen inside the commands so
`edge --help` stays instant."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Annotated

import typer

from edge.console import echo, fail
from edge.noise import MAX_SEED

app = typer.Typer(
    help="edge: make text-to-video models fit and run fast on devices.\n\n"
         "The default model, tiny-sora, ships with the package: every command works offline.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_show_locals=False)
train_app = typer.Typer(help="Train a model the project ships, from scratch.",
                        no_args_is_help=True)
app.add_typer(train_app, name="train")

WeightsOption = Annotated[Path | None, typer.Option(
    "--weights", help="tiny-sora weights folder [default: the one shipped in the package]",
    exists=True, file_okay=False)]


# Step leaping, token merging and the step cache (edge/sampler.py); None: the model's default
LeapOption = Annotated[bool | None, typer.Option(
    "--leap/--no-leap", help="Linear Proportional Leap: after --leap-after steps (or, with "
    "the dynamic options, once consecutive velocities stop aligning better) finish in "
    "--leap-steps steps [default: off].")]
LeapAfterOption = Annotated[int | None, typer.Option(
    min=1, help="Fixed leap: leap after this many steps (implies --leap) [default: the "
    "model's; tiny-sora: 6].")]
LeapMinStepsOption = Annotated[int | None, typer.Option(
    min=1, help="Dynamic leap (this or --leap-patience/--leap-tol asks for the cosine rule; "
    "implies --leap): never before this many steps [default: 15].")]
LeapPatienceOption = Annotated[int | None, typer.Option(
    min=1, help="Dynamic leap: after this many steps without a better cosine [default: 3].")]
LeapTolOption = Annotated[float | None, typer.Option(
    min=0, help="Dynamic leap: a better cosine must gain more than this [default: 1e-3].")]
LeapStepsOption = Annotated[int | None, typer.Option(
    min=1, help="Leap (implies --leap): steps from the leap to the end, spaced as the "
    "schedule spaces its own; 1 is one step straight to the end [default: the model's; "
    "tiny-sora: 10].")]
MergeStepsOption = Annotated[int | None, typer.Option(
    min=0, help="Temporal token merging (TDTM) for the first N steps, e.g. 15 = the first "
    "half of 30 [default: 0, off].")]
CacheOption = Annotated[float | None, typer.Option(
    min=0, help="Step cache: skip the transformer while the first block's input changed "
    "less than this in total, e.g. 0.1 [default: 0, off].")]
GuidanceRescaleOption = Annotated[float | None, typer.Option(
    min=0.0, max=1.0, help="LTXPipeline's guidance_rescale: mix each step's guided velocity "
    "with itself rescaled to the conditional velocity's spread (0: off) [default: the "
    "package's].")]
DynamicGuidanceOption = Annotated[bool | None, typer.Option(
    "--dynamic-guidance/--no-dynamic-guidance", help="CogVideoX's dynamic classifier-free "
    "guidance (CogVideoXPipeline's use_dynamic_cfg): each step's scale from its timestep; "
    "cogvideox_ddim packages only [default: the package's].")]


def _sampler_overrides(**values) -> dict:
    """The sampler settings given on the command line (None: not given)."""
    out = {k: v for k, v in values.items() if v is not None}
    if {"leap_min_steps", "leap_patience", "leap_tol"} & set(out) and "leap_after" not in out:
        out["leap_after"] = None  # a dynamic option asks for the dynamic rule
    if {"leap_after", "leap_steps", "leap_min_steps", "leap_patience", "leap_tol"} & set(out):
        out.setdefault("leap", True)  # any leap option implies --leap (--no-leap still wins)
    return out


def _load_pipeline(weights: Path | None):
    from edge.models.tiny_sora import DEFAULT_WEIGHTS, TinySora

    return TinySora.load(weights or DEFAULT_WEIGHTS)


def _cell(value: float | int | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def _advance(bar, done: int, total: int) -> None:
    """Move a tqdm bar to `done` of `total` steps; a leap shortens the total on the way."""
    if bar.total != total:
        bar.total = total
        bar.refresh()
    bar.update(done - bar.n)


@app.command()
def generate(
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
    weights: WeightsOption = None,
    memory_budget: Annotated[str | None, typer.Option(
        help="With a package: most bytes of block weights held at once, e.g. 64MB "
             "[default: no limit, every block resident].")] = None,
    leap: LeapOption = None,
    leap_after: LeapAfterOption = None,
    leap_min_steps: LeapMinStepsOption = None,
    leap_patience: LeapPatienceOption = None,
    leap_tol: LeapTolOption = None,
    leap_steps: LeapStepsOption = None,
    merge_steps: MergeStepsOption = None,
    cache_threshold: CacheOption = None,
    dynamic_guidance: DynamicGuidanceOption = None,
    guidance_rescale: GuidanceRescaleOption = None,
    negative_prompt: Annotated[str | None, typer.Option(
        help="With a package: what the unconditional pass is told [default: the package's "
        "learned null caption or negative prompt].")] = None,
) -> None:
    """Generate a video from a prompt, with the PyTorch pipeline or an exported package."""
    from tqdm import tqdm

    from edge.files import OutputError, check_output_file
    from edge.options import with_overrides
    from edge.video import FORMATS, write_video

    # every option and the destination before anything is loaded or computed
    if output.suffix.lower() not in FORMATS:
        fail(f"-o {output}: use a {' or '.join(FORMATS)} file name")
    package, text = (Path(first), prompt) if prompt is not None else (None, first)
    if package is None and memory_budget:
        fail("--memory-budget applies to exported packages: give the package folder first")
    if package is None and negative_prompt is not None:
        fail("--negative-prompt applies to exported packages: give the package folder first")
    budget = _budget_option(memory_budget)
    try:
        check_output_file(output, "-o")
    except OutputError as err:
        fail(str(err))
    pipe = _load_runtime(package, budget) if package else _load_pipeline(weights)
    overrides = _sampler_overrides(
        steps=steps, guidance=guidance, leap=leap, leap_after=leap_after,
        leap_min_steps=leap_min_steps, leap_patience=leap_patience, leap_tol=leap_tol,
        leap_steps=leap_steps, merge_steps=merge_steps, cache_threshold=cache_threshold,
        dynamic_guidance=dynamic_guidance, guidance_rescale=guidance_rescale)
    try:
        total = with_overrides(pipe.sampler, overrides).steps
    except ValueError as err:
        fail(str(err))
    started = time.perf_counter()
    with tqdm(total=total, desc="denoising", unit="step") as bar:
        try:
            extra = {} if negative_prompt is None else {"negative_prompt": negative_prompt}
            video = pipe.generate(text, seed=seed, on_step=lambda i, n: _advance(bar, i, n),
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
         f"transformer pairs run, {trace['merged_calls']} merged (TDTM), {leaped}")
    if package:
        _print_run_figures(pipe.last_run)


@app.command()
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
    leap: LeapOption = None,
    leap_after: LeapAfterOption = None,
    leap_min_steps: LeapMinStepsOption = None,
    leap_patience: LeapPatienceOption = None,
    leap_tol: LeapTolOption = None,
    leap_steps: LeapStepsOption = None,
    merge_steps: MergeStepsOption = None,
    cache_threshold: CacheOption = None,
    dynamic_guidance: DynamicGuidanceOption = None,
    guidance_rescale: GuidanceRescaleOption = None,
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
    _check_destination(output, force, identify_bundle)
    noise = None
    if latents is not None:
        try:
            noise = np.load(latents, allow_pickle=False)
        except (OSError, ValueError, EOFError) as err:
            fail(f"--latents {latents}: not a NumPy array file ({err})")
    overrides = _sampler_overrides(
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


def _budget_option(memory_budget: str | None) -> int | None:
    """--memory-budget in bytes, refused by name before any work."""
    from edge.budget import parse_size

    try:
        return parse_size(memory_budget, "--memory-budget")
    except ValueError as err:
        fail(str(err))


def _check_destination(dest: Path, force: bool, identify=None, option: str = "-o") -> None:
    """Before any work: the folder `dest` can be written, and replaces nothing but a folder
    edge wrote (a package, unless `identify` says what else), and that only with --force;
    says what it replaces."""
    from edge.files import OutputError, check_writable_parent
    from edge.package import PackageWriteError, check_replaceable, identify_package

    try:
        check_writable_parent(dest, option)
        replaced = check_replaceable(dest, force, identify or identify_package)
    except (OutputError, PackageWriteError) as err:
        fail(str(err))
    if replaced:
        echo(f"replacing {replaced} at {dest} (--force)")


def _load_runtime(package: Path, budget: int | None):
    from edge.package import PackageError
    from runtimes.python import BudgetError, Pipeline

    try:
        # one generation: no next one to keep the pinned blocks for, so the decoder's
        # activations may take their memory
        return Pipeline.load(package, memory_budget=budget, lean_decode=budget is not None)
    except (PackageError, BudgetError, ValueError) as err:
        fail(str(err))


def _print_run_figures(run: dict) -> None:
    from edge.budget import format_size

    walls = ", ".join(f"{k} {v:.2f} s" for k, v in run["wall_s"].items())
    bw = run["read_bandwidth_bytes_per_s"]
    overlap = run["overlap_efficiency"]  # None unless transformer blocks were streamed
    echo(
        f"wall: {walls}\n"
        f"transformer calls {run['transformer_calls']}, read {format_size(run['bytes_read'])}"
        f" in {run['reads']} reads ({format_size(int(bw)) + '/s' if bw else 'n/a'}), "
        f"compute waited {run['io_wait_s']:.2f} s for I/O, "
        + ("" if overlap is None else
           f"streamed denoising hid {overlap:.0%} of its read time behind compute, ")
        + f"peak held {format_size(run['peak_held_bytes'])}, "
        f"peak RSS {format_size(run['peak_rss_bytes'])}")


@app.command()
def bench(
    package: Annotated[Path, typer.Argument(help="An exported package folder.", exists=True,
                                            file_okay=False)],
    memory_budget: Annotated[str, typer.Option(
        help="Budget for the streamed and naive modes, e.g. 64MB.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    prompt: Annotated[str, typer.Option()] = "a red circle moving left",
    steps: Annotated[int | None, typer.Option(min=1, help="Denoising steps [default: 30].")] = None,
    threads: Annotated[int | None, typer.Option(min=1, help="onnxruntime threads.")] = None,
    lean: Annotated[bool, typer.Option(
        "--lean", help="Also time 'lean': streamed, with the pinned blocks let go before the "
        "VAE decode and read again on the next generation.")] = False,
    repeats: Annotated[int, typer.Option(
        min=1, help="Timed generations per mode; the median is reported.")] = 1,
) -> None:
    """Time one generation all-resident, streamed with prefetch under the budget, and naive
    (load on demand, no prefetch), beside a cold sequential read of the weights."""
    from edge.budget import BudgetError, format_size
    from edge.package import PackageError
    from runtimes.python.bench import MODES
    from runtimes.python.bench import bench as run_bench

    modes = (*MODES, "lean") if lean else MODES
    try:
        result = run_bench(package, _budget_option(memory_budget), prompt=prompt, steps=steps,
                           threads=threads, modes=modes, repeats=repeats)
    except (PackageError, BudgetError, ValueError) as err:
        fail(str(err))
    if as_json:
        echo(json.dumps(result))
        return
    cold = result["cold_sequential_read"]
    echo(f"cold sequential read: {format_size(cold['bytes'])} at "
         f"{format_size(int(cold['bytes_per_s']))}/s")
    echo(f"{'mode':<10}{'wall s':>9}{'x resident':>11}{'x floor':>8}{'read':>11}"
         f"{'io wait s':>10}{'overlap':>9}{'bw/cold':>8}{'peak RSS':>11}")
    for mode in modes:
        r = result[mode]
        echo(f"{mode:<10}{r['wall_s']:>9.2f}{r['wall_vs_resident']:>11.2f}"
             f"{r['wall_vs_floor']:>8.2f}"
             f"{format_size(r['bytes_read']):>11}{r['io_wait_s']:>10.2f}"
             f"{_cell(r['overlap_efficiency']):>9}{_cell(r['read_bw_fraction']):>8}"
             f"{format_size(r['peak_rss_bytes']):>11}")


@app.command()
def serve(
    package: Annotated[Path, typer.Argument(help="The package folder to serve.")],
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port (0: any free one).")] = 8000,
    host: Annotated[str, typer.Option(
        help="Address to bind; anything but loopback exposes the package to the network."
    )] = "127.0.0.1",
    quiet: Annotated[bool, typer.Option(help="Do not log requests.")] = False,
) -> None:
    """Serve a package folder over HTTP for the web runtime: its files only, never a listing,
    with the content types browsers require (.wasm, .js, .mjs, .json, .wgsl)."""
    from edge.serve import make_server

    try:
        server = make_server(package, host, port, quiet=quiet)
    except OSError as err:
        fail(f"cannot serve {package} on {host}:{port}: {err.strerror or err}")
    echo(f"serving {package} at {server.url} (Ctrl-C to stop)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


@app.command()
def export(
    target: Annotated[str, typer.Option(
        help="onnx, or iphone (CoreML: one .mlpackage per block; compiling them to "
        ".mlmodelc is macOS-only), or web (WebGPU kernels by TVM and wasm graphs for "
        "onnxruntime-web, with the demo page: a static site for `edge serve`).")] = "onnx",
    model: Annotated[Path | None, typer.Option(
        help="A diffusers pipeline folder (WanPipeline: Wan 2.1, Wan 2.2 TI2V-5B; "
        "CogVideoXPipeline; LTXPipeline) or a tiny-sora weights folder [default: the shipped "
        "tiny-sora]. Local files only.")] = None,
    output: Annotated[Path | None, typer.Option(
        "-o", "--output", help="Package folder [default: dist/MODEL-TARGET].")] = None,
    memory_budget: Annotated[str | None, typer.Option(
        help="Plan residency for this budget, e.g. 64MB (shown with --dry-run).")] = None,
    dry_run: Annotated[bool, typer.Option(
        help="Print the blocks, their bytes and what stays resident; write nothing.")] = False,
    quantize: Annotated[str | None, typer.Option(
        help="iphone: weight compression fp16, 8 (int8 linear), 6 (palettized) or 4 "
        "(mostly 4-bit palettized, the transformer int8) [default: fp16].")] = None,
    min_ios: Annotated[int | None, typer.Option(
        help="iphone: the oldest iOS the package runs on. 18: a block and its variants (TDTM, "
        "the decoder's first pieces) are the functions of one multifunction .mlpackage "
        "sharing one weight file; 17: each variant is an .mlpackage of its own with a copy "
        "of the weights [default: 18].")] = None,
    force: Annotated[bool, typer.Option(
        "--force", help="Replace a package already at the destination.")] = False,
    height: Annotated[int | None, typer.Option(
        help="Video height of a diffusers model's package (static) [default: the family's, "
        "480 for Wan].")] = None,
    width: Annotated[int | None, typer.Option(
        help="Video width [default: the family's, 832 for Wan].")] = None,
    frames: Annotated[int | None, typer.Option(
        help="Frame count [default: the family's, 81 for Wan; Wan takes 4k + 1].")] = None,
    steps: Annotated[int | None, typer.Option(
        min=1, help="Denoising steps the package defaults to [default: the family's, 50 "
        "for Wan, CogVideoX and LTX-Video].")] = None,
    frame_rate: Annotated[float | None, typer.Option(
        help="LTX-Video: the frames per second the positions are scaled for (LTXPipeline's "
        "frame_rate) [default: 25].")] = None,
    decode_timestep: Annotated[float | None, typer.Option(
        help="LTX-Video with a timestep-conditioned decoder (0.9.5+): the decode timestep "
        "the package defaults to, in [0, 1] (LTXPipeline's decode_timestep) "
        "[default: 0].")] = None,
    decode_noise_scale: Annotated[float | None, typer.Option(
        help="LTX-Video with a timestep-conditioned decoder: how much decode noise the "
        "package mixes into the latents by default, in [0, 1] (LTXPipeline's "
        "decode_noise_scale) [default: the decode timestep].")] = None,
    out_of_core: Annotated[bool | None, typer.Option(
        "--out-of-core/--in-memory",
        help="onnx, diffusers folders: build the models without weights and read each "
        "block's from the folder's safetensors files only while it is exported, so memory "
        "holds one block, never the model; the end-to-end check then streams the PyTorch "
        "blocks under the budget [default: out of core when the float32 weights exceed "
        "half this machine's memory].")] = None,
    ort_url: Annotated[str | None, typer.Option(
        help="web: the https folder URL the page loads onnxruntime-web (its wasm path) from, "
        "each file checked by sha256 [default: the pinned version on the jsDelivr CDN].")] = None,
    bundle_ort: Annotated[Path | None, typer.Option(
        help="web: copy onnxruntime-web from this dist folder into the package, so the page "
        "works offline.")] = None,
) -> None:
    """Export a model to a device package: one graph per block, validated against PyTorch."""
    from edge.budget import BudgetError
    from edge.families import FamilyError, check_options, check_target, family_of, load_model
    from exporters import ExportOptionError, ExportOptions
    from exporters import target as target_module

    # refused before any work: an unknown folder or target, a target the family lacks,
    # options the family or the target does not take, a destination edge may not replace
    size_options = {"height": height, "width": width, "frames": frames, "steps": steps}
    own_options = {k: v for k, v in {"frame_rate": frame_rate, "decode_timestep": decode_timestep,
                                     "decode_noise_scale": decode_noise_scale,
                                     "out_of_core": out_of_core}.items()
                   if v is not None}
    try:
        family = family_of(model)
        exporter = target_module(target)
        check_target(family, target)
        check_options(family, size_options)
        _check_family_options(family, own_options)
        if out_of_core and target != "onnx":
            raise ExportOptionError(f"--out-of-core applies to --target onnx, not {target}")
        options = ExportOptions(memory_budget=_budget_option(memory_budget),
                                quantize=quantize, min_ios=min_ios, ort_url=ort_url,
                                bundle_ort=bundle_ort)
        exporter.check(options)
    except (FamilyError, ExportOptionError) as err:
        fail(str(err))
    model_name = model.resolve().name if model else "tiny-sora"
    dest = output or Path("dist") / exporter.folder_name(model_name, options)
    if not dry_run:
        _check_destination(dest, force)
    try:
        family_model = load_model(model, **size_options, **own_options)
        for note in getattr(family_model, "notes", []):
            echo(note)
        prepared = exporter.prepare(family_model, options)
    except (FamilyError, BudgetError, ExportOptionError) as err:
        fail(str(err))
    for note in prepared.notes:
        echo(note)
    if dry_run:
        for line in prepared.plan_lines:
            echo(line)
        return
    _export_with_progress(exporter, family_model, prepared, dest, options, target)


def _family_load_options(family: str) -> set[str]:
    """The options a family's `load` takes: what the family says it takes, by its own
    signature (edge/families/<family>.py)."""
    import importlib
    import inspect

    from edge.families import PIPELINE_FAMILIES

    if family not in PIPELINE_FAMILIES.values():  # tiny-sora: its weights say everything
        return set()
    module = importlib.import_module(f"edge.families.{family}")
    return set(inspect.signature(module.load).parameters)


def _check_family_options(family: str, options: dict) -> None:
    """Refuse, naming the option, an export option of some families' own (e.g. LTX-Video's
    frame rate) that this family's load does not take."""
    from edge.families import PIPELINE_FAMILIES, FamilyError

    for name in options:
        if name not in _family_load_options(family):
            takers = sorted(f for f in set(PIPELINE_FAMILIES.values())
                            if name in _family_load_options(f))
            raise FamilyError(f"--{name.replace('_', '-')}: {family} models do not take it "
                              f"(an export option of {', '.join(takers)} models)")


def _export_with_progress(exporter, model, prepared, dest: Path, options, target: str) -> None:
    """Export with a bar over the blocks (and one over an end-to-end check's steps), then
    print the target's summary; a failed check or write is one line and exit status 2."""
    from tqdm import tqdm

    from edge.package import PackageWriteError
    from exporters import ExportValidationError, Progress

    check_bar: list[tqdm] = []  # made at the first step of the end-to-end check

    def on_check_step(done: int, steps: int) -> None:
        if not check_bar:
            check_bar.append(tqdm(total=steps, desc="checking end to end", unit="step"))
        _advance(check_bar[0], done, steps)

    started = time.perf_counter()
    try:
        with tqdm(total=prepared.block_count, desc=f"exporting ({target})", unit="block") as bar:
            progress = Progress(on_block=lambda key: (bar.set_postfix_str(key), bar.update()),
                                on_check_step=on_check_step)
            manifest = exporter.export(model, prepared, dest, options, progress)
    except ExportValidationError as err:
        fail(f"validation failed, nothing written to {dest}: {err}")
    except PackageWriteError as err:  # full disk, unwritable destination
        fail(str(err))
    finally:
        for b in check_bar:
            b.close()
    echo(exporter.summary(manifest, dest, time.perf_counter() - started))


@app.command("eval")
def evaluate(
    prompts: Annotated[Path | None, typer.Option(
        help="Text file, one prompt per line [default: 48 built-in prompts incl. held-out "
             "combinations and unseen paraphrases].", exists=True, dir_okay=False)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    seed: Annotated[int, typer.Option(
        min=0, max=MAX_SEED, help="Seed of the first prompt; prompt i uses seed+i.")] = 0,
    steps: Annotated[int | None, typer.Option(min=1, help="Denoising steps [default: 30].")] = None,
    batch: Annotated[int, typer.Option(min=1, help="Prompts generated together.")] = 8,
    weights: WeightsOption = None,
    sweep: Annotated[bool, typer.Option(
        "--sweep", help="Run an exported package under every leap/merge/cache setting, all "
        "blocks resident and streamed under a tight budget; one table per regime.")] = False,
    package: Annotated[Path, typer.Option(
        help="With --sweep: the exported package.", file_okay=False)] = Path(
        "dist/tiny-sora-onnx"),
    memory_budget: Annotated[str | None, typer.Option(
        help="With --sweep: the streamed regime's budget [default: the smallest that "
             "works].")] = None,
    cache_threshold: CacheOption = None,
    threads: Annotated[int | None, typer.Option(
        min=1, help="With --sweep: onnxruntime threads [default: onnxruntime's].")] = None,
    plot: Annotated[Path | None, typer.Option(
        help="With --sweep: also draw speed against quality (one point per setting and "
             "regime) to this PNG.", dir_okay=False)] = None,
    ray: Annotated[bool, typer.Option(
        "--ray", help="Run each prompt chunk (with --sweep: each setting and chunk) as a Ray "
        "task on a local Ray instance, or on the cluster --ray-address names "
        "(docs/scale.md).")] = False,
    ray_address: Annotated[str | None, typer.Option(
        help="Join the Ray cluster at HOST:PORT (implies --ray).")] = None,
) -> None:
    """Generate videos for a prompt set and score colour, shape, direction, consistency and
    coherence with the shipped attribute classifier."""
    from tqdm import tqdm

    from edge.eval.run import default_prompts, load_classifier, read_prompts, reference_scores
    from edge.eval.run import evaluate as run_eval
    from edge.models.tiny_sora import DEFAULT_WEIGHTS, load_sampler

    try:
        prompt_set = read_prompts(prompts) if prompts else default_prompts()
    except ValueError as err:
        fail(str(err))
    if plot is not None and not sweep:
        fail("--plot draws a sweep: add --sweep")
    if plot is not None and plot.suffix.lower() != ".png":
        fail(f"--plot {plot}: the plot is written as PNG; name a .png file")
    if plot is not None:  # before the sweep's hours, not after
        from edge.files import OutputError, check_output_file

        try:
            check_output_file(plot, "--plot")
        except OutputError as err:
            fail(str(err))
    if memory_budget is not None and not sweep:
        fail("--memory-budget is the streamed regime's budget of a sweep: add --sweep")
    memory_budget = _budget_option(memory_budget)
    if sweep:
        _eval_sweep(package, prompt_set, load_classifier(weights or DEFAULT_WEIGHTS), as_json,
                    plot, ray_address if ray_address else ray, steps=steps or 30, seed=seed,
                    batch=batch, memory_budget=memory_budget, cache_threshold=cache_threshold,
                    threads=threads)
        return
    classifier = load_classifier(weights or DEFAULT_WEIGHTS)
    overrides = {"steps": steps} if steps else {}
    started = time.perf_counter()
    with tqdm(total=len(prompt_set), desc="generating", unit="prompt", disable=as_json) as bar:
        if ray or ray_address:
            with _ray_connection(ray_address):
                from edge.ray_eval import generate_on_ray

                generate = generate_on_ray(weights, overrides, prompt_set, seed, batch,
                                           on_batch=bar.update)
            result = run_eval(generate, classifier, prompt_set, seed=seed, batch=batch)
        else:
            pipe = _load_pipeline(weights)
            result = run_eval(lambda p, s: pipe.generate(p, s, **overrides), classifier,
                              prompt_set, seed=seed, batch=batch, on_batch=bar.update)
    result["steps"] = steps or load_sampler(weights or DEFAULT_WEIGHTS).steps
    result["ray"] = bool(ray or ray_address)
    result["wall_s"] = round(time.perf_counter() - started, 2)
    result["real_clips"] = reference_scores(classifier, prompt_set, seed)
    if as_json:
        echo(json.dumps(result))
        return
    echo(f"{'metric':<16}{'all prompts':>12}{'held-out':>10}{'real clips':>12}")
    for key in ("color_acc", "shape_acc", "direction_acc", "consistency", "coherence",
                "n_prompts"):
        row = [result.get(key), result.get(f"held_out_{key}"), result["real_clips"].get(key)]
        cells = "".join(f"{_cell(v):>{w}}" for v, w in zip(row, (12, 10, 12), strict=True))
        echo(f"{key:<16}{cells}")
    echo(f"{result['steps']} steps, {result['wall_s']} s")


@contextlib.contextmanager
def _ray_connection(address: str | None, enabled: bool = True):
    """Connected to Ray inside (a local instance without an address); a cluster that cannot
    be reached ends the command with its address, before any work."""
    if not enabled:
        yield
        return
    import ray

    from edge.ray_eval import RayError, connect

    try:
        connected = connect(address)
    except RayError as err:
        fail(str(err))
    try:
        yield
    except ray.exceptions.RayTaskError as err:  # a task failed for a reason retries can't fix
        fail(f"a Ray task failed: {err.cause if err.cause else err}")
    finally:
        if connected:
            ray.shutdown()


def _eval_sweep(package: Path, prompt_set, classifier, as_json: bool, plot: Path | None,
                ray: bool | str, **options) -> None:
    """`edge eval --sweep`: edge/sweep.py."""
    from tqdm import tqdm

    from edge.budget import BudgetError
    from edge.package import PackageError
    from edge.sweep import (
        DEFAULT_CACHE_THRESHOLD,
        format_table,
        generations,
        package_settings,
        run_sweep,
    )

    if options["cache_threshold"] is None:
        options["cache_threshold"] = DEFAULT_CACHE_THRESHOLD
    if not (package / "manifest.json").is_file():
        fail(f"no package at {package}: run `edge export --target onnx -o {package}` first")
    started = time.perf_counter()
    try:
        rows = package_settings(package, options["steps"], options["cache_threshold"])
    except (PackageError, ValueError) as err:
        fail(str(err))
    total = generations(len(prompt_set), options["batch"], len(rows))
    with _ray_connection(ray if isinstance(ray, str) else None, enabled=bool(ray)):
        with tqdm(total=total, desc="sweep", unit="run") as bar:  # stderr: JSON stays clean
            try:
                result = run_sweep(package, classifier, prompt_set, ray=bool(ray), settings=rows,
                                   on_generation=lambda name: (bar.set_postfix_str(name),
                                                               bar.update()), **options)
            except (PackageError, BudgetError, ValueError) as err:  # RayError included
                fail(str(err))
    result["sweep_wall_s"] = round(time.perf_counter() - started, 1)
    if plot is not None:
        from edge.files import OutputError
        from edge.sweep_plot import plot_frontier

        try:
            plot_frontier(result, plot)
        except OutputError as err:
            fail(str(err))
        result["plot"] = str(plot)
    if as_json:
        echo(json.dumps(result))
        return
    for regime, rows in result["regimes"].items():
        echo(f"\n{regime}" + (f" (budget {result['streamed_budget_bytes']} bytes, cold "
                                      "reads)" if regime == "streamed" else "") + ":")
        echo(format_table(rows))
    echo(f"\n{result['n_prompts']} prompts, {result['steps']} steps, batch "
         f"{result['batch']}, threads {result['threads'] or 'default'}, "
         f"{result['sweep_wall_s']} s" + (f"; plot: {plot}" if plot else ""))


@app.command("scale-model")
def scale_model(
    out: Annotated[Path, typer.Argument(help="Model folder to write.")],
    like: Annotated[str | None, typer.Option(
        help="Write a diffusers folder with a real model's shapes instead: wan2.1-t2v-1.3b "
        "(transformer 1.42 B parameters, 5.7 GB fp32; Wan's VAE; a small UMT5), "
        "wan2.2-ti2v-5b (transformer 5.00 B, 20.0 GB fp32; Wan 2.2's 705 M VAE; a small "
        "UMT5), wan2.1-small (Wan's architecture at a size a browser page holds), "
        "cogvideox-2b (transformer 1.69 B; CogVideoX's VAE; a small T5) or ltx-video-2b "
        "(LTX-Video 0.9.0: transformer 1.92 B; its VAE; a small T5).")] = None,
    full_text_encoder: Annotated[bool, typer.Option(
        help="With a Wan --like: UMT5-XXL's shapes (5.7 B parameters, 22.7 GB fp32).")] = False,
    hidden: Annotated[int, typer.Option(min=8, help="Transformer width.")] = 1024,
    pairs: Annotated[int, typer.Option(min=1, help="Spatial/temporal block pairs.")] = 8,
    heads: Annotated[int, typer.Option(min=1)] = 16,
    seed: Annotated[int, typer.Option(min=0)] = 0,
    force: Annotated[bool, typer.Option(
        "--force", help="Replace a folder scale-model wrote before (never another).")] = False,
) -> None:
    """Write a model with random weights for speed and memory benchmarks (`edge export
    --model OUT`): tiny-sora's architecture at a larger size (the defaults give a ~1 GB
    transformer), or with --like a diffusers folder of a real model's shapes, written one
    block at a time."""
    from edge.budget import format_size
    from edge.models.scaled import identify_scaled_model
    from edge.package import PackageWriteError

    if full_text_encoder and like is None:
        fail("--full-text-encoder applies with --like")
    _check_destination(out, force, identify_scaled_model, option="OUT")
    if like is not None:
        from tqdm import tqdm

        from edge.models import scaled_families, scaled_wan

        if like not in scaled_wan.LIKE and like not in scaled_families.LIKE:
            fail(f"--like {like!r}: known: {', '.join([*scaled_wan.LIKE, *scaled_families.LIKE])}")
        if full_text_encoder and like in scaled_families.LIKE:
            # only Wan's UMT5-XXL shapes are offered; the small T5 already has T5-XXL's width
            fail(f"--full-text-encoder: applies to the Wan presets only, not {like}")
        try:
            with tqdm(desc="writing", unit="part") as bar:
                def on_part(name: str) -> None:
                    bar.set_postfix_str(name)
                    bar.update()

                if like in scaled_families.LIKE:
                    written = scaled_families.write_family_like(out, like, seed, on_part, force)
                else:
                    written = scaled_wan.write_wan_like(out, like, full_text_encoder, seed,
                                                        on_part, force)
        except (ValueError, PackageWriteError) as err:
            fail(str(err))
        params = written["transformer_params"]
        echo(f"wrote {out}: {like} shapes, transformer of {params / 1e9:.3f} B "
             f"parameters ({format_size(params * 4)} fp32), text encoder of "
             f"{written['text_encoder_params'] / 1e6:.0f} M, random weights (seed {seed})")
        return
    from edge.models.scaled import write_scaled_model

    try:
        config = write_scaled_model(out, hidden, pairs, heads, seed, force=force)
    except (ValueError, PackageWriteError) as err:
        fail(str(err))
    params = config["random_weights"]["transformer_params"]
    echo(f"wrote {out}: transformer of {params / 1e6:.0f} M parameters "
         f"({format_size(params * 4)} fp32), random weights (seed {seed})")


@train_app.command("tiny-sora")
def train_tiny_sora(
    out: Annotated[Path, typer.Option(help="Folder to write the weights to.")] = Path(
        "runs/tiny-sora"),
    seed: Annotated[int, typer.Option(min=0)] = 0,
    transformer_steps: Annotated[int | None, typer.Option(
        min=1, help="Transformer optimisation steps [default: the shipped recipe's].")] = None,
    checkpoint_every: Annotated[int, typer.Option(
        min=0, help="Also save the transformer every N steps (0: never).")] = 0,
) -> None:
    """Reproduce the shipped tiny-sora weights (VAE, transformer, classifier) on the CPU.

    Takes about 50 minutes on 2 cores with the default recipe. Copy the result over
    edge/weights/tiny-sora to ship it."""
    from dataclasses import replace

    from edge.files import OutputError, check_writable_parent, kind_of
    from edge.train import TrainingRecipe
    from edge.train import train_tiny_sora as train

    try:  # before fifty minutes of training, not after
        if kind_of(out) not in ("missing", "a folder"):
            raise OutputError(f"--out {out}: is {kind_of(out)}, not a folder")
        check_writable_parent(out / "tiny-sora.json", "--out")
    except OutputError as err:
        fail(str(err))
    recipe = TrainingRecipe(seed=seed)
    if transformer_steps:
        recipe = replace(recipe, transformer_steps=transformer_steps)
    log = train(out, recipe, checkpoint_every=checkpoint_every)
    echo(json.dumps(log, indent=2))
    echo(f"wrote {out} in {log['total_seconds'] / 60:.1f} min")


def main() -> None:
    app()
