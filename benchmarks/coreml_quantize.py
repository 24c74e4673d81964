"""What each `--quantize` setting of `edge export --target iphone` costs, on more than the
exporter's one validation prompt, for tiny-sora or a diffusers folder.

    python benchmarks/coreml_quantize.py                 # tiny-sora, every setting
    python benchmarks/coreml_quantize.py --settings 4 6  # some
    python benchmarks/coreml_quantize.py --sizes         # sizes only, both layouts
    python benchmarks/coreml_quantize.py --model /tmp/wan13 --height 128 --width 128 \\
        --frames 17 --steps 2 --videos 2 --settings 8 \\
        --rules "text_encoder/*=int8,transformer/*=lut4-g16,vae_decoder/*=int8"
    python benchmarks/coreml_quantize.py --model /tmp/wan13 --height 128 --width 128 \\
        --frames 17 --blocks transformer/block_0 vae_decoder/up_1 --forms int8 lut4 int4-b32

For each setting (and each `--rules` trial: "block pattern=stored form" pairs, the first matching
pattern winning, as a family's own setting words them; the forms are
edge.exporters.iphone.compression.STORAGES):
export the model to a temporary folder (with the exporter's own checks; a trial has no floor), then
render `--videos` of PROMPTS x SEEDS with the weights read back out of the programs
(edge.exporters.iphone.coreml.check.stored_weights_in_place) and compare each video with fp32
PyTorch (PSNR over the uint8 frames; SNR against the video's own spread). Prints one row per
setting: iOS, the whole package on disk, how much smaller than the fp32 tensors it stores, each
component's share, PSNR (validation prompt, mean, worst) and the worst SNR. `--sizes` exports each
setting for iOS 18 (multifunction programs) and iOS 17 (a program per variant) without the renders
and prints the whole package, its weight files and the fp32 reference. `--blocks` compares stored
forms on single blocks, each converted alone: weight file, the weights' SNR, the block's output
error, conversion time. CoreML cannot predict on Linux: this measures weight compression, not the
Neural Engine's fp16 activations.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from model_options import PROMPTS, SEEDS, add_model_options, cases, model_from  # beside it

from edge.core.video_metrics import psnr, snr
from edge.exporters.iphone.coreml.check import end_to_end_check, stored_weights_in_place
from edge.exporters.iphone.coreml.package import (
    DEFAULT_MIN_IOS,
    LAYOUTS,
    QUANTIZE,
    STORAGES,
    Compression,
    compression,
    cut_for_device,
    export_coreml,
    from_rule,
)
from edge.exporters.iphone.target import package_bytes
from edge.graph.family_model import FamilyModel, StorageRule


def trial(spec: str) -> Compression:
    """A `--rules` trial: "pattern=form,pattern=form" -> a setting named by the spec, with no
    floor (it is measured, not guarded)."""
    rules = tuple((pattern.strip(), form) for pattern, _, form
                  in (part.partition("=") for part in spec.split(",")))
    try:
        return from_rule(spec, StorageRule(rules, psnr_floor_db=0.0, note=""), f"--rules {spec!r}")
    except ValueError as err:
        raise SystemExit(str(err)) from None


def sizes(manifest: dict, root: Path) -> dict:
    """The whole package on disk (every file's bytes) and by component, its weight files, and
    the fp32 reference: the distinct tensors the programs store, at 4 bytes each."""
    fp32 = sum(b["reference_weight_bytes"] for c in manifest["components"]
               for b in c["blocks"])
    on_disk = package_bytes(root)
    return {"deployment_target": manifest["coreml"]["minimum_deployment_target"],
            "layout": manifest["coreml"]["layout"], "package_bytes": on_disk,
            "component_bytes": {c["name"]: package_bytes(root / "models" / c["name"])
                                for c in manifest["components"]},
            "weight_file_bytes": sum(p.stat().st_size for p in root.rglob("weight.bin")),
            "fp32_tensor_bytes": fp32, "smaller_than_fp32": fp32 / on_disk}


def measure(model: FamilyModel, setting: Compression, folder: Path, videos: int,
            min_ios: int = DEFAULT_MIN_IOS) -> dict:
    started = time.perf_counter()
    root = folder / "package"
    shutil.rmtree(root, ignore_errors=True)   # the last setting's (a real-size one is GBs)
    manifest = export_coreml(model, root, setting, min_ios=min_ios,
                             validate_end_to_end=end_to_end_check(model, setting))
    export_s = time.perf_counter() - started
    videos_run = cases(videos)
    want = [model.generate(p, seed=s) for p, s in videos_run]
    with stored_weights_in_place(cut_for_device(model), root, manifest):
        got = [model.generate(p, seed=s) for p, s in videos_run]
    psnrs = [psnr(a, b) for a, b in zip(got, want, strict=True)]
    snrs = [snr(a, b) for a, b in zip(got, want, strict=True)]
    worst_block = max((b["validation"]["max_abs_error"], f"{c['name']}/{b['name']}")
                      for c in manifest["components"] for b in c["blocks"])
    return {"setting": setting.setting, **sizes(manifest, root),
            "psnr_validation_db": manifest["validation"]["psnr_db"],
            "psnr_mean_db": float(np.mean(psnrs)), "psnr_min_db": float(min(psnrs)),
            "snr_min_db": float(min(snrs)), "psnr_db": [round(v, 2) for v in psnrs],
            "worst_block": worst_block, "export_s": round(export_s, 1),
            "total_s": round(time.perf_counter() - started, 1)}


def block_forms(model: FamilyModel, keys: list[str], forms: list[str]) -> None:
    """Each stored form on single blocks, converted alone: the weight file, the weights' SNR
    against fp32 (mean and worst over the compressed tensors), the block's output error on
    its example inputs (max-abs over the output's max-abs) and the conversion time."""
    from edge.exporters.iphone.coreml.check import block_numerics
    from edge.exporters.iphone.coreml.package import WEIGHT_THRESHOLD, convert_module, save_program
    from edge.exporters.iphone.coreml.weights import read_parameters

    blocks = {b.key: b for bs in cut_for_device(model).values() for b in bs}
    unknown = [k for k in keys if k not in blocks]
    if unknown:
        raise SystemExit(f"--blocks: no block {unknown[0]!r}; the device cut has "
                         f"{', '.join(blocks)}")
    print(f"{'block':<24}{'form':>10}{'weights MB':>12}{'SNR mean':>10}{'worst':>7}"
          f"{'output error':>14}{'convert s':>11}")
    for key in keys:
        block = blocks[key]
        reference, params = block.run(*block.example), block.parameters()
        for form in forms:
            setting = trial(f"*={form}")
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "block.mlpackage"
                started = time.perf_counter()
                save_program(convert_module(block.module, block, setting), path)
                seconds = time.perf_counter() - started
                stored, _ = read_parameters(path, params)
                numerics = block_numerics(path, block.module, block, reference)
                size = sum(f.stat().st_size for f in path.rglob("weight.bin"))
            snrs = [10 * np.log10(float((params[n].double() ** 2).sum())
                                  / max(float(((stored[n].double() - params[n].double()) ** 2)
                                              .sum()), 1e-30))
                    for n in params if params[n].numel() >= WEIGHT_THRESHOLD]
            error = numerics["max_abs_error"] / numerics["reference_max_abs"]
            # a block with no tensor of WEIGHT_THRESHOLD elements stores everything in fp16
            mean, worst = (f"{np.mean(snrs):.1f}", f"{min(snrs):.1f}") if snrs else ("-", "-")
            print(f"{key:<24}{form:>10}{size / 1e6:>12.1f}{mean:>10}{worst:>7}"
                  f"{error:>13.2%}{seconds:>11.1f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_options(parser)
    parser.add_argument("--settings", nargs="*", default=None, choices=list(QUANTIZE),
                        help="named settings (default: all, or none with --rules)")
    parser.add_argument("--rules", nargs="+", default=[], metavar="SPEC",
                        help='trial rules, e.g. "text_encoder/*=int8,transformer/*=lut4-g16"')
    parser.add_argument("--videos", type=int, default=len(PROMPTS) * len(SEEDS),
                        help="prompt x seed videos rendered per setting (default: all 8)")
    parser.add_argument("--min-ios", type=int, default=DEFAULT_MIN_IOS, choices=list(LAYOUTS),
                        help="the package's layout (18: multifunction, 17: separate)")
    parser.add_argument("--sizes", action="store_true",
                        help="sizes only, each setting for iOS 18 and for iOS 17 (no renders)")
    parser.add_argument("--blocks", nargs="+", metavar="KEY",
                        help="compare stored forms on these blocks alone (no exports)")
    parser.add_argument("--forms", nargs="+", default=list(STORAGES), choices=list(STORAGES),
                        help="the stored forms --blocks compares (default: all)")
    parser.add_argument("--json", action="store_true", help="print one JSON object per row")
    args = parser.parse_args()
    model = model_from(args)
    if args.blocks:
        block_forms(model, args.blocks, args.forms)
        return
    named = args.settings if args.settings is not None else (
        [] if args.rules else list(QUANTIZE))
    settings = [compression(s, model) for s in named] + [trial(r) for r in args.rules]
    if args.sizes:
        print(f"{'setting':<8}{'iOS':>7}{'layout':>15}{'package MB':>12}{'weight files MB':>17}"
              f"{'fp32 MB':>9}{'x smaller':>10}")
        with tempfile.TemporaryDirectory() as tmp:
            for setting in settings:
                for min_ios in LAYOUTS:
                    root = Path(tmp) / f"{len(settings)}-ios{min_ios}"
                    row = {"setting": setting.setting, **sizes(export_coreml(
                        model, root, setting, min_ios=min_ios), root)}
                    if args.json:
                        print(json.dumps(row))
                    print(f"{setting.setting:<8}{row['deployment_target']:>7}"
                          f"{row['layout']:>15}{row['package_bytes'] / 1e6:>12.2f}"
                          f"{row['weight_file_bytes'] / 1e6:>17.2f}"
                          f"{row['fp32_tensor_bytes'] / 1e6:>9.1f}"
                          f"{row['smaller_than_fp32']:>10.2f}")
        return
    print(f"{min(args.videos, len(PROMPTS) * len(SEEDS))} videos (prompts x seeds), "
          f"{args.steps or model.sampler.steps} steps, against fp32 PyTorch")
    print(f"{'iOS':>6}{'package MB':>12}{'x smaller':>10}{'PSNR val':>10}{'mean':>7}"
          f"{'worst':>7}{'SNR worst':>10}  setting")
    with tempfile.TemporaryDirectory() as tmp:
        for setting in settings:
            row = measure(model, setting, Path(tmp), args.videos, args.min_ios)
            if args.json:
                print(json.dumps(row), flush=True)
            parts = ", ".join(f"{name} {size / 1e6:.0f}"
                              for name, size in row["component_bytes"].items())
            print(f"{row['deployment_target']:>6}{row['package_bytes'] / 1e6:>12.1f}"
                  f"{row['smaller_than_fp32']:>10.2f}{row['psnr_validation_db']:>10.1f}"
                  f"{row['psnr_mean_db']:>7.1f}{row['psnr_min_db']:>7.1f}"
                  f"{row['snr_min_db']:>10.1f}  {setting.setting} ({parts} MB; "
                  f"{row['total_s']:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
