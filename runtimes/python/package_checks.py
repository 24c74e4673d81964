"""What the Python runtime refuses in a well-formed package before any session exists: another
target, components it cannot feed, a decoder it cannot condition, a tokenizer past the text
encoder's table. The manifest's own checks (edge.core.manifest_schema) ran before these."""

from __future__ import annotations

from pathlib import Path

from edge.core.manifest_schema import MANIFEST, check_chain
from edge.core.options import check_settings
from edge.core.package import PackageError
from edge.core.sampler import SamplerSettings
from edge.core.tokenizer import CLEANERS

RUNTIME_TARGET = "onnx"
# what this runtime feeds each component and what it takes from it (see docs/package-format.md)
# a decoder conditioned on a timestep (the manifest's `decode`) takes these beside z, at the
# batch: the timestep, the scale s of the noise mixed in as (1 - s) z + s noise, the noise
DECODE_INPUTS = {"decode_t", "decode_noise_scale", "decode_noise"}
COMPONENT_INPUTS = {"text_encoder": {"input_ids", "attention_mask"},
                    "transformer": {"latent", "t", "caption", "caption_mask"},  # any of these
                    "vae_decoder": {"z"} | DECODE_INPUTS}
COMPONENT_OUTPUTS = {"text_encoder": {"hidden"}, "transformer": {"velocity"},
                     "vae_decoder": {"frames"}}
# how the VAE decoder takes the latents (B, C, T, h, w): "frames" as B*T images (C, h, w) and
# gives (B*T, 3, H, W); "video" as they are and gives (B, 3, T', H, W) (a causal video VAE)
LATENT_LAYOUTS = ("frames", "video")


def check_runnable(manifest: dict, any_target: bool = False) -> None:
    """Refuse, before any session exists, a well-formed package this runtime cannot run: another
    target (unless `any_target`: its blocks run some other way), a missing component, blocks
    needing inputs the runtime does not give or not making the outputs it takes, sampler
    settings it does not know."""
    if manifest["target"] != RUNTIME_TARGET and not any_target:
        raise PackageError(f"{MANIFEST}: target {manifest['target']!r}; the Python runtime "
                           f"runs {RUNTIME_TARGET!r} packages and iphone packages of the "
                           "Core AI layout (edge export --target iphone --min-ios 27)")
    components = {c["name"]: c["blocks"] for c in manifest["components"]}
    chunking = {c["name"]: c["chunked"] for c in manifest["components"] if "chunked" in c}
    for name, given in COMPONENT_INPUTS.items():
        if name not in components:
            raise PackageError(f"{MANIFEST}: no component {name!r}; the Python runtime needs "
                               f"{', '.join(COMPONENT_INPUTS)}")
        chunked = chunking.get(name)
        if chunked is None:
            check_chain(name, components[name], provided=given)
        else:  # the manifest check saw the chains; here: what this runtime feeds and takes
            if chunked["input"] not in given or chunked["output"] not in COMPONENT_OUTPUTS[name]:
                raise PackageError(f"{MANIFEST} component {name} chunked: pieces of "
                                   f"{chunked['input']!r} giving {chunked['output']!r}; the "
                                   f"Python runtime feeds {', '.join(sorted(given))} and takes "
                                   f"{', '.join(sorted(COMPONENT_OUTPUTS[name]))}")
        made = {s["name"] for b in components[name] for s in b["outputs"]}
        if not COMPONENT_OUTPUTS[name] <= made:
            raise PackageError(f"{MANIFEST}: component {name!r} makes no "
                               f"{', '.join(sorted(COMPONENT_OUTPUTS[name] - made))}")
    if "latent_shape" not in manifest:
        raise PackageError(f"{MANIFEST}: the Python runtime needs 'latent_shape'")
    if ("null_caption" not in manifest["conditioning"]
            and not isinstance(manifest.get("negative_prompt"), str)):
        raise PackageError(f"{MANIFEST}: the unconditional pass needs "
                           "'conditioning.null_caption' or a 'negative_prompt' string")
    check_decode(manifest, components["vae_decoder"], "vae_decoder" in chunking)
    tiled = [c["name"] for c in manifest["components"] if "tiles" in c]
    if tiled and (tiled != ["vae_decoder"] or manifest.get("latent_layout") != "video"
                  or "decode" in manifest):
        raise PackageError(f"{MANIFEST} component {tiled[0]} tiles: the Python runtime tiles "
                           "only a decoder of latents laid out as 'video' without decode "
                           "conditioning")
    if manifest.get("latent_layout", "frames") not in LATENT_LAYOUTS:
        raise PackageError(f"{MANIFEST}: latent_layout {manifest['latent_layout']!r}; known: "
                           f"{', '.join(LATENT_LAYOUTS)}")
    if manifest["tokenizer"].get("clean", "none") not in CLEANERS:
        raise PackageError(f"{MANIFEST} tokenizer: clean {manifest['tokenizer']['clean']!r}; "
                           f"known: {', '.join(CLEANERS)}")
    try:
        check_settings(SamplerSettings.from_dict(manifest["sampler"]))
    except (TypeError, ValueError) as err:
        raise PackageError(f"{MANIFEST} sampler: {err}") from None


def check_decode(manifest: dict, decoder: list[dict], chunked: bool) -> None:
    """A decoder that takes the decode inputs needs the manifest's `decode` settings, and
    runs on whole videos (the noise is one video's latents); a package with them has such a
    decoder."""
    takes = {s["name"] for b in decoder for s in b["inputs"]} & DECODE_INPUTS
    spec = manifest.get("decode")
    if spec is None and not takes:
        return
    if spec is None:
        raise PackageError(f"{MANIFEST}: the vae_decoder takes {', '.join(sorted(takes))} "
                           "but the manifest has no 'decode' settings")
    if takes != DECODE_INPUTS or chunked or manifest.get("latent_layout") != "video":
        raise PackageError(f"{MANIFEST} decode: needs a whole-video vae_decoder (latent_layout "
                           f"'video', not chunked) taking {', '.join(sorted(DECODE_INPUTS))}")
    number = (int, float)
    if not (isinstance(spec, dict) and isinstance(spec.get("timestep"), number)
            and (spec.get("noise_scale") is None or isinstance(spec["noise_scale"], number))
            and not any(isinstance(spec.get(k), bool) for k in ("timestep", "noise_scale"))):
        raise PackageError(f"{MANIFEST} decode: must be {{\"timestep\": number, "
                           f"\"noise_scale\": number or null}}, got {spec!r}")



def check_vocabulary(tokenizer, manifest_tokenizer: dict, path: Path) -> None:
    """Every id the tokenizer can give indexes the text encoder's embedding table (the
    manifest's `embedding_rows`): a larger vocabulary would fail inside onnxruntime's Gather
    on the first prompt that uses a token past the table."""
    rows = manifest_tokenizer.get("embedding_rows")
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    if rows is not None and vocab > rows:
        raise PackageError(f"{path}: a vocabulary of {vocab} tokens, but the text encoder's "
                           f"embedding table has {rows} rows ({MANIFEST} tokenizer "
                           "embedding_rows): ids past it index nothing")

