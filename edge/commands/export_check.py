"""How much of an export's end-to-end check runs (`edge export --check`).

The check generates a video twice, with the package and with the family's reference, and
compares them. At toy sizes that is seconds; at Wan 1.3B's 480x832x17 one step is tens of
TFLOP, about ten minutes of this machine each way, and at 480x832x81 hours. The levels:

- full: both generations at the export's own size (what every export did before);
- small: both at the family's small size (`edge.families.check_size`), through the same
  family code and the same exporter into a temporary package, before the real export, whose
  blocks are then each validated at their own size as always; the manifest records the size;
- blocks: each block against PyTorch, no generation;
- auto (the default): full when its estimate (edge/planning/compute_cost.py: the FLOPs of two
  generations over this machine's measured rate) is under CHECK_SECONDS, otherwise small
  where the family has a small size, saying so. With the reference on a GPU (`--device`)
  only the package's generation counts.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

from edge.core.console import echo

CHECK_SECONDS = 600.0  # the most `auto` lets a full check take by its estimate


def check_level(level: str, family: str, folder: Path | None, model, prepared) -> str:
    """The level to run: `level` itself, or for `auto` the one its estimate allows (said in a
    note). The estimate counts the blocks as cut, from their shapes."""
    from edge.families import check_size
    from edge.graph.reference_device import current
    from edge.planning.compute_cost import format_seconds, matmul_rate, model_generation_cost

    if level != "auto":
        return level
    try:
        cost = model_generation_cost(model, prepared.components)
    except Exception as err:  # noqa: BLE001 - an estimate must not stop an export
        echo(f"note: the end-to-end check's cost could not be estimated ({type(err).__name__}:"
             f" {str(err)[:200]}); checking in full")
        return "full"
    # the package's generation runs here; the reference's too unless it runs on a GPU
    # (--device), which takes seconds beside it
    on_cpu = current().type == "cpu"
    seconds = (2 if on_cpu else 1) * cost.total / matmul_rate()
    if seconds <= CHECK_SECONDS or check_size(family, folder) is None:
        return "full"
    what = ("two generations" if on_cpu else f"the package's generation, the reference's on "
            f"{current()}")
    echo(f"note: a full end-to-end check at this size takes at least "
         f"{format_seconds(seconds)} here ({what} of {model.sampler.steps} steps); "
         "checking end to end at the family's small size instead (--check full to insist)")
    return "small"


def end_to_end_result(level: str, family: str, folder: Path | None, family_options: dict,
                      model, exporter, options) -> dict | None:
    """The manifest's `validation` for `level`, computed before the export (None for full:
    the export checks itself)."""
    if level == "full":
        return None
    if level == "blocks":
        return {"skipped": True, "note": "no end-to-end check (--check blocks): "
                f"{_blocks_validated(options)} against PyTorch"}
    return _small_check(family, folder, family_options, model, exporter, options)


def _small_check(family: str, folder: Path | None, family_options: dict, model, exporter,
                 options) -> dict:
    """Export `model` at the family's small size into a temporary package, with its full
    end-to-end check; that check's result, with the size. The small model shares `model`'s
    weights, and the check's runtime streams under the export's budget where one is given."""
    from tqdm import tqdm

    from edge.exporters import Progress
    from edge.families import check_size, model_at_size

    size = check_size(family, folder)
    small = model_at_size(model, folder, **(family_options | size))
    prepared = exporter.prepare(small, options)
    at = f"{size['height']}x{size['width']}x{size['frames']}"
    with (tempfile.TemporaryDirectory(prefix="edge-check-") as tmp,
          tqdm(total=prepared.block_count, desc=f"checking end to end at {at}",
               unit="block") as bar):
        progress = Progress(on_block=lambda key: bar.update())
        # every block of the small export validated: seconds at its size
        manifest = exporter.export(small, prepared, Path(tmp) / "package",
                                   replace(options, end_to_end=None, execute=None), progress)
    return manifest["validation"] | {
        "size": size, "note": f"checked end to end at {at}, the family's small size, "
        f"through the same code; {_blocks_validated(options)} at the package's own size"}


def _blocks_validated(options) -> str:
    if options.execute == "distinct":
        return ("one block of each distinct graph validated (--execute distinct: the others' "
                "graphs are one of those but for metadata)")
    return "each block validated"
