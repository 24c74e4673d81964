"""Guidance-free steps and the guidance cutoff: a call is guided only with a scale over 1
(as diffusers) and among the first `guidance_steps` calls; an unguided call runs the
transformer on the caption's half alone (a batch of one) where the package's graphs take
any batch, and encodes no unconditional caption where no call is guided."""
import shutil

import numpy as np
import pytest
from typer.testing import CliRunner

import edge.runtimes.python.pipeline as runtime_module
from edge.commands import app
from edge.core.options import with_overrides
from edge.core.sampler import SamplerSettings, Trace, guided_call, sample
from edge.core.video_metrics import psnr, snr
from edge.runtimes.python import Pipeline

PROMPT, SEED, STEPS = "a green square moving up", 11, 6


def test_a_call_is_guided_above_one_and_before_the_cutoff():
    assert [guided_call(SamplerSettings(guidance=5.0, guidance_steps=2), i)
            for i in range(4)] == [True, True, False, False]
    assert guided_call(SamplerSettings(guidance=5.0), 29)           # no cutoff: every call
    for scale in (1.0, 0.5, -2.0):                                   # diffusers: only over 1
        assert not guided_call(SamplerSettings(guidance=scale), 0)
    assert not guided_call(SamplerSettings(guidance=5.0, guidance_steps=0), 0)


def test_a_call_runs_the_variant_each_block_has():
    """Merging applies where a block merges, the caption's half to every block; a block
    without the caption-half program a call needs is refused by name (the page mirrors it:
    runtimes/web/pipeline.js blockVariant)."""
    from edge.core.manifest_schema import block_variant, call_variant

    assert [call_variant(m, a) for m in (False, True) for a in (False, True)] == \
        [None, "unguided", "tdtm", "tdtm_unguided"]
    pair, prologue = {"tdtm", "unguided", "tdtm_unguided"}, {"unguided"}
    assert [block_variant(pair, call_variant(True, a)) for a in (False, True)] == \
        ["tdtm", "tdtm_unguided"]
    assert [block_variant(prologue, call_variant(True, a)) for a in (False, True)] == \
        [None, "unguided"]
    assert block_variant({"first"}, "first") == "first"
    with pytest.raises(KeyError, match="has no variant 'unguided' .it has: tdtm."):
        block_variant({"tdtm"}, "unguided")
    # a merging block without its merged caption half is not run unmerged in its place
    with pytest.raises(KeyError, match="'tdtm_unguided'"):
        block_variant({"tdtm", "unguided"}, "tdtm_unguided")


def test_unguided_calls_get_no_unconditional_prediction_and_take_the_conditional_one():
    cond = np.array([[1.0, 2.0]], np.float32)
    uncond = np.array([[-3.0, 0.5]], np.float32)
    asked = []

    def predict(x, t, step):
        asked.append(step.guided)
        return cond, (uncond if step.guided else None)

    trace = Trace()
    guided = sample(predict, np.zeros((1, 2), np.float32),
                    SamplerSettings(steps=4, guidance=3.0, guidance_steps=1), trace=trace)
    assert asked == [True, False, False, False] and trace.guided_calls == 1
    plain = sample(lambda x, t, s: (cond, None), np.zeros((1, 2), np.float32),
                   SamplerSettings(steps=4, guidance=1.0))
    # the guided first step moved the latent elsewhere than the conditional velocity would
    assert not np.allclose(guided, plain)


@pytest.mark.parametrize("overrides,named", [
    ({"guidance_steps": 7}, "from 0 to steps (6)"),
    ({"guidance_steps": -1}, "from 0 to steps"),
    ({"guidance_steps": 2.5}, "must be an integer or None"),
    ({"guidance_steps": True}, "must be an integer or None"),
])
def test_a_cutoff_outside_the_steps_is_refused_by_name(overrides, named):
    with pytest.raises(ValueError, match=r"guidance_steps=.*" + named.replace("(", r"\(")
                       .replace(")", r"\)")):
        with_overrides(SamplerSettings(steps=6), overrides)


def test_cli_names_a_cutoff_beyond_the_steps(exported_package, tmp_path):
    root, _ = exported_package
    result = CliRunner().invoke(app, ["generate", str(root), PROMPT, "--steps", "4",
                                      "--guidance-steps", "5", "-o", str(tmp_path / "v.gif")])
    assert result.exit_code != 0
    assert "guidance_steps=5" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "v.gif").exists()


@pytest.fixture
def rows_fed(monkeypatch):
    """The batch each text-encoder and transformer-prologue call is fed: [(what, rows)]."""
    fed = []
    run = runtime_module.run_in_batch_pieces

    def counting(session, block, inputs, weights, piece):
        for name in ("input_ids", "latent"):
            if name in inputs:
                fed.append((name, inputs[name].shape[0]))
        return run(session, block, inputs, weights, piece)

    monkeypatch.setattr(runtime_module, "run_in_batch_pieces", counting)
    return fed


@pytest.fixture(scope="module")
def runtime(exported_package):
    pipe = Pipeline.load(exported_package[0])
    yield pipe
    pipe.close()


def test_cutoff_runs_the_unguided_steps_at_a_batch_of_one_and_is_the_references_video(
        runtime, pipeline, rows_fed):
    got = runtime.generate(PROMPT, seed=SEED, steps=STEPS, guidance_steps=2)
    assert [r for what, r in rows_fed if what == "latent"] == [2, 2, 1, 1, 1, 1]
    assert [r for what, r in rows_fed if what == "input_ids"] == [1]  # null caption: learned
    run = runtime.last_run
    assert run["sampler"]["guided_calls"] == 2 and run["unguided_batch"] == 1
    want = pipeline.generate(PROMPT, seed=SEED, steps=STEPS, guidance_steps=2)
    assert pipeline.last_trace.guided_calls == 2
    assert psnr(got, want) >= 40 and snr(got, want) >= 25
    # and it is not the fully guided video: the cutoff changed what was computed
    guided = pipeline.generate(PROMPT, seed=SEED, steps=STEPS)
    assert snr(got, guided) < snr(got, want) - 10


def test_guidance_one_runs_no_unconditional_pass_at_all(runtime, pipeline, rows_fed):
    got = runtime.generate(PROMPT, seed=SEED, steps=STEPS, guidance=1.0)
    assert [r for what, r in rows_fed if what == "latent"] == [1] * STEPS
    assert runtime.last_run["sampler"]["guided_calls"] == 0
    want = pipeline.generate(PROMPT, seed=SEED, steps=STEPS, guidance=1.0)
    assert psnr(got, want) >= 40 and snr(got, want) >= 25
    # a cutoff of 0 is the same computation: no call guided, whatever the scale
    again = runtime.generate(PROMPT, seed=SEED, steps=STEPS, guidance_steps=0)
    np.testing.assert_array_equal(again, got)


def test_a_package_with_a_fixed_batch_runs_the_pair_says_so_and_makes_the_same_video(
        exported_package, runtime, tmp_path, rows_fed):
    """Device programs take the guidance batch whole: the null half runs and is dropped."""
    from manifest_edits import rewrite

    root = tmp_path / "fixed"
    shutil.copytree(exported_package[0], root)

    def fixed_batch(m):
        for comp in m["components"]:
            if comp["name"] == "transformer":
                for block in comp["blocks"]:
                    for s in block["inputs"] + block["outputs"]:
                        if s["shape"] and s["shape"][0] == "batch":
                            s["shape"][0] = 2
    rewrite(root, fixed_batch)

    def open_block(key, record):  # as a device package's programs open: by another runner
        import onnxruntime as ort
        return ort.InferenceSession(str(root / record["graph"]),
                                    providers=["CPUExecutionProvider"])

    fixed = Pipeline.load(root, open_block=open_block)
    try:
        with pytest.warns(UserWarning, match=r"fixed batch of 2.*guidance_steps 2"):
            got = fixed.generate(PROMPT, seed=SEED, steps=STEPS, guidance_steps=2)
        assert fixed.last_run["unguided_batch"] == 2
    finally:
        fixed.close()
    assert [r for what, r in rows_fed if what == "latent"] == [2] * STEPS
    want = runtime.generate(PROMPT, seed=SEED, steps=STEPS, guidance_steps=2)
    assert psnr(got, want) >= 40 and snr(got, want) >= 25


def test_the_step_cache_goes_on_across_the_cutoff(runtime, pipeline):
    """The cache's indicator is the caption half's, so the batch of two before the cutoff and
    of one after it measure the same change, and a residual stored on a guided call stands in
    for an unguided one (its caption half): the runtime and the PyTorch pipeline skip the
    same calls and make the same video."""
    options = {"steps": 12, "guidance_steps": 4, "cache_threshold": 0.3}
    got = runtime.generate(PROMPT, seed=SEED, **options)
    made = runtime.last_run["sampler"]
    want = pipeline.generate(PROMPT, seed=SEED, **options)
    assert made["transformer_calls"] == pipeline.last_trace.transformer_calls < 12
    assert made["guided_calls"] == 4
    assert psnr(got, want) >= 40 and snr(got, want) >= 25


def test_the_transformer_flops_count_what_the_calls_ran(exported_package, runtime):
    """Every ONNX block records its FLOPs per batch row, and the runtime counts a run's
    transformer work from them: a cutoff after 2 of 6 calls computes (2 + 4 / 2) / 6 of the
    guided run, guidance 1 half of it, a merged call its variant's (less)."""
    manifest = exported_package[1]
    transformer = next(c for c in manifest["components"] if c["name"] == "transformer")
    for block in transformer["blocks"]:
        rows = block["flops"]["rows_input"]
        assert block["flops"]["per_row"] > 0 and rows in [s["name"] for s in block["inputs"]]
    pair = transformer["blocks"][1]
    assert 0 < pair["variants"]["tdtm"]["flops"]["per_row"] < pair["flops"]["per_row"]
    per_call = sum(b["flops"]["per_row"] for b in transformer["blocks"])
    figures = {}
    for name, options in {"guided": {}, "cutoff": {"guidance_steps": 2},
                          "unguided": {"guidance": 1.0}, "merged": {"merge_steps": 2}}.items():
        runtime.generate(PROMPT, seed=SEED, steps=STEPS, **options)
        figures[name] = runtime.last_run["transformer_flops"]
    assert figures["guided"] == 2 * STEPS * per_call
    assert figures["cutoff"] == (2 * 2 + (STEPS - 2)) * per_call
    assert figures["unguided"] == STEPS * per_call
    assert figures["merged"] < figures["guided"]


def test_a_bad_flops_record_is_refused_naming_the_block(exported_package, tmp_path):
    from manifest_edits import rewrite

    from edge.core.package import PackageError

    root = tmp_path / "bad"
    shutil.copytree(exported_package[0], root)
    rewrite(root, lambda m: m["components"][1]["blocks"][1]["flops"].update(
        rows_input="nothing"))
    with pytest.raises(PackageError, match=r"pair_0.*flops: rows_input 'nothing' is not one "
                                           r"of the inputs"):
        Pipeline.load(root)
