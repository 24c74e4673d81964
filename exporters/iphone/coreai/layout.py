"""`edge export --target iphone --min-ios 27`: the iphone target's Core AI layout (the
iphone target's module, exporters/iphone/target.py, hands `--min-ios 27` here). The family's device
cut, one `.aimodel` per block (exporters/iphone/coreai/package.py), every program executed through
Core AI at export, then the whole package generated through Core AI by the Python runtime and held
to the family's reference (diffusers' pipeline for a folder)."""

from __future__ import annotations

from pathlib import Path

from edge.core.budget import MIB, format_size
from edge.core.package import folder_bytes, read_manifest
from edge.core.video_metrics import psnr, snr
from edge.exporters import (
    ExportOptionError,
    ExportOptions,
    ExportValidationError,
    Prepared,
    Progress,
    inputs_text,
)
from edge.exporters.iphone.compression import Compression, auto_target
from edge.exporters.iphone.coreai.package import (
    COMPRESSED_RANKS,
    LAYOUT,
    MIN_IOS,
    OPT_THRESHOLD,
    Precision,
    check_precision,
    check_setting,
    export_blocks,
    import_coreai,
    quantizes,
)
from edge.exporters.iphone.coreai.worker import PINNED
from edge.exporters.shared.options import EXECUTE_CHOICES
from edge.exporters.shared.package_run import (
    STREAMED_FROM_FOLDER,
    package_video,
    streamed_reference,
    streaming_budget,
)
from edge.exporters.shared.package_writer import PackageParts, write_package
from edge.exporters.shared.validation import VALIDATION_PROMPT
from edge.graph.attention import budget_score_limit
from edge.graph.family_model import FamilyModel, applied_tiles
from edge.graph.reference_device import reference_record
from edge.planning.plan import READ_UNIT, Partition, device_residency, partition

DEFAULT_QUANTIZE = "fp16"
# the package's whole generation through Core AI against the family's reference
PSNR_FLOOR_DB, SNR_FLOOR_DB = 35.0, 20.0
# the interpreter emulates float16 on Linux (a tiny-sora transformer pair: 12 s against 0.1 s
# at fp32), so a generation of an fp16 package is not run at export; its blocks are
FP16_NOTE = ("not run: Core AI's Linux interpreter emulates float16 (about 100x the float32 "
             "time); {} was executed instead (each block's validation)")
EXECUTED_BLOCKS = {"all": "every block", "distinct": "one block of each repeated shape "
                   "(--execute distinct)"}


def precision(options: ExportOptions, model: FamilyModel) -> Precision:
    try:
        return check_precision(options.quantize or DEFAULT_QUANTIZE, model)
    except ValueError as err:
        raise ExportOptionError(str(err)) from None


def check(options: ExportOptions) -> None:
    quantize = options.quantize or DEFAULT_QUANTIZE
    try:
        check_setting(quantize)
    except ValueError as err:
        raise ExportOptionError(str(err)) from None
    import_coreai(quantizing=quantizes(quantize))


def stored_bytes(block, chosen: Precision) -> int:
    """The block's weights as its program stores them: each tensor coreai-opt compresses
    (`COMPRESSED_RANKS`, more than OPT_THRESHOLD values) at its stored form's bits (block
    scales counted), every other at the compute dtype's."""
    form, computed = chosen.stored_form(block.key).bits, 8 * chosen.dtype.itemsize
    bits = sum(p.numel() * (form if p.dim() in COMPRESSED_RANKS and p.numel() > OPT_THRESHOLD
                            else computed) for p in block.parameters().values())
    return int(bits // 8)


def device_blocks(model: FamilyModel, chosen: Precision, budget: int | None) -> Partition:
    """The device cut re-cut for a memory budget (edge/planning/plan.py), each block counted as the
    bytes its program stores at `chosen` (what a runtime holds for it)."""
    from edge.exporters.iphone.coreml.package import cut_for_device

    return partition(cut_for_device(model), budget, READ_UNIT,
                     size_of=lambda block: stored_bytes(block, chosen))


def prepare(model: FamilyModel, options: ExportOptions) -> Prepared:
    chosen = precision(options, model)
    budget = options.memory_budget
    cut = device_blocks(model, chosen, budget)
    held = {b.key: stored_bytes(b, chosen) for bs in cut.components.values() for b in bs}
    lines = [f"{'block':<28}{'fp32 MiB':>9}{f'{chosen.setting} MiB':>10}  inputs"]
    total = stored = 0
    for blocks in cut.components.values():
        for block in blocks:
            fp32, kept = block.weight_bytes(), held[block.key]
            total, stored = total + fp32, stored + kept
            extra = f" (+{', '.join(block.variants)} function)" if block.variants else ""
            lines.append(f"{block.key:<28}{fp32 / MIB:>9.2f}{kept / MIB:>10.2f}  "
                         f"{inputs_text(block)}{extra}")
    executed = (f"{EXECUTED_BLOCKS['distinct']} executed through Core AI at export, the "
                "repeats written unexecuted" if options.execute == "distinct" else
                "every program executed through Core AI at export")
    lines.append(f"total {format_size(total)} fp32 parameters, about {format_size(stored)} "
                 f"of Core AI models at {chosen.setting} for iOS {MIN_IOS}: a block and its "
                 f"variants as the functions of one .aimodel, {executed}")
    quantize = options.quantize or DEFAULT_QUANTIZE
    if auto_target(quantize) is not None:
        from edge.exporters.iphone.coreai.recipe import CANDIDATES
        from edge.exporters.iphone.coreml.recipe import VIDEOS

        count = sum(len(blocks) for blocks in cut.components.values())
        lines.append(f"--quantize {quantize}: each block's stored form is chosen at export by "
                     f"measurement ({len(CANDIDATES)} forms x {count} blocks, coreai-opt's "
                     f"weights simulated, each rendering {len(VIDEOS)} videos; counted above "
                     "at fp16, the most any form stores)")
    notes = list(cut.notes)
    if budget is not None:
        residency, plan_notes = device_residency(cut, budget, held, chosen.setting,
                                                 chosen.setting)
        lines += residency
        notes += plan_notes
    return Prepared(cut.components, notes=notes, plan_lines=lines,
                    manifest_plan=cut.to_manifest(budget, READ_UNIT) if budget else None,
                    held_bytes=held, activation_itemsize=chosen.dtype.itemsize)


def end_to_end(model: FamilyModel, root: Path, chosen: Precision, progress: Progress,
               execute: str, components: dict[str, list] | None = None,
               seed: int = 0) -> dict:
    """The package generated through Core AI by the Python runtime against the family's
    reference on a fixed prompt and seed (`execute`: which blocks were executed, said where
    float16 keeps the generation from running). A model loaded out of core is never held
    whole: both run streamed under twice the largest block, the reference its PyTorch blocks
    (`components`, as exported; default: the device cut) each reading its float32 weights
    from the folder."""
    if chosen.dtype.itemsize < 4:
        return {"prompt": VALIDATION_PROMPT, "seed": seed,
                "skipped": FP16_NOTE.format(EXECUTED_BLOCKS[execute])}
    on_step = progress.on_check_step

    def steps(offset: int):
        return None if on_step is None else lambda i, n: on_step(offset * n + i, 2 * n)

    budget = None
    if model.out_of_core:
        if components is None:
            from edge.exporters.iphone.coreml.package import cut_for_device

            components = cut_for_device(model)
        # the loader counts a block as its program's bytes: twice the largest, or of its
        # float32 weights
        programs = max(b["weight_bytes"] for c in read_manifest(root)["components"]
                       for b in c["blocks"])
        budget = max(streaming_budget(components), 2 * programs)
    got = package_video(root, budget, seed, steps(0))
    if model.out_of_core:
        want = streamed_reference(root, components, budget, seed, steps(1),
                                  fed_weights=False)
    else:
        want = model.generate(VALIDATION_PROMPT, seed=seed, on_step=steps(1))
    value, ratio = float(psnr(got, want)), float(snr(got, want))
    if not (value >= PSNR_FLOOR_DB and ratio >= SNR_FLOOR_DB):
        raise ExportValidationError(
            f"end to end: generated through Core AI the package's video differs from the "
            f"family's reference by PSNR {value:.1f} dB, SNR {ratio:.1f} dB (floors "
            f"{PSNR_FLOOR_DB:g} and {SNR_FLOOR_DB:g} dB) on {VALIDATION_PROMPT!r}, seed {seed}")
    identical = value == float("inf")
    return {"prompt": VALIDATION_PROMPT, "seed": seed, "identical": identical,
            "psnr_db": None if identical else round(value, 2),
            "snr_db": None if identical else round(ratio, 2),
            "psnr_floor_db": PSNR_FLOOR_DB, "snr_floor_db": SNR_FLOOR_DB,
            "measures": "the package generated through Core AI's runtime",
            **({"reference": STREAMED_FROM_FOLDER} if model.out_of_core else {}),
            **reference_record()}


def coreai_section(chosen: Precision, execute: str) -> dict:
    """The manifest's `coreml` settings for the Core AI layout: runtimes that know only the
    Core ML layouts refuse it by its layout name. `executed`: which programs the export ran
    through Core AI (`--execute`)."""
    return {"format": "aimodel", "executed": execute,
            "minimum_deployment_target": f"iOS{MIN_IOS}", "layout": LAYOUT,
            "compute_precision": "float16" if chosen.dtype.itemsize < 4 else "float32",
            "compute_units": "all", "output_prefix": "",
            "compression": {"setting": chosen.setting, **chosen.record},
            "compiled": False, "converter": dict(PINNED)}


def _chosen(model: FamilyModel, prepared: Prepared, quantize: str, progress: Progress
            ) -> tuple[Precision, Compression]:
    """`--quantize auto[:TARGET]` measured on the blocks to export: (the Core AI setting,
    the recipe); a target no recipe reaches is refused naming it (nothing written)."""
    from edge.exporters.iphone.coreai.recipe import chosen_precision

    def on_trial(done: int, total: int, trial) -> None:
        if progress.on_measure is not None:
            progress.on_measure(done, total, f"{trial.block} {trial.form}")

    try:
        return chosen_precision(model, prepared.components, quantize, on_trial)
    except ValueError as err:
        raise ExportValidationError(str(err)) from None


def export(model: FamilyModel, prepared: Prepared, dest: Path, options: ExportOptions,
           progress: Progress) -> dict:
    quantize, recipe = options.quantize or DEFAULT_QUANTIZE, None
    if auto_target(quantize) is not None:
        chosen, recipe = _chosen(model, prepared, quantize, progress)
    else:
        chosen = precision(options, model)
    execute = options.execute or EXECUTE_CHOICES[0]

    def export_component(name: str, blocks: list, root: Path, on_block) -> list[dict]:
        # one child process a component: its graphs wait on disk for it meanwhile; the
        # transformer's functions at the caption's half too, unless asked not to
        unguided = name == "transformer" and options.unguided_variants is not False
        with budget_score_limit(options.memory_budget):   # attention chunked as planned
            return export_blocks(blocks, root, chosen, on_block, unguided,
                                 distinct_only=execute == "distinct")

    def check(root: Path, manifest: dict) -> dict:
        validation = end_to_end(model, root, chosen, progress, execute, prepared.components)
        if recipe is not None:   # the chosen recipe whole, against its prediction's floor
            from edge.exporters.iphone.coreai.recipe import recipe_check

            validation["recipe"] = recipe_check(
                model, prepared.components, chosen, recipe, progress.on_check_step)
        return validation

    parts = PackageParts(
        "iphone", raw_null_caption=True, export_component=export_component,
        head=lambda root: {"coreml": coreai_section(chosen, execute)},
        tiles=applied_tiles(model, model.shapes("iphone")),
        # the plan after the components, where this layout has always written it
        tail=lambda root, manifest: (
            {"plan": prepared.manifest_plan} if prepared.manifest_plan else {}),
        check=check)
    return write_package(model, dest, prepared.components, parts, model.name,
                         progress.on_block)


def summary(manifest: dict, dest: Path, seconds: float) -> str:
    blocks = [(f"{c['name']}/{b['name']}", b) for c in manifest["components"]
              for b in c["blocks"]]
    def programs_of(records):   # a block's own function and its variants'
        return sum(1 + len(b.get("variants", {})) for _, b in records)

    ran = [(key, b) for key, b in blocks if "relative_error" in b["validation"]]
    programs, ran_programs = programs_of(blocks), programs_of(ran)
    worst = max((b["validation"]["relative_error"], key) for key, b in ran)
    reference = sum(b["reference_weight_bytes"] for _, b in blocks)
    on_disk = folder_bytes(dest)
    setting = manifest["coreml"]["compression"]["setting"]
    check = manifest["validation"]
    end = (check["skipped"] if "skipped" in check else
           f"PSNR {check['psnr_db']} dB, SNR {check['snr_db']} dB against the family's "
           f"reference on {check['prompt']!r}")
    return (f"wrote {dest} in {seconds:.0f} s: {len(blocks)} blocks as Core AI models "
            f"(.aimodel, iOS {MIN_IOS}), {format_size(on_disk)} on disk: "
            f"{on_disk / max(reference, 1):.2f}x the fp32 parameters' "
            f"{format_size(reference)} (tables the converter folds in included)\n"
            + (f"executed through Core AI here: all {programs} programs"
               if ran_programs == programs else
               f"executed through Core AI here: {ran_programs} of {programs} programs "
               f"(--execute distinct), {len(blocks) - len(ran)} blocks repeating their shapes "
               "written unexecuted")
            + f", worst relative error {worst[0]:.3g} ({worst[1]}) at {setting}\n"
            f"end to end: {end}"
            + (f"\nthe chosen recipe ({manifest['coreml']['compression'].get('note', '')}) "
               f"rendered whole with its weights simulated: PSNR {check['recipe']['psnr_db']} "
               f"dB against fp32 (floor {check['recipe']['psnr_floor_db']} dB)"
               if "recipe" in check else ""))

