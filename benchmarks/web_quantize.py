"""What each `--quantize` setting of `edge export --target web` costs, on more than the
exporter's one validation prompt, for tiny-sora or a diffusers folder.

    python benchmarks/web_quantize.py                          # tiny-sora, every setting
    python benchmarks/web_quantize.py --settings 8 4
    python benchmarks/web_quantize.py --settings --rules "*=4" "text_encoder/*=4,*=8"
    python benchmarks/web_quantize.py --model /tmp/wan-tiny --height 64 --width 96 --frames 17

For each setting (and each `--rules` trial: "block pattern=web form" pairs, the first
matching pattern winning, as a family's own rule words them; forms fp16, 8, 4): the web's
blocks' weights stored and decoded as the page decodes them (exporters/web/storage.py), put
in the model in place of its own, and `--videos` of PROMPTS x SEEDS rendered by the family's
PyTorch pipeline and compared with float32 (PSNR over the uint8 frames; SNR against the
video's own spread). No export is needed: the export checks apart that each block's compiled
forms compute what PyTorch computes with the decoded weights (within 1e-4 of the outputs).
One row per setting: the weights the package stores, how much smaller than float32, each
component's bytes, PSNR (mean, worst) and the worst SNR.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from model_options import PROMPTS, SEEDS, add_model_options, model_from  # beside it

from edge.core.video_metrics import psnr, snr
from edge.exporters.shared.weights_in_place import weights_replaced
from edge.exporters.web.check import decode_in_place
from edge.exporters.web.storage import FORMS, WebStorage, block_stored_bytes, web_storage
from edge.graph.family_model import FamilyModel, StorageRule

# a web form -> the iphone stored form a StorageRule names for it (WEB_FORM_OF, inverted)
RULE_NAME = {"fp16": "fp16", "8": "int8", "4": "int4-b32"}


def trial(spec: str) -> WebStorage:
    """A `--rules` trial: "pattern=form,pattern=form" -> a setting with no floor."""
    rules = []
    for part in spec.split(","):
        pattern, _, form = part.partition("=")
        if form not in RULE_NAME:
            raise SystemExit(f"--rules {spec!r}: form {form!r} is none of "
                             f"{', '.join(RULE_NAME)}")
        rules.append((pattern.strip(), RULE_NAME[form]))
    return WebStorage("4", StorageRule(tuple(rules), psnr_floor_db=0.0, note=spec))


def measure(model: FamilyModel, name: str, storage: WebStorage, videos: int) -> dict:
    started = time.perf_counter()
    components = model.cut(model.shapes("web"))
    by_component = {c: sum(block_stored_bytes(b, storage) for b in blocks)
                    for c, blocks in components.items()}
    fp32 = sum(b.weight_bytes() for blocks in components.values() for b in blocks)
    cases = [(p, s) for s in SEEDS for p in PROMPTS][:videos]
    want = [model.generate(p, seed=s) for p, s in cases]
    with weights_replaced(components, lambda c: decode_in_place(c, storage)):
        got = [model.generate(p, seed=s) for p, s in cases]
    psnrs = [psnr(a, b) for a, b in zip(got, want, strict=True)]
    snrs = [snr(a, b) for a, b in zip(got, want, strict=True)]
    stored = sum(by_component.values())
    return {"setting": name, "stored_bytes": stored, "fp32_bytes": fp32,
            "smaller_than_fp32": fp32 / stored, "component_bytes": by_component,
            "psnr_mean_db": float(np.mean(psnrs)), "psnr_min_db": float(min(psnrs)),
            "snr_min_db": float(min(snrs)), "psnr_db": [round(float(v), 2) for v in psnrs],
            "seconds": round(time.perf_counter() - started, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_options(parser)
    parser.add_argument("--settings", nargs="*", default=None, choices=list(FORMS),
                        help="named settings (default: all, or none with --rules)")
    parser.add_argument("--rules", nargs="+", default=[], metavar="SPEC",
                        help='trial rules, e.g. "text_encoder/*=8,*=4"')
    parser.add_argument("--videos", type=int, default=len(PROMPTS) * len(SEEDS),
                        help="prompt x seed videos rendered per setting (default: all 8)")
    parser.add_argument("--json", action="store_true", help="print one JSON object per row")
    args = parser.parse_args()
    model = model_from(args)
    settings = args.settings if args.settings is not None else \
        ([] if args.rules else [f for f in FORMS if f != "fp32"])
    trials = [(s, web_storage(s, model)) for s in settings]
    trials += [(spec, trial(spec)) for spec in args.rules]
    print(f"{model.name}: {args.videos} videos a setting against float32")
    print(f"{'setting':<28}{'stored MB':>10}{'x fp32':>8}{'PSNR mean':>10}{'worst':>7}"
          f"{'SNR worst':>10}  by component (MB)")
    for name, storage in trials:
        row = measure(model, name, storage, args.videos)
        if args.json:
            print(json.dumps(row), flush=True)
            continue
        parts = ", ".join(f"{c} {b / 1e6:.1f}" for c, b in row["component_bytes"].items())
        print(f"{name:<28}{row['stored_bytes'] / 1e6:>10.1f}{row['smaller_than_fp32']:>7.2f}x"
              f"{row['psnr_mean_db']:>10.1f}{row['psnr_min_db']:>7.1f}{row['snr_min_db']:>10.1f}"
              f"  {parts}", flush=True)


if __name__ == "__main__":
    main()
