"""Bad input to the commands and the Python API, as a new user or a hostile environment gives
it: each case is refused with a one-line message naming the option, file or value, exit
status 2, no traceback, before any work, and nothing the user had is changed.
docs/reliability.md lists the cases and these tests."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from edge.commands import app
from edge.core.files import OutputError, atomic_file, check_output_file, printable
from edge.core.package import FORMAT, MANIFEST

sys.path.insert(0, str(Path(__file__).parent))
from manifest_edits import block_record, rewrite  # noqa: E402
from tiny_parts import edited_copy  # noqa: E402
from wan_folder import make_wan_folder  # noqa: E402

runner = CliRunner()


def refused(args: list[str], message: str) -> str:
    """Run `edge ARGS`: exit status 2, no traceback, one `error:` line containing
    `message`, on a line of its own. Returns the output."""
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    assert isinstance(res.exception, SystemExit), res.exception  # not a crash
    assert "Traceback" not in res.output
    errors = [line for line in res.output.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith("error: "), res.output
    assert message in errors[0], res.output
    return res.output


def snapshot(root: Path) -> dict:
    """Every entry under `root` (folders too) with the bytes of the files."""
    return {p.relative_to(root).as_posix(): (p.read_bytes() if p.is_file() else "dir")
            for p in sorted(root.rglob("*"))}


@pytest.fixture
def no_work(monkeypatch):
    """Loading a model or a package fails the test: the refusal had to come first."""
    import edge.commands.common as common
    import edge.families as families
    import edge.runtimes.python as runtime

    def never(*a, **k):
        pytest.fail("work started before the refusal")

    monkeypatch.setattr(common, "load_reference_pipeline", never)
    monkeypatch.setattr(families, "load_model", never)
    monkeypatch.setattr(runtime.Pipeline, "load", never)


# --- 1. --force replaces only what edge wrote -----------------------------------------------

def make_pwa(root: Path) -> None:
    (root / "src").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / MANIFEST).write_text('{"name": "My PWA"}')
    (root / "src" / "app.js").write_text("x")


NOT_OURS = "edge replaces only folders it wrote, with or without --force"


@pytest.mark.parametrize("target", ["onnx", "iphone", "web"])
@pytest.mark.parametrize("force", [True, False])
def test_a_web_app_with_a_manifest_is_never_replaced(tmp_path, target, force, no_work):
    dest = tmp_path / "pwa"
    make_pwa(dest)
    before = snapshot(dest)
    out = refused(["export", "--target", target, "-o", str(dest)] + (["--force"] * force),
                  "its manifest.json is not an edge manifest")
    assert NOT_OURS in out and "a package is already there" not in out
    assert snapshot(dest) == before
    assert [p.name for p in tmp_path.iterdir()] == ["pwa"]


@pytest.mark.parametrize("make, message", [
    (lambda d: (d / MANIFEST).mkdir(), "no edge manifest (manifest.json is a folder)"),
    (lambda d: os.mkfifo(d / MANIFEST), "no edge manifest (manifest.json is a FIFO"),
    (lambda d: (d / MANIFEST).write_text("{not json"), "is not an edge manifest"),
    (lambda d: (d / MANIFEST).write_text('{"format": "other"}'), "is not an edge manifest"),
    (lambda d: (d / MANIFEST).write_text(json.dumps({"format": FORMAT})),
     "says edge but is damaged"),
    (lambda d: (d / "site.html").write_text("x"), "no edge manifest (manifest.json is missing)"),
])
def test_force_refuses_other_folders_naming_why(tmp_path, make, message, no_work):
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "keep.txt").write_text("mine")
    make(dest)
    before = snapshot(dest)
    out = refused(["export", "-o", str(dest), "--force"], message)
    assert NOT_OURS in out
    assert snapshot(dest) == before


def test_a_package_holding_a_users_files_is_not_replaced(exported_package, tmp_path, no_work):
    dest = tmp_path / "pkg"
    shutil.copytree(exported_package[0], dest)
    (dest / ".git").mkdir()
    (dest / ".git" / "HEAD").write_text("ref")
    before = snapshot(dest)
    refused(["export", "-o", str(dest), "--force"],
            "an edge package, but it also holds files its manifest does not list (.git/HEAD)")
    assert snapshot(dest) == before


def test_force_says_what_it_replaces(exported_package, tmp_path, monkeypatch):
    import edge.families as families

    dest = tmp_path / "pkg"
    shutil.copytree(exported_package[0], dest)
    before = snapshot(dest)

    def stop(*a, **k):
        raise families.FamilyError("stopped at the load")

    monkeypatch.setattr(families, "load_model", stop)
    out = refused(["export", "-o", str(dest), "--force"], "stopped at the load")
    assert f"replacing the edge package tiny-sora (onnx) at {dest} (--force)" in out
    assert snapshot(dest) == before


def test_scale_model_replaces_only_its_own_folders(tmp_path):
    dest = tmp_path / "site"
    make_pwa(dest)
    before = snapshot(dest)
    refused(["scale-model", str(dest), "--force", "--hidden", "32", "--pairs", "1",
             "--heads", "2"], "not a model folder that `edge scale-model` wrote")
    assert snapshot(dest) == before
    small = ["--hidden", "32", "--pairs", "1", "--heads", "2"]
    mine = tmp_path / "mine"
    assert runner.invoke(app, ["scale-model", str(mine), *small]).exit_code == 0
    refused(["scale-model", str(mine), *small], "pass --force to replace it")
    res = runner.invoke(app, ["scale-model", str(mine), *small, "--seed", "1", "--force"])
    assert res.exit_code == 0, res.output
    assert "replacing the random-weight model folder (seed 0)" in res.output
    (mine / "notes.txt").write_text("mine")
    refused(["scale-model", str(mine), *small, "--force"], "it also holds notes.txt")


def test_scale_model_refuses_what_cannot_fit_before_building_it(tmp_path):
    """A hundred million pairs are counted (one and two pairs, extended), never built; a seed
    past PyTorch's range is the option's own error, not "Overflow when unpacking"."""
    import time

    started = time.monotonic()
    refused(["scale-model", str(tmp_path / "m"), "--pairs", "100000000"],
            "--hidden 1024 --pairs 100000000: 3,359,385,610,540,048 parameters need about")
    assert time.monotonic() - started < 30
    res = runner.invoke(app, ["scale-model", str(tmp_path / "m"), "--seed", "1" + "0" * 23])
    assert res.exit_code == 2 and "Invalid value for '--seed'" in res.output
    assert "Overflow" not in res.output and list(tmp_path.iterdir()) == []


def test_a_folder_edge_writes_holds_no_owner_only_file(tmp_path):
    """safetensors' writer makes its files 0600: scale-model's transformer.safetensors was
    unreadable beside 0644 files. Everything atomic_directory publishes gets the usual mode."""
    from edge.core.files import current_umask

    out = tmp_path / "m"
    assert runner.invoke(app, ["scale-model", str(out), "--hidden", "32", "--pairs", "1",
                               "--heads", "2"]).exit_code == 0
    usual = {p.name: 0o666 & ~current_umask() for p in out.rglob("*") if p.is_file()}
    assert "transformer.safetensors" in usual
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.rglob("*")
            if p.is_file()} == usual


# --- 2. videos and plots are written atomically ---------------------------------------------

@pytest.mark.parametrize("umask, folder, file", [(0o022, 0o755, 0o644), (0o077, 0o700, 0o600)])
def test_written_files_and_packages_have_the_usual_modes(tmp_path, umask, folder, file):
    """The modes a plain mkdir or open gives under the umask (mkdtemp and mkstemp would give
    0700 and 0600 whatever it is: a web server could not read an export)."""
    from edge.core.package import atomic_directory

    old = os.umask(umask)
    try:
        with atomic_file(tmp_path / "f.json") as tmp:
            tmp.write_text("{}")
        with atomic_directory(tmp_path / "pkg") as root:
            (root / "sub").mkdir()
            (root / "sub" / "w.bin").write_bytes(b"x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "f.json").stat().st_mode) == file
    assert stat.S_IMODE((tmp_path / "pkg").stat().st_mode) == folder
    assert stat.S_IMODE((tmp_path / "pkg" / "sub").stat().st_mode) == folder
    assert stat.S_IMODE((tmp_path / "pkg" / "sub" / "w.bin").stat().st_mode) == file


def test_an_exported_package_is_readable_by_others(exported_package):
    from edge.core.files import current_umask

    root = exported_package[0]
    assert stat.S_IMODE(root.stat().st_mode) == 0o777 & ~current_umask()


# --- 3. every destination is checked before the work ----------------------------------------

@pytest.mark.parametrize("make, output, message", [
    (lambda t: (t / "out" / "dir.gif").mkdir(parents=True), "out/dir.gif",
     "out/dir.gif: is a folder; name a file to write"),
    (lambda t: (t / "afile").write_text("x"), "afile/x.gif", "afile is a file, not a folder"),
    (lambda t: (t / "afile").write_text("x"), "afile/deeper/x.mp4",
     "afile is a file, not a folder"),
    (lambda t: os.mkfifo(t / "pipe.gif"), "pipe.gif", "pipe.gif: is a FIFO (named pipe)"),
    (lambda t: None, "/proc/x.gif", "-o /proc/x.gif: cannot write in /proc"),
    (lambda t: None, "out.avi", "-o out.avi: use a .gif or .mp4 file name"),
])
def test_unwritable_video_path_is_refused_before_generating(tmp_path, monkeypatch, no_work,
                                                            make, output, message):
    monkeypatch.chdir(tmp_path)
    make(tmp_path)
    before = snapshot(tmp_path)
    refused(["generate", "a red circle", "-o", output], message)
    assert snapshot(tmp_path) == before


def test_a_device_is_never_replaced(tmp_path):
    with pytest.raises(OutputError, match="/dev/null: is a character device; name a file"):
        check_output_file(Path("/dev/null"), "-o")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through folder permissions")
def test_read_only_folder_is_refused_before_generating(tmp_path, no_work):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    refused(["generate", "x", "-o", str(ro / "x.gif")], "cannot write in")


def test_plot_destination_is_checked_before_the_sweep(tmp_path, no_work, monkeypatch):
    import edge.commands.evaluate as evaluate

    monkeypatch.setattr(evaluate, "_eval_sweep", lambda *a, **k: pytest.fail("the sweep ran"))
    (tmp_path / "afile").write_text("x")
    refused(["eval", "--sweep", "--plot", str(tmp_path / "afile" / "f.png")],
            f"--plot {tmp_path / 'afile' / 'f.png'}: {tmp_path / 'afile'} is a file, not a "
            "folder")


def test_export_destination_inside_a_file_is_refused_before_loading(tmp_path, no_work):
    (tmp_path / "afile").write_text("x")
    refused(["export", "-o", str(tmp_path / "afile" / "pkg")], "afile is a file, not a folder")


def test_training_destination_is_checked_before_training(tmp_path, monkeypatch):
    import edge.train as train

    monkeypatch.setattr(train, "train_tiny_sora", lambda *a, **k: pytest.fail("trained"))
    (tmp_path / "afile").write_text("x")
    refused(["train", "tiny-sora", "--out", str(tmp_path / "afile")],
            f"--out {tmp_path / 'afile'}: is a file, not a folder")
    refused(["train", "tiny-sora", "--out", str(tmp_path / "afile" / "run")],
            "afile is a file, not a folder")


# --- 4-6. what a Wan folder may say, checked before loading ---------------------------------

@pytest.fixture(scope="module")
def wan_source(tmp_path_factory) -> Path:
    return make_wan_folder(tmp_path_factory.mktemp("wan") / "wan")


@pytest.fixture
def never_loads_wan(monkeypatch):
    from edge.families.wan import family as wan

    monkeypatch.setattr(wan, "load_pipeline", lambda f: pytest.fail("the pipeline was loaded"))


SCHED = "scheduler/scheduler_config.json"


@pytest.mark.parametrize("file, fields, message", [
    (SCHED, {"flow_shift": -1.0}, "scheduler_config.json: flow_shift=-1.0 gives no usable "
     "sampler: sampler setting shift=-1.0: must be positive"),
    (SCHED, {"flow_shift": 0}, "flow_shift=0.0 gives no usable sampler"),
    (SCHED, {"flow_shift": "3"}, "scheduler_config.json: flow_shift='3'; must be a number"),
    (SCHED, {"flow_shift": 1e12}, "flow_shift=1000000000000.0 gives no usable sampler"),
    (SCHED, {"num_train_timesteps": 1}, "num_train_timesteps=1; must be an integer of at "
     "least 2"),
    ("transformer/config.json", {"in_channels": 8, "out_channels": 8},
     "config.json: in_channels=8, but"),
    ("transformer/config.json", {"out_channels": 4}, "out_channels=4, but"),
    ("transformer/config.json", {"text_dim": 64}, "text_dim=64, but"),
    ("transformer/config.json", {"patch_size": [1, 2]}, "patch_size=[1, 2]; must be 3"),
    ("transformer/config.json", {"rope_max_seq_len": 0}, "rope_max_seq_len=0; must be an "
     "integer of at least 1"),
    ("vae/config.json", {"latents_mean": [0.0] * 8}, "latents_mean must list z_dim=16"),
    ("vae/config.json", {"z_dim": "16"}, "z_dim='16'; must be an integer"),
])
def test_wan_settings_are_refused_before_loading(wan_source, tmp_path, never_loads_wan, file,
                                                  fields, message):
    folder = edited_copy(wan_source, tmp_path / "wan", file, **fields)
    before = snapshot(folder)
    refused(["export", "--model", str(folder), "--height", "32", "--width", "32", "--frames",
             "5", "-o", str(tmp_path / "pkg")], message)
    assert snapshot(folder) == before and not (tmp_path / "pkg").exists()


def test_wan_channels_that_disagree_name_both_files(wan_source, tmp_path, never_loads_wan):
    folder = edited_copy(wan_source, tmp_path / "wan", "transformer/config.json",
                        in_channels=8, out_channels=8)
    out = refused(["export", "--model", str(folder), "--height", "32", "--width", "32",
                   "--frames", "5", "--dry-run"], "in_channels=8")
    assert f"{folder / 'vae' / 'config.json'} has z_dim=16" in out


SMALL = ["--height", "32", "--width", "32", "--frames", "5"]  # later options win


@pytest.mark.parametrize("size, message", [
    (["--frames", "100001"], "--frames 100001: 25001 positions on that axis, more than the "
     "transformer's RoPE tables hold (rope_max_seq_len=32)"),
    (["--height", "4096", "--width", "4096"], "--height 4096: 256 positions on that axis"),
    (["--height", "160000", "--width", "160000"], "--height 160000: 10000 positions"),
    (["--frames", "6"], "--frames 6: Wan needs 4k + 1 frames"),
    (["--height", "40"], "--height 40: Wan needs a positive multiple of 16"),
    (["--steps", "20000"], "--steps 20000: sampler setting steps=20000: more than 10000"),
])
def test_sizes_past_what_the_model_takes_are_refused(wan_source, never_loads_wan, size,
                                                     message):
    refused(["export", "--model", str(wan_source), "--dry-run", *SMALL, *size], message)


def test_tokens_and_memory_are_bounded(wan_source, tmp_path, never_loads_wan, monkeypatch):
    from edge.families.wan import folder_checks as wan

    folder = edited_copy(wan_source, tmp_path / "wan", "transformer/config.json",
                        rope_max_seq_len=4096)
    refused(["export", "--model", str(folder), "--dry-run", "--height", "16384", "--width",
             "16384", "--frames", "1"], f"1048576 transformer tokens, more than edge takes "
            f"({wan.MAX_TOKENS})")
    monkeypatch.setattr(wan, "physical_memory_bytes", lambda: 1 << 29)
    refused(["export", "--model", str(folder), "--dry-run", "--height", "1024", "--width",
             "1024", "--frames", "81"], "an export at this size holds about 0.9 GiB of "
            "activations, more than this machine's 0.5 GiB of memory")


def test_symlink_loops_and_fifos_in_a_model_folder_are_named(wan_source, tmp_path):
    folder = tmp_path / "wan"
    shutil.copytree(wan_source, folder)
    shutil.rmtree(folder / "vae")
    (folder / "vae").symlink_to(folder / "vae")
    refused(["export", "--model", str(folder), "--dry-run"],
            f"{folder / 'vae'}: is a symbolic link loop (model_index.json lists 'vae'")
    (folder / "model_index.json").unlink()
    os.mkfifo(folder / "model_index.json")  # reading it would block forever
    refused(["export", "--model", str(folder), "--dry-run"],
            "model_index.json: is a FIFO (named pipe), not a JSON file")


@pytest.mark.parametrize("mode", ["--in-memory", "--out-of-core"])
def test_a_fifo_where_a_shard_should_be_is_named_not_read(wan_source, tmp_path, mode):
    """Whichever way the model is loaded, a FIFO in a component folder is refused by name
    before anything opens it (reading it would wait for a writer for ever)."""
    folder = tmp_path / "wan"
    shutil.copytree(wan_source, folder)
    (shard,) = (folder / "transformer").glob("*.safetensors")
    shard.unlink()
    os.mkfifo(shard)
    done = {}

    def run():
        done["res"] = runner.invoke(app, ["export", "--model", str(folder), mode, "--dry-run"])

    import threading

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout=240)
    assert not worker.is_alive(), "the export hung on the FIFO"
    res = done["res"]
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert f"{shard}: is a FIFO (named pipe), not a file" in res.output


@pytest.mark.parametrize("name, data, message", [
    ("tokenizer/tokenizer_config.json", b'{"x": "\xff"}', "not UTF-8 text (invalid start byte "
     "at byte 7)"),
    ("tokenizer/tokenizer_config.json", b"{", "not JSON"),
    ("transformer/config.json", b"[1]", "must be a JSON object"),
    # JSON, but no tokenizer: transformers raised a bare KeyError: 'added_tokens' (item 20)
    ("tokenizer/tokenizer.json", b'{"a": 1}', "not a tokenizer the tokenizers library reads"),
    ("tokenizer/tokenizer.json", b'{"version": "1.0", "model": {"type": "Unigram", "vocab": '
     b'[["a", 0.0]]}}', "lacks 'added_tokens', 'decoder'"),
])
def test_every_json_file_of_a_component_is_named_when_unreadable(wan_source, tmp_path, name,
                                                                 data, message, never_loads_wan):
    folder = tmp_path / "wan"
    shutil.copytree(wan_source, folder)
    (folder / name).write_bytes(data)
    refused(["export", "--model", str(folder), "--dry-run"], f"{folder / name}: {message}")


def test_a_shard_header_is_read_only_from_a_regular_file(tmp_path):
    from edge.graph.lazy_weights import ShardError, read_header

    os.mkfifo(tmp_path / "x.safetensors")
    with pytest.raises(ShardError, match="x.safetensors: is a FIFO .*not a safetensors file"):
        read_header(tmp_path / "x.safetensors")


def test_a_fifo_manifest_is_named(tmp_path):
    from edge.core.package import PackageError, read_package

    (tmp_path / "pkg").mkdir()
    os.mkfifo(tmp_path / "pkg" / MANIFEST)
    with pytest.raises(PackageError, match=r"manifest\.json: is a FIFO \(named pipe\), not a "
                       "file"):
        read_package(tmp_path / "pkg")


# --- 7. one size parser for the command line and the Python API -----------------------------

@pytest.mark.parametrize("value, message", [
    ("infGB", "--memory-budget 'infGB': must be a finite size"),
    ("nanMB", "--memory-budget 'nanMB': must be a finite size"),
    ("1e400MB", "--memory-budget '1e400MB': must be a finite size"),
    ("0", "--memory-budget '0': must be positive"),
    ("-5", "--memory-budget '-5': must be positive"),
    ("0.1B", "--memory-budget '0.1B': less than one byte"),
    ("lots", "--memory-budget 'lots': not understood; use e.g. 64MB"),
    ("9999999TB", "beyond any machine's memory"),
])
def test_bad_budgets_are_refused_by_name_in_every_command(tmp_path, no_work, value, message):
    refused(["generate", str(tmp_path), "a prompt", "--memory-budget", value], message)
    refused(["export", "--dry-run", "--memory-budget", value], message)
    refused(["bench", str(tmp_path), "--memory-budget", value], message)
    refused(["eval", "--sweep", "--memory-budget", value], message)


@pytest.mark.parametrize("value, message", [
    (0.5, "memory_budget: 0.5 is a float; give a whole number of bytes (int) or a size such "
     "as '64MB'"),
    (True, "memory_budget: True is a bool"),
    ([64], "memory_budget: [64] is a list"),
    (-5, "memory_budget -5: must be positive"),
    ("infGB", "memory_budget 'infGB': must be a finite size"),
])
def test_bad_budgets_from_python_name_the_argument(exported_package, value, message):
    from edge.runtimes.python import Pipeline

    with pytest.raises(ValueError, match=re.escape(message)):
        Pipeline.load(exported_package[0], memory_budget=value)


def test_good_budgets_parse_alike_everywhere():
    from edge.core.budget import parse_size

    assert parse_size("64MB") == parse_size("64mib") == parse_size(64 << 20) == 64 << 20
    assert parse_size("1.5GB") == 3 << 29 and parse_size(None) is None


# --- 8. text from files is shown escaped ----------------------------------------------------

def test_control_characters_from_a_package_never_reach_the_terminal(exported_package,
                                                                      tmp_path):
    pkg = tmp_path / "pkg"
    shutil.copytree(exported_package[0], pkg)
    hostile = "pair_1\x1b]0;owned\x07\x1b[2K\u202e"

    def rename_and_break(m):
        block = block_record(m)
        block["name"] = hostile
        block["weights"]["tensors"][0]["shape"][0] += 1  # an error that names the block

    rewrite(pkg, rename_and_break)
    out = refused(["generate", str(pkg), "a prompt", "-o", str(tmp_path / "x.gif")],
                  r"pair_1\x1b]0;owned\x07\x1b[2K\u202e")
    assert not any(c in out for c in "\x1b\x07\u202e")


def test_printable_escapes_controls_and_keeps_text():
    assert printable("a\tb\nc é 猫") == "a\tb\nc é 猫"
    assert printable("\x1b[31mred\x9b\x00\u2066") == r"\x1b[31mred\x9b\x00\u2066"


# --- 9. smaller ones --------------------------------------------------------------------------

def test_a_closed_pipeline_says_so(exported_package):
    from edge.runtimes.python import Pipeline

    pipe = Pipeline.load(exported_package[0])
    pipe.close()
    pipe.close()  # twice: nothing to do
    with pytest.raises(ValueError, match=r"the pipeline of .* is closed \(close\(\) was "
                       r"called\); load the package again"):
        pipe.generate("a red circle", steps=1)


def test_option_errors_print_on_their_own_line(tmp_path):
    out = refused(["generate", "a red circle", "--steps", "4", "--merge-steps", "9", "-o",
                   str(tmp_path / "x.gif")], "merge_steps=9: more than steps=4")
    assert "denoising" not in out  # refused before the progress bar started


def test_an_error_during_generation_starts_a_new_line(tmp_path, monkeypatch, pipeline):
    import edge.commands.common as common

    class Failing:
        sampler, frame_size = pipeline.sampler, pipeline.frame_size

        def generate(self, text, on_step, **kw):
            on_step(1, 3)
            raise ValueError("a block file changed on disk")

    monkeypatch.setattr(common, "load_reference_pipeline", lambda w: Failing())
    out = refused(["generate", "x", "--steps", "3", "-o", str(tmp_path / "x.gif")],
                  "a block file changed on disk")
    assert "denoising" in out and "\nerror: a block file changed on disk" in out
    assert not (tmp_path / "x.gif").exists()


def test_web_dry_run_writes_nothing_and_a_web_budget_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["export", "--target", "web", "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "transformer/pair_0" in res.output and "stored as fp16" in res.output
    assert "streams the rest" in res.output
    # the streaming floor counts the blocks' stored bytes (what the wasm path holds), not
    # float32's: the two largest of the table's stored sizes (both in MiB, as edge prints sizes)
    stored = sorted((float(m[1]) for m in re.finditer(r"^\S+/\S+ +([\d.]+)  \S+ \[",
                                                      res.output, re.MULTILINE)), reverse=True)
    assert len(stored) > 2
    floor = re.search(r"every block streamed \(([\d.]+) MiB of weights\)", res.output)
    assert floor, res.output
    assert float(floor[1]) == pytest.approx(sum(stored[:2]), rel=0.01)
    assert list(tmp_path.iterdir()) == []  # was: a full export
    refused(["export", "--target", "web", "--memory-budget", "64MB"],
            "--memory-budget: a web package takes its budget where the page loads it")


# --- the second probe: options checked before the package is read, text, scale, -o --------

def damaged_copy(exported_package, tmp_path) -> Path:
    """The exported package with one weight file's bytes changed (its size kept): loading it
    fails the sha256 check, so any error printed first came before the hashing."""
    root = tmp_path / "pkg"
    shutil.copytree(exported_package[0], root)
    weights = sorted((root / "weights").rglob("*.bin"))[0]
    data = bytearray(weights.read_bytes())
    data[0] ^= 0xFF
    weights.write_bytes(bytes(data))
    return root


@pytest.mark.parametrize("options, message", [
    (["--guidance", "nan"], "guidance=nan: must be a finite number"),
    (["--steps", "100000"], "steps=100000: more than"),
    (["--merge-steps", "5", "--steps", "2"], "merge_steps=5: more than steps=2"),
    (["--scale", "1000"], "--scale 1000: frames of 32x32 upscaled x1000"),
])
def test_options_are_checked_before_the_package_is_hashed(exported_package, tmp_path, options,
                                                          message):
    root = damaged_copy(exported_package, tmp_path)
    refused(["generate", str(root), "a red circle", "-o", str(tmp_path / "x.gif"), *options],
            message)
    if "--scale" not in options:  # a bundle has no scale
        refused(["record", str(root), "a red circle", "-o", str(tmp_path / "b"), *options],
                message)


def test_scale_is_bounded_before_the_reference_generates(tmp_path, monkeypatch, pipeline):
    import edge.commands.common as common

    class NoGeneration:
        sampler, frame_size = pipeline.sampler, pipeline.frame_size

        def generate(self, *a, **k):
            pytest.fail("generated before refusing the scale")

    monkeypatch.setattr(common, "load_reference_pipeline", lambda w: NoGeneration())
    refused(["generate", "x", "--scale", "1000", "-o", str(tmp_path / "x.gif")],
            "--scale 1000: frames of 32x32 upscaled x1000 would be 32000x32000; at most x256")


@pytest.mark.parametrize("args, what", [
    (["BAD"], "prompt"), (["PKG", "BAD"], "prompt"),
    (["PKG", "x", "--negative-prompt", "BAD"], "--negative-prompt")])
def test_text_that_is_not_valid_unicode_is_refused_up_front(exported_package, args, what,
                                                            no_work, tmp_path):
    # "a \udcff" is what Python makes of the byte 0xff in a command-line argument
    args = [{"PKG": str(exported_package[0]), "BAD": "a \udcff"}.get(a, a) for a in args]
    refused(["generate", *args, "-o", str(tmp_path / "x.gif")],
            f"{what} is not valid Unicode text")


def test_outputs_inside_the_package_are_refused_before_any_work(exported_package, tmp_path,
                                                                no_work):
    root = tmp_path / "pkg"
    shutil.copytree(exported_package[0], root)
    before = snapshot(root)
    refused(["generate", str(root), "x", "-o", str(root / "out.gif")],
            f"-o {root / 'out.gif'}: inside the package {root}")
    refused(["record", str(root), "x", "-o", str(root / "b")],
            f"-o {root / 'b'}: inside the package {root}")
    os.symlink(root / "weights", tmp_path / "elsewhere")  # inside through a link
    refused(["generate", str(root), "x", "-o", str(tmp_path / "elsewhere" / "v.gif")],
            "inside the package")
    assert snapshot(root) == before


def test_the_api_refuses_latents_that_are_not_floats_and_takes_numpy_seeds(exported_package):
    from edge.runtimes.python import Pipeline

    pipe = Pipeline.load(exported_package[0])
    shape = (1, *pipe.latent_shape)
    for latents in (np.zeros(shape, np.int64), np.zeros(shape, bool),
                    np.zeros(shape, np.complex64), np.full(shape, "x"),
                    np.zeros(shape, object)):
        with pytest.raises(ValueError, match=f"latents must hold floating-point numbers .* got "
                                             f"{latents.dtype}"):
            pipe.generate("x", latents=latents, steps=1)
    a = pipe.generate("x", seed=np.int64(3), steps=2)
    b = pipe.generate("x", seed=3, steps=2)
    assert np.array_equal(a, b)


def test_generate_called_from_its_own_callback_raises_instead_of_hanging(exported_package):
    from edge.runtimes.python import Pipeline

    pipe = Pipeline.load(exported_package[0])
    inner = []

    def again(i, n):
        if not inner:
            with pytest.raises(RuntimeError, match="called while this thread runs generate"):
                pipe.generate("y", steps=1)
            inner.append(i)

    pipe.generate("x", steps=2, on_step=again)
    assert inner  # the callback ran and the outer generation finished


def test_a_budget_just_below_the_block_shows_the_difference():
    """Sizes that differ but would print alike are shown in bytes."""
    from edge.core.budget import BudgetError, check_budget

    block = int(45.5 * 2**20)
    with pytest.raises(BudgetError, match=r"memory budget 47,710,207 bytes is smaller than "
                                          r"block b \(47,710,208 bytes\)"):
        check_budget({"b": block}, block - 1)
    with pytest.raises(BudgetError, match=r"memory budget 40\.0 MiB is smaller than block b "
                                          r"\(45\.5 MiB\)"):
        check_budget({"b": block}, 40 << 20)


def test_notes_print_on_lines_of_their_own_above_the_progress_bar(exported_package, tmp_path):
    """A prompt longer than the model reads is said as a note, on its own line (not inside
    the progress bar's), and the video is still written."""
    out = tmp_path / "x.gif"
    res = runner.invoke(app, ["generate", str(exported_package[0]),
                              "a red circle moving left " * 6, "--steps", "2", "-o", str(out)])
    assert res.exit_code == 0, res.output
    notes = [line for line in res.output.splitlines() if "note: prompt" in line]
    assert len(notes) == 1 and notes[0].startswith("note: prompt"), res.output
    assert "is ignored" in notes[0] and out.is_file()


@pytest.mark.parametrize("make, message", [
    (os.mkfifo, "is a FIFO (named pipe); name a file to read"),
    (lambda p: None, "no such file"),
])
def test_latents_that_are_not_a_file_are_refused_not_read(exported_package, tmp_path, make,
                                                          message):
    """`edge record --latents FIFO` blocked for ever in np.load: in a process of its own, so
    a hang fails the test instead of holding the suite."""
    import subprocess

    latents = tmp_path / "latents.npy"
    make(latents)
    res = subprocess.run(
        [sys.executable, "-c", "from edge.commands import app; app()", "record",
         str(exported_package[0]), "a red circle", "-o", str(tmp_path / "b"), "--latents",
         str(latents)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and f"--latents {latents}: {message}" in res.stdout + res.stderr


def _component(m: dict, name: str) -> dict:
    return next(c for c in m["components"] if c["name"] == name)


def _decoder_frames(shape: list):
    return lambda m: _component(m, "vae_decoder")["blocks"][-1]["outputs"][0].__setitem__(
        "shape", shape)


@pytest.mark.parametrize("change, message", [
    (lambda m: m.__setitem__("components", []), "field 'components' is empty"),
    (lambda m: _component(m, "vae_decoder").__setitem__("blocks", []),
     "component vae_decoder: field 'blocks' is empty"),
    (lambda m: m.__setitem__("components", m["components"][:2]),
     "no component 'vae_decoder'"),
    (_decoder_frames(["batch", 3, 0, 32]), "the decoder's frames are 0x32; a frame side is"),
    (_decoder_frames(["batch", 3, 100000, 32]), "the decoder's frames are 100000x32"),
])
def test_generate_refuses_manifests_it_cannot_run_in_a_line(exported_package, tmp_path,
                                                             change, message):
    """Manifests the structural check passed crashed `generate` (an IndexError from no
    components or an empty decoder), or blamed --scale for the manifest's own frame size."""
    pkg = tmp_path / "pkg"
    shutil.copytree(exported_package[0], pkg)
    rewrite(pkg, change)
    out = refused(["generate", str(pkg), "a red circle", "-o", str(tmp_path / "v.gif")],
                  message)
    assert "--scale" not in out


def test_generate_takes_a_thread_count_for_shared_cores(exported_package, tmp_path,
                                                        monkeypatch):
    """`--threads` reaches every onnxruntime session the package opens (item 33: the
    runtime slowed 5-6x beside other busy processes, and generate had no way to say so)."""
    import edge.runtimes.python.pipeline as pipeline

    asked = []
    real = pipeline.session_options

    def counted(threads=None, spinning=False):
        asked.append((threads, spinning))
        return real(threads, spinning)

    monkeypatch.setattr(pipeline, "session_options", counted)
    res = runner.invoke(app, ["generate", str(exported_package[0]), "a red circle", "--steps",
                              "1", "--threads", "1", "-o", str(tmp_path / "v.gif")])
    assert res.exit_code == 0, res.output
    assert asked and set(asked) == {(1, False)}
    refused(["generate", "a red circle", "--threads", "2", "-o", str(tmp_path / "w.gif")],
            "--threads applies to exported packages")


def test_runtime_threads_wait_rather_than_spin_unless_asked(exported_package):
    """Every session the runtime opens has onnxruntime's spinning off (its idle threads took
    cores from the work beside other busy processes: item 33), and on where the caller asks
    for it; the thread count reaches each session."""
    from edge.runtimes.python import Pipeline

    key = "session.intra_op.allow_spinning"
    for spinning, threads, expected in ((False, None, "0"), (True, 1, "1")):
        pipe = Pipeline.load(exported_package[0], spinning=spinning, threads=threads)
        sessions = [s for c in pipe.components.values() for s in c.sessions.values()]
        assert sessions
        for session in sessions:
            options = session.get_session_options()
            assert options.get_session_config_entry(key) == expected
            assert options.intra_op_num_threads == (threads or 0)
