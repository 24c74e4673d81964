"""What each `--quantize` setting of `edge export --target iphone` costs, on more than the
exporter's one validation prompt.

    python benchmarks/coreml_quantize.py                 # every setting
    python benchmarks/coreml_quantize.py --settings 4 6  # some
    python benchmarks/coreml_quantize.py --sizes         # sizes only, both layouts

For each setting: export tiny-sora to a temporary folder (with the exporter's own checks),
then render PROMPTS x SEEDS (30 steps) with the weights read back out of the programs
(exporters.coreml_check.stored_weights_in_place) and compare each video with fp32
PyTorch (PSNR over the uint8 frames). Prints one row per setting: iOS target, the whole
package on disk, how much smaller than the fp32 tensors it stores, and PSNR (validation
prompt, mean, worst). `--sizes` exports each setting for iOS 18 (multifunction programs) and
iOS 17 (a program per variant) without the renders and prints the whole package, its weight
files and the fp32 reference. CoreML cannot predict on Linux: this measures weight
compression, not the Neural Engine's fp16 activations.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from edge.families import FamilyModel, load_model
from edge.video_metrics import psnr
from exporters.coreml import (
    COMPRESSIONS,
    DEFAULT_MIN_IOS,
    LAYOUTS,
    cut_for_device,
    export_coreml,
)
from exporters.coreml_check import end_to_end_check, stored_weights_in_place
from exporters.coreml_target import package_bytes

PROMPTS = ["a red circle moving left", "a blue square moving up",
           "a green triangle moving right", "a yellow ball moving down"]
SEEDS = (0, 1)


def sizes(manifest: dict, root: Path) -> dict:
    """The whole package on disk (every file's bytes), its weight files, and the fp32
    reference: the distinct tensors the programs store, at 4 bytes each."""
    fp32 = sum(b["reference_weight_bytes"] for c in manifest["components"]
               for b in c["blocks"])
    on_disk = package_bytes(root)
    return {"deployment_target": manifest["coreml"]["minimum_deployment_target"],
            "layout": manifest["coreml"]["layout"], "package_bytes": on_disk,
            "weight_file_bytes": sum(p.stat().st_size for p in root.rglob("weight.bin")),
            "fp32_tensor_bytes": fp32, "smaller_than_fp32": fp32 / on_disk}


def measure(pipe: FamilyModel, setting: str, folder: Path,
            min_ios: int = DEFAULT_MIN_IOS) -> dict:
    started = time.perf_counter()
    manifest = export_coreml(pipe, folder / setting, setting, min_ios=min_ios,
                             validate_end_to_end=end_to_end_check(pipe, setting))
    export_s = time.perf_counter() - started
    want = [pipe.generate(p, seed=s) for p in PROMPTS for s in SEEDS]
    with stored_weights_in_place(cut_for_device(pipe), folder / setting, manifest):
        got = [pipe.generate(p, seed=s) for p in PROMPTS for s in SEEDS]
    values = [psnr(a, b) for a, b in zip(got, want, strict=True)]
    return {"setting": setting, **sizes(manifest, folder / setting),
            "psnr_validation_db": manifest["validation"]["psnr_db"],
            "psnr_mean_db": float(np.mean(values)), "psnr_min_db": float(min(values)),
            "psnr_db": [round(v, 2) for v in values], "export_s": round(export_s, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", nargs="+", default=list(COMPRESSIONS),
                        choices=list(COMPRESSIONS))
    parser.add_argument("--min-ios", type=int, default=DEFAULT_MIN_IOS, choices=list(LAYOUTS),
                        help="the package's layout (18: multifunction, 17: separate)")
    parser.add_argument("--sizes", action="store_true",
                        help="sizes only, each setting for iOS 18 and for iOS 17 (no renders)")
    parser.add_argument("--json", action="store_true", help="print one JSON object per row")
    args = parser.parse_args()
    pipe = load_model()
    if args.sizes:
        print(f"{'setting':<8}{'iOS':>7}{'layout':>15}{'package MB':>12}{'weight files MB':>17}"
              f"{'fp32 MB':>9}{'x smaller':>10}")
        with tempfile.TemporaryDirectory() as tmp:
            for setting in args.settings:
                for min_ios in LAYOUTS:
                    root = Path(tmp) / f"{setting}-ios{min_ios}"
                    row = {"setting": setting, **sizes(export_coreml(
                        pipe, root, setting, min_ios=min_ios), root)}
                    if args.json:
                        print(json.dumps(row))
                    print(f"{setting:<8}{row['deployment_target']:>7}{row['layout']:>15}"
                          f"{row['package_bytes'] / 1e6:>12.2f}"
                          f"{row['weight_file_bytes'] / 1e6:>17.2f}"
                          f"{row['fp32_tensor_bytes'] / 1e6:>9.1f}"
                          f"{row['smaller_than_fp32']:>10.2f}")
        return
    print(f"{len(PROMPTS)} prompts x {len(SEEDS)} seeds, 30 steps, PSNR against fp32 PyTorch")
    print(f"{'setting':<8}{'iOS':>7}{'package MB':>12}{'x smaller':>10}"
          f"{'PSNR val':>10}{'mean':>7}{'worst':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        for setting in args.settings:
            row = measure(pipe, setting, Path(tmp), args.min_ios)
            if args.json:
                print(json.dumps(row))
            print(f"{setting:<8}{row['deployment_target']:>7}{row['package_bytes'] / 1e6:>12.1f}"
                  f"{row['smaller_than_fp32']:>10.2f}{row['psnr_validation_db']:>10.1f}"
                  f"{row['psnr_mean_db']:>7.1f}{row['psnr_min_db']:>7.1f}")


if __name__ == "__main__":
    main()
