"""`edge export`: a model (the default tiny-sora or a diffusers folder) to a target's package."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Annotated

import typer

from edge.commands import common
from edge.core.console import echo, fail


def export(
    ctx: typer.Context,
    target: Annotated[str, typer.Option(
        help="onnx, or iphone (CoreML: one .mlpackage per block; compiling them to "
        ".mlmodelc is macOS-only), or web (WebGPU kernels by TVM and wasm graphs for "
        "onnxruntime-web, or the wasm graphs alone with --web-paths wasm, with the demo "
        "page: a static site for `edge serve`).")] = "onnx",
    model: Annotated[Path | None, typer.Option(
        help="A diffusers pipeline folder (WanPipeline: Wan 2.1, Wan 2.2 TI2V-5B; "
        "CogVideoXPipeline; LTXPipeline), an Open-Sora 1.2 folder (transformer/, vae/, "
        "text_encoder/, tokenizer/) or a tiny-sora weights folder [default: the shipped "
        "tiny-sora]. Local files only.")] = None,
    output: Annotated[Path | None, typer.Option(
        "-o", "--output", help="Package folder [default: dist/MODEL-TARGET].")] = None,
    memory_budget: Annotated[str | None, typer.Option(
        help="Plan residency for this budget, e.g. 64MB (shown with --dry-run).")] = None,
    dry_run: Annotated[bool, typer.Option(
        help="Print the blocks, their bytes and what stays resident; write nothing.")] = False,
    quantize: Annotated[str | None, typer.Option(
        help="iphone: weight compression fp16, 8 (int8 linear), 6 (palettized), 4 "
        "(mostly 4-bit palettized, the transformer int8) or auto (each block's form chosen "
        "by measurement for a target: auto = auto:38dB, the worst measurement video's PSNR; "
        "auto:7x or auto:14MB, the weight files' size); with --min-ios 27 fp32, fp16, 8, "
        "4 (the family's rule in int8 and int4 with a scale per 32 inputs) or auto (fp16, "
        "int8 and int4 per block, measured on coreai-opt's simulated weights) "
        "[default: fp16]. "
        "web: how weights are stored and downloaded: fp32, fp16, 8 (int8 "
        "with a scale per row) or 4 (the family's rule: int4 with a scale per 32 inputs "
        "where its phone rule stores 4 bits, int8 elsewhere) [default: fp16].")] = None,
    min_ios: Annotated[int | None, typer.Option(
        help="iphone: the oldest iOS the package runs on. 27: a Core AI model (.aimodel) per "
        "block, its variants as functions sharing its weights, every program executed "
        "through Core AI at export; 18: a block and its variants (TDTM, "
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
    sigmas: common.SigmasOption = None,
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
        help="onnx and web, diffusers folders: build the models without weights and read each "
        "block's from the folder's safetensors files only while it is exported, so memory "
        "holds one block, never the model; the end-to-end check then streams the PyTorch "
        "blocks under the budget [default: out of core when the float32 weights exceed "
        "half this machine's memory].")] = None,
    lora: Annotated[list[str] | None, typer.Option(
        help="Diffusers folders: a LoRA adapter (a .safetensors file diffusers' "
        "load_lora_weights reads for the family) fused into the transformer before the "
        "export, at SCALE if given as FILE:SCALE [default scale: 1]; repeatable. The "
        "manifest records each file's name, SHA-256 and scale.")] = None,
    ort_url: Annotated[str | None, typer.Option(
        help="web: the https folder URL the page loads onnxruntime-web (its wasm path) from, "
        "each file checked by sha256 [default: the pinned version on the jsDelivr CDN].")] = None,
    bundle_ort: Annotated[Path | None, typer.Option(
        help="web: copy onnxruntime-web from this dist folder into the package, so the page "
        "works offline.")] = None,
    web_paths: Annotated[str | None, typer.Option(
        help="web: the paths the package holds. webgpu,wasm: WebGPU kernels and launch plans "
        "(TVM, each plan replayed with its llvm build) and the wasm graphs, the page running "
        "the faster; wasm: onnxruntime-web's wasm graphs alone, no TVM (tiny-sora's blocks "
        "export in a quarter of the time; the page runs on the CPU, a GPU or not) "
        "[default: webgpu,wasm].")
    ] = None,
    unguided_variants: Annotated[bool | None, typer.Option(
        "--unguided-variants/--no-unguided-variants",
        help="web, and iphone with --min-ios 18 or 27: also write the transformer's blocks "
        "at the caption's half of the guidance batch, so a call without guidance (guidance "
        "1, or after --guidance-steps) computes half; without them such calls run the pair "
        "and drop its null half [default: written; iphone --min-ios 17 cannot hold them].")
    ] = None,
    execute: Annotated[str | None, typer.Option(
        help="onnx, and iphone --min-ios 27: the blocks the export runs and holds to "
        "PyTorch. all: every block and variant; distinct: one block of each repeated program "
        "(the transformer's block_0 for block_1..29) and every block that repeats none, the "
        "repeats converted and written unrun, as the manifest and summary say. onnx: a "
        "repeat is a graph that is one validated but for metadata, for real video sizes (a Wan "
        "1.3B block at 480x832x81 takes minutes to run twice); iphone: one of the same "
        "shapes, for real-size models on Linux, where Core AI's interpreter emulates "
        "float16 (a Wan 1.3B transformer block takes 4-6 minutes) [default: all].")] = None,
    check: Annotated[str, typer.Option(
        help="onnx: the end-to-end check. full: a generation by the package against the "
        "family's reference at the export's size; small: at the family's small size, "
        "exported alongside through the same code; blocks: each block only; auto: full "
        "when its estimate here is under 10 minutes, else small.")] = "auto",
    device: Annotated[str, typer.Option(
        help="Where the PyTorch reference runs: every block's forward pass the graphs are "
        "held to, and the end-to-end check's reference video (diffusers' pipeline, "
        "Open-Sora's sampling): cpu, cuda, cuda:N, or auto: cuda where torch sees a GPU. "
        "Tracing and the package's own runs stay on the CPU, and so does tiny-sora's "
        "reference (seconds).")] = "auto",
) -> None:
    """Export a model to a device package: one graph per block, validated against PyTorch."""
    from edge.exporters import ExportOptionError, ExportOptions
    from edge.exporters import target as target_module
    from edge.families import FAMILIES, FamilyError, check_options, export_options, family_of
    from edge.graph.reference_device import DeviceError, reference_device

    # the export options the families declare are this command's options of the same names;
    # those given go to the family
    declared = {name for f in FAMILIES for name in export_options(f)}
    family_options = {k: v for k, v in ctx.params.items()
                      if k in declared and v is not None and v not in ([], ())}
    # refused before any work: an unknown folder or target, options the family or the target
    # does not take, a destination edge may not replace
    try:
        family = family_of(model)
        reference_on = _reference_device(device, family)
        _check_option(check, target, family)
        exporter = target_module(target)
        check_options(family, family_options)
        if out_of_core and target not in ("onnx", "web"):
            raise ExportOptionError(f"--out-of-core applies to --target onnx or web, not "
                                    f"{target}")
        options = ExportOptions(memory_budget=common.budget_option(memory_budget),
                                quantize=quantize, min_ios=min_ios, ort_url=ort_url,
                                bundle_ort=bundle_ort, unguided_variants=unguided_variants,
                                web_paths=web_paths, execute=execute)
        exporter.check(options)
    except (FamilyError, ExportOptionError, DeviceError) as err:
        fail(str(err))
    with reference_device(reference_on), _gpu_memory_refused(reference_on):
        _export(target, model, output, dry_run, force, check, family, family_options,
                exporter, options)


def _export(target: str, model: Path | None, output: Path | None, dry_run: bool, force: bool,
            check: str, family: str, family_options: dict, exporter, options) -> None:
    """The export (or its plan) once its options are checked."""
    from edge.core.budget import BudgetError
    from edge.exporters import ExportOptionError
    from edge.families import FamilyError, load_model
    from edge.graph.shapes_only import shapes_only
    from edge.planning.compute_cost import model_generation_cost

    model_name = model.resolve().name if model else "tiny-sora"
    dest = output or Path("dist") / exporter.folder_name(model_name, options)
    if not dry_run:
        common.check_destination(dest, force)
    try:
        family_model = load_model(model, **family_options)
        for note in getattr(family_model, "notes", []):
            echo(note)
        if options.memory_budget is not None and not dry_run:
            _check_calls_fit(exporter, family_model, options, target)
        # a plan needs the blocks' shapes, not their activations: a dry run cuts the model
        # with shapes only, in seconds at any video size
        with shapes_only() if dry_run else contextlib.nullcontext():
            prepared = exporter.prepare(family_model, options)
            plan = (prepared.plan_lines + _activation_lines(prepared, options, target)
                    if dry_run else [])
            cost = model_generation_cost(family_model, prepared.components) if dry_run else None
    except (FamilyError, BudgetError, ExportOptionError) as err:
        fail(str(err))
    for note in prepared.notes:
        echo(note)
    if dry_run:
        from edge.planning.compute_cost import cost_lines, matmul_rate

        for line in plan + cost_lines(cost, matmul_rate()):  # the rate of real products
            echo(line)
        return
    try:
        options = _with_end_to_end(check, target, family, model, family_options, family_model,
                                   prepared, exporter, options)
    except (FamilyError, BudgetError, ExportOptionError) as err:
        fail(str(err))
    _export_with_progress(exporter, family_model, prepared, dest, options, target)


def _reference_device(name: str, family: str):
    """The device `--device NAME` runs the reference on for `family`: tiny-sora's stays on
    the CPU (its fixed tiny size takes seconds there), which `auto` picks for it and a GPU
    named outright is refused."""
    from edge.graph.reference_device import CPU, DeviceError, resolve_device

    device = resolve_device(name)
    if family == "tiny-sora" and device != CPU:
        if name.strip().lower() != "auto":
            raise DeviceError(f"--device {name}: tiny-sora's reference runs on the CPU (its "
                              "fixed tiny size takes seconds there); --device is for the "
                              "diffusers families and Open-Sora")
        return CPU
    return device


@contextlib.contextmanager
def _gpu_memory_refused(device):
    """A reference too large for the GPU's memory: one line naming the device and the way
    out, not a traceback (nothing is written: the export is atomic)."""
    import torch

    try:
        yield
    except torch.OutOfMemoryError as err:
        first = str(err).splitlines()[0] if str(err) else ""
        fail(f"the PyTorch reference ran out of memory on {device} ({first[:160]}); "
             "--device cpu runs it on the CPU")


def _check_option(check: str, target: str, family: str) -> None:
    from edge.commands.export_check import LEVELS
    from edge.exporters import ExportOptionError

    if check not in LEVELS:
        raise ExportOptionError(f"--check {check!r}: one of {', '.join(LEVELS)}")
    if check in ("small", "blocks") and target != "onnx":
        raise ExportOptionError(f"--check {check} applies to --target onnx, not {target} "
                                "(its end-to-end check runs at the export's size)")
    if check == "small" and family == "tiny-sora":
        raise ExportOptionError("--check small: tiny-sora's size is fixed, and its full "
                                "check takes seconds")


def _with_end_to_end(check, target, family, folder, family_options, model, prepared,
                     exporter, options):
    """`options` with the end-to-end check's result where --check (or its estimate, for
    auto) has it run beside the export rather than by it (edge/commands/export_check.py)."""
    from dataclasses import replace

    from edge.commands.export_check import check_level, end_to_end_result

    if target != "onnx":
        return options
    level = check_level(check, family, folder, model, prepared)
    result = end_to_end_result(level, family, folder, family_options, model, exporter,
                               options)
    return options if result is None else replace(options, end_to_end=result)


def _activation_lines(prepared, options, target: str) -> list[str]:
    """The activations each block call holds, from shapes alone, attention and feed-forwards
    chunked as the target's export will trace them (the score limit from the budget), at the
    batch a call runs at (an ONNX package's dynamic batch in the Python runtime's pieces, a
    tiled decoder a tile a call)."""
    from edge.graph.attention import budget_score_limit
    from edge.planning.activation_memory import RUNTIME_BATCH_PIECES, activation_lines
    from edge.planning.plan import block_bytes

    held = prepared.held_bytes or {}
    sizes = sorted((held.get(b.key, block_bytes(b)) for bs in prepared.components.values()
                    for b in bs), reverse=True)
    floor = sum(sizes[:2])  # the block computing and the one read ahead
    with budget_score_limit(options.memory_budget):
        # the Python runtime splits a call's batch under a budget (Pipeline.split_batches)
        pieces = (RUNTIME_BATCH_PIECES if target == "onnx" and options.memory_budget
                  is not None else None)
        return activation_lines(prepared.components, floor, options.memory_budget, pieces,
                                prepared.activation_itemsize)


def _check_calls_fit(exporter, model, options, target: str) -> None:
    """Before any work: a budget no call fits, even with every other block streamed, is
    refused naming the call (a cut on shapes alone, seconds at any size)."""
    from edge.graph.attention import budget_score_limit
    from edge.graph.shapes_only import shapes_only
    from edge.planning.activation_memory import RUNTIME_BATCH_PIECES, check_calls_fit

    dims = [getattr(model, k, None) for k in ("height", "width", "frames")]
    size = (f"{dims[0]}x{dims[1]}x{dims[2]} (height x width x frames)" if None not in dims
            else f"latents {tuple(model.latent_shape)}")
    with shapes_only(), budget_score_limit(options.memory_budget):
        prepared = exporter.prepare(model, options)
        check_calls_fit(prepared.components, options.memory_budget, size,
                        RUNTIME_BATCH_PIECES if target == "onnx" else None,
                        prepared.activation_itemsize, prepared.held_bytes)


def _export_with_progress(exporter, model, prepared, dest: Path, options, target: str) -> None:
    """Export with a bar over the blocks (and one over an end-to-end check's steps), then
    print the target's summary; a failed check or write is one line and exit status 2."""
    from tqdm import tqdm

    from edge.core.package import PackageWriteError
    from edge.exporters import ExportValidationError, Progress

    check_bar: list[tqdm] = []  # made at the first step of the end-to-end check
    measure_bar: list[tqdm] = []  # made at the first measurement of --quantize auto

    def on_check_step(done: int, steps: int) -> None:
        if not check_bar:
            check_bar.append(tqdm(total=steps, desc="checking end to end", unit="step"))
        common.advance(check_bar[0], done, steps)

    def on_measure(done: int, total: int, what: str) -> None:
        if not measure_bar:
            measure_bar.append(tqdm(total=total, desc="choosing storage", unit="trial"))
        measure_bar[0].set_postfix_str(what)
        common.advance(measure_bar[0], done, total)

    started = time.perf_counter()
    try:
        with tqdm(total=prepared.block_count, desc=f"exporting ({target})", unit="block") as bar:
            progress = Progress(on_block=lambda key: (bar.set_postfix_str(key), bar.update()),
                                on_check_step=on_check_step, on_measure=on_measure)
            manifest = exporter.export(model, prepared, dest, options, progress)
    except ExportValidationError as err:
        fail(f"validation failed, nothing written to {dest}: {err}")
    except PackageWriteError as err:  # full disk, unwritable destination
        fail(str(err))
    finally:
        for b in (*measure_bar, *check_bar):
            b.close()
    echo(exporter.summary(manifest, dest, time.perf_counter() - started))
