"""`--target iphone`: the registered target (`target.py`) over two layouts, Core ML programs
(`coreml/`, iOS 17 and 18) and Core AI models (`coreai/`, `--min-ios 27`), and the `--quantize`
settings both take (`compression.py`). What the command line reads at start, without torch, is
declared here."""

from edge.core.declared import Option
from edge.exporters.shared.options import (
    EXECUTE,
    MEMORY_BUDGET,
    UNGUIDED_VARIANTS,
    only_in,
)

NAME = "iphone"
HELP = ("Core ML: one .mlpackage per block (compiling them to .mlmodelc is macOS-only), or Core "
        "AI with --min-ios 27")
NEEDS = ("torch", "coremltools")
# Core AI (--min-ios 27) reads each block's weights while its graph is saved for the
# converter; Core ML converts whole programs with their weights
READS_BLOCKS_FROM_STORAGE = "--min-ios 27"


def reads_blocks_from_storage(options) -> bool:
    return options.min_ios == 27

OPTIONS = (
    Option("quantize", str, "Weight compression fp16, 8 (int8 linear), 6 (palettized), 4 "
           "(mostly 4-bit palettized, the transformer int8) or auto (each block's form chosen "
           "by measurement for a target: auto = auto:38dB, the worst measurement video's PSNR; "
           "auto:7x or auto:14MB, the weight files' size); with --min-ios 27 fp32, fp16, 8, 4 "
           "(the family's rule in int8 and int4 with a scale per 32 inputs) or auto (fp16, "
           "int8 and int4 per block, measured on coreai-opt's simulated weights) "
           "[default: fp16].", group="Quantization"),
    Option("min_ios", int, "The oldest iOS the package runs on. 27: a Core AI model (.aimodel) "
           "per block, its variants as functions sharing its weights, every program executed "
           "through Core AI at export; 18: a block and its variants (TDTM, the decoder's first "
           "pieces) are the functions of one multifunction .mlpackage sharing one weight "
           "file; 17: each variant is an .mlpackage of its own with a copy of the weights "
           "[default: 18]."),
    MEMORY_BUDGET,
    only_in(UNGUIDED_VARIANTS, "--min-ios 18 or 27"),
    only_in(EXECUTE, "--min-ios 27"),
)
