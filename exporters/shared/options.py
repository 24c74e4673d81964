"""The export options more than one target takes, declared once as data
(edge/core/declared.py); each target's `__init__.py` lists those it takes beside its own."""

from __future__ import annotations

from dataclasses import replace

from edge.core.budget import parse_size
from edge.core.declared import Option


def _budget_bytes(text: str) -> int:
    return parse_size(text, "--memory-budget")


MEMORY_BUDGET = Option("memory_budget", str, "Plan residency for this budget, e.g. 64MB "
                       "(shown with --dry-run).", parse=_budget_bytes)
UNGUIDED_VARIANTS = Option(
    "unguided_variants", bool, "Also write the transformer's blocks at the caption's half of "
    "the guidance batch, so a call without guidance (guidance 1, or after --guidance-steps) "
    "computes half; without them such calls run the pair and drop its null half [default: "
    "written].", switch="--unguided-variants/--no-unguided-variants")
# --execute: which blocks an export runs and holds to PyTorch
EXECUTE_CHOICES = ("all", "distinct")
EXECUTE = Option(
    "execute", str, "The blocks the export runs and holds to PyTorch. all: every block and "
    "variant; distinct: one block of each repeated program (the transformer's block_0 for "
    "block_1..29) and every block that repeats none, the repeats converted and written unrun, "
    "as the manifest and summary say: for real-size models, whose blocks take minutes each to "
    "run (a Wan 1.3B block at 480x832x81 in PyTorch; on Linux, where Core AI's interpreter "
    "emulates float16, one of its transformer blocks) [default: all].",
    choices=EXECUTE_CHOICES)


def only_in(option: Option, layouts: str) -> Option:
    """`option` as a target takes it in some of its layouts only (said in refusals)."""
    return replace(option, only=layouts)
