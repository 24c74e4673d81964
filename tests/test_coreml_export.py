"""`edge export --target iphone`: CoreML packages, validated where CoreML cannot predict.

One full export of tiny-sora (fp16, iOS 18: multifunction programs) per session, and one in
the iOS 17 layout (a program per variant) for this module; quantization is checked on one
transformer block, converted at each setting, merged with its TDTM variant into one
multifunction program and read back out of it, function by function."""

from __future__ import annotations

import copy
import json
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

pytest.importorskip("coremltools", reason="coremltools is in the test extras (pip install -e "
                    "'.[test]'); the CoreML exporter needs it")

from edge.core.budget import format_size  # noqa: E402
from edge.core.manifest_schema import PackageError, check_manifest  # noqa: E402
from edge.core.package import read_package  # noqa: E402
from edge.exporters.iphone.coreml.check import (  # noqa: E402
    block_numerics,
    check_structure,
    end_to_end_check,
    program_interface,
)
from edge.exporters.iphone.coreml.package import (  # noqa: E402
    ExportValidationError,
    compression,
    convert_module,
    cut_for_device,
    export_coreml,
    save_functions,
    save_program,
)
from edge.exporters.iphone.coreml.weights import (  # noqa: E402
    mil_constants,
    program_functions,
    read_parameters,
)
from edge.exporters.iphone.target import package_bytes  # noqa: E402


@pytest.fixture(scope="module")
def pair_block(tiny_sora):
    return cut_for_device(tiny_sora)["transformer"][1]


@pytest.fixture(scope="module")
def pair_fp16(pair_block, tmp_path_factory):
    """The pair block as an fp16 program, the baseline of the quantized ones."""
    path = tmp_path_factory.mktemp("pair") / "fp16.mlpackage"
    save_program(convert_module(pair_block.module, pair_block, compression("fp16")), path)
    return path


@pytest.fixture(scope="module")
def coreml_package_ios17(tmp_path_factory, tiny_sora):
    """tiny-sora exported for iOS 17 (each TDTM variant a program of its own), fp16, the
    end-to-end check on 6 steps: (root, manifest)."""
    root = tmp_path_factory.mktemp("coreml17") / "tiny-sora-iphone-ios17"
    manifest = export_coreml(tiny_sora, root, min_ios=17, validate_end_to_end=end_to_end_check(
        tiny_sora, "fp16", steps=6))
    return root, manifest


def variant_bytes(root, manifest) -> tuple[int, int]:
    """(weight file bytes, bytes on disk) of the programs of the blocks with variants."""
    models = {r["model"] for c in manifest["components"] for b in c["blocks"]
              if b.get("variants") for r in [b, *b["variants"].values()]}
    return (sum(f.stat().st_size for m in models for f in (root / m).rglob("weight.bin")),
            sum(package_bytes(root / m) for m in models))


def test_package_is_valid_and_complete(coreml_package, tiny_sora):
    root, manifest = coreml_package
    assert read_package(root) == json.loads((root / "manifest.json").read_text())
    assert manifest["target"] == "iphone"
    coreml = manifest["coreml"]
    assert coreml["compute_units"] == "cpuAndNeuralEngine"
    assert coreml["minimum_deployment_target"] == "iOS18"
    assert coreml["layout"] == "multifunction"
    assert coreml["compression"]["setting"] == "fp16"
    assert "macOS" in coreml["note"]
    names = {c["name"]: [b["name"] for b in c["blocks"]] for c in manifest["components"]}
    assert names == {k: [b.name for b in v] for k, v in cut_for_device(tiny_sora).items()}
    for comp in manifest["components"]:
        for block in comp["blocks"]:
            assert (root / block["model"] / "Manifest.json").is_file()
            assert not (root / block["model"] / "executorch_debug_handle_mapping.json").exists()
            assert block["model"] == f"models/{comp['name']}/{block['name']}.mlpackage"
            # fp16 weights (a block's constant tables, e.g. position encodings, count too)
            assert block["weight_bytes"] < 0.8 * block["reference_weight_bytes"]
    blocks = [b for c in manifest["components"] for b in c["blocks"]]
    ratio = (sum(b["weight_bytes"] for b in blocks)
             / sum(b["reference_weight_bytes"] for b in blocks))
    assert 0.45 < ratio < 0.56, ratio
    # the fp32 reference: the distinct tensors stored, about the fp32 parameters' bytes
    fp32_parameters = sum(b.weight_bytes() for bs in cut_for_device(tiny_sora).values()
                          for b in bs)
    assert 0.98 < sum(b["reference_weight_bytes"] for b in blocks) / fp32_parameters < 1.02
    pairs = [b for b in manifest["components"][1]["blocks"] if b["name"].startswith("pair_")]
    assert len(pairs) == 4 and all(set(b["variants"]) == {"tdtm"} for b in pairs)
    for pair in pairs:  # the variant is a function of the pair's own program
        tdtm = pair["variants"]["tdtm"]
        assert (pair["function"], tdtm["function"]) == ("main", "tdtm")
        assert tdtm["model"] == pair["model"] and tdtm["files"] == pair["files"]
        assert program_functions(root / pair["model"]) == (["main", "tdtm"], "main")
        assert tdtm["validation"]["weights_found"]["folded"] == []
        assert tdtm["validation"]["max_abs_error"] < 5e-3 * tdtm["validation"][
            "reference_max_abs"]
    assert not any("function" in b for b in blocks if not b.get("variants"))
    tok = root / manifest["tokenizer"]["files"][0]["path"]
    assert json.loads(tok.read_text())["model"]["type"] == "WordPiece"
    null = np.fromfile(root / manifest["conditioning"]["null_caption_f32"]["path"], "<f4")
    assert np.array_equal(null.reshape(16, 384),
                          np.load(root / manifest["conditioning"]["null_caption"]["path"]))


def test_programs_match_manifest_and_chain(coreml_package):
    root, manifest = coreml_package
    assert check_structure(root, manifest) == []
    emb = manifest["components"][0]["blocks"][0]
    inputs, outputs = program_interface(root / emb["model"])
    assert inputs == [{"name": "input_ids", "dtype": "int32", "shape": [1, 16]},
                      {"name": "attention_mask", "dtype": "int32", "shape": [1, 16]}]
    assert [o["name"] for o in outputs] == ["out_hidden", "out_attention_bias"]
    pair = manifest["components"][1]["blocks"][1]
    for function in ("main", "tdtm"):
        inputs, outputs = program_interface(root / pair["model"], function)
        assert inputs == pair["inputs"]
        assert [o["name"] for o in outputs] == ["out_" + o["name"] for o in pair["outputs"]]
    with pytest.raises(ValueError, match="no function 'merged'"):
        program_interface(root / pair["model"], "merged")


def test_structure_check_names_a_mismatch(coreml_package):
    root, manifest = coreml_package
    bad = copy.deepcopy(manifest)
    bad["components"][1]["blocks"][2]["inputs"][0]["shape"] = [2, 8, 16, 128]
    problems = check_structure(root, bad)
    assert any("transformer/pair_1" in p and "inputs" in p for p in problems), problems
    assert any("pair_1: input x is float32 [2, 8, 16, 128]" in p for p in problems), problems
    bad = copy.deepcopy(manifest)
    bad["latent_shape"][1] = 8
    assert any(p.startswith("latent_shape -> transformer latent") for p in
               check_structure(root, bad))
    bad = copy.deepcopy(manifest)  # a function the program does not hold
    bad["components"][1]["blocks"][1]["variants"]["tdtm"]["function"] = "merged"
    problems = check_structure(root, bad)
    assert any("variant tdtm" in p and "no function 'merged'" in p for p in problems), problems
    assert any("holds functions ['main', 'tdtm'], the manifest names ['main', 'merged']" in p
               for p in problems), problems


def test_numerics_recorded(coreml_package):
    _, manifest = coreml_package
    for comp in manifest["components"]:
        for block in comp["blocks"]:
            v = block["validation"]
            # fp16 weights in fp32 PyTorch: errors of fp16 rounding, relative to the outputs
            assert v["weights_max_abs_error"] < 2e-3, block["name"]
            assert v["max_abs_error"] < 5e-3 * max(1.0, min(v["reference_max_abs"], 100.0))
            assert v["weights_found"]["by_name"] > 0
    assert manifest["validation"]["identical"] or manifest["validation"]["psnr_db"] >= 40
    assert manifest["validation"]["steps"] == 6


def _refused(manifest: dict, match: str) -> None:
    manifest.pop("manifest_sha256")  # edited on purpose: the digest would refuse it first
    with pytest.raises(PackageError, match=match):
        check_manifest(manifest)


def test_manifest_refusals(coreml_package):
    _, manifest = coreml_package
    m = copy.deepcopy(manifest)
    m["coreml"]["compute_units"] = "gpuOnly"
    _refused(m, "compute_units 'gpuOnly'")
    m = copy.deepcopy(manifest)
    del m["coreml"]
    _refused(m, "missing field 'coreml'")
    m = copy.deepcopy(manifest)
    m["components"][0]["blocks"][1]["graph"] = m["components"][0]["blocks"][0]["graph"]
    _refused(m, "graph .* is not one of the block's files")
    m = copy.deepcopy(manifest)
    m["components"][1]["blocks"][1]["variants"]["tdtm"]["model"] = "models/x.mlpackage"
    _refused(m, "pair_0 variant tdtm: graph .* not a listed file inside models/x.mlpackage")


def _pair(manifest: dict) -> dict:
    return manifest["components"][1]["blocks"][1]


@pytest.mark.parametrize("edit,match", [
    (lambda m: _pair(m)["variants"]["tdtm"].pop("function"),
     "pair_0 variant tdtm: missing field 'function'"),
    (lambda m: _pair(m).pop("function"),
     "pair_0: a block with variants in the multifunction layout must name its function"),
    (lambda m: _pair(m)["variants"]["tdtm"].update(function="main"),
     "pair_0 variant tdtm: function 'main' is also the block's"),
    (lambda m: _pair(m)["variants"]["tdtm"].update(function=7),
     "pair_0 variant tdtm: field 'function' must be str"),
    (lambda m: _pair(m)["variants"]["tdtm"].update(function="td-tm"),
     "function 'td-tm' is not a function name"),
    (lambda m: m["coreml"].update(layout="shared"),
     "coreml: layout 'shared'; known: separate, multifunction, coreai"),
    (lambda m: m["coreml"].update(minimum_deployment_target="iOS17"),
     "layout 'multifunction' needs iOS18 or later, but minimum_deployment_target is 'iOS17'"),
    (lambda m: m["coreml"].update(minimum_deployment_target="18"),
     "minimum_deployment_target '18' is not iOS<n>"),
    (lambda m: m["coreml"].update(layout="separate"),
     "pair_0: function 'main' in a 'separate' layout"),
    (lambda m: m["coreml"].pop("layout"),   # an older package's: separate
     "pair_0: function 'main' in a 'separate' layout"),
])
def test_manifest_refuses_a_malformed_function_entry(coreml_package, edit, match):
    m = copy.deepcopy(coreml_package[1])
    edit(m)
    _refused(m, match)


def test_manifest_refuses_a_variant_running_its_blocks_program_in_the_separate_layout(
        coreml_package):
    m = copy.deepcopy(coreml_package[1])
    m["coreml"]["layout"] = "separate"
    for comp in m["components"]:
        for block in comp["blocks"]:
            for record in [block, *block.get("variants", {}).values()]:
                record.pop("function", None)
    _refused(m, "pair_0 variant tdtm: model 'models/transformer/pair_0.mlpackage' is the "
                "block's own program")
    m = copy.deepcopy(coreml_package[1])
    _pair(m)["variants"]["tdtm"]["model"] = "models/transformer/pair_0.tdtm.mlpackage"
    for f in _pair(m)["variants"]["tdtm"]["files"]:  # listed, but another program
        f["path"] = f["path"].replace("pair_0.mlpackage", "pair_0.tdtm.mlpackage")
    for key in ("graph",):
        _pair(m)["variants"]["tdtm"][key] = _pair(m)["variants"]["tdtm"][key].replace(
            "pair_0.mlpackage", "pair_0.tdtm.mlpackage")
    _pair(m)["variants"]["tdtm"]["weights"]["path"] = _pair(m)["variants"]["tdtm"][
        "weights"]["path"].replace("pair_0.mlpackage", "pair_0.tdtm.mlpackage")
    _pair(m)["files"] += _pair(m)["variants"]["tdtm"]["files"]
    _refused(m, "pair_0 variant tdtm: model 'models/transformer/pair_0.tdtm.mlpackage' is not "
                "the block's 'models/transformer/pair_0.mlpackage'; in the multifunction "
                "layout a variant is a function of its block's program")


def test_python_runtime_refuses_an_iphone_package(coreml_package):
    from edge.runtimes.python import Pipeline

    with pytest.raises(PackageError, match="target 'iphone'"):
        Pipeline.load(coreml_package[0])


def test_failed_validation_writes_nothing(tmp_path, tiny_sora, coreml_package):
    dest = tmp_path / "pkg"  # an earlier package, which a failed export must leave alone
    dest.mkdir()
    (dest / "manifest.json").write_bytes((coreml_package[0] / "manifest.json").read_bytes())
    before = (dest / "manifest.json").read_bytes()
    blocks = {"vae_decoder": cut_for_device(tiny_sora)["vae_decoder"][-1:]}

    def failing(root, manifest, components):
        raise ExportValidationError("end to end: too far from fp32")

    with pytest.raises(ExportValidationError, match="too far"):
        export_coreml(tiny_sora, dest, components=blocks, validate_end_to_end=failing)
    assert (dest / "manifest.json").read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["pkg"]
    with pytest.raises(ValueError, match="--quantize '3'"):
        export_coreml(tiny_sora, tmp_path / "other", quantize="3", components=blocks)
    with pytest.raises(ValueError, match="--min-ios 16 not understood; use 27, 18 or 17"):
        export_coreml(tiny_sora, tmp_path / "other", min_ios=16, components=blocks)
    assert not (tmp_path / "other").exists()


def test_a_variant_name_that_cannot_name_a_function_is_refused(tmp_path, tiny_sora):
    from edge.graph.blocks import Block

    block = Block("transformer", "lin", torch.nn.Linear(4, 4), ["x"], ["x"],
                  (torch.randn(1, 4),), variants={"td-tm": torch.nn.Linear(4, 4)})
    for min_ios in (18, 17):  # a package's variants can be stored in either layout
        with pytest.raises(ExportValidationError, match="block transformer/lin: variant name "
                           "'td-tm' cannot name a CoreML function"):
            export_coreml(tiny_sora, tmp_path / "pkg", min_ios=min_ios,
                          components={"transformer": [block]})
    assert list(tmp_path.iterdir()) == []


BIN = "Data/com.apple.CoreML/weights/weight.bin"


def per_tensor(w: np.ndarray) -> list[np.ndarray]:
    return [w.reshape(-1)]


def per_output_channel(w: np.ndarray) -> list[np.ndarray]:
    return list(w.reshape(w.shape[0], -1))


def per_channel_group(w: np.ndarray, size: int = 16) -> list[np.ndarray]:
    rows = w.reshape(w.shape[0], -1)
    return [rows[i:i + size].reshape(-1) for i in range(0, len(rows), size)]


def per_input_block(w: np.ndarray, size: int = 32) -> list[np.ndarray]:
    """Each output channel's inputs in blocks of `size` (one scale each)."""
    rows = w.reshape(w.shape[0], -1)
    return list(rows.reshape(-1, size))


def as_setting(form: str):
    """A named setting, or one stored form for every block (a form a family's rule names)."""
    from edge.exporters.iphone.coreml.package import STORAGES, Compression

    return compression(form) if form in ("8", "6") else \
        Compression(form, (("*", STORAGES[form]),), psnr_floor_db=0.0)


# (setting or stored form, how its values are grouped, values per group, fp16 size fraction,
# relative error)
@pytest.mark.parametrize("quantize,groups,levels,size,error", [
    ("8", per_output_channel, 256, 0.6, 0.01), ("6", per_tensor, 64, 0.45, 0.2),
    ("lut4-g16", per_channel_group, 16, 0.32, 0.2), ("int4-b32", per_input_block, 16, 0.36, 0.2)])
def test_quantized_weights_read_back(tmp_path, pair_block, pair_fp16, quantize, groups, levels,
                                    size, error):
    """The compressed weights, read back out of the saved program, are what the setting
    promises (at most 2^bits values per tensor, output channel, group of output channels or
    block of inputs), smaller on disk, and the block computes close to fp32 with them."""
    paths = {"fp16": pair_fp16, quantize: tmp_path / f"{quantize}.mlpackage"}
    save_program(convert_module(pair_block.module, pair_block, as_setting(quantize)),
                 paths[quantize])
    params = pair_block.parameters()
    stored, how = read_parameters(paths[quantize], params)
    assert how["folded"] == [] and set(stored) == set(params)
    big = [n for n, p in params.items() if p.numel() >= 2048]
    assert len(big) >= 8
    for name in big:
        w = stored[name].numpy()
        assert max(len(np.unique(r)) for r in groups(w)) <= levels, name
        assert not np.array_equal(w, params[name].numpy())
        ref = params[name].numpy()
        relative = float(np.linalg.norm(w - ref) / np.linalg.norm(ref))
        assert relative < error, (name, relative)

    def weight_bin(p):
        return (p / BIN).stat().st_size

    assert weight_bin(paths[quantize]) < size * weight_bin(paths["fp16"])
    reference = pair_block.run(*pair_block.example)
    got = block_numerics(paths[quantize], pair_block.module, pair_block, reference)
    fp16 = block_numerics(paths["fp16"], pair_block.module, pair_block, reference)
    assert fp16["max_abs_error"] < got["max_abs_error"] < 0.25 * got["reference_max_abs"]
    # compression works tensor by tensor: another program over the same tensors (the TDTM
    # variant) stores the very same bytes, so compressing each block's program equals
    # compressing the whole model before cutting it
    variant = replace(pair_block, module=pair_block.variants["tdtm"])
    tdtm = tmp_path / "tdtm.mlpackage"
    save_program(convert_module(variant.module, variant, as_setting(quantize)), tdtm)
    assert (tdtm / BIN).read_bytes() == (paths[quantize] / BIN).read_bytes()
    # ... so one multifunction program of both stores the compressed tensors once, and each
    # function reads back what its own program stores
    merged = tmp_path / "merged.mlpackage"
    save_functions({"main": paths[quantize], "tdtm": tdtm}, merged)
    assert weight_bin(merged) <= weight_bin(paths[quantize])
    assert weight_bin(merged) / (weight_bin(paths[quantize]) + weight_bin(tdtm)) < 0.51
    for function, alone in (("main", paths[quantize]), ("tdtm", tdtm)):
        got, want = mil_constants(merged, function), mil_constants(alone)
        assert got.keys() == want.keys()
        assert all(np.array_equal(got[k], want[k]) for k in want), function
    with torch.no_grad():
        assert torch.equal(pair_block.run(*pair_block.example)[0], reference[0])  # untouched


def test_4bit_setting_stores_each_component_as_measured_and_its_weights_6x_smaller(
        tiny_sora):
    """--quantize 4 keeps the blocks whose errors compound (transformer) at 8 bits and still
    stores the weights >= 6x smaller than fp32 (estimated from the parameters; lookup tables
    and scales add < 1%; the whole package, with its specs and tokenizer, is 5.6x smaller:
    docs/benchmarks.md)."""
    from edge.exporters.iphone.coreml.package import estimated_bytes

    setting = compression("4", tiny_sora)
    blocks = [b for bs in cut_for_device(tiny_sora).values() for b in bs]
    assert {b.key: setting.storage(b.key).bits for b in blocks if b.key in (
        "text_encoder/embeddings", "text_encoder/layer_2", "transformer/pair_1",
        "vae_decoder/up_1")} == {"text_encoder/embeddings": 4, "text_encoder/layer_2": 6,
                                 "transformer/pair_1": 8, "vae_decoder/up_1": 4}
    fp32 = sum(b.weight_bytes() for b in blocks)
    stored = sum(estimated_bytes(b, setting) for b in blocks)
    assert fp32 / stored >= 6.0, fp32 / stored
    record = setting.record()
    assert [r["blocks"] for r in record["rules"]] == [
        "text_encoder/embeddings", "text_encoder/*", "transformer/*", "vae_decoder/*"]
    assert setting.min_ios == 17


def test_a_tensor_rule_stores_the_tensors_it_names_in_its_own_form(tmp_path, pair_block):
    """A rule by tensor (StorageRule.tensors; Open-Sora keeps its cross-attention at int8 in
    int4 pairs): the tensors it names are stored per output channel at 8 bits, the rest of
    the block in int4 blocks; the size estimate counts each at its own bits, and the manifest
    records the rule."""
    from edge.exporters.iphone.coreml.package import STORAGES, Compression, estimated_bytes

    setting = Compression("4", (("*", STORAGES["int4-b32"]),), psnr_floor_db=0.0,
                          tensor_rules=(("transformer/*", "*cross_attn*", STORAGES["int8"]),))
    path = tmp_path / "mixed.mlpackage"
    save_program(convert_module(pair_block.module, pair_block, setting), path)
    params = pair_block.parameters()
    stored, _ = read_parameters(path, params)
    big = [n for n, p in params.items() if p.numel() >= 2048]
    named = [n for n in big if "cross_attn" in n]
    assert 0 < len(named) < len(big)
    for name in big:
        w = stored[name].numpy()
        in_blocks = max(len(np.unique(r)) for r in per_input_block(w))
        if name in named:   # int8 per channel: far more than 16 values in a block of 32
            assert in_blocks > 16 and max(len(np.unique(r)) for r in
                                          per_output_channel(w)) <= 256, name
        else:
            assert in_blocks <= 16, name
    int4 = estimated_bytes(pair_block, Compression("4", (("*", STORAGES["int4-b32"]),), 0.0))
    int8 = estimated_bytes(pair_block, Compression("8", (("*", STORAGES["int8"]),), 0.0))
    assert int4 < estimated_bytes(pair_block, setting) < int8
    assert setting.record()["tensor_rules"] == [{"blocks": "transformer/*",
                                                 "tensors": "*cross_attn*",
                                                 **STORAGES["int8"].record}]
    palettized = replace(setting, tensor_rules=(("*", "*cross_attn*", STORAGES["lut4"]),))
    with pytest.raises(ValueError, match=f"block {pair_block.key} mixes linear and "
                                         "palettize storage"):
        palettized.compressor(pair_block.key, ["p_spatial_cross_attn_q_weight_to_fp16"])


def test_a_setting_a_family_words_itself_is_resolved_through_the_family(tiny_sora):
    """--quantize 4 is each family's rule (FamilyModel.device_storage): asked without the
    model, for a family without one, or naming a stored form the exporter lacks, the refusal
    says which; the uniform settings need no model."""
    from edge.exporters.iphone.coreml.package import STORAGES, UNIFORM
    from edge.graph.family_model import StorageRule

    assert compression("8") is UNIFORM["8"] and compression("8", tiny_sora) is UNIFORM["8"]
    with pytest.raises(ValueError, match="--quantize 4 is worded by each family"):
        compression("4")
    with pytest.raises(ValueError, match="--quantize 4 has no storage rule for tiny-sora "
                       "models yet; use one of fp16, 8, 6"):
        compression("4", replace(tiny_sora, device_storage={}))
    odd = replace(tiny_sora, device_storage={"4": StorageRule(
        (("transformer/*", "lut5"), ("*", "int8")), psnr_floor_db=30.0, note="")})
    with pytest.raises(ValueError, match="tiny-sora's --quantize 4 names stored form 'lut5'"):
        compression("4", odd)
    mine = compression("4", tiny_sora)
    assert mine.psnr_floor_db == 35.0 and all(s in STORAGES.values() for _, s in mine.rules)


def test_a_setting_needing_a_later_ios_is_refused_for_an_earlier_one(tiny_sora, tmp_path):
    """Per-grouped-channel tables and int4 blocks need iOS 18's ops: --min-ios 17 with a rule
    storing them is refused naming the blocks, before anything converts."""
    from edge.graph.family_model import StorageRule

    grouped = replace(tiny_sora, device_storage={"4": StorageRule(
        (("transformer/*", "lut4-g16"), ("*", "int8")), psnr_floor_db=30.0, note="")})
    assert compression("4", grouped).min_ios == 18
    with pytest.raises(ValueError, match=r"--quantize 4 stores transformer/\* in forms iOS 18 "
                       r"decompresses; --min-ios 17 cannot load them: use --min-ios 18 or "
                       r"--quantize fp16 / 8 / 6"):
        export_coreml(grouped, tmp_path / "pkg", "4", min_ios=17)
    assert list(tmp_path.iterdir()) == []


def test_cli_refuses_bad_quantize_and_wrong_target():
    from typer.testing import CliRunner

    from edge.commands import app

    runner = CliRunner()
    result = runner.invoke(app, ["export", "--target", "iphone", "--quantize", "3"])
    assert result.exit_code == 2 and "--quantize '3' not understood" in result.output
    result = runner.invoke(app, ["export", "--target", "onnx", "--quantize", "4"])
    assert result.exit_code == 2 and "--quantize applies to --target iphone" in result.output
    result = runner.invoke(app, ["export", "--target", "iphone", "--min-ios", "16"])
    assert result.exit_code == 2 and "--min-ios 16 not understood" in result.output
    result = runner.invoke(app, ["export", "--target", "web", "--min-ios", "17"])
    assert result.exit_code == 2 and "--min-ios applies to --target iphone" in result.output


def _shape_of(manifest: dict) -> dict:
    """What a runtime decodes from a manifest, less the bytes, digests and measurements that
    change from one export to the next."""
    return {"target": manifest["target"], "sampler": manifest["sampler"],
            "latent_shape": manifest["latent_shape"],
            "coreml": {k: v for k, v in manifest["coreml"].items()},
            "components": [[(b["name"], b["model"], b.get("function"), b["graph"],
                             b["inputs"], b["outputs"],
                             {n: (v["model"], v.get("function"), v["graph"])
                              for n, v in sorted(b.get("variants", {}).items())})
                            for b in c["blocks"]] for c in manifest["components"]]}


def same_within_rounding(a, b) -> bool:
    """Equal JSON, floats within float32 rounding of a few operations (rtol 1e-4): NumPy's
    float32 solves (UniPC's order conditions) differ in the last bits between CPUs and BLAS
    builds, so a fixture made on one machine is not bit-equal on another; a change of the
    code moves them far more."""
    if isinstance(a, float) or isinstance(b, float):
        return (isinstance(a, int | float) and isinstance(b, int | float)
                and math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-6))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_within_rounding(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(same_within_rounding, a, b))
    return a == b


def test_swift_fixtures_are_current(coreml_package):
    """The fixtures runtimes/swift/Tests read exist and are what the Python side writes now
    (tests/swift_fixtures.py, tests/sampler_fixtures.py), and the manifest example is a
    current export's."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    import sampler_fixtures
    import swift_fixtures

    for name, data in swift_fixtures.build().items():
        on_disk = json.loads((swift_fixtures.FIXTURES / name).read_text())
        assert same_within_rounding(on_disk, json.loads(json.dumps(data))), \
            f"{name}: run tests/swift_fixtures.py"
    for name, data in sampler_fixtures.build().items():
        on_disk = json.loads((sampler_fixtures.FIXTURES / f"{name}.json").read_text())
        assert same_within_rounding(on_disk, json.loads(json.dumps(data))), name
    tok = swift_fixtures.FIXTURES / "tokenizer.json"
    assert tok.read_bytes() == swift_fixtures.default_tokenizer().read_bytes()
    example = json.loads((swift_fixtures.FIXTURES / "manifest_iphone.json").read_text())
    check_manifest(example)
    assert _shape_of(example) == _shape_of(coreml_package[1])
    bad = json.loads((swift_fixtures.FIXTURES / "manifest_bad_version.json").read_text())
    with pytest.raises(PackageError, match="unknown format_version 2"):
        check_manifest(bad)


def test_cli_summary_reports_size_psnr_and_the_macos_note(coreml_package):
    from edge.exporters.iphone.target import summary

    root, manifest = coreml_package
    text = summary(manifest, root, 12.0)
    assert "17 blocks (+4 tdtm variants)" in text
    assert f"end to end PSNR {manifest['validation']['psnr_db']} dB" in text
    # every size is the whole package on disk, against the fp32 tensors it stores
    on_disk = package_bytes(root)
    fp32 = sum(b["reference_weight_bytes"] for c in manifest["components"]
               for b in c["blocks"])
    assert f"{format_size(on_disk)} on disk (the whole package)" in text
    assert f"the package is {fp32 / on_disk:.2f}x smaller than the fp32 tensors" in text
    assert 1.85 < fp32 / on_disk < 2.0, fp32 / on_disk
    assert "layout multifunction, runs on iOS18 and later" in text and "needs macOS" in text


def test_cli_dry_run_shows_the_device_cut():
    from typer.testing import CliRunner

    from edge.commands import app

    result = CliRunner().invoke(app, ["export", "--target", "iphone", "--dry-run",
                                      "--quantize", "8"])
    assert result.exit_code == 0, result.output
    # a pair's TDTM function and the caption-half ones (iOS 18 holds them by default)
    assert "transformer/pair_0" in result.output
    assert "(+tdtm, unguided, tdtm_unguided variants)" in result.output
    assert "latent [2, 4, 16, 8, 8]" in result.output  # static shapes: one prompt + null
    assert ("97.5 MiB fp32 parameters, about 24.4 MiB of weight files at 8 (estimate) for "
            "iOS 18: a block's variants are functions") in result.output
    assert "macOS" in result.output
    result = CliRunner().invoke(app, ["export", "--target", "iphone", "--dry-run",
                                      "--quantize", "8", "--min-ios", "17"])
    assert result.exit_code == 0, result.output
    # each of the 4 pairs' TDTM programs holds another copy of its pair's weights (and no
    # caption-half programs: they would be copies too)
    assert "(+tdtm variant)" in result.output and "unguided" not in result.output
    assert ("about 26.5 MiB of weight files at 8 (estimate) for iOS 17: each variant is an "
            ".mlpackage of its own") in result.output


@pytest.mark.slow  # a second whole export (about a minute on 2 cores)
def test_ios17_layout_stores_each_variant_as_its_own_program(coreml_package_ios17,
                                                              coreml_package):
    root, manifest = coreml_package_ios17
    assert read_package(root) == json.loads((root / "manifest.json").read_text())
    assert (manifest["coreml"]["minimum_deployment_target"],
            manifest["coreml"]["layout"]) == ("iOS17", "separate")
    assert check_structure(root, manifest) == []
    blocks = [b for c in manifest["components"] for b in c["blocks"]]
    assert not any("function" in r for b in blocks
                   for r in [b, *b.get("variants", {}).values()])
    pairs = [b for b in blocks if b.get("variants")]
    assert len(pairs) == 4
    for pair in pairs:
        tdtm = pair["variants"]["tdtm"]
        assert tdtm["model"] == pair["model"].replace(".mlpackage", ".tdtm.mlpackage")
        assert program_functions(root / tdtm["model"]) == (["main"], "main")
        assert {f["path"] for f in tdtm["files"]} <= {f["path"] for f in pair["files"]}
    assert manifest["validation"]["identical"] or manifest["validation"]["psnr_db"] >= 40
    # the same stored tensors as the multifunction package, so the same fp32 reference
    mf_root, mf = coreml_package
    assert ([b["reference_weight_bytes"] for c in manifest["components"] for b in c["blocks"]]
            == [b["reference_weight_bytes"] for c in mf["components"] for b in c["blocks"]])
    # the pairs' weights: once in the multifunction programs, twice in the separate ones
    (mf_weights, mf_disk), (weights, disk) = variant_bytes(mf_root, mf), variant_bytes(
        root, manifest)
    assert 0.49 < mf_weights / weights < 0.51, mf_weights / weights
    assert mf_disk / disk < 0.56, mf_disk / disk
    # and the whole package is smaller by about those copies
    saved = package_bytes(root) - package_bytes(mf_root)
    assert 0.9 * (weights - mf_weights) < saved < 1.1 * (weights - mf_weights)


def test_cli_dry_run_plans_the_budget_in_stored_bytes():
    """--memory-budget re-cuts the device blocks counting what each program stores at the
    setting: the same 24 MB merges pairs at fp16, and 8 MB splits them at 4 bits; a budget
    below the largest stored block is refused naming it."""
    from typer.testing import CliRunner

    from edge.commands import app

    def dry_run(*args: str):
        return CliRunner().invoke(app, ["export", "--target", "iphone", "--dry-run", *args])

    result = dry_run("--memory-budget", "24MB")
    assert result.exit_code == 0, result.output
    assert "residency on the device at 24.0 MiB (stored fp16 bytes" in result.output
    assert "<- pair_0, pair_1, pair_2" in result.output  # merged: one read instead of 3
    assert "text_encoder/embeddings         22.7 MiB  streamed every use" in result.output
    result = dry_run("--memory-budget", "8MB", "--quantize", "4")
    assert result.exit_code == 0, result.output
    assert "transformer/pair_0_spatial" in result.output and "<- pair_0" in result.output
    result = dry_run("--memory-budget", "20MB")
    assert result.exit_code != 0
    assert ("smaller than block text_encoder/embeddings (22.7 MiB); the smallest budget that "
            "works is 22.7 MiB") in result.output


@pytest.mark.slow  # a whole export and a recording (a few minutes on 2 cores)
def test_export_for_a_budget_is_recut_validated_recorded_and_leaves_the_model(tmp_path,
                                                                              tiny_sora):
    from edge.commands.record import record_bundle as record
    from edge.exporters import ExportOptions, Progress
    from edge.exporters.iphone import target

    def parameters() -> dict:  # every module the device cut shares, the text encoder too
        modules = {"text_encoder": tiny_sora.pipe.text_encoder.bert,
                   "transformer": tiny_sora.pipe.transformer, "vae": tiny_sora.pipe.vae}
        return {f"{m}.{n}": p for m, module in modules.items()
                for n, p in module.named_parameters()}

    before = {n: p.detach().clone() for n, p in parameters().items()}
    options = ExportOptions(memory_budget=24 << 20)
    prepared = target.prepare(tiny_sora, options)
    root = tmp_path / "tiny-sora-iphone-24MB"
    manifest = target.export(tiny_sora, prepared, root, options, Progress())
    assert manifest["plan"]["memory_budget_bytes"] == 24 << 20
    assert manifest["plan"]["blocks"]["transformer/pair_0-2"] == ["pair_0", "pair_1", "pair_2"]
    names = [b["name"] for c in manifest["components"] for b in c["blocks"]]
    assert "pair_0-2" in names and "up_0-1" in names and "pair_0" not in names
    merged = next(b for c in manifest["components"] for b in c["blocks"]
                  if b["name"] == "pair_0-2")
    assert "tdtm" in merged["variants"]  # the members' variant, a function of one program
    assert check_structure(root, manifest) == []
    assert manifest["validation"]["psnr_db"] is None or manifest["validation"]["psnr_db"] >= 40
    # the check rendered with the stored fp16 weights in place, then put the fp32 ones back
    for n, p in parameters().items():
        assert torch.equal(p, before[n]), n
    # `edge record` re-cuts its own model the same way and runs the package's blocks
    info = record(root, "a red circle moving left", tmp_path / "bundle", overrides={"steps": 2})
    calls = json.loads((tmp_path / "bundle" / "bundle.json").read_text())["calls"]
    assert any(c["key"].startswith("transformer/pair_0-2") for c in calls), info
    # its model's weights were put back too (tiny-sora's text encoder is loaded once and
    # shared: stored fp16 weights left in it changed later tests' text embeddings)
    for n, p in parameters().items():
        assert torch.equal(p, before[n]), n
