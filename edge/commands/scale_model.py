"""`edge scale-model`: random-weight models of real shapes for benchmarks."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from edge.commands import common
from edge.core.console import echo, fail


def scale_model(
    out: Annotated[Path, typer.Argument(help="Model folder to write.")],
    like: Annotated[str | None, typer.Option(
        help="Write a diffusers folder with a real model's shapes instead: wan2.1-t2v-1.3b "
        "(transformer 1.42 B parameters, 5.3 GiB fp32; Wan's VAE; a small UMT5), "
        "wan2.2-ti2v-5b (transformer 5.00 B, 18.6 GiB fp32; Wan 2.2's 705 M VAE; a small "
        "UMT5), wan2.1-small (Wan's architecture at a size a browser page holds), "
        "cogvideox-2b (transformer 1.69 B; CogVideoX's VAE; a small T5), ltx-video-2b "
        "(LTX-Video 0.9.0: transformer 1.92 B; its VAE; a small T5) or opensora-1.2 (the "
        "released STDiT-v3 and VAE-v1.2 checkpoints' shapes in their layout; a small T5).")
    ] = None,
    full_text_encoder: Annotated[bool, typer.Option(
        help="With a Wan --like: UMT5-XXL's shapes (5.7 B parameters, 21.1 GiB fp32).")] = False,
    hidden: Annotated[int, typer.Option(min=8, help="Transformer width.")] = 1024,
    pairs: Annotated[int, typer.Option(min=1, help="Spatial/temporal block pairs.")] = 8,
    heads: Annotated[int, typer.Option(min=1)] = 16,
    seed: Annotated[int, typer.Option(min=0, max=2**64 - 1, help="The random weights' seed "
                                      "(PyTorch takes up to 2^64 - 1).")] = 0,
    force: Annotated[bool, typer.Option(
        "--force", help="Replace a folder scale-model wrote before (never another).")] = False,
) -> None:
    """Write a model with random weights for speed and memory benchmarks (`edge export
    --model OUT`): tiny-sora's architecture at a larger size (the defaults give a ~1 GB
    transformer), or with --like a diffusers folder of a real model's shapes, written one
    block at a time."""
    from edge.core.budget import format_size
    from edge.core.package import PackageWriteError
    from edge.families.scaled import identify_scaled_model

    if full_text_encoder and like is None:
        fail("--full-text-encoder applies with --like")
    common.check_destination(out, force, identify_scaled_model, option="OUT")
    if like is not None:
        from tqdm import tqdm

        from edge.families.cogvideox import scale as cogvideox_scale
        from edge.families.ltx import scale as ltx_scale
        from edge.families.opensora import scale as opensora_scale
        from edge.families.wan import scale as wan_scale

        # each family's presets and writer (edge/families/<family>/scale.py)
        writers = [wan_scale, cogvideox_scale, ltx_scale, opensora_scale]
        known = [name for writer in writers for name in writer.LIKE]
        if like not in known:
            fail(f"--like {like!r}: known: {', '.join(known)}")
        if full_text_encoder and like not in wan_scale.LIKE:
            # only Wan's UMT5-XXL shapes are offered; the small T5 already has T5-XXL's width
            fail(f"--full-text-encoder: applies to the Wan presets only, not {like}")
        writer = next(w for w in writers if like in w.LIKE)
        own = {"full_text_encoder": full_text_encoder} if writer is wan_scale else {}
        try:
            with tqdm(desc="writing", unit="part") as bar:
                def on_part(name: str) -> None:
                    bar.set_postfix_str(name)
                    bar.update()

                written = writer.write_like(out, like, seed, on_part, force, **own)
        except (ValueError, PackageWriteError) as err:
            fail(str(err))
        params = written["transformer_params"]
        echo(f"wrote {out}: {like} shapes, transformer of {params / 1e9:.3f} B "
             f"parameters ({format_size(params * 4)} fp32), text encoder of "
             f"{written['text_encoder_params'] / 1e6:.0f} M, random weights (seed {seed})")
        return
    from edge.families.tiny_sora.scale import write_scaled_model

    try:
        config = write_scaled_model(out, hidden, pairs, heads, seed, force=force)
    except (ValueError, PackageWriteError) as err:
        fail(str(err))
    params = config["random_weights"]["transformer_params"]
    echo(f"wrote {out}: transformer of {params / 1e6:.0f} M parameters "
         f"({format_size(params * 4)} fp32), random weights (seed {seed})")
