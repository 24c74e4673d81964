"""`edge export --target onnx`: the blocks re-cut for a memory budget (edge/planning/plan.py), one
ONNX graph each (exporters/onnx/package.py), checked end to end by the Python runtime against the
family's reference."""

from __future__ import annotations

import resource
from pathlib import Path

from edge.core.budget import format_size
from edge.exporters import ExportOptions, Prepared, Progress, check_declared
from edge.exporters.onnx import NAME
from edge.exporters.shared.validation import worst_block
from edge.graph.attention import budget_score_limit
from edge.graph.family_model import FamilyModel
from edge.planning.activation_memory import RUNTIME_BATCH_PIECES
from edge.planning.plan import READ_UNIT, partition, plan_lines, plan_residency


def check(options: ExportOptions) -> None:
    check_declared(NAME, options)


def folder_name(model_name: str, options: ExportOptions) -> str:
    return f"{model_name}-{NAME}"


def prepare(model: FamilyModel, options: ExportOptions) -> Prepared:
    """A budget re-cuts the blocks: pairs too large split, small neighbours merged
    (BudgetError when the largest block cannot fit)."""
    budget = options.memory_budget
    cut = partition(model.cut(model.shapes(NAME)), budget)
    plan = plan_residency(cut.components, budget)
    lines = plan_lines(plan, cut.members, budget)
    return Prepared(cut.components, notes=cut.notes + plan["notes"], plan_lines=lines,
                    manifest_plan=cut.to_manifest(budget, READ_UNIT) if budget else None,
                    batch_pieces=RUNTIME_BATCH_PIECES if budget is not None else None)


def export(model: FamilyModel, prepared: Prepared, dest: Path, options: ExportOptions,
           progress: Progress) -> dict:
    from edge.exporters.onnx.package import end_to_end_check, export_onnx

    if options.end_to_end is not None:  # checked beside the export (edge export --check)
        def validate(root: Path) -> dict:
            return options.end_to_end
    else:
        validate = end_to_end_check(model, on_step=progress.on_check_step,
                                    memory_budget=options.memory_budget,
                                    components=prepared.components)
    with budget_score_limit(options.memory_budget):
        return export_onnx(model, dest, components=prepared.components,
                           on_block=progress.on_block, plan=prepared.manifest_plan,
                           validate_end_to_end=validate,
                           distinct_only=options.execute == "distinct")


def summary(manifest: dict, dest: Path, seconds: float) -> str:
    blocks = [b for c in manifest["components"] for b in c["blocks"]]
    worst = worst_block(manifest)
    validation = manifest["validation"]
    if validation.get("skipped"):
        end_to_end = "no end-to-end check (--check blocks)"
    else:
        psnr = ("identical videos" if validation.get("identical")
                else f"{validation['psnr_db']} dB")
        size = validation.get("size")
        at = f" at {size['height']}x{size['width']}x{size['frames']}" if size else ""
        end_to_end = f"end to end PSNR {psnr}{at}"
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    unvalidated = sum(1 for b in blocks if b["validation"].get("executed") is False)
    skipped = (f" ({unvalidated} not run: --execute distinct, their graphs those of blocks "
               "validated)" if unvalidated else "")
    return (f"wrote {dest} in {seconds:.0f} s: {len(blocks)} blocks{skipped}, worst block "
            f"error {worst[0]:.2g} of its largest output ({worst[1]}), {end_to_end}, peak RSS "
            f"{format_size(peak_rss)}")
