"""`edge scale-model --like cogvideox-2b | ltx-video-2b`: the real models' transformer sizes
on the meta device, and the same code path written small through the CLI, which edge's
CogVideoX and LTX families load."""

from __future__ import annotations

import json
from dataclasses import replace

import diffusers
import pytest
import torch
from cogvideox_folder import SAMPLE
from ltx_folder import PLAIN_DECODER, VAE_COMMON
from safetensors.torch import load_file
from typer.testing import CliRunner

from edge.commands import app
from edge.families import load_model, scaled
from edge.families.cogvideox import family as cogvideox
from edge.families.cogvideox import scale as cogvideox_scale
from edge.families.ltx import family as ltx
from edge.families.ltx import scale as ltx_scale

SIZE = {"height": 32, "width": 64, "frames": 17}
SCALES = {"cogvideox-2b": cogvideox_scale, "ltx-video-2b": ltx_scale}
TEXT = scaled.T5_SMALL | {"d_model": 32, "d_kv": 8, "num_heads": 2, "d_ff": 32}
# each family's preset at a size the test machine writes and loads in seconds; only the
# widths and counts differ from the real presets
SMALL = {
    "cogvideox-2b": {"transformer": {"num_attention_heads": 2, "attention_head_dim": 16,
                                     "in_channels": 8, "out_channels": 8, "time_embed_dim": 16,
                                     "text_embed_dim": 32, "num_layers": 2,
                                     "max_text_seq_length": 16, **SAMPLE},
                     "vae": {"block_out_channels": [8, 8, 16, 16], "latent_channels": 8,
                             "layers_per_block": 1, "norm_num_groups": 4}},
    "ltx-video-2b": {"transformer": {"in_channels": 8, "out_channels": 8,
                                     "num_attention_heads": 2, "attention_head_dim": 16,
                                     "cross_attention_dim": 32, "num_layers": 2,
                                     "caption_channels": 32},
                     "vae": VAE_COMMON | PLAIN_DECODER},
}


@pytest.mark.parametrize("like, billions", [("cogvideox-2b", 1.69), ("ltx-video-2b", 1.92)])
def test_real_size_transformers(like, billions):
    shape = SCALES[like].LIKE[like]
    with torch.device("meta"):
        transformer = getattr(diffusers, shape.transformer_class)(**shape.transformer)
    assert round(sum(p.numel() for p in transformer.parameters()) / 1e9, 2) == billions
    assert shape.text_encoder["d_model"] == 4096


@pytest.mark.parametrize("like, family", [("cogvideox-2b", cogvideox), ("ltx-video-2b", ltx)])
def test_real_size_configs_are_what_the_families_take(tmp_path, monkeypatch, like, family):
    """The real-size folder's JSON files, written on the meta device with the weights left
    out, pass the family's checks at the model's own video size (its defaults)."""
    # no weights written: the transformer's shards, and the text encoder's (both through
    # edge/families/scaled.py's write_shards)
    monkeypatch.setattr(scaled, "write_shards", lambda *args: 0)
    monkeypatch.setattr(diffusers.ModelMixin, "save_pretrained",
                        lambda self, folder, **kw: self.save_config(folder))
    with torch.device("meta"):
        SCALES[like].write_like(tmp_path / like, like)
    size = family.accepts(tmp_path / like)[0]
    assert size["frames"] == {"cogvideox-2b": 49, "ltx-video-2b": 161}[like]


@pytest.mark.parametrize("like", list(SMALL))
def test_scale_model_writes_a_folder_the_family_loads(tmp_path, monkeypatch, like):
    shape = SCALES[like].LIKE[like]
    small = replace(shape, transformer=shape.transformer | SMALL[like]["transformer"],
                    vae=SMALL[like]["vae"], text_encoder=TEXT)
    monkeypatch.setitem(SCALES[like].LIKE, like, small)
    out = tmp_path / like
    res = CliRunner().invoke(app, ["scale-model", "--like", like, "--seed", "3", str(out)])
    assert res.exit_code == 0, res.output
    index = json.loads((out / "model_index.json").read_text())
    assert index["_class_name"] == shape.pipeline
    assert index["_edge_random_weights"] == {"like": like, "seed": 3}
    # one shard per block plus the rest, for the transformer and the text encoder
    assert len(list((out / "transformer").glob("*.safetensors"))) == 3
    assert len(list((out / "text_encoder").glob("*.safetensors"))) == 3

    model = load_model(out, **SIZE)
    assert type(model.pipe).__name__ == shape.pipeline
    assert len(model.pipe.transformer.transformer_blocks) == 2
    # every stored tensor is the loaded model's (the shards' names are the model's own), and
    # only the first T5 layer holds the relative attention bias
    for component in ("transformer", "text_encoder"):
        state, stored = getattr(model.pipe, component).state_dict(), set()
        for shard in (out / component).glob("*.safetensors"):
            for name, tensor in load_file(shard).items():
                torch.testing.assert_close(state[name], tensor, atol=0, rtol=0)
                stored.add(name)
        assert set(state) - stored <= {"encoder.embed_tokens.weight"}  # tied to `shared`
    blocks = model.pipe.text_encoder.encoder.block
    assert [b.layer[0].SelfAttention.has_relative_attention_bias for b in blocks] == [True, False]

    # a folder scale-model wrote is replaced with --force; --full-text-encoder is Wan's only
    res = CliRunner().invoke(app, ["scale-model", "--like", like, "--force", str(out)])
    assert res.exit_code == 0, res.output
    other = tmp_path / "full"
    res = CliRunner().invoke(app, ["scale-model", "--like", like, "--full-text-encoder",
                                   str(other)])
    assert res.exit_code == 2 and "Wan presets only" in res.output and not other.exists()
