"""Hardening of the Python runtime: prompts of every shape run, bad options are refused by name
before any block runs, two generations from one pipeline in threads are safe (they run one
after another), a manifest that disagrees with its graphs is refused at load, and a block file
that changes on disk after verification is refused when it is read."""
import os
import shutil
import threading
import warnings

import numpy as np
import pytest
from manifest_edits import block_record, rewrite

from edge.core.package import PackageError
from edge.core.tokenizer import PromptTruncatedWarning

STEPS = 1


@pytest.fixture(scope="module")
def runtime(exported_package):
    from edge.runtimes.python import Pipeline

    pipe = Pipeline.load(exported_package[0])
    yield pipe
    pipe.close()


@pytest.fixture
def pkg(exported_package, tmp_path):
    dest = tmp_path / "pkg"
    shutil.copytree(exported_package[0], dest)
    return dest


# --- prompts ---------------------------------------------------------------------------------

PROMPTS = ["", " ", "a red circle moving left", "un cercle rouge qui se déplace à gauche",
           "красный круг движется влево", "赤い円が左に動く", "🔴 ➡️ ⬅️ 🟢🔺", "\u200b\u0301\ufeff",
           "a\tred\ncircle\r\n", "a" * 10_000]


def test_prompts_of_every_shape_give_a_video(runtime):
    """Empty, blank, non-ASCII scripts, emoji, invisible characters, control characters and a
    10 000-character word: one batch, one video each."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PromptTruncatedWarning)
        video = runtime.generate(PROMPTS, seed=1, steps=STEPS)
    assert video.dtype == np.uint8 and video.shape == (len(PROMPTS), 16, 32, 32, 3)


def test_long_prompt_is_truncated_with_a_warning_naming_what_is_dropped(runtime):
    words = "a red circle moving left " + "then a green square moving up " * 20
    with pytest.warns(PromptTruncatedWarning, match="is ignored"):
        long = runtime.generate(words, seed=2, steps=STEPS)
    # what the model reads is the beginning: the same video as that beginning alone
    enc = runtime.tokenizer.encode(words)
    head = words[:enc.offsets[-2][1]]  # up to the last token before [SEP]
    with warnings.catch_warnings():
        warnings.simplefilter("error", PromptTruncatedWarning)
        short = runtime.generate(head, seed=2, steps=STEPS)
    assert np.array_equal(long, short)


def test_prompt_that_is_not_text_is_refused(runtime):
    for bad, message in [(None, "prompts must be"), ([], "non-empty"), ([3], "prompt 0 must"),
                         ("caf\udce9", "not valid Unicode")]:
        with pytest.raises(ValueError, match=message):
            runtime.generate(bad, steps=STEPS)


# --- options ---------------------------------------------------------------------------------

@pytest.mark.parametrize("options, message", [
    ({"steps": -1}, "steps"), ({"steps": 0}, "steps"), ({"steps": 2.5}, "steps"),
    ({"steps": 4, "merge_steps": 5}, "merge_steps=5: more than steps=4"),
    ({"merge_steps": -1}, "merge_steps"), ({"guidance": float("nan")}, "guidance"),
    ({"guidance": float("inf")}, "guidance"), ({"shift": 0.0}, "shift"),
    ({"leap_after": 0}, "leap_after"), ({"cache_threshold": "0.1"}, "cache_threshold"),
    ({"leap": 1}, "leap"), ({"stepz": 3}, "unknown sampler setting"),
    ({"seed": -1}, "seed -1"), ({"seed": [1, 2]}, "seed must be"),
    ({"shift": 1e308}, "no usable noise schedule"), ({"shift": 1e-300}, "no usable noise"),
    ({"num_train_timesteps": 1}, "no usable noise"), ({"steps": 10 ** 9}, "more than 10000"),
    ({"guidance": -1e300}, "guidance=-1e\\+300: larger than"),
])
def test_invalid_options_are_refused_by_name_before_any_block_runs(runtime, monkeypatch,
                                                                   options, message):
    ran = []
    monkeypatch.setattr(type(runtime), "_run_blocks", lambda *a, **k: ran.append(a))
    seed = options.pop("seed", 0)
    with pytest.raises(ValueError, match=message):
        runtime.generate("a red circle", seed=seed, **options)
    assert ran == []


def test_a_generation_that_goes_non_finite_raises_instead_of_returning_noise(runtime,
                                                                            monkeypatch):
    import edge.runtimes.python.pipeline as pipeline

    monkeypatch.setattr(pipeline, "sample", lambda predict, x, *a: np.full_like(x, np.nan))
    with pytest.raises(FloatingPointError, match="NaN or infinity"):
        runtime.generate("a red circle", steps=STEPS)


# --- threads ---------------------------------------------------------------------------------

def test_two_generations_at_once_from_threads_are_safe(exported_package):
    """Decision: one pipeline runs one generation at a time (its loader budget, resident
    blocks and run figures belong to one); calls from other threads wait their turn and get
    exactly the video they would get alone."""
    from edge.runtimes.python import Pipeline

    pipe = Pipeline.load(exported_package[0], memory_budget="64MB")  # streamed blocks too
    try:
        alone = {p: pipe.generate(p, seed=3, steps=STEPS) for p in ("a red circle moving left",
                                                                   "a blue square moving up")}
        got, errors, inside, most = {}, [], [0], [0]
        real = pipe._run_blocks
        lock = threading.Lock()

        def counting(*a, **k):  # how many generations are inside blocks at once
            with lock:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
            try:
                return real(*a, **k)
            finally:
                with lock:
                    inside[0] -= 1

        pipe._run_blocks = counting

        def work(prompt):
            try:
                got[prompt] = pipe.generate(prompt, seed=3, steps=STEPS)
            except Exception as err:  # noqa: BLE001  (reported below)
                errors.append(err)

        threads = [threading.Thread(target=work, args=(p,)) for p in alone]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert errors == [] and not any(t.is_alive() for t in threads)
        assert most[0] == 1
        for prompt, video in alone.items():
            assert np.array_equal(got[prompt], video)
        assert pipe.last_run["transformer_calls"] == STEPS
        assert not all(row["resident"] for row in pipe.plan())  # some blocks were streamed
    finally:
        pipe.close()


# --- a manifest that disagrees with its graphs -----------------------------------------------

SESSIONS: dict = {}


def _tensor(m, name="spatial.attn.q.weight"):
    return next(t for t in block_record(m)["weights"]["tensors"] if t["name"] == name)


@pytest.mark.parametrize("change, message", [
    (lambda m: _tensor(m).update(shape=list(reversed(_tensor(m)["shape"])) + [1]),
     "has shape"),
    (lambda m: _tensor(m).update(shape=[_tensor(m)["shape"][0] // 2,
                                        _tensor(m)["shape"][1] * 2]), "has shape"),
    (lambda m: _tensor(m).update(name="spatial.attn.q.weights"),
     "needs input 'spatial.attn.q.weight'"),
    (lambda m: block_record(m)["weights"]["tensors"].pop(), "lists neither"),
    (lambda m: block_record(m)["outputs"][0].update(dtype="float16"), "in the graph"),
    (lambda m: block_record(m)["inputs"][1].update(shape=["batch", 6, 64]), "has shape"),
    (lambda m: block_record(m, "vae_decoder", "head")["inputs"][0].update(
        shape=["batch", 4, 8, 9]), "in the graph"),
    (lambda m: m.update(latent_shape=[4, 8, 8, 8]), "what feeds it"),
    (lambda m: m["tokenizer"].update(max_tokens=12), "what feeds it"),
    (lambda m: block_record(m).update(graph=block_record(m)["weights"]["path"]),
     "not a graph onnxruntime can load"),
    (lambda m: block_record(m)["variants"]["tdtm"].update(graph="graphs/transformer/x.onnx"),
     "not one of the block's files"),
    (lambda m: m["sampler"].update(shift=1e308), "sampler: .*no usable noise schedule"),
    (lambda m: m["sampler"].update(steps=10 ** 12), "sampler: .*more than 10000"),
])
def test_manifest_that_disagrees_with_its_graphs_is_refused_at_load(pkg, monkeypatch, change,
                                                                    message):
    import edge.runtimes.python.pipeline as pipeline
    import edge.runtimes.python.sessions as sessions
    from edge.runtimes.python import Pipeline

    ran = []
    monkeypatch.setattr(pipeline.Pipeline, "_run_blocks", lambda *a, **k: ran.append(a))
    real = sessions.ort.InferenceSession

    def session(path, *a, **k):  # made once per graph of the package: the checks still run
        key = (os.path.relpath(path, pkg), os.path.getsize(path))
        if key not in SESSIONS:
            SESSIONS[key] = real(path, *a, **k)
        return SESSIONS[key]

    monkeypatch.setattr(sessions.ort, "InferenceSession", session)
    rewrite(pkg, change)
    with pytest.raises(PackageError, match=message):
        Pipeline.load(pkg)
    assert ran == []


# --- files that change after verification ----------------------------------------------------

def _change_in_place(path):
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF
    with open(path, "r+b") as f:  # same inode, same size: only the content and mtime differ
        f.write(data)


def _replace(path):
    tmp = path.with_suffix(".new")
    tmp.write_bytes(path.read_bytes())
    os.replace(tmp, path)  # same bytes, another file


@pytest.mark.parametrize("how", [_change_in_place, _replace])
def test_block_file_changed_after_verification_is_refused_when_read(pkg, how):
    from edge.runtimes.python import Pipeline

    pipe = Pipeline.load(pkg, pin=False)  # every block streamed: read at each use
    try:
        weights = pkg / block_record(pipe.manifest)["weights"]["path"]
        how(weights)
        with pytest.raises(PackageError, match=f"{weights.name}: changed on disk since"):
            pipe.generate("a red circle", steps=1)
    finally:
        pipe.close()


def _delete(path):
    path.unlink()


def _truncate(path):
    os.truncate(path, path.stat().st_size // 2)


def _folder(path):
    path.unlink()
    path.mkdir()


def _fifo(path):
    path.unlink()
    os.mkfifo(path)  # opening it for reading would wait for a writer for ever


@pytest.mark.parametrize("how, message", [
    (_delete, "gone since the package was verified (moved or deleted)"),
    (_truncate, "changed on disk since the package was verified"),
    (_folder, "is a folder now, not the file the package verified"),
    (_fifo, "is not a regular file now"),
])
def test_a_block_file_moved_cut_or_replaced_while_streaming_is_one_error(pkg, how, message):
    """What happens to a streamed block's file between verification and its read is one
    PackageError naming the file and what changed: never a bare OSError, never a hang."""
    import threading

    from edge.runtimes.python import Pipeline

    pipe = Pipeline.load(pkg, pin=False)
    outcome = []
    try:
        weights = pkg / block_record(pipe.manifest)["weights"]["path"]
        how(weights)

        def run():
            try:
                pipe.generate("a red circle", steps=1)
            except Exception as err:  # noqa: BLE001  (the test looks at what came out)
                outcome.append(err)

        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        worker.join(timeout=60)
        assert not worker.is_alive(), "generate hung on the changed file"
        assert len(outcome) == 1 and isinstance(outcome[0], PackageError), outcome
        assert str(outcome[0]).startswith(f"{weights}: ") and message in str(outcome[0])
    finally:
        pipe.close()


@pytest.mark.parametrize("change, message", [
    (_replace, "changed on disk since"),  # the same bytes in another file: a graph that loads
    (None, "removed or moved since the package was verified"),
])
def test_graph_changed_between_verification_and_session_is_refused(pkg, monkeypatch, change,
                                                                   message):
    """The load's last identity check (after the graphs are read): a graph replaced, or
    removed (was a bare FileNotFoundError), is one PackageError naming it."""
    import onnxruntime as ort

    from edge.core import package
    from edge.runtimes.python import Pipeline

    real = package.verify_files
    graph = pkg / "graphs" / "transformer" / "pair_1.onnx"

    def verify_then_change(*a, **k):
        found = real(*a, **k)
        if change is not None:
            change(graph)
        return found

    real_session = ort.InferenceSession

    def session_then_remove(path_or_bytes, *a, **k):
        made = real_session(path_or_bytes, *a, **k)
        if change is None and str(path_or_bytes) == str(graph):
            graph.unlink()
        return made

    import edge.runtimes.python.pipeline as pipeline

    monkeypatch.setattr(package, "verify_files", verify_then_change)
    monkeypatch.setattr(pipeline, "read_package", package.read_package)
    monkeypatch.setattr(ort, "InferenceSession", session_then_remove)
    with pytest.raises(PackageError, match=message) as err:
        Pipeline.load(pkg)
    assert str(err.value).startswith(str(graph))


def test_cli_generate_names_a_bad_option_combination(exported_package, tmp_path):
    from typer.testing import CliRunner

    from edge.commands import app

    res = CliRunner().invoke(app, ["generate", str(exported_package[0]), "a red circle",
                                   "-o", str(tmp_path / "v.gif"), "--steps", "2",
                                   "--merge-steps", "5"])
    assert res.exit_code == 2, res.output
    assert "merge_steps=5: more than steps=2" in res.output
    assert not (tmp_path / "v.gif").exists()
