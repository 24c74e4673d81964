"""`edge export --target iphone`: the command's body (edge/cli.py parses the options).

Exports the model to CoreML with a progress bar, validates it (structure, then the stored
weights in PyTorch against fp32) and prints what the compression cost: package size, weight
bytes against fp32, the worst block error and the end-to-end PSNR.
"""

from __future__ import annotations

import time
from pathlib import Path

from edge.console import echo, fail
from exporters.coreml import MACOS_ONLY_NOTE, WEIGHT_THRESHOLD, compression


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
    target = manifest["coreml"]["minimum_deployment_target"]
    return (f"wrote {dest} in {seconds:.0f} s: {len(blocks)} blocks (+{variants} TDTM "
            f"variants) as .mlpackage, {package_bytes(dest) / 1e6:.1f} MB on disk\n"
            f"weights ({setting}, runs on {target} and later): {stored / 1e6:.1f} MB in the "
            f"base blocks' programs vs "
            f"{reference / 1e6:.1f} MB fp32 ({reference / stored:.1f}x smaller)\n"
            f"stored weights in PyTorch vs fp32: worst block max-abs error {worst[0]:.3g} "
            f"({worst[1]}), end to end PSNR {manifest['validation']['psnr_db']} dB on "
            f"{manifest['validation']['prompt']!r}\n"
            f"note: {MACOS_ONLY_NOTE}. Not measured here: fp16 activations on the device "
            "(CoreML cannot predict on Linux).")


def estimated_bytes(block, quantize: str) -> int:
    """Stored weight bytes of a block at a setting, before exporting: tensors of at least
    WEIGHT_THRESHOLD elements at the bits the setting gives this block (lookup tables and
    scales left out), the rest fp16."""
    per_weight = compression(quantize).storage(block.key).bits
    bits = sum(p.numel() * (per_weight if p.numel() >= WEIGHT_THRESHOLD else 16)
               for p in block.parameters().values())
    return bits // 8


def dry_run(model: Path | None, quantize: str) -> None:
    """The device cut: blocks, their static input shapes, fp32 bytes and an estimate of the
    stored bytes at `quantize`; writes nothing."""
    from edge.models.tiny_sora import DEFAULT_WEIGHTS, TinySora
    from exporters.coreml import cut_for_device

    _check(quantize)
    components = cut_for_device(TinySora.load(model or DEFAULT_WEIGHTS))
    echo(f"{'block':<28}{'fp32 MB':>9}{f'~{quantize} MB':>10}  inputs")
    total = estimate = 0
    for blocks in components.values():
        for block in blocks:
            est = estimated_bytes(block, quantize)
            total, estimate = total + block.weight_bytes(), estimate + est
            shapes = ", ".join(f"{n} {list(t.shape)}" for n, t in zip(block.inputs,
                                                                   block.example, strict=True))
            extra = f" (+{', '.join(block.variants)} variant)" if block.variants else ""
            echo(f"{block.key:<28}{block.weight_bytes() / 1e6:>9.2f}{est / 1e6:>10.2f}  "
                 f"{shapes}{extra}")
    echo(f"total {total / 1e6:.1f} MB fp32, about {estimate / 1e6:.1f} MB at {quantize} "
         f"(estimate; TDTM variants add a copy of their pair's weights). {MACOS_ONLY_NOTE}.")


def _check(quantize: str) -> None:
    try:
        compression(quantize)
    except ValueError as err:
        fail(str(err))


def export_iphone(model: Path | None, output: Path | None, quantize: str) -> None:
    """Export, validate and report; exits with status 2 and a message on failure."""
    from tqdm import tqdm

    from edge.models.tiny_sora import DEFAULT_WEIGHTS, TinySora
    from edge.package import PackageWriteError
    from exporters.coreml import ExportValidationError, cut_for_device, export_coreml
    from exporters.coreml_check import end_to_end_check

    _check(quantize)
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
        fail(f"validation failed, nothing written to {dest}: {err}")
    except PackageWriteError as err:  # a full disk, an unwritable destination
        fail(str(err))
    echo(summary(manifest, dest, time.perf_counter() - started))


