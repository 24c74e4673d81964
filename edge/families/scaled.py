"""What the random-weight writers of `edge scale-model` share (each family's own is its
folder's scale.py; tiny-sora's, its architecture at a larger size, tiny_sora/scale.py): the
folders it may replace (`identify_scaled_model`), a small tokenizer built in memory, writing a
model one block per safetensors shard with the index files diffusers and transformers read,
and the diffusers writer CogVideoX and LTX-Video share (`FamilyLike`, `write_family_like`).
Random weights cost exactly what trained ones cost to read and compute; they make no video
worth looking at."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from edge.core.package import atomic_directory, check_replaceable, not_edges

# what `edge scale-model` writes: the top-level names of each kind of folder, and the mark
# its config carries (tiny-sora.json's "random_weights", model_index.json's
# "_edge_random_weights": diffusers ignores keys that start with "_")
SCALED_TINY_SORA = {"tiny-sora.json", "transformer.safetensors", "vae"}
SCALED_DIFFUSERS = {"model_index.json", "tokenizer", "scheduler", "vae", "transformer",
                    "text_encoder"}
# an Open-Sora folder has no index of its own: the mark is a file beside its parts
SCALED_OPENSORA = {"edge_random_weights.json", "tokenizer", "vae", "transformer",
                   "text_encoder"}


def identify_scaled_model(dest: Path) -> str:
    """What `edge scale-model` wrote at `dest`; any other folder is refused with the reason
    (PackageWriteError): scale-model replaces only its own random-weight folders."""
    for config, names, mark in (("tiny-sora.json", SCALED_TINY_SORA, "random_weights"),
                                ("model_index.json", SCALED_DIFFUSERS, "_edge_random_weights"),
                                ("edge_random_weights.json", SCALED_OPENSORA,
                                 "random_weights")):
        path = dest / config
        if not path.is_file():
            continue
        try:
            written = json.loads(path.read_text()).get(mark)
        except (ValueError, AttributeError):
            written = None
        if not isinstance(written, dict):
            raise not_edges(dest, f"a model folder that `edge scale-model` did not write (its "
                                  f"{config} has no {mark!r})")
        other = sorted(p.name for p in dest.iterdir() if p.name not in names)
        if other:
            raise not_edges(dest, f"a random-weight model folder, but it also holds "
                                  f"{', '.join(other[:3])}")
        return f"the random-weight model folder (seed {written.get('seed')})"
    raise not_edges(dest, "not a model folder that `edge scale-model` wrote (no tiny-sora.json, "
                          "model_index.json or edge_random_weights.json)")


TOKENIZER_WORDS = ("a red blue green circle square cat dog moving left right up down slowly "
                   "the over under fast bright dark video of and surfing wave sea sky").split()


def small_tokenizer():
    """A Unigram T5 tokenizer over a few words, built in memory (no hub)."""
    from transformers import T5Tokenizer

    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -2.0)]
    vocab += [(f"▁{w}", -5.0 - i * 0.01) for i, w in enumerate(TOKENIZER_WORDS)]
    vocab += [(c, -8.0) for c in "abcdefghijklmnopqrstuvwxyz"]
    return T5Tokenizer(vocab=vocab, extra_ids=0)


def write_shards(folder: Path, weights_name: str, index_name: str,
                 parts: Iterator[tuple[str, nn.Module]], count: int,
                 on_part: Callable[[str], None] | None = None) -> int:
    """Each of the `count` (prefix, module) pairs `parts` yields as its own safetensors shard
    (tensor names prefixed), plus the index that maps every tensor to its shard; returns the
    parameter count. `parts` is consumed lazily: one module exists at a time."""
    stem = weights_name.removesuffix(".safetensors")
    weight_map, total_bytes, params = {}, 0, 0
    for i, (prefix, module) in enumerate(parts):
        shard = f"{stem}-{i + 1:05d}-of-{count:05d}.safetensors"
        tensors, seen = {}, set()
        for k, v in module.state_dict().items():
            if v.data_ptr() in seen:  # a tied copy (UMT5's encoder.embed_tokens is `shared`)
                continue
            seen.add(v.data_ptr())
            tensors[f"{prefix}{k}"] = v.detach().contiguous()
        save_file(tensors, folder / shard, metadata={"format": "pt"})
        for name, t in tensors.items():
            weight_map[name] = shard
            total_bytes += t.numel() * t.element_size()
        params += sum(p.numel() for p in module.parameters())
        del module, tensors
        if on_part:
            on_part(prefix or "rest")
    (folder / index_name).write_text(json.dumps(
        {"metadata": {"total_size": total_bytes}, "weight_map": weight_map}, indent=1) + "\n")
    return params


def write_text_encoder(folder: Path, config, parts: Iterator[tuple[str, nn.Module]],
                       on_part: Callable[[str], None] | None = None) -> int:
    """A transformers encoder's folder: its config, then `parts` (the encoder without layers,
    then each layer) one shard each with transformers' index; returns the parameter count."""
    folder.mkdir()
    config.save_pretrained(folder)
    return write_shards(folder, "model.safetensors", "model.safetensors.index.json", parts,
                        config.num_layers + 1, on_part)


# google/t5-v1_1-xxl encoder shapes at its output width (the transformers' text width) and
# little else, as Wan's UMT5_SMALL
T5_SMALL = {"d_model": 4096, "d_kv": 64, "num_heads": 8, "d_ff": 1024, "num_layers": 2,
            "relative_attention_num_buckets": 32, "relative_attention_max_distance": 128,
            "feed_forward_proj": "gated-gelu"}


@dataclass(frozen=True)
class FamilyLike:
    """What `--like NAME` writes: the pipeline and component classes (diffusers names), their
    configs, and how to build one transformer block from the transformer's full config."""

    pipeline: str
    transformer_class: str
    vae_class: str
    scheduler_class: str
    transformer: dict
    vae: dict
    scheduler: dict
    block: Callable[[dict], nn.Module]
    text_encoder: dict = field(default_factory=T5_SMALL.copy)


def transformer_parts(shape: FamilyLike) -> Iterator[tuple[str, nn.Module]]:
    """The transformer without its blocks, then each block on its own under the name the
    whole model gives it (transformer_blocks.{i}.)."""
    import diffusers

    rest = getattr(diffusers, shape.transformer_class)(**(shape.transformer | {"num_layers": 0}))
    config = dict(rest.config)  # every argument, defaults included, for the blocks
    yield "", rest
    del rest  # one module in memory at a time
    for i in range(shape.transformer["num_layers"]):
        yield f"transformer_blocks.{i}.", shape.block(config)


def t5_encoder_parts(config) -> Iterator[tuple[str, nn.Module]]:
    """The T5 encoder without layers (embedding, final norm), then each layer; only the first
    holds the relative attention bias, which T5 shares across its layers."""
    from transformers import T5EncoderModel
    from transformers.models.t5.modeling_t5 import T5Block

    empty = config.__class__(**(config.to_dict() | {"num_layers": 0}))
    yield "", T5EncoderModel(empty)
    for i in range(config.num_layers):
        yield f"encoder.block.{i}.", T5Block(config, has_relative_attention_bias=(i == 0),
                                             layer_idx=i)


def write_family_like(out: str | Path, like: str, presets: dict[str, FamilyLike],
                      seed: int = 0, on_part: Callable[[str], None] | None = None,
                      force: bool = False) -> dict:
    """Write the folder of preset `like` (one of a family's `presets`) atomically; returns
    what was written (parameter counts). An earlier folder at `out` is replaced only with
    `force`, and only when scale-model wrote it."""
    import diffusers
    from transformers import T5Config

    if like not in presets:
        raise ValueError(f"--like {like!r}: known: {', '.join(presets)}")
    shape = presets[like]
    check_replaceable(Path(out), force, identify_scaled_model)
    torch.manual_seed(seed)
    tok = small_tokenizer()
    text_config = T5Config(**shape.text_encoder, vocab_size=len(tok), pad_token_id=0,
                           eos_token_id=1)
    text_config.architectures = ["T5EncoderModel"]
    index = {"_class_name": shape.pipeline, "_diffusers_version": diffusers.__version__,
             "scheduler": ["diffusers", shape.scheduler_class],
             "text_encoder": ["transformers", "T5EncoderModel"],
             "tokenizer": ["transformers", "T5Tokenizer"],
             "transformer": ["diffusers", shape.transformer_class],
             "vae": ["diffusers", shape.vae_class],
             "_edge_random_weights": {"like": like, "seed": seed}}
    transformer_class = getattr(diffusers, shape.transformer_class)
    with atomic_directory(out, identify_scaled_model) as tmp:
        (tmp / "model_index.json").write_text(json.dumps(index, indent=2) + "\n")
        tok.save_pretrained(tmp / "tokenizer")
        getattr(diffusers, shape.scheduler_class)(**shape.scheduler).save_pretrained(
            tmp / "scheduler")
        getattr(diffusers, shape.vae_class)(**shape.vae).eval().save_pretrained(tmp / "vae")
        folder = tmp / "transformer"
        with torch.device("meta"):  # the full config.json, defaults included, without weights
            transformer_class(**shape.transformer).save_config(folder)
        transformer_params = write_shards(folder, "diffusion_pytorch_model.safetensors",
                                          "diffusion_pytorch_model.safetensors.index.json",
                                          transformer_parts(shape),
                                          shape.transformer["num_layers"] + 1, on_part)
        text_params = write_text_encoder(tmp / "text_encoder", text_config,
                                         t5_encoder_parts(text_config), on_part)
    return {"like": like, "seed": seed, "transformer_params": transformer_params,
            "text_encoder_params": text_params}
