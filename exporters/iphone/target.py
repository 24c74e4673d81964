"""`edge export --target iphone`: the family's blocks at the device's shapes, one CoreML
program each (exporters/iphone/coreml/package.py; for iOS 18, `--min-ios 18`, the default, a block
and its variants as the functions of one multifunction program, for `--min-ios 17` a program per
variant), validated (structure, then the stored weights in PyTorch against fp32, end to end against
the family's reference); the summary says what the compression cost: the whole package on disk
against the fp32 bytes of the tensors it stores, the worst block error and the end-to-end PSNR.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from edge.core.budget import MIB, format_size
from edge.core.manifest_schema import is_coreai
from edge.core.package import folder_bytes
from edge.exporters import (
    ExportOptionError,
    ExportOptions,
    Prepared,
    Progress,
    check_declared,
    inputs_text,
    refuse_out_of_core,
)
from edge.exporters.iphone import NAME
from edge.exporters.iphone.coreml.package import (
    DEFAULT_MIN_IOS,
    LAYOUTS,
    MACOS_ONLY_NOTE,
    auto_target,
    check_setting,
    deployment_target,
    layout,
    partition_setting,
    unguided_refusal,
)
from edge.graph.attention import budget_score_limit
from edge.graph.blocks import with_unguided
from edge.graph.family_model import FamilyModel
from edge.planning.plan import READ_UNIT, device_residency

COREAI_MIN_IOS = 27   # --min-ios 27: the Core AI layout (exporters/iphone/coreai/layout.py)


def _min_ios(options: ExportOptions) -> int:
    return DEFAULT_MIN_IOS if options.min_ios is None else options.min_ios


def _coreai(options: ExportOptions):
    """The Core AI layout's module where `--min-ios 27` asks for it, else None."""
    if _min_ios(options) != COREAI_MIN_IOS:
        return None
    from edge.exporters.iphone.coreai import layout as coreai_layout

    return coreai_layout


def check(options: ExportOptions) -> None:
    check_declared(NAME, options)
    if coreai := _coreai(options):
        return coreai.check(options)
    if options.execute is not None:
        raise ExportOptionError(f"--execute applies to --min-ios {COREAI_MIN_IOS}: Core ML "
                                "programs do not run here (Core ML predicts only on macOS)")
    try:
        check_setting(options.quantize or "fp16")
        chosen = layout(_min_ios(options))
    except ValueError as err:
        raise ExportOptionError(str(err)) from None
    if options.unguided_variants and chosen.name != "multifunction":
        raise ExportOptionError(unguided_refusal(chosen.min_ios))


def _unguided(options: ExportOptions) -> bool:
    """Whether the transformer's caption-half functions are written: asked for, or by
    default where the layout holds them as functions of one program (iOS 18)."""
    if options.unguided_variants is not None:
        return options.unguided_variants
    return layout(_min_ios(options)).name == "multifunction"


def folder_name(model_name: str, options: ExportOptions) -> str:
    quantize, min_ios = options.quantize or "fp16", _min_ios(options)
    quantize = quantize.replace(":", "-")   # auto:7x: no colon in a folder name
    return (f"{model_name}-{NAME}" + ("" if quantize == "fp16" else f"-q{quantize}")
            + ("" if min_ios == DEFAULT_MIN_IOS else f"-ios{min_ios}"))


package_bytes = folder_bytes   # the whole package on disk (benchmarks and tests name it so)


def prepare(model: FamilyModel, options: ExportOptions) -> Prepared:
    """The device cut (re-cut for a budget, counted in stored bytes): blocks, their static
    input shapes, fp32 bytes and an estimate of the stored bytes at the setting, then with a
    budget the residency plan the Swift loader will follow (the --dry-run table)."""
    from edge.exporters.iphone.coreml.package import device_blocks, estimated_bytes

    if coreai := _coreai(options):
        return coreai.prepare(model, options)
    refused = refuse_out_of_core(NAME, model, f" --min-ios {_min_ios(options)} (Core ML)")
    quantize, chosen = options.quantize or "fp16", layout(_min_ios(options))
    try:   # the family's own settings ("4") and the iOS they need are known once it is loaded
        setting = partition_setting(quantize, model)   # auto: counted at fp16 until chosen
        deployment_target(setting, _min_ios(options))
    except ValueError as err:
        raise ExportOptionError(str(err)) from None
    auto = auto_target(quantize) is not None
    counted = setting.setting
    budget = options.memory_budget
    copies = chosen.name == "separate"   # each variant's program holds its own copy
    cut = device_blocks(model, quantize, budget)
    held = {b.key: estimated_bytes(b, setting) for bs in cut.components.values() for b in bs}
    lines = [f"{'block':<28}{'fp32 MiB':>9}{f'~{counted} MiB':>10}  inputs"]
    total = estimate = 0
    unguided = _unguided(options)
    for component, blocks in cut.components.items():
        for block in blocks:
            est = held[block.key] * (1 + copies * len(block.variants))
            total, estimate = total + block.weight_bytes(), estimate + est
            shapes = inputs_text(block)
            # the caption-half functions share the block's weights: no bytes added
            names = list(with_unguided(block).variants if unguided and component
                         == "transformer" else block.variants)
            extra = (f" (+{', '.join(names)} variant{'s' if len(names) > 1 else ''})"
                     if names else "")
            lines.append(f"{block.key:<28}{block.weight_bytes() / MIB:>9.2f}"
                         f"{est / MIB:>10.2f}  {shapes}{extra}")
    lines.append(f"total {format_size(total)} fp32 parameters, about {format_size(estimate)} "
                 f"of weight files at {counted} (estimate) for iOS {chosen.min_ios}: "
                 f"{chosen.text}. {MACOS_ONLY_NOTE}.")
    if auto:
        from edge.exporters.iphone.coreml.recipe import VIDEOS, candidate_forms

        forms = candidate_forms(_min_ios(options))
        count = sum(len(blocks) for blocks in cut.components.values())
        lines.append(f"--quantize {quantize}: each block's stored form is chosen at export by "
                     f"measurement ({len(forms)} forms x {count} blocks, each "
                     f"rendering {len(VIDEOS)} videos; counted above at fp16, the most any "
                     "form stores)")
    notes = [*cut.notes, *refused]
    if budget is not None:
        residency, plan_notes = device_residency(cut, budget, held, counted, f"~{counted}")
        lines += residency
        notes += plan_notes
    return Prepared(cut.components, notes=notes, plan_lines=lines,
                    manifest_plan=cut.to_manifest(budget, READ_UNIT) if budget else None,
                    held_bytes=held, activation_itemsize=2)   # Core ML computes in float16


def export(model: FamilyModel, prepared: Prepared, dest: Path, options: ExportOptions,
           progress: Progress) -> dict:
    from edge.exporters.iphone.coreml.check import end_to_end_check
    from edge.exporters.iphone.coreml.package import export_coreml

    if coreai := _coreai(options):
        return coreai.export(model, prepared, dest, options, progress)
    quantize = options.quantize or "fp16"
    if auto_target(quantize) is not None:
        quantize = _chosen(model, prepared, quantize, _min_ios(options), progress)
    with budget_score_limit(options.memory_budget):
        return export_coreml(model, dest, quantize=quantize, min_ios=_min_ios(options),
                             components=prepared.components, on_block=progress.on_block,
                             validate_end_to_end=end_to_end_check(
                                 model, quantize, on_step=progress.on_check_step),
                             plan=prepared.manifest_plan, unguided=_unguided(options))


def _chosen(model: FamilyModel, prepared: Prepared, quantize: str, min_ios: int,
            progress: Progress):
    """`--quantize auto[:TARGET]` measured on the blocks to export and made a setting; a
    target no recipe reaches is refused naming it (nothing written)."""
    from edge.exporters import ExportValidationError
    from edge.exporters.iphone.coreml.recipe import chosen_setting

    def on_trial(done: int, total: int, trial) -> None:
        if progress.on_measure is not None:
            progress.on_measure(done, total, f"{trial.block} {trial.form}")

    try:
        return chosen_setting(model, prepared.components, quantize, min_ios, on_trial)
    except ValueError as err:
        raise ExportValidationError(str(err)) from None


def summary(manifest: dict, dest: Path, seconds: float) -> str:
    if is_coreai(manifest):
        from edge.exporters.iphone.coreai import layout as coreai_layout

        return coreai_layout.summary(manifest, dest, seconds)
    blocks = [(f"{c['name']}/{b['name']}", b) for c in manifest["components"]
              for b in c["blocks"]]
    on_disk = package_bytes(dest)
    reference = sum(b["reference_weight_bytes"] for _, b in blocks)
    worst = max((b["validation"]["max_abs_error"], key) for key, b in blocks)
    kinds = Counter(v for _, b in blocks for v in b.get("variants", {}))
    variants = ", ".join(f"{n} {name}" for name, n in sorted(kinds.items()))
    coreml = manifest["coreml"]
    setting, target = coreml["compression"]["setting"], coreml["minimum_deployment_target"]
    chosen = next((lay for lay in LAYOUTS.values() if lay.name == coreml.get("layout")),
                  LAYOUTS[17])
    return (f"wrote {dest} in {seconds:.0f} s: {len(blocks)} blocks"
            f"{f' (+{variants} variants)' if variants else ''} as .mlpackage, "
            f"{format_size(on_disk)} on disk (the whole package)\n"
            f"layout {chosen.name}, runs on {target} and later: {chosen.text}\n"
            f"weights ({setting}): the package is {reference / on_disk:.2f}x smaller than the "
            f"fp32 tensors it stores ({format_size(reference)}: parameters and the tables "
            f"folded from them at conversion, each tensor once)\n"
            + (f"storage {coreml['compression']['note']}\n"
               if auto_target(setting) is not None else "")
            + f"stored weights in PyTorch vs fp32: worst block max-abs error {worst[0]:.3g} "
            f"({worst[1]}), end to end PSNR {manifest['validation']['psnr_db']} dB on "
            f"{manifest['validation']['prompt']!r}\n"
            f"note: {MACOS_ONLY_NOTE}. Not measured here: fp16 activations on the device "
            "(CoreML cannot predict on Linux).")
