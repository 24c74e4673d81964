"""Mixed-bit recipes for `--target iphone --min-ios 27` chosen by measurement
(exporters/iphone/coreai/recipe.py), against what they predict: for tiny-sora (or a diffusers
folder) every block in coreai-opt's forms (fp16, int8, int4 per 32 inputs) with its weights
simulated as coreai-opt stores them, the recipes for the targets, each rendered whole with
its simulated weights on the 8 videos of benchmarks/coreml_quantize.py.

    python benchmarks/coreai_recipe.py --save /tmp/coreai-trials.json   # measure, choose, check
    python benchmarks/coreai_recipe.py --trials /tmp/coreai-trials.json \\
        --max-weights-x 7 6 5 --min-psnr 38                             # choose again, check

Prints the trials (each block's forms: stored MB, the PSNR of the measurement videos with
that block alone stored so), the recipes the hulls give, then per target the recipe, its
predicted weight MB and worst PSNR, and rendered whole: PSNR validation / mean / worst of 8.
A size target here is the stored weights against the fp32 parameters (a Core AI package
adds its programs' ops, its tokenizer and captions: `edge export` prints the whole).

Why not exported: the Linux interpreter emulates float16 (about 100x float32), so a
compressed package's generation is not run here; each program of an export is executed
block by block and held to this simulation (exporters/iphone/coreai/package.py `simulated_error`).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from coreml_recipe import MB, add_recipe_options, measured  # beside it
from model_options import add_model_options, cases, model_from  # beside it

from edge.exporters.iphone.coreai.recipe import CANDIDATES, simulated_forms
from edge.exporters.iphone.coreml.package import cut_for_device
from edge.exporters.iphone.coreml.recipe import check_recipe, choose, recipes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_options(parser)
    parser.add_argument("--max-weights-x", type=float, nargs="*", default=[7.0],
                        help="targets: the stored weights this many times smaller than fp32")
    add_recipe_options(parser)
    args = parser.parse_args()
    model = model_from(args)
    trials = measured(args, model, list(CANDIDATES), simulated_forms, " (simulated)")
    components = cut_for_device(model)
    fp32 = sum(b.weight_bytes() for bs in components.values() for b in bs)

    print(f"\nthe recipes the hulls give (stored MB, x smaller than the {fp32 / MB:.1f} MB of "
          "fp32 parameters, predicted worst PSNR):")
    print("  " + ", ".join(f"{r.weight_bytes / MB:.1f} MB {fp32 / r.weight_bytes:.2f}x "
                           f"{r.psnr_db:.1f} dB" for r in recipes(trials)))
    targets = ([("x", x) for x in args.max_weights_x] + [("dB", p) for p in args.min_psnr])
    for kind, value in targets:
        started = time.perf_counter()
        try:
            recipe = (choose(trials, max_bytes=int(fp32 / value)) if kind == "x"
                      else choose(trials, min_psnr_db=value))
        except ValueError as err:
            print(f"\n{value:g}{kind}: {err}")
            continue
        label = f"weights {value:g}x smaller" if kind == "x" else f"worst video {value:g} dB"
        got = check_recipe(model, components, recipe, cases(args.videos), steps=args.steps,
                           store=simulated_forms)
        print(f"\n{label}: predicted {recipe.weight_bytes / MB:.2f} MB "
              f"({fp32 / recipe.weight_bytes:.2f}x), worst {recipe.psnr_db:.1f} dB")
        print("  " + ", ".join(f"{k} {f}" for k, f in recipe.forms.items()))
        print(f"  rendered whole (simulated weights): PSNR validation {got[0]:.1f}, mean "
              f"{float(np.mean(got)):.1f}, worst {min(got):.1f} of {len(got)} "
              f"({time.perf_counter() - started:.0f} s)")
        print("  PSNR per video: " + ", ".join(f"{v:.1f}" for v in got), flush=True)


if __name__ == "__main__":
    main()
