"""`--target web`: the registered target (`target.py`) and the static site it writes
(`package.py`): TVM WebGPU kernels with launch plans (`tvm_plan.py`, `tvm_passes.py`), wasm
graphs for onnxruntime-web (`ort_web.py`), the stored weight forms (`storage.py`), the inputs
both paths take (`inputs.py`) and the end-to-end check of the stored form (`check.py`). What
the command line reads at start, without torch, is declared here."""

from pathlib import Path

from edge.core.declared import Option
from edge.core.manifest_schema import WEB_PATHS
from edge.exporters.shared.options import UNGUIDED_VARIANTS

NAME = "web"
HELP = ("WebGPU kernels by TVM and wasm graphs for onnxruntime-web, or the wasm graphs alone "
        "with --web-paths wasm, with the demo page: a static site for `edge serve`")
NEEDS = ("torch", "onnx")            # TVM too for the WebGPU path: `needs`
READS_BLOCKS_FROM_STORAGE = True
# `--web-paths`: both paths (the default), or the wasm graphs alone. No webgpu-only package:
# the wasm graphs are the cheap part of an export and the page's fallback without WebGPU
BUILT_PATHS = (WEB_PATHS, ("wasm",))
DEFAULT_WEB_PATHS = ",".join(WEB_PATHS)

OPTIONS = (
    Option("quantize", str, "How weights are stored and downloaded: fp32, fp16, 8 (int8 with a "
           "scale per row) or 4 (the family's rule: int4 with a scale per 32 inputs where its "
           "phone rule stores 4 bits, int8 elsewhere) [default: fp16].", group="Quantization"),
    Option("ort_url", str, "The https folder URL the page loads onnxruntime-web (its wasm path) "
           "from, each file checked by sha256 [default: the pinned version on the jsDelivr "
           "CDN]."),
    Option("bundle_ort", Path, "Copy onnxruntime-web from this dist folder into the package, so "
           "the page works offline."),
    Option("web_paths", str, "The paths the package holds. webgpu,wasm: WebGPU kernels and "
           "launch plans (TVM, each plan replayed with its llvm build) and the wasm graphs, the "
           "page running the faster; wasm: onnxruntime-web's wasm graphs alone, no TVM "
           "(the default model's blocks export in a quarter of the time; the page runs on the "
           "CPU, a GPU or not) [default: webgpu,wasm]."),
    UNGUIDED_VARIANTS,
)


def needs(options: dict) -> tuple[tuple[str, ...], tuple[str, tuple[str, ...]] | None]:
    """What the options add to NEEDS: TVM, unless the package holds the wasm path alone; and
    the lighter choice an install without TVM has (target.py's `check` refuses the same for
    callers that name no options to `exporters.target`)."""
    given = options.get("web_paths") or DEFAULT_WEB_PATHS
    if "webgpu" not in {name.strip() for name in given.split(",")}:
        return (), None
    return ("tvm",), ("--web-paths wasm", NEEDS)
