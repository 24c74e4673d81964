"""Core AI programs at a model's real parameter shapes: a sample of its blocks converted and
executed through Core AI's runtime (on Linux its reference interpreter) at each `--quantize`
setting, against the fp32 PyTorch block; beside them the dry run's whole-package figure.

    edge scale-model --like wan2.1-t2v-1.3b /tmp/wan13
    python benchmarks/coreai_blocks.py --model /tmp/wan13 --height 64 --width 64 --frames 1 \\
        --blocks text_encoder/layer_0 transformer/block_0 vae_decoder/head \\
        --settings fp16 8 4

Each setting runs in a process of its own (so the peak RSS of its Core AI worker is its own) and
exports the sample blocks exactly as `edge export --target iphone --min-ios 27` does
(exporters/iphone/coreai/package.py: torch.export, coreai-torch, coreai-opt, every program executed
and held to its tolerance). Prints per block: the program's bytes on disk against the dry run's
estimate and the fp32 parameters, the executed relative error (against the fp32 block, and for a
compressed setting against the block with coreai-opt's stored weights simulated: what float16
compute leaves), the conversion-and-execution wall; per setting: the worker's peak RSS and the whole
package the dry run predicts (its transformer beside it). A small video keeps the interpreter's
float16 emulation (about 100x float32) to minutes a block; the weights, what the setting stores, are
the real ones.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from model_options import add_model_options, model_from  # beside it


def measure(args: argparse.Namespace, setting: str) -> dict:
    """In this process: the sample blocks exported at `setting`, and the dry run's totals."""
    from edge.exporters import ExportOptions
    from edge.exporters.iphone.coreai.layout import device_blocks, precision, stored_bytes
    from edge.exporters.iphone.coreai.package import export_blocks

    model = model_from(args)
    chosen = precision(ExportOptions(quantize=setting, min_ios=27), model)
    blocks = {b.key: b for bs in device_blocks(model, chosen, None).components.values()
              for b in bs}
    missing = [k for k in args.blocks if k not in blocks]
    if missing:
        raise SystemExit(f"no block {', '.join(missing)}; blocks: {', '.join(blocks)}")
    predicted = {k: stored_bytes(b, chosen) for k, b in blocks.items()}
    rows = []
    with tempfile.TemporaryDirectory(prefix="coreai-blocks-") as tmp:
        for key in args.blocks:  # one worker a block: its wall is its own
            started = time.perf_counter()
            record = export_blocks([blocks[key]], Path(tmp), chosen)[0]
            rows.append({"block": key, "seconds": time.perf_counter() - started,
                         "bytes": record["weight_bytes"], "predicted_bytes": predicted[key],
                         "fp32_bytes": record["reference_weight_bytes"],
                         "relative_error": record["validation"]["relative_error"],
                         # against coreai-opt's stored weights simulated (compressed only)
                         "simulated_error": record["validation"].get("simulated", {}).get(
                             "relative_error"),
                         "tolerance": record["validation"]["tolerance"],
                         "execute_seconds": record["validation"]["execute_seconds"]})
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return {"setting": setting, "blocks": rows, "worker_peak_rss_bytes": children,
            "predicted_total_bytes": sum(predicted.values()),
            "predicted_transformer_bytes": sum(n for k, n in predicted.items()
                                               if k.startswith("transformer/")),
            "fp32_total_bytes": sum(b.weight_bytes() for b in blocks.values())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_options(parser)
    parser.add_argument("--blocks", nargs="+", default=["transformer/block_0"])
    parser.add_argument("--settings", nargs="+", default=["fp16", "8", "4"])
    parser.add_argument("--json", type=Path, help="write every figure here too")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child measuring one setting
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args, args.one)))
        return
    forwarded = ["--blocks", *args.blocks]
    forwarded += ["--model", str(args.model)] if args.model else []
    for size in ("height", "width", "frames"):
        if getattr(args, size) is not None:
            forwarded += [f"--{size}", str(getattr(args, size))]
    results = []
    for setting in args.settings:
        child = subprocess.run([sys.executable, __file__, *forwarded, "--one", setting],
                               check=True, capture_output=True, text=True)
        results.append(json.loads(child.stdout.strip().splitlines()[-1]))
        report(results[-1])
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


def report(result: dict) -> None:
    mb = 1e6
    total, transformer = result["predicted_total_bytes"], result["predicted_transformer_bytes"]
    print(f"--quantize {result['setting']}: whole package ~{total / mb:.0f} MB (transformer "
          f"{transformer / mb:.0f} MB) of "
          f"{result['fp32_total_bytes'] / mb:.0f} MB fp32 (dry run); worker peak RSS "
          f"{result['worker_peak_rss_bytes'] / 2**30:.2f} GiB")
    print(f"  {'block':<24}{'program MB':>11}{'dry run MB':>11}{'x fp32':>8}"
          f"{'rel. error':>12}{'simulated':>11}{'tolerance':>10}{'wall s':>8}{'exec s':>8}")
    for row in result["blocks"]:
        simulated = ("—" if row["simulated_error"] is None
                     else f"{row['simulated_error']:.2e}")
        print(f"  {row['block']:<24}{row['bytes'] / mb:>11.2f}{row['predicted_bytes'] / mb:>11.2f}"
              f"{row['bytes'] / row['fp32_bytes']:>8.3f}{row['relative_error']:>12.2e}"
              f"{simulated:>11}{row['tolerance']:>10g}{row['seconds']:>8.0f}"
              f"{row['execute_seconds']:>8.0f}")


if __name__ == "__main__":
    main()
