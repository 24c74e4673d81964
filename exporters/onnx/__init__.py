"""`--target onnx`: the registered target (`target.py`) and the package it writes (`package.py`:
one ONNX graph per block, weights in flash-laid-out files, the end-to-end check). What the
command line reads at start, without torch, is declared here."""

from edge.core.declared import Option
from edge.exporters.shared.options import EXECUTE, MEMORY_BUDGET

NAME = "onnx"
HELP = "ONNX graphs, one a block, for onnxruntime (the Python runtime)"
NEEDS = ("torch", "onnx")            # what its compiler needs, whatever its options
READS_BLOCKS_FROM_STORAGE = True     # exports a model too large for memory block by block
# --check: the end-to-end check's levels
CHECK_LEVELS = ("auto", "full", "small", "blocks")


OPTIONS = (
    MEMORY_BUDGET,
    EXECUTE,
    Option("check", str, "The end-to-end check. full: a generation by the package against the "
           "family's reference at the export's size; small: at the family's small size, "
           "exported alongside through the same code; blocks: each block only; auto: full "
           "when its estimate here is under 10 minutes, else small [default: auto].",
           choices=CHECK_LEVELS, group="Checks"),
)
