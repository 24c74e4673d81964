"""`edge export --target web`: the family's blocks at the web's static shapes, each as WebGPU
kernels with a launch plan (TVM) and as a wasm graph for onnxruntime-web (exporters/web/package.py),
in a package that is a static site with the demo page; `--web-paths wasm` writes the wasm
graphs alone (no TVM)."""

from __future__ import annotations

from pathlib import Path

from edge.core.budget import MIB, format_size
from edge.exporters import (
    ExportOptionError,
    ExportOptions,
    Prepared,
    Progress,
    check_declared,
    inputs_text,
    need_modules,
)
from edge.exporters.shared.validation import worst_block
from edge.exporters.web import BUILT_PATHS, DEFAULT_WEB_PATHS, NAME
from edge.graph.family_model import FamilyModel

# what one page can hold: the wasm32 heap (4 GiB), where onnxruntime-web's wasm path keeps
# every weight; a Chrome ArrayBuffer stops at about 2 GB (docs/web.md, Limits)
PAGE_MEMORY_BYTES = 4 * 1024**3


def web_paths(options: ExportOptions) -> tuple[str, ...]:
    """The paths `--web-paths` asks for, in the manifest's order (either order is taken);
    any other value is refused, naming it."""
    given = DEFAULT_WEB_PATHS if options.web_paths is None else options.web_paths
    names = {name.strip() for name in given.split(",")}
    for paths in BUILT_PATHS:
        if names == set(paths):
            return paths
    if names == {"webgpu"}:
        raise ExportOptionError(f"--web-paths {given!r}: a package without the wasm path is not "
                                "built (its graphs are the page's fallback without WebGPU, and "
                                "the cheap part of an export); give webgpu,wasm or wasm")
    raise ExportOptionError(f"--web-paths {given!r}: give webgpu,wasm (both paths, the "
                            "default) or wasm (onnxruntime-web's graphs alone)")


def check(options: ExportOptions) -> None:
    """Refuse a bad --ort-url / --bundle-ort / --quantize / --web-paths before any work,
    naming the value or file; without TVM, a package with the WebGPU path."""
    from edge.exporters.web.ort_web import OrtLocationError, check_bundle, check_ort_url
    from edge.exporters.web.storage import check_form

    if options.memory_budget is not None:
        raise ExportOptionError(
            "--memory-budget: a web package takes its budget where the page loads it "
            "(Pipeline.load(url, {budget}), ?budget= on the demo page), not at export")
    check_declared(NAME, options)
    paths = web_paths(options)
    try:
        if options.quantize is not None:
            check_form(options.quantize)
        if options.ort_url is not None and options.bundle_ort is not None:
            raise OrtLocationError("--ort-url and --bundle-ort: give one (a bundled copy needs "
                                   "no URL)")
        if options.ort_url is not None:
            check_ort_url(options.ort_url)
        if options.bundle_ort is not None:
            check_bundle(options.bundle_ort)
    except (OrtLocationError, ValueError) as err:
        raise ExportOptionError(str(err)) from None
    if "webgpu" in paths:  # TVM compiles its kernels (the [web] extra)
        need_modules("--target web --web-paths webgpu,wasm", ("tvm",))


def folder_name(model_name: str, options: ExportOptions) -> str:
    return f"{model_name}-{NAME}"


def prepare(model: FamilyModel, options: ExportOptions) -> Prepared:
    """The blocks at the web's shapes, their stored bytes and input shapes (the --dry-run
    table)."""
    from edge.exporters.web.package import web_blocks
    from edge.exporters.web.storage import block_stored_bytes, web_storage

    form = stored_form(options)
    try:
        storage = web_storage(form, model)
    except ValueError as err:
        raise ExportOptionError(str(err)) from None
    components = web_blocks(model)
    lines = [f"{'block':<28}{'weights MiB':>12}  inputs"]
    held = {}
    for blocks in components.values():
        for block in blocks:
            held[block.key] = block_stored_bytes(block, storage)
            names = list(block.variants)   # their programs read the block's weights
            extra = (f" (+{', '.join(names)} variant{'s' * (len(names) > 1)})" if names
                     else "")
            lines.append(f"{block.key:<28}{held[block.key] / MIB:>12.2f}  {inputs_text(block)}"
                         f"{extra}")
    total = sum(held.values())
    paths = web_paths(options)
    lines.append(f"total {format_size(total)} stored as {form} (--quantize), for the "
                 f"{' and '.join(paths)} path{'s' * (len(paths) > 1)} (--web-paths); the page "
                 "keeps what its memory budget holds and streams the rest from the browser's "
                 "storage")
    notes = []
    if total > PAGE_MEMORY_BYTES:
        notes.append(f"without a memory budget the page holds every block's weights: "
                     f"{format_size(total)} as {form} here, past the "
                     f"{format_size(PAGE_MEMORY_BYTES)} a browser gives one page's WebAssembly "
                     "heap; load it with a budget (Pipeline.load(url, {budget}), ?budget= "
                     "on the demo page) so blocks stream from the browser's storage")
    # the wasm path holds the stored form (the WebGPU path float32, decoded on the GPU)
    return Prepared(components, notes=notes, plan_lines=lines, held_bytes=held)


def export(model: FamilyModel, prepared: Prepared, dest: Path, options: ExportOptions,
           progress: Progress) -> dict:
    from edge.exporters.web.package import export_web

    return export_web(model, dest, components=prepared.components, on_block=progress.on_block,
                      ort_url=options.ort_url, bundle_ort=options.bundle_ort,
                      form=stored_form(options), validate_end_to_end=True,
                      unguided=options.unguided_variants is not False,
                      on_check_step=progress.on_check_step, paths=web_paths(options))


def stored_form(options: ExportOptions) -> str:
    from edge.exporters.web.storage import DEFAULT_FORM

    return options.quantize or DEFAULT_FORM


def _end_to_end(manifest: dict) -> str:
    check = manifest.get("validation")
    if not check:
        return ""
    if check["identical"]:
        return ": the video identical to float32's"
    return (f": video {check['psnr_db']:.1f} dB PSNR, {check['snr_db']:.1f} dB SNR from "
            f"float32's, floor {check['psnr_floor_db']:g} dB")


def _worst(manifest: dict) -> tuple[float, str]:
    """worst_block over both of a block's checks: its `graph`'s (the launch plan's, or in a
    wasm-only package the wasm graph's) and its wasm graph's."""
    views = [{"name": c["name"], "blocks": [b | {"validation": v} for b in c["blocks"]
                                            for v in (b["validation"], b["wasm"]["validation"])]}
             for c in manifest["components"]]
    return worst_block({"components": views})


def _checked(manifest: dict) -> str:
    if "webgpu" in manifest["web"]["paths"]:
        return "launch plans replayed with TVM's llvm build, wasm graphs run by onnxruntime"
    return "wasm graphs run by onnxruntime; no WebGPU path (--web-paths wasm)"


def summary(manifest: dict, dest: Path, seconds: float) -> str:
    blocks = [(f"{c['name']}/{b['name']}", b) for c in manifest["components"]
              for b in c["blocks"]]
    worst = _worst(manifest)
    size = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
    return (f"wrote {dest} in {seconds:.0f} s: {len(blocks)} blocks, {format_size(size)} "
            f"(weights stored as {manifest['web']['storage']['quantize']}{_end_to_end(manifest)}), "
            f"worst block error {worst[0]:.2g} of its largest output ({worst[1]}; "
            f"{_checked(manifest)})\n"
            f"onnxruntime-web for the wasm path: {ort_source(manifest['web']['ort'])}\n"
            f"serve it with: edge serve {dest}")


def ort_source(ort: dict) -> str:
    if ort["bundled"]:
        return f"{ort['version']}, bundled in {ort['base']} (works offline)"
    return f"{ort['version']} from {ort['base']} (checked by sha256 in the page)"
