"""Token merging and step leaping in the Python runtime, on the exported tiny-sora package:
the merged graphs, the switch between variants by step, the budget, state between runs."""
import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from edge.commands import app
from edge.core.video_metrics import psnr
from edge.exporters.onnx.package import PSNR_LIMIT_DB
from edge.models.stdit import MergedPair
from edge.runtimes.python import Pipeline

runner = CliRunner()
PROMPT = "a green square moving up"


def _pairs(manifest: dict) -> list[dict]:
    transformer = next(c for c in manifest["components"] if c["name"] == "transformer")
    return [b for b in transformer["blocks"] if b["name"].startswith("pair_")]


def test_exported_merged_variants_match_their_pytorch_reference(exported_package, pipeline):
    root, manifest = exported_package
    runtime = Pipeline.load(root)
    rng = torch.Generator().manual_seed(0)
    cfg = pipeline.transformer.cfg
    # inputs the export never saw: another batch size, random tokens and modulation
    x = torch.randn(3, cfg.frames, cfg.tokens_per_frame, cfg.hidden, generator=rng)
    t_mod = torch.randn(3, 6, cfg.hidden, generator=rng) * 0.3
    y = torch.randn(3, cfg.caption_len, cfg.hidden, generator=rng)
    y_bias = torch.zeros(3, 1, 1, cfg.caption_len)
    y_bias[0, ..., 10:] = -1e4
    feeds = {"x": x.numpy(), "t_mod": t_mod.numpy(), "y": y.numpy(), "y_bias": y_bias.numpy()}
    comp = runtime.components["transformer"]
    pairs = _pairs(manifest)
    assert len(pairs) == cfg.pairs
    for i, block in enumerate(pairs):
        assert block["variants"]["tdtm"]["validation"]["max_abs_error"] <= 1e-4
        key = f"transformer/{block['name']}"
        runs = runtime.loader.run([key])
        _, weights = next(runs)  # the base block's weights, read from the package
        merged = comp.variants[key, "tdtm"].run(["out:x"], feeds | weights)[0]
        base = comp.sessions[key].run(["out:x"], feeds | weights)[0]
        runs.close()
        with torch.no_grad():
            want = MergedPair(pipeline.transformer.pairs[i])(x, t_mod, y, y_bias).numpy()
        assert np.abs(merged - want).max() <= 1e-4, block["name"]
        assert np.abs(base - want).max() > 1e-3, "the variant graph is the base graph"
    runtime.close()


class _Recorded:
    """An onnxruntime session that notes which graph ran."""

    def __init__(self, session, log: list, tag: str) -> None:
        self.session, self.log, self.tag = session, log, tag

    def run(self, *args, **kwargs):
        self.log.append(self.tag)
        return self.session.run(*args, **kwargs)


def _record_graphs(runtime: Pipeline) -> list:
    log: list = []
    comp = runtime.components["transformer"]
    for key in comp.keys():
        comp.sessions[key] = _Recorded(comp.sessions[key], log, f"{key}:base")
        if (key, "tdtm") in comp.variants:
            comp.variants[key, "tdtm"] = _Recorded(comp.variants[key, "tdtm"], log,
                                                   f"{key}:tdtm")
    return log


@pytest.mark.parametrize("cache_threshold", [0.0, 1e-9])
def test_runtime_runs_merged_graphs_for_the_first_merge_steps(exported_package, pipeline,
                                                              cache_threshold):
    root, manifest = exported_package
    runtime = Pipeline.load(root)
    log = _record_graphs(runtime)
    got = runtime.generate(PROMPT, seed=2, steps=4, merge_steps=2,
                           cache_threshold=cache_threshold)
    names = [b["name"] for b in next(c for c in manifest["components"]
                                     if c["name"] == "transformer")["blocks"]]
    per_call = [log[i:i + len(names)] for i in range(0, len(log), len(names))]
    assert len(per_call) == 4
    for call, graphs in enumerate(per_call):
        kind = "tdtm" if call < 2 else "base"
        want = [f"transformer/{n}:{kind if n.startswith('pair_') else 'base'}" for n in names]
        assert graphs == want, call
    assert runtime.last_run["sampler"]["merged_calls"] == 2
    # the same video as the PyTorch reference with the same switch, and not the unmerged one
    want = pipeline.generate(PROMPT, seed=2, steps=4, merge_steps=2,
                             cache_threshold=cache_threshold)
    assert psnr(got, want) >= PSNR_LIMIT_DB
    assert psnr(got, runtime.generate(PROMPT, seed=2, steps=4)) < PSNR_LIMIT_DB
    runtime.close()


def test_loader_holds_one_copy_of_a_block_whichever_graph_runs(exported_package):
    root, manifest = exported_package
    sizes = [b["files"][1]["bytes"] for c in manifest["components"] for b in c["blocks"]]
    # every block resident in a budget of exactly one copy of each: a loader that counted a
    # variant apart from its block could not fit, or would read again
    runtime = Pipeline.load(root, memory_budget=sum(sizes))
    assert set(runtime.loader.blocks) == {f"{c['name']}/{b['name']}"
                                          for c in manifest["components"] for b in c["blocks"]}
    assert len(runtime.loader.pinned) == len(sizes)
    runtime.generate(PROMPT, steps=3, merge_steps=2)
    runtime.generate(PROMPT, steps=3, merge_steps=3)
    assert runtime.last_run["bytes_read"] == 0
    assert runtime.last_run["peak_held_bytes"] <= sum(sizes)
    runtime.close()
    # streamed: merged and unmerged steps read the same bytes
    budget = max(sizes) + 8192
    streamed = Pipeline.load(root, memory_budget=budget)
    read = {}
    for merge in (0, 3):
        streamed.generate(PROMPT, steps=3, merge_steps=merge)
        read[merge] = streamed.last_run["bytes_read"]
        assert streamed.last_run["peak_held_bytes"] <= budget
    assert read[0] == read[3] > 0
    streamed.close()


def test_runtime_starts_every_generation_afresh(exported_package):
    root, _ = exported_package
    settings = {"steps": 8, "leap": True, "leap_after": None, "leap_min_steps": 2,
                "leap_patience": 2, "cache_threshold": 0.05, "merge_steps": 3}
    runtime = Pipeline.load(root)
    first = runtime.generate(PROMPT, seed=1, **settings)
    first_trace = runtime.last_run["sampler"]
    runtime.generate("a yellow triangle moving right", seed=4, **settings)
    other_trace = runtime.last_run["sampler"]
    again = runtime.generate(PROMPT, seed=1, **settings)
    assert runtime.last_run["sampler"] == first_trace
    np.testing.assert_array_equal(again, first)
    runtime.close()
    fresh = Pipeline.load(root)
    fresh.generate("a yellow triangle moving right", seed=4, **settings)
    assert fresh.last_run["sampler"] == other_trace
    fresh.close()


def test_cli_generate_leaps_and_merges_on_a_package(exported_package, tmp_path):
    root, _ = exported_package
    res = runner.invoke(app, ["generate", str(root), "a red circle moving left", "-o",
                              str(tmp_path / "v.gif"), "--steps", "6", "--leap-after", "3",
                              "--leap-steps", "1", "--merge-steps", "2"])
    assert res.exit_code == 0, res.output
    assert "4 predictions" in res.output and "2 merged (TDTM)" in res.output
    assert "leap after step 3" in res.output
    # --leap alone: the package's rule, after 6 of 30 steps, the rest in 10
    res = runner.invoke(app, ["generate", str(root), "a red circle moving left", "-o",
                              str(tmp_path / "v.gif"), "--leap"])
    assert res.exit_code == 0, res.output
    assert "16 predictions" in res.output and "leap after step 6" in res.output
    # a tail longer than the steps it replaces: the block schedule stretches to fit
    res = runner.invoke(app, ["generate", str(root), "a red circle moving left", "-o",
                              str(tmp_path / "v.gif"), "--steps", "4", "--leap-after", "1",
                              "--leap-steps", "6"])
    assert res.exit_code == 0, res.output
    assert "7 predictions" in res.output and "leap after step 1" in res.output
    # a dynamic option asks for the cosine rule, whatever fixed leap the package names
    res = runner.invoke(app, ["generate", str(root), "a red circle moving left", "-o",
                              str(tmp_path / "v.gif"), "--steps", "8", "--leap",
                              "--leap-min-steps", "2", "--leap-patience", "1",
                              "--leap-steps", "1"])
    assert res.exit_code == 0, res.output
    assert "leap after step" in res.output and "leap after step 6" not in res.output
