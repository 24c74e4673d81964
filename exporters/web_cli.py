"""`edge export --target web`: the command's body (edge/cli.py parses the options)."""

from __future__ import annotations

import time
from pathlib import Path

import typer


def export_web_command(model: Path | None, output: Path | None) -> None:
    from tqdm import tqdm

    from edge.models.tiny_sora import DEFAULT_WEIGHTS, TinySora
    from exporters.onnx import ExportValidationError
    from exporters.tvm_plan import PlanError
    from exporters.web import block_count, export_web

    pipe = TinySora.load(model or DEFAULT_WEIGHTS)
    name = model.resolve().name if model else "tiny-sora"
    dest = output or Path("dist") / f"{name}-web"
    started = time.perf_counter()
    try:
        with tqdm(total=block_count(pipe), desc="exporting (TVM -> WebGPU)", unit="block") as bar:
            manifest = export_web(pipe, dest, model_name=name,
                                  on_block=lambda key: (bar.set_postfix_str(key), bar.update()))
    except (ExportValidationError, PlanError) as err:
        typer.secho(f"error: validation failed, nothing written to {dest}: {err}",
                    fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    blocks = [(f"{c['name']}/{b['name']}", b) for c in manifest["components"]
              for b in c["blocks"]]
    worst = max((b["validation"]["max_abs_error"], key) for key, b in blocks)
    size = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
    typer.echo(f"wrote {dest} in {time.perf_counter() - started:.0f} s: {len(blocks)} blocks, "
               f"{size / 1e6:.1f} MB, worst block error {worst[0]:.2g} ({worst[1]}; launch "
               f"plans replayed with TVM's llvm build)\nserve it with: edge serve {dest}")
