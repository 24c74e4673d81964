"""Mixed-bit recipes for `--target iphone` chosen by measurement
(exporters/iphone/coreml/recipe.py), measured against what they predict: for tiny-sora (or a
diffusers folder) every block in every candidate form, the recipes for the targets, each exported
and rendered on the 8 videos of benchmarks/coreml_quantize.py.

    python benchmarks/coreml_recipe.py --save /tmp/trials.json      # measure, choose, check
    python benchmarks/coreml_recipe.py --trials /tmp/trials.json \\
        --max-package-x 7 --min-psnr 38                              # choose again, check

Prints the trials (each block's forms: weight MB, the PSNR of the 2 measurement videos with
that block alone stored so), then per target the recipe, its predicted weight MB and worst
PSNR, and the exported package: MB on disk, × smaller than fp32, PSNR validation / mean /
worst of 8 (coreml_quantize.measure). A size target is the whole package ("7×" smaller than
the fp32 tensors), converted to weight bytes by the package's measured overhead.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from coreml_quantize import measure, sizes  # beside it
from model_options import PROMPTS, SEEDS, add_model_options, cases, model_from  # beside it

from edge.exporters.iphone.coreml.package import (
    DEFAULT_MIN_IOS,
    LAYOUTS,
    cut_for_device,
    export_coreml,
)
from edge.exporters.iphone.coreml.recipe import (
    VIDEOS,
    FormTrial,
    candidate_forms,
    choose,
    measure_forms,
    psnr_of,
    recipes,
)

MB = 1e6


def measured(args, model, forms: list[str], store=None, how: str = "") -> list[FormTrial]:
    """The trials: read from `--trials`, else every block of the device cut measured in each
    of `forms` (stored by `store`, the layout's: default Core ML's at `--min-ios`; `how` says
    so in the header), printed as they come and saved to `--save`."""
    if args.trials:
        return [FormTrial(**{**t, "mse": tuple(t["mse"])})
                for t in json.loads(Path(args.trials).read_text())]
    videos = VIDEOS if args.measure_videos is None else cases(args.measure_videos)
    started = time.perf_counter()
    print(f"measuring {', '.join(forms)}{how} on every block, {len(videos)} videos "
          f"({args.steps or model.sampler.steps} steps)", flush=True)
    print(f"{'block':<28}{'form':>10}{'weights MB':>12}{'PSNR alone':>12}")

    def show(t: FormTrial) -> None:
        print(f"{t.block:<28}{t.form:>10}{t.weight_bytes / MB:>12.2f}"
              f"{psnr_of(max(t.mse)):>12.1f}", flush=True)

    trials = measure_forms(model, cut_for_device(model), forms, videos, steps=args.steps,
                           min_ios=getattr(args, "min_ios", DEFAULT_MIN_IOS), on_trial=show,
                           store=store)
    print(f"measured in {time.perf_counter() - started:.0f} s")
    if args.save:
        Path(args.save).write_text(json.dumps([asdict(t) for t in trials]))
    return trials


def add_recipe_options(parser: argparse.ArgumentParser) -> None:
    """The options `measured` reads (where trials come from and go, the videos they are
    measured on), the PSNR targets and the videos each recipe is rendered on: the same for
    every layout's recipe benchmark, beside its own size target."""
    parser.add_argument("--trials", help="trials saved by --save (skips the measurement)")
    parser.add_argument("--save", help="write the measured trials here (JSON)")
    parser.add_argument("--min-psnr", type=float, nargs="*", default=[38.0],
                        help="targets: the worst measurement video's predicted PSNR (dB)")
    parser.add_argument("--measure-videos", type=int,
                        help=f"measure the trials on the check's first N videos (default: the "
                             f"exporter's {len(VIDEOS)})")
    parser.add_argument("--videos", type=int, default=len(PROMPTS) * len(SEEDS),
                        help=f"videos each recipe is rendered on (default: all "
                             f"{len(PROMPTS) * len(SEEDS)})")


def package_overhead(model, root: Path, min_ios: int) -> int:
    """What a package holds beyond its weight files (program specs, tokenizer, captions):
    measured on an fp16 export (no end-to-end check), about the same at every recipe."""
    row = sizes(export_coreml(model, root, "fp16", min_ios=min_ios), root)
    return row["package_bytes"] - row["weight_file_bytes"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_options(parser)
    parser.add_argument("--min-ios", type=int, default=DEFAULT_MIN_IOS, choices=list(LAYOUTS))
    parser.add_argument("--forms", nargs="+", help="candidate forms (default: all the iOS takes)")
    parser.add_argument("--max-package-x", type=float, nargs="*", default=[7.0],
                        help="targets: the whole package this many times smaller than fp32")
    add_recipe_options(parser)
    args = parser.parse_args()
    model = model_from(args)
    trials = measured(args, model, candidate_forms(args.min_ios, args.forms))

    print("\nthe recipes the hulls give (weights MB, predicted worst PSNR):")
    print("  " + ", ".join(f"{r.weight_bytes / MB:.1f} MB {r.psnr_db:.1f} dB"
                           for r in recipes(trials)))
    fp32 = sum(b.weight_bytes() for bs in cut_for_device(model).values() for b in bs)
    overhead = None  # measured on the first size target
    with tempfile.TemporaryDirectory() as tmp:
        targets = ([("x", x) for x in args.max_package_x]
                   + [("dB", p) for p in args.min_psnr])
        for kind, value in targets:
            if kind == "x":
                if overhead is None:
                    overhead = package_overhead(model, Path(tmp) / "fp16", args.min_ios)
                recipe = choose(trials, max_bytes=int(fp32 / value - overhead))
                label = f"package {value:g}x smaller"
            else:
                recipe = choose(trials, min_psnr_db=value)
                label = f"worst video {value:g} dB"
            row = measure(model, recipe.setting(0.0, note=label), Path(tmp), args.videos,
                          args.min_ios)
            print(f"\n{label}: predicted {recipe.weight_bytes / MB:.2f} MB of weights, "
                  f"worst {recipe.psnr_db:.1f} dB")
            print("  " + ", ".join(f"{k} {f}" for k, f in recipe.forms.items()))
            print(f"  exported: {row['package_bytes'] / MB:.2f} MB on disk "
                  f"({row['weight_file_bytes'] / MB:.2f} MB weight files), "
                  f"{row['smaller_than_fp32']:.2f}x smaller than fp32; PSNR validation "
                  f"{row['psnr_validation_db']:.1f}, mean {row['psnr_mean_db']:.1f}, worst "
                  f"{row['psnr_min_db']:.1f} of {args.videos}; SNR worst "
                  f"{row['snr_min_db']:.1f} ({row['total_s']:.0f} s)")
            print("  PSNR per video: " + ", ".join(f"{v:.1f}" for v in row["psnr_db"]),
                  flush=True)


if __name__ == "__main__":
    main()
