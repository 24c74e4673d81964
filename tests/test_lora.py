"""LoRA adapters fused at export (edge/families/adapters.py): each family's package with a
random-weight adapter in diffusers' format makes the video of diffusers' pipeline that
loaded the same adapter (unfused, at the same scale), which the adapter visibly changes;
the manifest records the file, its SHA-256 and the scale; an adapter that is missing,
truncated, for another family or base size is refused naming the file and the first tensor
that does not fit, before any export work."""

from __future__ import annotations

import hashlib
import json
import math
import struct

import numpy as np
import pytest
import torch
from conftest import FAMILY_SIZE, LTX_OPTIONS, WAN_SIZE
from lora_files import make_lora

from edge.core.video_metrics import psnr, snr
from edge.families import FamilyError, load_model

PROMPT = "a red circle moving left"
# case -> (folders fixture, key, the tests' size and options, steps)
CASES = {"wan": ("wan_folders", "unipc", WAN_SIZE, 4),
         "cogvideox-5b": ("cog_folders", "5b", FAMILY_SIZE, 4),
         "ltx-timestep": ("ltx_folders", "timestep", FAMILY_SIZE | LTX_OPTIONS["timestep"], 3)}


def _folder(request, case: str):
    fixture, key, _, _ = CASES[case]
    return request.getfixturevalue(fixture)[key]


def _load(folder, case: str, **options):
    _, _, size, steps = CASES[case]
    return load_model(folder, steps=steps, **size, **options)


@pytest.fixture(scope="module")
def wan_lora(wan_folders, tmp_path_factory):
    return make_lora(wan_folders["unipc"], tmp_path_factory.mktemp("lora") / "wan.safetensors")


@pytest.mark.slow  # an ONNX export per family
@pytest.mark.parametrize("case", CASES)
def test_the_package_makes_the_video_of_the_pipeline_with_the_adapter(request, tmp_path, case):
    from edge.exporters.onnx.package import export_onnx
    from edge.runtimes.python import Pipeline

    folder = _folder(request, case)
    lora = make_lora(folder, tmp_path / "adapter.safetensors")
    fused = _load(folder, case, lora=[f"{lora}:0.8"])
    root = tmp_path / "pkg"
    manifest = export_onnx(fused, root)
    assert manifest["adapters"] == [{"file": "adapter.safetensors", "scale": 0.8,
                                     "sha256": hashlib.sha256(lora.read_bytes()).hexdigest()}]
    # the reference: diffusers' pipeline with the adapter loaded as its layers, unfused
    pipeline = _load(folder, case)
    plain_video_model = _load(folder, case)
    pipeline.pipe.load_lora_weights(str(lora), adapter_name="adapter")
    pipeline.pipe.set_adapters(["adapter"], [0.8])
    latents = np.random.default_rng(7).standard_normal((1, *fused.latent_shape),
                                                       dtype=np.float32)
    kwargs = {"latents": latents, "steps": CASES[case][3], "guidance": 4.0}
    if "decode" in manifest:  # given latents: the generator draws the decode noise first
        decode_noise = torch.randn((1, *fused.latent_shape),
                                   generator=torch.Generator().manual_seed(5)).numpy()
        want = pipeline.reference(PROMPT, seed=5, **kwargs)
        plain = plain_video_model.reference(PROMPT, seed=5, **kwargs)
        kwargs["decode_noise"] = decode_noise
    else:
        want = pipeline.reference(PROMPT, **kwargs)
        plain = plain_video_model.reference(PROMPT, **kwargs)
    runtime = Pipeline.load(root)
    try:
        got = runtime.generate(PROMPT, **kwargs)
    finally:
        runtime.close()
    assert psnr(got, want) >= 40.0 and snr(got, want) >= 25.0, (psnr(got, want),
                                                                snr(got, want))
    # the adapter changes the video well beyond the match above
    assert snr(plain, want) < 20.0, snr(plain, want)
    print(f"{case}: PSNR {psnr(got, want):.1f} dB, SNR {snr(got, want):.1f} dB; without "
          f"the adapter: SNR {snr(plain, want):.1f} dB")


def test_two_adapters_fuse_at_their_scales(wan_folders, wan_lora, tmp_path):
    other = make_lora(wan_folders["unipc"], tmp_path / "other.safetensors", seed=1)
    both = _load(wan_folders["unipc"], "wan", lora=[f"{wan_lora}:0.5", str(other)])
    assert [(a["file"], a["scale"]) for a in both.adapters] == [("wan.safetensors", 0.5),
                                                                ("other.safetensors", 1.0)]
    reference = _load(wan_folders["unipc"], "wan")
    reference.pipe.load_lora_weights(str(wan_lora), adapter_name="a")
    reference.pipe.load_lora_weights(str(other), adapter_name="b")
    reference.pipe.set_adapters(["a", "b"], [0.5, 1.0])
    latents = np.random.default_rng(3).standard_normal((1, *both.latent_shape),
                                                       dtype=np.float32)
    got = both.reference(PROMPT, latents=latents, steps=2)
    want = reference.reference(PROMPT, latents=latents, steps=2)
    assert psnr(got, want) >= 40.0 and snr(got, want) >= 25.0


def safetensors_bytes(header) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text


@pytest.mark.parametrize("damage,message", [
    (lambda p: p.unlink(), "no such file"),
    (lambda p: p.write_bytes(p.read_bytes()[:-100]), "truncated"),
    (lambda p: p.write_bytes(b"\x05"), "not a safetensors file"),
    (lambda p: (p.unlink(), p.symlink_to(p.name)), "is a symbolic link loop, not a LoRA file"),
    (lambda p: p.write_bytes(safetensors_bytes([1, 2])), r"a JSON list, not an object"),
    (lambda p: p.write_bytes(safetensors_bytes({"a": {"dtype": "F32", "shape": [2]}})),
     r"tensor 'a': data_offsets None are not two byte offsets"),
    (lambda p: p.write_bytes(safetensors_bytes({"a": {"dtype": "F32", "shape": [2],
                                                      "data_offsets": [0, 4]}})),
     r"tensor 'a': spans 4 bytes; F32 of shape \[2\] takes 8"),
])
def test_a_missing_or_truncated_adapter_is_refused_naming_it(wan_folders, wan_lora, tmp_path,
                                                             damage, message):
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(wan_lora.read_bytes())
    damage(broken)
    with pytest.raises(FamilyError, match=message) as err:
        _load(wan_folders["unipc"], "wan", lora=[str(broken)])
    assert str(broken) in str(err.value)


def test_an_adapter_for_another_family_or_size_names_the_tensor(
        wan_folders, cog_folders, wan_lora, tmp_path):
    from safetensors.torch import load_file, save_file

    # another family: Wan's blocks are not CogVideoX's
    with pytest.raises(FamilyError, match=r"tensor 'transformer\.blocks\.0\.attn1\.to_k") as err:
        _load(cog_folders["5b"], "cogvideox-5b", lora=[str(wan_lora)])
    assert str(wan_lora) in str(err.value)
    # another base size: one projection's adapter made for a wider model (40 inputs, not 24)
    tensors = load_file(wan_lora)
    key = next(k for k in sorted(tensors) if k.endswith("attn1.to_q.lora_A.weight"))
    tensors[key] = torch.zeros(4, 40)
    wide = tmp_path / "wide.safetensors"
    save_file(tensors, wide)
    with pytest.raises(FamilyError, match=r"has shape \[4, 40\]; .* takes \[4, 24\]") as err:
        _load(wan_folders["unipc"], "wan", lora=[str(wide)])
    assert str(wide) in str(err.value)


def test_the_cli_refuses_an_adapter_out_of_core_and_for_tiny_sora(wan_folders, wan_lora,
                                                                   tmp_path):
    from typer.testing import CliRunner

    from edge.commands import app

    out = tmp_path / "pkg"
    res = CliRunner().invoke(app, ["export", "--model", str(wan_folders["unipc"]),
                                   "--out-of-core", "--lora", str(wan_lora), "-o", str(out),
                                   "--height", "32", "--width", "48", "--frames", "9"])
    assert res.exit_code != 0 and "--lora: adapters are fused into the weights" in res.output
    res = CliRunner().invoke(app, ["export", "--lora", str(wan_lora), "-o", str(out)])
    assert res.exit_code != 0 and "--lora: tiny-sora models do not take it" in res.output
    assert not out.exists()


def test_the_cli_dry_run_reads_the_adapter(wan_folders, wan_lora):
    from typer.testing import CliRunner

    from edge.commands import app

    res = CliRunner().invoke(app, ["export", "--model", str(wan_folders["unipc"]), "--dry-run",
                                   "--lora", f"{wan_lora}:0.25", "--height", "32", "--width",
                                   "48", "--frames", "9"])
    assert res.exit_code == 0, res.output
    assert f"{wan_lora}: LoRA fused into the transformer at scale 0.25" in res.output


# diffusers' key -> the original Wan trainers' (diffusers converts these when it loads them)
WAN_ORIGINAL = {"attn1.to_q": "self_attn.q", "attn1.to_k": "self_attn.k",
                "attn1.to_v": "self_attn.v", "attn1.to_out.0": "self_attn.o",
                "attn2.to_q": "cross_attn.q", "attn2.to_k": "cross_attn.k",
                "attn2.to_v": "cross_attn.v", "attn2.to_out.0": "cross_attn.o",
                "ffn.net.0.proj": "ffn.0", "ffn.net.2": "ffn.2"}


def test_an_adapter_in_the_original_wan_format_fuses_as_diffusers_converts_it(
        wan_folders, wan_lora, tmp_path):
    """Wan's own trainers' keys (`diffusion_model.blocks.N.self_attn.q.lora_down.weight`,
    an alpha of half the rank): the same weights as diffusers' format at scale 0.5."""
    import re

    from safetensors.torch import load_file, save_file

    original = {}
    for key, tensor in load_file(wan_lora).items():
        found = re.fullmatch(r"transformer\.blocks\.(\d+)\.(.+)\.lora_([AB])\.weight", key)
        block, layer, part = found.groups()
        name = f"diffusion_model.blocks.{block}.{WAN_ORIGINAL[layer]}"
        original[f"{name}.lora_{'down' if part == 'A' else 'up'}.weight"] = tensor
        if part == "A":
            original[f"{name}.alpha"] = torch.tensor(tensor.shape[0] / 2)
    save_file(original, tmp_path / "original.safetensors")
    got = _load(wan_folders["unipc"], "wan", lora=[str(tmp_path / "original.safetensors")])
    want = _load(wan_folders["unipc"], "wan", lora=[f"{wan_lora}:0.5"])
    base = _load(wan_folders["unipc"], "wan")
    weights = dict(want.pipe.transformer.named_parameters())
    changed = 0
    for name, tensor in got.pipe.transformer.named_parameters():
        torch.testing.assert_close(tensor, weights[name], rtol=1e-5, atol=1e-6)
        changed += not torch.equal(tensor, dict(base.pipe.transformer.named_parameters())[name])
    assert changed == 2 * len(WAN_ORIGINAL)   # every adapted layer of both blocks


def sparse_lora(path, tensors: dict[str, list[int]]):
    """A safetensors file whose header declares `tensors` (name -> shape, float32) and whose
    data is a hole: gigabytes on paper, a few KiB on disk."""
    header, offset = {}, 0
    for name, shape in tensors.items():
        nbytes = 4 * math.prod(shape)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    path.write_bytes(safetensors_bytes(header))
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size + offset)
    return path


def test_an_adapter_too_large_for_its_model_is_refused_from_its_header(wan_folders, tmp_path):
    """A sparse file declaring a rank of a million, or 4 GB of tensors, is refused in the
    header, before diffusers reads (allocates) a byte of it."""
    key = "transformer.blocks.0.attn1.to_q"
    huge_rank = sparse_lora(tmp_path / "rank.safetensors", {
        f"{key}.lora_A.weight": [1_000_000, 24], f"{key}.lora_B.weight": [24, 1_000_000]})
    with pytest.raises(FamilyError, match=rf"{key}.lora_A.weight' has rank 1000000; the "
                       r"transformer's widest linear layer has \d+ features"):
        _load(wan_folders["unipc"], "wan", lora=[str(huge_rank)])
    many = sparse_lora(tmp_path / "many.safetensors", {
        f"transformer.blocks.{i}.ffn.net.2.lora_B.weight": [24, 16] for i in range(1)} | {
        f"transformer.extra_{i}.lora_B.weight": [1 << 20, 24] for i in range(40)})
    with pytest.raises(FamilyError, match=r"holds 4,026,53\d,\d+ bytes of tensors, more than "
                       "twice the transformer's float32 weights"):
        _load(wan_folders["unipc"], "wan", lora=[str(many)])


def test_an_adapter_or_scale_that_is_not_finite_is_refused(wan_folders, wan_lora, tmp_path):
    from safetensors.torch import load_file, save_file

    for scale in ("nan", "inf", "-inf"):
        with pytest.raises(FamilyError, match=rf":{scale}: the scale {scale} is not a finite"):
            _load(wan_folders["unipc"], "wan", lora=[f"{wan_lora}:{scale}"])
    tensors = load_file(wan_lora)
    key = sorted(k for k in tensors if k.endswith("lora_B.weight"))[3]
    tensors[key][0, 0] = float("nan")
    tensors[key][1, 1] = float("inf")
    poisoned = tmp_path / "poisoned.safetensors"
    save_file(tensors, poisoned)
    with pytest.raises(FamilyError, match=rf"{poisoned}: tensor '{key}' holds 2 NaN or "
                       "infinite values"):
        _load(wan_folders["unipc"], "wan", lora=[str(poisoned)])


def test_a_kohya_lora_for_another_model_says_so(wan_folders, tmp_path):
    """diffusers' converter for kohya names raises a bare KeyError on another model's."""
    from safetensors.torch import save_file

    key = "lora_unet_down_blocks_0_attentions_0_proj_in"
    sd = tmp_path / "sd15.safetensors"
    save_file({f"{key}.lora_down.weight": torch.zeros(4, 24),
               f"{key}.lora_up.weight": torch.zeros(24, 4), f"{key}.alpha": torch.tensor(4.0)},
              sd)
    with pytest.raises(FamilyError, match=rf"--lora {sd}: its tensor names are not those of a "
                       r"WanPipeline LoRA \(diffusers' converter looked for '.*'\): a LoRA for "
                       "another model"):
        _load(wan_folders["unipc"], "wan", lora=[str(sd)])
