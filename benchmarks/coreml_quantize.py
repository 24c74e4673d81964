"""What each `--quantize` setting of `edge export --target iphone` costs, on more than the
exporter's one validation prompt.

    python benchmarks/coreml_quantize.py                 # every setting
    python benchmarks/coreml_quantize.py --settings 4 6  # some

For each setting: export tiny-sora to a temporary folder (with the exporter's own checks),
then render PROMPTS x SEEDS (30 steps) with the weights read back out of the programs
(exporters.coreml_check.model_with_stored_weights) and compare each video with fp32
PyTorch (PSNR over the uint8 frames). Prints one row per setting: iOS target, weight bytes of
the base programs, how much smaller than fp32, and PSNR (validation prompt, mean, worst).
CoreML cannot predict on Linux: this measures weight compression, not the Neural Engine's
fp16 activations.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from edge.families import FamilyModel, load_model
from exporters.coreml import COMPRESSIONS, export_coreml
from exporters.coreml_check import end_to_end_check, model_with_stored_weights, psnr

PROMPTS = ["a red circle moving left", "a blue square moving up",
           "a green triangle moving right", "a yellow ball moving down"]
SEEDS = (0, 1)


def measure(pipe: FamilyModel, setting: str, folder: Path) -> dict:
    started = time.perf_counter()
    manifest = export_coreml(pipe, folder / setting, setting,
                             validate_end_to_end=end_to_end_check(pipe, setting))
    export_s = time.perf_counter() - started
    blocks = [b for c in manifest["components"] for b in c["blocks"]]
    fp32 = sum(b["reference_weight_bytes"] for b in blocks)
    stored = sum(b["weight_bytes"] for b in blocks)
    twin = model_with_stored_weights(pipe, folder / setting, manifest)
    values = [psnr(twin.generate(p, seed=s), pipe.generate(p, seed=s))
              for p in PROMPTS for s in SEEDS]
    return {"setting": setting,
            "deployment_target": manifest["coreml"]["minimum_deployment_target"],
            "weight_bytes": stored, "smaller_than_fp32": fp32 / stored,
            "psnr_validation_db": manifest["validation"]["psnr_db"],
            "psnr_mean_db": float(np.mean(values)), "psnr_min_db": float(min(values)),
            "psnr_db": [round(v, 2) for v in values], "export_s": round(export_s, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", nargs="+", default=list(COMPRESSIONS),
                        choices=list(COMPRESSIONS))
    parser.add_argument("--json", action="store_true", help="print one JSON object per row")
    args = parser.parse_args()
    pipe = load_model()
    print(f"{len(PROMPTS)} prompts x {len(SEEDS)} seeds, 30 steps, PSNR against fp32 PyTorch")
    print(f"{'setting':<8}{'iOS':>7}{'weights MB':>12}{'x smaller':>10}"
          f"{'PSNR val':>10}{'mean':>7}{'worst':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        for setting in args.settings:
            row = measure(pipe, setting, Path(tmp))
            if args.json:
                print(json.dumps(row))
            print(f"{setting:<8}{row['deployment_target']:>7}{row['weight_bytes'] / 1e6:>12.1f}"
                  f"{row['smaller_than_fp32']:>10.2f}{row['psnr_validation_db']:>10.1f}"
                  f"{row['psnr_mean_db']:>7.1f}{row['psnr_min_db']:>7.1f}")


if __name__ == "__main__":
    main()
