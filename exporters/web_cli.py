"""`edge export --target web`: the command's body (edge/cli.py parses the options)."""

from __future__ import annotations

import time
from pathlib import Path

from edge.console import echo, fail


def check_ort_options(ort_url: str | None, bundle_ort: Path | None) -> None:
    """Refuse a bad --ort-url / --bundle-ort before any work, naming the value or file."""
    from exporters.ort_web import OrtLocationError, check_bundle, check_ort_url

    try:
        if ort_url is not None and bundle_ort is not None:
            raise OrtLocationError("--ort-url and --bundle-ort: give one (a bundled copy needs "
                                   "no URL)")
        if ort_url is not None:
            check_ort_url(ort_url)
        if bundle_ort is not None:
            check_bundle(bundle_ort)
    except OrtLocationError as err:
        fail(str(err))


def export_web_command(model: Path | None, output: Path | None, ort_url: str | None = None,
                       bundle_ort: Path | None = None) -> None:
    from tqdm import tqdm

    from edge.models.tiny_sora import DEFAULT_WEIGHTS, TinySora
    from edge.package import PackageWriteError
    from exporters.onnx import ExportValidationError
    from exporters.tvm_plan import PlanError
    from exporters.web import block_count, export_web

    pipe = TinySora.load(model or DEFAULT_WEIGHTS)
    name = model.resolve().name if model else "tiny-sora"
    dest = output or Path("dist") / f"{name}-web"
    started = time.perf_counter()
    try:
        with tqdm(total=block_count(pipe), desc="exporting (TVM -> WebGPU)", unit="block") as bar:
            manifest = export_web(pipe, dest, model_name=name, ort_url=ort_url,
                                  bundle_ort=bundle_ort,
                                  on_block=lambda key: (bar.set_postfix_str(key), bar.update()))
    except (ExportValidationError, PlanError) as err:
        fail(f"validation failed, nothing written to {dest}: {err}")
    except PackageWriteError as err:  # a full disk, an unwritable destination
        fail(str(err))
    blocks = [(f"{c['name']}/{b['name']}", b) for c in manifest["components"]
              for b in c["blocks"]]
    worst = max((b["validation"]["max_abs_error"], key) for key, b in blocks)
    size = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
    echo(f"wrote {dest} in {time.perf_counter() - started:.0f} s: {len(blocks)} blocks, "
         f"{size / 1e6:.1f} MB, worst block error {worst[0]:.2g} ({worst[1]}; launch "
         f"plans replayed with TVM's llvm build, wasm graphs with onnxruntime)\n"
         f"onnxruntime-web for the wasm path: {ort_source(manifest['web']['ort'])}\n"
         f"serve it with: edge serve {dest}")


def ort_source(ort: dict) -> str:
    if ort["bundled"]:
        return f"{ort['version']}, bundled in {ort['base']} (works offline)"
    return f"{ort['version']} from {ort['base']} (checked by sha256 in the page)"
