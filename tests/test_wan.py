"""The Wan family against diffusers' own WanPipeline, on tiny random-weight folders built
offline (tests/wan_folder.py): the cut equals the components, the decoder runs frame by frame,
and bad folders are refused before any work. What every family's package does (reproduce its
pipeline, a seed, the techniques, streaming; UniPC and flow-match Euler): the family contract,
tests/test_family_contract.py."""

from __future__ import annotations

import contextlib
import json
import shutil

import numpy as np
import pytest
import torch
from wan_folder import diffusers_frames

from edge.families import FamilyError, family_of, load_model
from edge.graph.blocks import run_chain, run_chunked

SIZE = {"height": 32, "width": 48, "frames": 9}


@torch.no_grad()
def test_cut_equals_the_diffusers_components(wan_models):
    model = wan_models["unipc"]
    cut = model.cut()
    assert [b.name for b in cut["transformer"]] == ["prologue", "block_0", "block_1",
                                                    "epilogue"]
    ids, mask = model._ids(["a red circle moving left", "the dog"])
    want = model.pipe.text_encoder(ids, mask).last_hidden_state * mask[..., None]
    got = run_chain(cut["text_encoder"], {"input_ids": ids, "attention_mask": mask})["hidden"]
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)

    latent = torch.randn(2, *model.latent_shape)
    caption = torch.randn(2, model.text_tokens, 32)
    want = model.pipe.transformer(latent, torch.tensor([999, 500]), caption,
                                  return_dict=False)[0]
    got = run_chain(cut["transformer"], {"latent": latent, "t": torch.tensor([0.999, 0.5]),
                                      "caption": caption})["velocity"]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)

    z = torch.randn(1, *model.latent_shape)
    want = diffusers_frames(model.pipe.vae, z)
    got = run_chunked(cut["vae_decoder"], model.chunked["vae_decoder"], {"z": z})["frames"]
    assert got.shape == (1, 3, SIZE["frames"], SIZE["height"], SIZE["width"])
    assert got.min() < 0 or got.max() > 1  # ONNX's decoder tiles: the runtime clamps after
    got = got.clamp(0, 1)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


@torch.no_grad()
def test_the_cut_runs_no_block_and_chained_feeds_each_the_activations_before_it(wan_models):
    """The transformer's cut makes no block's input by running the ones before (at 480p a
    forward pass of minutes): each takes the prologue's "x" as a stand-in, and
    `edge.graph.blocks.chained`, as the exporters run the blocks, gives each block the output of
    the one before on its own example, computing each block's forward pass once."""
    from edge.graph.blocks import chained

    blocks = wan_models["unipc"].cut()["transformer"]
    stand_in = blocks[1].example[0]
    assert all(b.example[0] is stand_in and b.chained == ("x",) for b in blocks[1:])
    x = blocks[0].run(*blocks[0].example)[0]
    calls = []
    for block in chained(blocks):
        if block.name != "prologue":
            torch.testing.assert_close(block.example[0], x, rtol=0, atol=0)
            assert not torch.equal(block.example[0], stand_in) or block.name == "block_0"
        forward = block.module.forward
        block.module.forward = lambda *a, f=forward, n=block.name: calls.append(n) or f(*a)
        got = block.reference()
        assert block.reference() is got  # computed once: the exporter's and the chain's
        del block.module.forward
        x = got[0]
    assert calls == [b.name for b in blocks]
    assert blocks[1].example[0] is stand_in and blocks[1]._reference is None  # copies ran


@torch.no_grad()
def test_graph_friendly_upsamplers_equal_diffusers(wan_models):
    """The decoder's upsamplers, rewritten with ops CoreML takes (nearest, rank <= 5), give
    exactly what diffusers' WanResample gives, frame by frame with the cache carried."""
    from edge.families.wan.networks import GraphFriendlyResample

    ups = [b.upsamplers[0] for b in wan_models["unipc"].pipe.vae.decoder.up_blocks
           if b.upsamplers is not None]
    assert {u.mode for u in ups} == {"upsample2d", "upsample3d"}
    for theirs in ups:
        ours = GraphFriendlyResample(theirs)
        assert dict(ours.named_parameters()).keys() == dict(theirs.named_parameters()).keys()
        cache_theirs, cache_ours = [None], [None]
        for frame in range(3):
            x = torch.randn(1, theirs.dim, 1, 4, 6, generator=torch.Generator().manual_seed(
                frame))
            want = theirs(x, feat_cache=cache_theirs, feat_idx=[0])
            got = ours(x, feat_cache=cache_ours, feat_idx=[0])
            assert torch.equal(got, want), (theirs.mode, frame)


def test_rope_tables_are_weights_not_graph_constants(wan_packages):
    _, manifest = wan_packages["unipc"]
    prologue = manifest["components"][1]["blocks"][0]
    names = {t["name"] for t in prologue["weights"]["tensors"]}
    assert {"rope_cos", "rope_sin"} <= names


def test_fixed_and_dynamic_leaps_on_wan(wan_packages):
    """A leap with the rest in one step, and the dynamic rule, which never leaps before half
    way; a leap into a re-planned UniPC tail, the step cache and TDTM: the family contract
    (tests/test_family_contract.py)."""
    from edge.runtimes.python import Pipeline

    root, _ = wan_packages["unipc"]
    runtime = Pipeline.load(root)
    try:
        runtime.generate("a cat", steps=12, leap=True, leap_after=6)
        assert runtime.last_run["sampler"]["calls"] == 7
        assert runtime.last_run["sampler"]["leap_at"] == 6
        runtime.generate("a cat", steps=12, leap=True)      # dynamic: never before step 6
        assert runtime.last_run["sampler"]["calls"] >= 7
    finally:
        runtime.close()


def test_latents_of_the_wrong_shape_are_refused(wan_packages):
    from edge.runtimes.python import Pipeline

    runtime = Pipeline.load(wan_packages["euler"][0])
    try:
        with pytest.raises(ValueError, match=r"latents must be .*\(1, 16, 3, 4, 6\)"):
            runtime.generate("a cat", latents=np.zeros((1, 16, 3, 4, 4), np.float32))
    finally:
        runtime.close()


def test_decoder_runs_frame_by_frame_and_keeps_what_fits(wan_packages):
    """The package says how the decoder runs (one latent frame a piece, its caches carried).
    Under a budget that pins only part of the decoder, the loader keeps what else fits for
    the decode (read once) and streams the rest once per frame, and the video is the one
    decoded with every block resident."""
    from edge.runtimes.python import Pipeline

    root, manifest = wan_packages["euler"]
    decoder = next(c for c in manifest["components"] if c["name"] == "vae_decoder")
    spec = decoder["chunked"]
    assert (spec["input"], spec["output"], spec["axis"], spec["size"]) == ("z", "frames", 2, 1)
    assert spec["state"] and all(b["variants"]["first"]["inputs"][0]["shape"][2] == 1
                                 for b in decoder["blocks"])
    latents = np.random.default_rng(3).standard_normal((1, *manifest["latent_shape"]),
                                                       dtype=np.float32)
    frames = manifest["latent_shape"][1]
    keys = [f"vae_decoder/{b['name']}" for b in decoder["blocks"]]
    resident = Pipeline.load(root)
    try:
        want = resident._decode(latents)
    finally:
        resident.close()
    runtime = Pipeline.load(root, memory_budget=236_000)
    try:
        loader = runtime.loader
        pinned = [k for k in keys if k in loader.pinned]
        kept = loader.kept_for_run(keys * frames)
        streamed = [k for k in keys if k not in pinned and k not in kept]
        assert pinned and kept and streamed  # this budget exercises all three
        got = runtime._decode(latents)
        size = {k: loader.blocks[k].nbytes for k in keys}
        assert loader.stats.bytes_read == sum(size[k] for k in pinned + list(kept)) + \
            frames * sum(size[k] for k in streamed)
        assert loader.stats.peak_held_bytes <= 236_000
    finally:
        runtime.close()
    np.testing.assert_array_equal(got, want)


class _BatchRecorder:
    """A block session that records the batch of each call (its first input's rows)."""

    def __init__(self, session, key: str, calls: list) -> None:
        self.session, self.key, self.calls = session, key, calls

    def run(self, names, feeds):
        self.calls.append((self.key, next(iter(feeds.values())).shape[0]))
        return self.session.run(names, feeds)


def test_guidance_halves_and_videos_run_as_calls_of_their_own(wan_packages, monkeypatch):
    """A dynamic-batch package runs each transformer block on the caption half and the null
    half of the guidance batch as two calls (one weight read), and the decoder one video a
    call: a call's activations are those of one piece. The videos are those of whole-batch
    calls."""
    from edge.runtimes.python import Pipeline
    from edge.runtimes.python import pipeline as runtime_module

    root, _ = wan_packages["unipc"]
    prompts = ["a red circle moving left", "the dog"]
    runtime = Pipeline.load(root, memory_budget=236_000)  # blocks streamed every use
    calls: list = []
    try:
        for comp in runtime.components.values():
            comp.sessions = {k: _BatchRecorder(s, k, calls) for k, s in comp.sessions.items()}
            comp.variants = {k: _BatchRecorder(s, k[0], calls) for k, s in comp.variants.items()}
        runtime.generate(prompts, seed=5, steps=2)  # the pinned blocks' first read
        calls.clear()
        reads = runtime.loader.stats.bytes_read
        got = runtime.generate(prompts, seed=5, steps=2)
        read_split = runtime.loader.stats.bytes_read - reads
        transformer = [b for k, b in calls if k.startswith("transformer/")]
        decoder = [b for k, b in calls if k.startswith("vae_decoder/")]
        assert transformer and set(transformer) == {2}  # 2 prompts: halves of 4 latents
        assert decoder and set(decoder) == {1}
        whole = runtime_module.run_in_batch_pieces
        monkeypatch.setattr(runtime_module, "run_in_batch_pieces",
                            lambda session, block, inputs, weights, piece:
                            whole(session, block, inputs, weights, None))
        calls.clear()
        reads = runtime.loader.stats.bytes_read
        want = runtime.generate(prompts, seed=5, steps=2)
        assert {b for k, b in calls if k.startswith("transformer/")} == {4}
        # the pieces read each streamed block's weights once, as the whole batch does
        assert runtime.loader.stats.bytes_read - reads == read_split > 0
    finally:
        runtime.close()
    assert np.abs(got.astype(int) - want.astype(int)).max() <= 1


def test_a_chunked_decoder_lets_go_of_each_pieces_activations(wan_packages, monkeypatch):
    """Decoding a latent frame at a time, a block's outputs of the last piece (its caches,
    handed on; its activations) are gone by the time the blocks after it run in the next
    piece: at 480p they are hundreds of MB a block. Sessions keep no memory pattern."""
    import weakref

    from edge.runtimes.python import Pipeline
    from edge.runtimes.python import pipeline as runtime_module

    root, manifest = wan_packages["unipc"]
    decoder = next(c for c in manifest["components"] if c["name"] == "vae_decoder")
    order = [b["name"] for b in decoder["blocks"]]
    runtime = Pipeline.load(root)
    made: list[tuple[int, int, weakref.ref]] = []  # (piece, block's place, an output)
    alive_after: list[tuple[int, str, list[int]]] = []
    piece_now = [-1]
    whole = runtime_module.run_in_batch_pieces

    def watched(session, block, inputs, weights, piece):
        if block["name"] not in order:
            return whole(session, block, inputs, weights, piece)
        place = order.index(block["name"])
        piece_now[0] += place == 0
        # the places of this block's predecessors whose outputs of the last piece live on
        alive_after.append((piece_now[0], block["name"], [
            p for n, p, ref in made if n == piece_now[0] - 1 and p < place
            and ref() is not None]))
        outputs = whole(session, block, inputs, weights, piece)
        made.extend((piece_now[0], place, weakref.ref(o)) for o in outputs)
        return outputs

    try:
        for session in runtime.components["vae_decoder"].sessions.values():
            assert session.get_session_options().enable_mem_pattern is False
        monkeypatch.setattr(runtime_module, "run_in_batch_pieces", watched)
        latents = np.random.default_rng(0).standard_normal(
            (1, *runtime.latent_shape), dtype=np.float32)
        runtime._decode(latents)
    finally:
        runtime.close()
    later = [(p, name, alive) for p, name, alive in alive_after if p > 0]
    assert later and max(p for p, _, _ in later) >= 1
    assert all(alive == [] for _, _, alive in later), later


@contextlib.contextmanager
def vae_tiles(vae, *tiling: int):
    """Within: diffusers' VAE tiles as `enable_tiling(*tiling)` says (tile height, width,
    stride down, across, in pixels); its own tiling after, the session's models shared."""
    own = (vae.tile_sample_min_height, vae.tile_sample_min_width,
           vae.tile_sample_stride_height, vae.tile_sample_stride_width)
    try:
        vae.enable_tiling(*tiling)
        yield
    finally:
        vae.enable_tiling(*own)


def test_the_decoder_in_tiles_decodes_as_diffusers_tiled_vae(wan_packages, wan_models):
    """The package's decoder graphs take any tile (height and width dynamic) and the
    manifest says how diffusers' VAE tiles (256 pixels, a stride of 192). Given tiles smaller
    than the tiny video (24 pixels, stride 16: 2 x 3 tiles of 3, 3 and 2 latents), the
    runtime decodes each tile's frames and blends them as AutoencoderKLWan's tiled_decode."""
    from edge.core.tiles import Tiling
    from edge.runtimes.python import Pipeline

    root, manifest = wan_packages["unipc"]
    decoder = next(c for c in manifest["components"] if c["name"] == "vae_decoder")
    assert decoder["tiles"] == {"latent_size": [32, 32], "latent_stride": [24, 24], "scale": 8}
    assert all(b["inputs"][0]["shape"][3:] == ["height", "width"] for b in decoder["blocks"])
    latents = np.random.default_rng(4).standard_normal((1, *manifest["latent_shape"]),
                                                       dtype=np.float32)
    vae = wan_models["unipc"].pipe.vae
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    with vae_tiles(vae, 24, 24, 16, 16), torch.no_grad():
        want = vae.decode(torch.from_numpy(latents) * std + mean).sample
    want = ((want + 1) / 2).permute(0, 2, 3, 4, 1).numpy()
    runtime = Pipeline.load(root)
    try:
        runtime.components["vae_decoder"].tiles = Tiling((3, 3), (2, 2), 8)
        got = runtime._decode(latents)
        runtime.components["vae_decoder"].tiles = None
        whole = runtime._decode(latents)
    finally:
        runtime.close()
    assert got.shape == want.shape == whole.shape
    error = np.abs(got - want)
    signal = float(np.var(want))
    assert error.max() < 1e-4, error.max()
    assert 10 * np.log10(signal / float(np.mean(error ** 2))) > 60  # SNR over its spread
    # tiles differ from the whole decode near their seams: the test tells them apart
    assert np.abs(whole - want).max() > 100 * error.max()


def test_lean_decode_gives_the_pinned_blocks_memory_to_the_decoder(wan_packages):
    """lean_decode: the same video; the pinned blocks outside the decoder are let go before
    each decode and read again on the next generation."""
    from edge.runtimes.python import Pipeline

    root, _ = wan_packages["euler"]
    videos, reads = {}, {}
    for lean in (False, True):
        runtime = Pipeline.load(root, memory_budget=236_000, lean_decode=lean)
        try:
            runtime.generate("a cat", steps=2)
            videos[lean] = runtime.generate("a cat", steps=2)
            reads[lean] = runtime.last_run["bytes_read"]
            released = runtime.last_run.get("released_for_decode_bytes")
            pinned = {k for k in runtime.loader.pinned if not k.startswith("vae_decoder/")}
        finally:
            runtime.close()
        assert released == (sum(runtime.loader.blocks[k].nbytes for k in pinned)
                            if lean else None)
    np.testing.assert_array_equal(videos[True], videos[False])
    assert released > 0 and reads[True] == reads[False] + released


@pytest.mark.parametrize("edit,message", [
    (lambda c: c["blocks"][2]["variants"].pop("first"),
     r"block vae_decoder/up_1: no variant 'first'"),
    (lambda c: c["chunked"]["state"].append("up_9_cache_0"),
     r"'up_9_cache_0' is given by none of the blocks"),
    (lambda c: c["chunked"].update(size=0), r"field 'size' is 0, must be at least 1"),
    (lambda c: c["chunked"].pop("first_variant"),
     r"chunked: state 'head_cache_0' is carried from piece to piece but there is no "
     r"first_variant"),
    (lambda c: c["chunked"]["state"].remove("up_0_cache_0"),
     r"vae_decoder/up_0: input 'up_0_cache_0' is neither"),
    (lambda c: c["blocks"][1]["variants"]["first"]["outputs"][1]["shape"].__setitem__(2, 3),
     r"vae_decoder/up_0 variant first: output 'out:up_0_cache_0' has shape "
     r"\['batch', 8, 3, 'height', 'width'\] in manifest.json but "
     r"\['batch', 8, 2, 'height', 'width'\] in the graph"),
    (lambda c: c["tiles"].update(latent_stride=[40, 24]),
     r"component vae_decoder tiles: tiles latent_stride \(40, 24\) is longer than "
     r"latent_size \(32, 32\)"),
    (lambda c: c["blocks"][0]["inputs"][0]["shape"].__setitem__(3, "depth"),
     r"shape entry 'depth' must be a size, \"batch\", \"height\" or \"width\""),
])
def test_chunked_decoder_records_that_cannot_run_are_refused(wan_packages, tmp_path, edit,
                                                              message):
    from manifest_edits import rewrite

    from edge.core.package import PackageError
    from edge.runtimes.python import Pipeline

    root = tmp_path / "pkg"
    shutil.copytree(wan_packages["euler"][0], root)
    rewrite(root, lambda m: edit(next(c for c in m["components"]
                                      if c["name"] == "vae_decoder")))
    with pytest.raises(PackageError, match=message):
        Pipeline.load(root).close()


# ---------------------------------------------------------------- bad folders

def test_folder_without_model_index_is_refused(tmp_path):
    with pytest.raises(FamilyError, match=f"{tmp_path}: no model_index.json"):
        family_of(tmp_path)


def test_unknown_pipeline_lists_the_supported_ones(tmp_path):
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "FluxPipeline"}))
    with pytest.raises(FamilyError, match="'FluxPipeline' is not a supported.*WanPipeline"):
        family_of(tmp_path)


def test_missing_component_folder_is_named(wan_folders, tmp_path):
    folder = shutil.copytree(wan_folders["euler"], tmp_path / "wan")
    shutil.rmtree(folder / "vae")
    with pytest.raises(FamilyError, match=r"wan/vae: missing"):
        load_model(folder, **SIZE)


def test_unsupported_scheduler_settings_are_named(wan_folders, tmp_path):
    folder = shutil.copytree(wan_folders["unipc"], tmp_path / "wan")
    config = folder / "scheduler" / "scheduler_config.json"
    config.write_text(json.dumps(json.loads(config.read_text()) | {"solver_order": 3}))
    with pytest.raises(FamilyError, match="solver_order=3"):
        load_model(folder, **SIZE)


def test_weights_not_matching_the_config_name_the_tensor(wan_folders, tmp_path):
    folder = shutil.copytree(wan_folders["euler"], tmp_path / "wan")
    config = folder / "transformer" / "config.json"
    config.write_text(json.dumps(json.loads(config.read_text()) | {"ffn_dim": 64}))
    with pytest.raises(FamilyError, match=r"transformer/diffusion_pytorch_model.safetensors: "
                       r"tensor 'blocks.0.ffn.net.0.proj.weight' has shape \[48, 24\], but .*"
                       r"transformer/config.json makes it \[64, 24\]"):
        load_model(folder, **SIZE)


def test_half_precision_checkpoints_are_converted_and_said(wan_folders, tmp_path):
    from diffusers import WanTransformer3DModel

    folder = shutil.copytree(wan_folders["euler"], tmp_path / "wan")
    WanTransformer3DModel.from_pretrained(folder / "transformer").half().save_pretrained(
        folder / "transformer")
    model = load_model(folder, **SIZE)
    assert next(model.pipe.transformer.parameters()).dtype == torch.float32
    assert any("F16" in n and "converted to float32" in n for n in model.notes)


def test_cli_refuses_before_writing(wan_folders, tmp_path):
    from typer.testing import CliRunner

    from edge.commands import app

    dest = tmp_path / "out"
    result = CliRunner().invoke(app, ["export", "--model", str(wan_folders["euler"]),
                                      "--frames", "6", "--height", "32", "--width", "48", "-o",
                                      str(dest)])
    assert result.exit_code == 2 and "--frames 6" in result.output
    assert not dest.exists()


@torch.no_grad()
def test_merged_block_equals_the_block_when_frame_pairs_are_equal(wan_models):
    """With each pair of latent frames equal (tokens and RoPE), merging loses nothing: the
    TDTM variant gives the base block's output."""
    from edge.families.wan.networks import MergedWanBlock, WanBlock

    model = wan_models["unipc"]
    block = model.pipe.transformer.blocks[0]
    frames, per_frame, d = 4, 6, 24
    x = torch.randn(2, frames // 2, 1, per_frame, d).expand(2, frames // 2, 2, per_frame, d)
    rope = torch.randn(1, frames // 2, 1, per_frame, 1, 6).expand(1, frames // 2, 2, per_frame,
                                                                   1, 6)
    args = (x.reshape(2, frames * per_frame, d), torch.randn(2, 6, d), torch.randn(2, 7, d),
            rope.reshape(1, frames * per_frame, 1, 6), rope.reshape(1, frames * per_frame, 1, 6))
    want = WanBlock(block)(*args)
    got = MergedWanBlock(block, frames)(*args)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # with different frames it is a different computation
    other = (torch.randn_like(args[0]), *args[1:])
    assert not torch.allclose(MergedWanBlock(block, frames)(*other), WanBlock(block)(*other),
                              atol=1e-3)


def test_real_size_folders_are_written_block_by_block_and_load(tmp_path):
    """edge scale-model --like writes each transformer block as its own shard with an index
    diffusers loads; checked here on a small config of the same code path."""
    from diffusers import WanTransformer3DModel

    from edge.families.scaled import write_shards
    from edge.families.wan.scale import WAN21_T2V_13B, transformer_parts

    config = WAN21_T2V_13B | {"num_attention_heads": 2, "attention_head_dim": 12,
                              "ffn_dim": 32, "num_layers": 3, "text_dim": 16, "freq_dim": 16}
    (tmp_path / "config.json").write_text(json.dumps(
        {"_class_name": "WanTransformer3DModel", **config}))
    written = []
    params = write_shards(tmp_path, "diffusion_pytorch_model.safetensors",
                          "diffusion_pytorch_model.safetensors.index.json",
                          transformer_parts(config), 4, written.append)
    assert written == ["rest", "blocks.0.", "blocks.1.", "blocks.2."]
    assert len(list(tmp_path.glob("*-of-00004.safetensors"))) == 4
    model = WanTransformer3DModel.from_pretrained(tmp_path)
    assert sum(p.numel() for p in model.parameters()) == params
    reference = WanTransformer3DModel(**config)
    assert {k: v.shape for k, v in model.state_dict().items()} == {
        k: v.shape for k, v in reference.state_dict().items()}


def test_the_page_sized_wan_is_written_and_loads(tmp_path):
    """`edge scale-model --like wan2.1-small` (the web target's benchmark model): Wan's
    architecture with components that agree, which the family loads; UMT5-XXL does not fit
    its transformer's text width and is refused by name before anything is written."""
    from typer.testing import CliRunner

    from edge.commands import app

    runner = CliRunner()
    out = tmp_path / "small"
    res = runner.invoke(app, ["scale-model", "--like", "wan2.1-small", str(out),
                              "--full-text-encoder"])
    assert res.exit_code == 2 and "text of width 512" in res.output and not out.exists()
    res = runner.invoke(app, ["scale-model", "--like", "wan2.1-small", str(out)])
    assert res.exit_code == 0, res.output
    model = load_model(out, height=32, width=32, frames=5, steps=2)
    transformer = model.pipe.transformer
    assert len(transformer.blocks) == 8 and transformer.config.text_dim == 512
    assert model.pipe.text_encoder.config.d_model == 512
    assert sum(p.numel() for p in transformer.parameters()) < 20e6


def test_identical_videos_are_recorded_in_valid_json(wan_packages, wan_models):
    """An end-to-end check whose two videos are identical (PSNR infinite) writes JSON that
    strict parsers accept: psnr_db null and identical true."""
    from edge.exporters.onnx.package import end_to_end_check
    from edge.exporters.shared.validation import VALIDATION_PROMPT
    from edge.runtimes.python import Pipeline

    root, _ = wan_packages["euler"]
    runtime = Pipeline.load(root)
    try:
        video = runtime.generate(VALIDATION_PROMPT, seed=0)
    finally:
        runtime.close()

    class Same:
        sampler = wan_models["euler"].sampler
        out_of_core = False

        def generate(self, prompt, seed=0, on_step=None):
            return video

    result = end_to_end_check(Same())(root)
    assert result["identical"] is True and result["psnr_db"] is None
    json.dumps(result, allow_nan=False)


@pytest.mark.parametrize("component,first,count", [
    ("text_encoder", 1, 2),   # the UMT5 layers, relative bias inside each
    ("transformer", 1, 2),    # two WanTransformerBlocks, and their TDTM variant
    ("vae_decoder", 1, 4),    # the causal decoder's up stages, their caches and first frame
])
def test_recut_wan_blocks_compute_what_the_blocks_compute(wan_models, component, first, count):
    """Export planning for a memory budget merges neighbouring blocks of one kind
    (edge/planning/partition.py); on Wan's cut that must change nothing, variants included."""
    from edge.planning.partition import merge

    model = wan_models["euler"]
    blocks = model.cut()[component]
    run = blocks[first:first + count]
    later = {n for b in blocks[first + count:] for n in b.inputs} | set(blocks[-1].outputs)
    merged = merge(run, later)
    assert merged.name == f"{run[0].name}-{run[-1].name.rsplit('_', 1)[1]}"  # e.g. up_0-3
    recut = [*blocks[:first], merged, *blocks[first + count:]]
    # the transformer's blocks take their "x" as a stand-in (edge.graph.blocks.chained); merged too
    assert merged.chained == (("x",) if component == "transformer" else ())
    assert set(merged.variants) == {"transformer": {"tdtm"}, "text_encoder": set(),
                                    "vae_decoder": {"first"}}[component]
    if component == "vae_decoder":  # chunked: every piece, the caches carried between them
        chunking = model.chunked[component]
        z = torch.randn(1, *model.latent_shape)
        assert chunking.state(recut) == chunking.state(blocks)
        want, got = run_chunked(blocks, chunking, {"z": z}), run_chunked(recut, chunking,
                                                                         {"z": z})
        torch.testing.assert_close(got["frames"], want["frames"], rtol=0, atol=0)
    for variant in [None, *merged.variants]:
        # every block's example inputs: the chain replaces those an earlier block gives
        as_run = [b.variant(variant) if variant in b.variants else b for b in blocks]
        feeds = {n: t for b in as_run for n, t in zip(b.inputs, b.example, strict=True)}
        want, got = run_chain(blocks, feeds, variant), run_chain(recut, feeds, variant)
        for name in blocks[-1].outputs:
            torch.testing.assert_close(got[name], want[name], rtol=0, atol=0)
    assert list(merged.parameters())[0].startswith(f"parts.{run[0].name}.")


def test_a_tiled_decoder_is_traced_and_estimated_at_one_tile(wan_models):
    """Where the latent is larger than a tile, the ONNX cut traces the decoder at one tile
    (what a call runs: its graphs take any tile), so the dry run's estimate is a tile's."""
    from edge.planning.activation_memory import activation_peaks

    model = wan_models["unipc"]
    vae = model.pipe.vae
    whole = model.cut()["vae_decoder"]
    assert whole[0].example[0].shape[-2:] == (4, 6)  # 4 x 6 latents: within one tile
    with vae_tiles(vae, 16, 24, 8, 16):  # tiles of 2 x 3 latents
        tiled = model.cut()["vae_decoder"]
    assert tiled[0].example[0].shape[-2:] == (2, 3)
    assert all(b.dynamic_space for b in tiled)
    whole_peaks, tile_peaks = activation_peaks(whole), activation_peaks(tiled)
    largest = max(whole_peaks, key=whole_peaks.get)
    assert 0.2 < tile_peaks[largest] / whole_peaks[largest] < 0.35  # a quarter of the pixels


def test_vae_tiles_set_the_decoders_tiles_checked_before_anything_loads(wan_folders,
                                                                       wan22_folder):
    """--vae-tiles (enable_tiling's four sizes in pixels) tiles the decoder, the reference
    pipeline's VAE alike; sizes that are not whole latent cells, and Wan 2.2's decoder (RGB in
    patches, not tiled), are refused naming the option and the figure."""
    from conftest import WAN22_SIZE, WAN_SIZE

    from edge.core.tiles import Tiling

    model = load_model(wan_folders["unipc"], vae_tiles=(32, 32, 32, 16), **WAN_SIZE)
    assert model.tiled["vae_decoder"] == Tiling((4, 4), (4, 2), 8)
    vae = model.pipe.vae
    assert vae.use_tiling and (vae.tile_sample_min_width, vae.tile_sample_stride_width) == (32, 16)
    with pytest.raises(FamilyError, match=r"--vae-tiles: the stride width \(12 pixels\) is not "
                       r"a multiple of the VAE's 8 pixels"):
        load_model(wan_folders["unipc"], vae_tiles=(32, 32, 32, 12), **WAN_SIZE)
    with pytest.raises(FamilyError, match=r"--vae-tiles: .*vae/config.json is Wan 2.2's"):
        load_model(wan22_folder, vae_tiles=(32, 32, 16, 16), **WAN22_SIZE)
