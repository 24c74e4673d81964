"""`edge export`: a model (the default one, a folder or a Hub id) to a target's package.

The options every export takes are this module's; the others are declared as data by what
takes them: each target (exporters/<target>/__init__.py) and each family
(edge/families/<family>/__init__.py). This module names no target and no family."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Annotated

import typer

from edge import exporters
from edge.commands import common
from edge.commands.declared import parsed, with_declared_options
from edge.core.console import echo, fail
from edge.core.declared import by_name
from edge.families import DEFAULT_FAMILY, FAMILIES, declared_options, registered


def _declared() -> tuple[dict, dict]:
    """The targets' options and the families' by name -> (declarer, declaration)."""
    return (exporters.declared_options(),
            by_name({family: declared_options(family) for family in FAMILIES}))


TARGET_OPTIONS, FAMILY_OPTIONS = _declared()
TARGET_HELP = "; ".join(f"{name}: {exporters.registered(name).HELP}"
                        for name in exporters.TARGETS)
MODEL_HELP = ("The model folder: " + "; ".join(registered(f).FOLDER for f in FAMILIES[1:])
              + f"; or {registered(DEFAULT_FAMILY).FOLDER}. Or a diffusers pipeline's Hub id, "
              "ORG/NAME[@REVISION], read through huggingface_hub's cache (HF_HUB_OFFLINE, "
              f"HF_TOKEN) [default: the shipped {DEFAULT_FAMILY}].")
CPU_ONLY = [f for f in FAMILIES if getattr(registered(f), "REFERENCE_ON_CPU", None)]


def _export_command(
    target: Annotated[str, typer.Option(help=TARGET_HELP + ".", rich_help_panel="Target")
                      ] = exporters.TARGETS[0],
    model: Annotated[str | None, typer.Option(metavar="FOLDER|ORG/NAME", help=MODEL_HELP,
                                              rich_help_panel="Model")] = None,
    output: Annotated[Path | None, typer.Option(
        "-o", "--output", help="Package folder [default: dist/MODEL-TARGET].",
        rich_help_panel="Target")] = None,
    dry_run: Annotated[bool, typer.Option(
        help="Print the blocks, their bytes and what stays resident; write nothing.",
        rich_help_panel="Target")] = False,
    force: Annotated[bool, typer.Option(
        "--force", help="Replace a package already at the destination.",
        rich_help_panel="Target")] = False,
    device: Annotated[str, typer.Option(
        help="Where the PyTorch reference runs: every block's forward pass the graphs are "
        "held to, and the end-to-end check's reference video (the family's pipeline "
        "or sampling): cpu, cuda, cuda:N, or auto: cuda where torch sees a GPU. "
        "Tracing and the package's own runs stay on the CPU, and so does the reference of "
        f"{', '.join(CPU_ONLY)} (seconds).", rich_help_panel="Checks")] = "auto",
    **declared,
) -> None:
    """Export a model to a device package: one graph per block, validated against PyTorch."""
    from edge.exporters import ExportOptionError, ExportOptions
    from edge.families import FamilyError, check_options, family_of
    from edge.families.hub import HubModelError, model_folder_of

    target_options = parsed(declared, TARGET_OPTIONS)
    family_options = parsed(declared, FAMILY_OPTIONS)
    try:  # what the install lacks, all of it in one line, before anything imports torch
        exporter = exporters.target(target, target_options)
    except ExportOptionError as err:
        fail(str(err))
    from edge.graph.reference_device import DeviceError, reference_device

    # refused before any work: an unknown folder, options the family or the target does
    # not take, a destination edge may not replace (for a Hub id, on its model_index.json
    # alone too: before any weights are fetched)
    def refusals(folder: Path | None) -> tuple[str, str]:
        """The folder's family and the device its reference runs on, once checked."""
        family = family_of(folder)
        reference_on = _reference_device(device, family)
        check_options(family, family_options)
        _check_out_of_core(family_options, target, options)
        _check_level(options, family)
        return family, reference_on

    try:
        options = ExportOptions(**target_options)
        exporter.check(options)
        dest = output or Path("dist") / exporter.folder_name(model_name(model), options)
        if not dry_run:
            common.check_destination(dest, force)
        folder = model_folder_of(model, check_pipeline=refusals)
        family, reference_on = refusals(folder)
    except (FamilyError, ExportOptionError, DeviceError, HubModelError) as err:
        fail(str(err))
    with reference_device(reference_on), _gpu_memory_refused(reference_on):
        _export(target, folder, dest, dry_run, family, family_options, exporter, options)


export = with_declared_options(_export_command, TARGET_OPTIONS | FAMILY_OPTIONS)


def model_name(model: str | None) -> str:
    """What the package is named after: the folder's name, a Hub id's repository name."""
    from edge.families.hub import hub_id

    if model is None:
        return DEFAULT_FAMILY
    found = hub_id(model)
    return found.name if found else Path(model).expanduser().resolve().name


def _export(target: str, model: Path | None, dest: Path, dry_run: bool, family: str,
            family_options: dict, exporter, options) -> None:
    """The export (or its plan) once its options are checked."""
    from edge.core.budget import BudgetError
    from edge.exporters import ExportOptionError
    from edge.families import FamilyError, load_model
    from edge.graph.shapes_only import shapes_only
    from edge.planning.compute_cost import model_generation_cost

    try:
        family_model = load_model(model, **family_options)
        for note in getattr(family_model, "notes", []):
            echo(note)
        if options.memory_budget is not None and not dry_run:
            _check_calls_fit(exporter, family_model, options)
        # a plan needs the blocks' shapes, not their activations: a dry run cuts the model
        # with shapes only, in seconds at any video size
        with shapes_only() if dry_run else contextlib.nullcontext():
            prepared = exporter.prepare(family_model, options)
            plan = (prepared.plan_lines + _activation_lines(prepared, options)
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
        options = _with_end_to_end(family, model, family_options, family_model, prepared,
                                   exporter, options)
    except (FamilyError, BudgetError, ExportOptionError) as err:
        fail(str(err))
    _export_with_progress(exporter, family_model, prepared, dest, options, target)


def _reference_device(name: str, family: str):
    """The device `--device NAME` runs the reference on for `family`: a family whose
    registration keeps it on the CPU (REFERENCE_ON_CPU: why) stays there, which `auto` picks
    for it and a GPU named outright is refused."""
    from edge.graph.reference_device import CPU, DeviceError, resolve_device

    device = resolve_device(name)
    why = getattr(registered(family), "REFERENCE_ON_CPU", None)
    if why and device != CPU:
        if name.strip().lower() != "auto":
            raise DeviceError(f"--device {name}: {family}'s reference runs on the CPU ({why})"
                              "; --device is for the families whose reference is large")
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


def _check_out_of_core(family_options: dict, target: str, options) -> None:
    """--out-of-core (a family's option) asks for a target that exports block by block."""
    from edge.exporters import ExportOptionError

    if family_options.get("out_of_core") and not exporters.reads_blocks_from_storage(
            target, options):
        takers = exporters.out_of_core_targets()
        raise ExportOptionError(f"--out-of-core applies to --target {' or '.join(takers)}, "
                                f"not {target}" + (f" --min-ios {options.min_ios}"
                                                   if options.min_ios else ""))


def _check_level(options, family: str) -> None:
    """--check small asks for a smaller size than the export's: a family whose size is fixed
    has none (its full check is the export's own)."""
    from edge.exporters import ExportOptionError
    from edge.families import SIZE_OPTIONS, export_options

    if options.check == "small" and not set(SIZE_OPTIONS) & set(export_options(family)):
        raise ExportOptionError(f"--check small: {family}'s size is fixed, and its full check "
                                "is the export's own")


def _with_end_to_end(family, folder, family_options, model, prepared, exporter, options):
    """`options` with the end-to-end check's result where --check (or its estimate, for
    auto) has it run beside the export rather than by it (edge/commands/export_check.py):
    for a target that takes --check."""
    from dataclasses import replace

    from edge.commands.export_check import check_level, end_to_end_result

    if exporter.NAME not in dict(TARGET_OPTIONS["check"]):
        return options
    level = check_level(options.check or "auto", family, folder, model, prepared)
    result = end_to_end_result(level, family, folder, family_options, model, exporter,
                               options)
    return options if result is None else replace(options, end_to_end=result)


def _activation_lines(prepared, options) -> list[str]:
    """The activations each block call holds, from shapes alone, attention and feed-forwards
    chunked as the target's export will trace them (the score limit from the budget), at the
    batch a call runs at (a dynamic batch in the pieces a runtime splits it into, a
    tiled decoder a tile a call)."""
    from edge.graph.attention import budget_score_limit
    from edge.planning.activation_memory import activation_lines
    from edge.planning.plan import block_bytes

    held = prepared.held_bytes or {}
    sizes = sorted((held.get(b.key, block_bytes(b)) for bs in prepared.components.values()
                    for b in bs), reverse=True)
    floor = sum(sizes[:2])  # the block computing and the one read ahead
    with budget_score_limit(options.memory_budget):
        return activation_lines(prepared.components, floor, options.memory_budget,
                                prepared.batch_pieces, prepared.activation_itemsize)


def _check_calls_fit(exporter, model, options) -> None:
    """Before any work: a budget no call fits, even with every other block streamed, is
    refused naming the call (a cut on shapes alone, seconds at any size)."""
    from edge.graph.attention import budget_score_limit
    from edge.graph.shapes_only import shapes_only
    from edge.planning.activation_memory import check_calls_fit

    dims = [getattr(model, k, None) for k in ("height", "width", "frames")]
    size = (f"{dims[0]}x{dims[1]}x{dims[2]} (height x width x frames)" if None not in dims
            else f"latents {tuple(model.latent_shape)}")
    with shapes_only(), budget_score_limit(options.memory_budget):
        prepared = exporter.prepare(model, options)
        check_calls_fit(prepared.components, options.memory_budget, size,
                        prepared.batch_pieces, prepared.activation_itemsize, prepared.held_bytes)


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
