"""`edge export --target web`: a package that is a static site running the model in a browser.

Every block is compiled for two paths, and the page runs whichever is faster where it
opens (runtimes/web/paths.js); a wasm-only package (`paths=("wasm",)`, `--web-paths wasm`)
has the second alone, exported without TVM (no module here imports it then):
- **webgpu**: TVM (exporters/web/tvm_plan.py) makes WebGPU kernels and a static launch plan,
  stored as one JSON file per block (`plans/<component>/<block>.json`: the plan and the WGSL
  of its kernels);
- **wasm**: an ONNX graph of the same block with its weights as graph inputs
  (`graphs/<component>/<block>.onnx`, the ONNX target's form at the web's static shapes),
  run by onnxruntime-web's wasm provider, which the page fetches from the manifest's
  `web.ort` location and checks by digest first (exporters/web/ort_web.py).
Both read the same weights: one flash-laid-out file per block (the ONNX target's layout),
each at most `SHARD_BYTES`, listed with size and sha256 in the manifest like every file. The
JavaScript runtime (runtimes/web) and the demo page (web_demo) are copied in, so serving the
folder (`edge serve`) gives a working page.

Shapes are static on the web (WGSL kernels are compiled for one shape): the text encoder runs
one caption, the transformer the guidance batch of 2 (caption, unconditional caption) and,
in its `unguided` variants, the caption's half alone (calls without guidance), the VAE
decoder the family's piece per call (`FamilyModel.shapes("web")`: tiny-sora 4 frames; Wan one
latent frame, the component chunked with its caches carried, as the manifest records). A
decoder whose family tiles it (Wan 2.1) decodes latents larger than one tile in tiles, a
program per tile size the video needs (`tile_RxC` variants), blended by the page. Each
block's plan is replayed with TVM's llvm build of the same kernels, and its ONNX graph run by
onnxruntime, against the PyTorch block at export; drift over `BLOCK_TOLERANCE` (of the
outputs' largest magnitude where that exceeds 1) fails the export. A block's `graph` is its
plan, or in a wasm-only package its wasm graph (with that graph's check as `validation`),
so the record says the same to every reader; `wasm` is there in both.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from edge.core.manifest_schema import TILE_VARIANT, UNGUIDED, WEB_PATHS
from edge.core.package import file_entry
from edge.exporters import ExportValidationError
from edge.exporters.shared.onnx_graph import export_graph, validate_block
from edge.exporters.shared.package_writer import PackageParts, write_package
from edge.exporters.shared.validation import check_validation, output_error
from edge.exporters.web.check import end_to_end_check, streamed_check
from edge.exporters.web.inputs import web_example
from edge.exporters.web.ort_web import ort_location
from edge.exporters.web.storage import (
    DEFAULT_FORM,
    StoredTensor,
    WebStorage,
    graph_weights,
    run_decoded,
    stored_arrays,
    stored_weights,
    web_storage,
    write_stored,
)
from edge.graph.blocks import Block, chained, with_unguided
from edge.graph.family_model import FamilyModel, applied_tiles
from edge.graph.lazy_weights import materialized
from edge.planning.compute_cost import block_flops

if TYPE_CHECKING:  # TVM is imported only where the WebGPU path is exported
    from edge.exporters.web.tvm_plan import BlockCompiler, CompiledBlock

BLOCK_TOLERANCE = 1e-4  # fp32 error of a replayed plan or wasm graph, over max(1, its outputs)
SHARD_BYTES = 32 * 1024 * 1024  # largest weights file a browser fetches in one piece
# the checkout (or the installed edge package, where runtimes/ and web_demo/ are edge.runtimes
# and edge.web_demo): exporters/web/package.py -> exporters/web -> exporters -> the root
REPO = Path(__file__).resolve().parents[2]
RUNTIME_DIR = REPO / "runtimes" / "web"
DEMO_DIR = REPO / "web_demo"
SITE_SUFFIXES = {".js", ".mjs", ".html", ".css"}


def web_blocks(model: FamilyModel) -> dict[str, list[Block]]:
    """The family's blocks at the static shapes it runs on the web."""
    return model.cut(model.shapes("web"))


def signature(names: list[str], tensors: tuple[torch.Tensor, ...]) -> list[dict]:
    return [{"name": n, "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}
            for n, t in zip(names, tensors, strict=True)]


def validate(compiled: CompiledBlock, block: Block, stored: list[StoredTensor],
             want: tuple[torch.Tensor, ...], what: str) -> dict:
    """The plan replayed on the CPU with the decoded weights (the page decodes them as it
    uploads them) against `want`, PyTorch's outputs on the block's example with the same
    weights: `output_error`'s record, refused over BLOCK_TOLERANCE of the outputs'
    magnitude."""
    got = compiled.replay([t.numpy() for t in web_example(block)],
                          [t.decoded for t in stored], block_flops(block))
    validation = output_error(got, want)
    check_validation(validation, f"block {what}: the web launch plan", BLOCK_TOLERANCE)
    return validation


def write_plan(compiled: CompiledBlock, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"plan": compiled.plan.to_json(), "kernels": compiled.wgsl}))


def split_shards(path: Path, limit: int = SHARD_BYTES) -> list[Path]:
    """Cut a weights file over `limit` bytes into `NAME.0.bin`, `NAME.1.bin`, ... of at most
    `limit` bytes each (tensor offsets then index their concatenation)."""
    size = path.stat().st_size
    if size <= limit:
        return [path]
    shards = []
    with open(path, "rb") as f:
        for i in range(-(-size // limit)):
            shard = path.with_name(f"{path.stem}.{i}{path.suffix}")
            shard.write_bytes(f.read(limit))
            shards.append(shard)
    path.unlink()
    return shards


def export_wasm_graph(block: Block, stored: list[StoredTensor],
                      want: tuple[torch.Tensor, ...], root: Path, name: str,
                      what: str) -> dict:
    """The block (or a variant) as the wasm path's ONNX graph: static web shapes,
    weights as graph inputs in their stored forms after the activations, decoded in the
    graph; run by onnxruntime against `want`, PyTorch's outputs with the decoded weights."""
    static = replace(block, example=web_example(block), variants={},
                     dynamic_batch=[False] * len(block.inputs))
    path = root / "graphs" / block.component / f"{name}.onnx"
    # onnxruntime-web's wasm path is not known to run com.microsoft's fused attention:
    # its graphs chunk every attention
    export_graph(static, path, fused_attention=False,
                 weight_inputs=graph_weights(static, stored))
    validation = validate_block(static, path, want, stored_arrays(stored))
    check_validation(validation, f"block {what}: the wasm path's ONNX graph", BLOCK_TOLERANCE)
    return {"graph": file_entry(root, path), "validation": validation}


def export_paths(block: Block, stored: list[StoredTensor], want: tuple[torch.Tensor, ...],
                 compiler: BlockCompiler | None, root: Path, name: str, what: str,
                 check: bool) -> tuple[list[dict], dict]:
    """The block's (or a variant's) graph on each path: their files (the record's `graph`
    first) and the record's fields. `compiler` None: a wasm-only package, whose wasm graph is
    then the `graph` and its check the `validation`."""
    files, plan = [], None
    if compiler is not None:  # the plan first: a block TVM refuses fails before its graph
        compiled = compiler.compile(block)
        validation = (validate(compiled, block, stored, want, what) if check
                      else {"max_abs_error": None})
        path = root / "plans" / block.component / f"{name}.json"
        write_plan(compiled, path)
        files.append(file_entry(root, path))
        plan = {"graph": files[0]["path"], "gpu": compiled.plan.gpu_sizes(),
                "validation": validation}
    exported = export_wasm_graph(block, stored, want, root, name, what)
    files.append(exported["graph"])
    wasm = {"graph": exported["graph"]["path"], "validation": exported["validation"]}
    return files, (plan or wasm) | {"wasm": wasm}


def export_variant(block: Block, name: str, stored: list[StoredTensor],
                   compiler: BlockCompiler | None, root: Path, check: bool) -> dict:
    """A variant's plan and wasm graph; it reads the base block's weights (same names). A
    variant with a signature of its own (a chunked component's "first") records it."""
    variant = block.variant(name)
    what = f"{block.key} variant {name}"
    if list(variant.parameters()) != list(block.parameters()):
        raise ExportValidationError(f"block {what}: its parameters are not the base block's")
    want = run_decoded(variant, stored)
    files, fields = export_paths(variant, stored, want, compiler, root,
                                 f"{block.name}.{name}", what, check)
    record = {"graph": fields.pop("graph"), "files": files} | fields
    if isinstance(block.variants[name], Block):
        record["inputs"] = signature(variant.inputs, web_example(variant))
        record["outputs"] = signature(variant.outputs, variant.reference())
    return record


def export_block(block: Block, compiler: BlockCompiler | None, root: Path,
                 variants: bool = True, check: bool = True,
                 required: frozenset[str] = frozenset(),
                 form: WebStorage | str = DEFAULT_FORM, shard_bytes: int = SHARD_BYTES) -> dict:
    """`compiler` None: the wasm path alone. `variants=False`: only the `required` variants
    (a chunked component's first). `form`: how the weights are stored
    (exporters/web/storage.py); `shard_bytes`: the largest weights file."""
    # a model larger than memory: this block's weights are read now and dropped after
    with materialized(block.module):
        return _export_block(block, compiler, root, variants, check, required, form,
                             shard_bytes)


def _export_block(block: Block, compiler: BlockCompiler | None, root: Path, variants: bool,
                  check: bool, required: frozenset[str], form: WebStorage | str,
                  shard_bytes: int) -> dict:
    weights_path = root / "weights" / block.component / f"{block.name}.bin"
    stored = stored_weights(block, form)
    want = run_decoded(block, stored)
    graphs, fields = export_paths(block, stored, want, compiler, root, block.name, block.key,
                                  check)
    table = write_stored(weights_path, stored)
    shards = [file_entry(root, p) for p in split_shards(weights_path, shard_bytes)]
    files = [*graphs, *shards]
    records = {name: export_variant(block, name, stored, compiler, root, check)
               for name in block.variants if variants or name in required}
    files += [f for r in records.values() for f in r["files"]]
    outputs = block.reference()
    record = {"name": block.name, "files": files, "graph": fields.pop("graph"),
              "weights": {"path": shards[0]["path"], "shards": [f["path"] for f in shards],
                          "tensors": table},
              "weight_bytes": block.weight_bytes(), **fields,
              "inputs": signature(block.inputs, web_example(block)),
              "outputs": signature(block.outputs, outputs),
              # what storing the weights costs: decoded against the trained weights
              "storage_error": output_error(list(want), outputs)}
    if records:
        record["variants"] = records
    return record


def copy_site(root: Path) -> list[dict]:
    """The runtime (under runtime/) and the demo page (at the top) into the package."""
    copied = []
    for src_dir, dest_dir in ((RUNTIME_DIR, root / "runtime"), (DEMO_DIR, root)):
        for src in sorted(src_dir.rglob("*")):
            if src.is_file() and (src.suffix in SITE_SUFFIXES or src.name.endswith("LICENSE")
                                  or src.name == "package.json"):
                dest = dest_dir / src.relative_to(src_dir)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dest)
                copied.append(file_entry(root, dest))
    return copied


def export_web(model: FamilyModel, dest: Path, model_name: str | None = None,
               on_block: Callable[[str], None] | None = None,
               compiler: BlockCompiler | None = None, variants: bool = True,
               check: bool = True, ort_url: str | None = None,
               bundle_ort: Path | None = None,
               components: dict[str, list[Block]] | None = None,
               form: WebStorage | str = DEFAULT_FORM, shard_bytes: int = SHARD_BYTES,
               validate_end_to_end: bool = False,
               on_check_step: Callable[[int, int], None] | None = None,
               unguided: bool = False, paths: tuple[str, ...] = WEB_PATHS) -> dict:
    """Export every block to `dest` atomically; returns the manifest. `variants=False` leaves
    out the blocks' optional variants (the TDTM pairs), so `merge_steps` is refused by the
    page; a chunked component's first variant is kept.
    `check=False` skips the llvm replay of each WebGPU plan against PyTorch (its
    `max_abs_error` is then null): for tests that check the result in a browser anyway; the
    wasm graphs are always checked (onnxruntime runs them in a moment). `ort_url` /
    `bundle_ort`: where the page gets onnxruntime-web (exporters/web/ort_web.py; default: the
    pinned version on the official CDN). `components`: the blocks, if already cut at the
    web's shapes. `form`: how the weights are stored (exporters/web/storage.py: fp32, fp16,
    8, or 4 as the family words it); `shard_bytes`: the largest weights file the page fetches
    in one piece. `validate_end_to_end`: render the model's video with the decoded weights
    against float32 first (exporters/web/check.py), refusing a form under its floor before
    anything is written; the result is the manifest's `validation`; `on_check_step(done,
    total)` counts its generations' steps. `unguided`: the transformer's blocks also at the
    caption's half of the guidance batch (`edge.graph.blocks.with_unguided`: `unguided`, and with
    `variants` `tdtm_unguided`), which the page runs for calls without guidance. `paths`:
    both (`WEB_PATHS`) or `("wasm",)`, the wasm graphs alone: no plan, nothing of TVM
    imported (`compiler` and `check` then unused)."""
    if "wasm" not in paths or not set(paths) <= set(WEB_PATHS):
        raise ValueError(f"paths {paths!r}: both of {WEB_PATHS} or ('wasm',)")
    storage = web_storage(form, model)
    if "webgpu" not in paths:
        compiler = None
    elif compiler is None:
        from edge.exporters.web.tvm_plan import shared_compiler

        compiler = shared_compiler()
    shapes = model.shapes("web")
    components = components or model.cut(shapes)
    # a model out of core is checked once its blocks are written (exporters/web/check.py)
    validation = end_to_end_check(model, components, storage, on_step=on_check_step) \
        if validate_end_to_end and not model.out_of_core else None
    ort_files: list[dict] = []

    def head(root: Path) -> dict:
        ort, files = ort_location(root, ort_url, bundle_ort)
        ort_files.extend(files)
        return {"web": {"guidance_batch": shapes.guidance_batch, "unguided": unguided,
                        "vae_frames": shapes.decoder_frames, "shard_bytes": shard_bytes,
                        "ort": ort, "paths": [p for p in WEB_PATHS if p in paths],
                        "storage": storage.record()}}

    def blocks_of(name: str, blocks: list[Block]):
        halves = unguided and name == "transformer"  # the caption-half programs
        for block in chained(blocks):
            # made from the activations the block will see
            yield with_unguided(block, optional=variants) if halves else block

    def export(name: str, block: Block, root: Path) -> dict:
        # a chunked component cannot run without its first piece's variant
        first = model.chunked[name].first_variant if name in model.chunked else None
        required = frozenset([first] if first is not None else [])
        if unguided and name == "transformer":
            required |= {UNGUIDED}
        # a tiled decoder cannot decode its other tile sizes without their programs
        required |= {v for v in block.variants if TILE_VARIANT.search(v)}
        return export_block(block, compiler, root, variants, check, required, storage,
                            shard_bytes)

    def checked(root: Path, manifest: dict) -> dict | None:
        if validate_end_to_end and model.out_of_core:   # on the package as written
            return streamed_check(root, components, storage, model.sampler.steps,
                                  on_step=on_check_step)
        return validation

    parts = PackageParts(
        "web", export_block=export, blocks=blocks_of, head=head,
        tiles=applied_tiles(model, shapes),
        tail=lambda root, manifest: {"files": copy_site(root) + ort_files}, check=checked)
    return write_package(model, dest, components, parts, model_name, on_block)
