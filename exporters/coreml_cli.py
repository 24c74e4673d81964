"""`edge export --target iphone`: the command's body (edge/cli.py parses the options).

Exports the model to CoreML with a progress bar, validates it (structure, then the stored
weights in PyTorch against fp32) and prints what the compression cost: package size, weight
bytes against fp32, the worst block error and the end-to-end PSNR.
"""

from __future__ import annotations

import time
from pathlib import Path

import typer

from exporters.coreml import MACOS_ONLY_NOTE, QUANTIZE


def package_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def summary(manifest: dict, dest: Path, seconds: float) -> str:
    blocks = [(f"{c['name']}/{b['name']}", b) for c in manifest["components"]
              for b in c["blocks"]]
    stored = sum(b["weight_bytes"] for _, b in blocks)
    reference = sum(b["reference_weight_bytes"] for _, b in blocks)
    worst = max((b["validation"]["max_abs_error"], key) for key, b in blocks)
    variants = sum(len(b.get("variants", {})) for _, b in blocks)
    setting = manifest["coreml"]["compression"]["setting"]
    return (f"wrote {dest} in {seconds:.0f} s: {len(blocks)} blocks (+{variants} TDTM "
            f"variants) as .mlpackage, {package_bytes(dest) / 1e6:.1f} MB on disk\n"
            f"weights ({setting}): {stored / 1e6:.1f} MB in the base blocks' programs vs "
            f"{reference / 1e6:.1f} MB fp32 ({reference / stored:.1f}x smaller)\n"
            f"stored weights in PyTorch vs fp32: worst block max-abs error {worst[0]:.3g} "
            f"({worst[1]}), end to end PSNR {manifest['validation']['psnr_db']} dB on "
            f"{manifest['validation']['prompt']!r}\n"
            f"note: {MACOS_ONLY_NOTE}. Not measured here: fp16 activations on the device "
            "(CoreML cannot predict on Linux).")


def export_iphone(model: Path | None, output: Path | None, quantize: str) -> None:
    """Export, validate and report; exits with status 2 and a message on failure."""
    from tqdm import tqdm

    from edge.models.tiny_sora import DEFAULT_WEIGHTS, TinySora
    from exporters.coreml import ExportValidationError, cut_for_device, export_coreml
    from exporters.coreml_check import end_to_end_check

    if quantize not in QUANTIZE:
        _fail(f"--quantize {quantize!r} not understood; use one of {', '.join(QUANTIZE)}")
    model_name = model.resolve().name if model else "tiny-sora"
    suffix = "" if quantize == "fp16" else f"-q{quantize}"
    dest = output or Path("dist") / f"{model_name}-iphone{suffix}"
    pipe = TinySora.load(model or DEFAULT_WEIGHTS)
    components = cut_for_device(pipe)
    total = sum(len(b) for b in components.values())
    started = time.perf_counter()
    try:
        with tqdm(total=total, desc=f"exporting to CoreML ({quantize})", unit="block") as bar:
            manifest = export_coreml(
                pipe, dest, quantize=quantize, model_name=model_name, components=components,
                on_block=lambda key: (bar.set_postfix_str(key), bar.update()),
                validate_end_to_end=end_to_end_check(pipe, quantize))
    except ExportValidationError as err:
        _fail(f"validation failed, nothing written to {dest}: {err}")
    typer.echo(summary(manifest, dest, time.perf_counter() - started))


def _fail(message: str) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)
