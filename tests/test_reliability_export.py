"""Hardening of package writing: Ctrl-C or SIGTERM at any point of a write leaves no partial
package and an earlier package at the destination intact (a write killed outright is cleaned
up by the next one); a full disk or an unwritable destination is a clear error; replacing a
package takes --force."""
import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import sigint_as_at_a_terminal
from small_disk import small_disk
from typer.testing import CliRunner

from edge.commands import app
from edge.core.files import EdgeNotice
from edge.core.package import FORMAT, MANIFEST, PackageWriteError, atomic_directory

runner = CliRunner()

# A writer through atomic_directory that stops at the named point, prints it and sleeps, so a
# test can signal it there. Only edge.core.package is imported: it starts in a fraction of a second.
WRITER = r"""
import json, os, sys, time
from pathlib import Path
import edge.core.package as package

dest, point = Path(sys.argv[1]), sys.argv[2]

def reach(name, wait=60.0):
    if name == point:
        print(name, flush=True)
        time.sleep(wait)

real_commit = package._commit
def commit(*args):
    reach("commit", wait=1.0)  # signals are held from here: the commit completes first
    real_commit(*args)
package._commit = commit

with package.atomic_directory(dest) as tmp:
    reach("started")
    for i in range(3):
        (tmp / "weights").mkdir(exist_ok=True)
        (tmp / "weights" / f"{i}.bin").write_bytes(bytes([i]) * 8192)
        reach(f"file {i}")
    (tmp / "manifest.json").write_text(json.dumps({"generation": "new"}))
    reach("manifest")
reach("after")
"""
POINTS = ["started", "file 0", "file 2", "manifest", "commit", "after"]


def old_package(dest: Path) -> dict:
    """An earlier package: a manifest that says it is edge's and lists its one file (a
    writer replaces nothing else)."""
    dest.mkdir(parents=True)
    (dest / "old.bin").write_bytes(b"old" * 1000)
    (dest / MANIFEST).write_text(json.dumps({
        "format": FORMAT, "generation": "old", "tokenizer": {"files": []}, "conditioning": {},
        "components": [], "files": [{"path": "old.bin", "bytes": 3000, "sha256": "0" * 64}]}))
    return snapshot(dest)


def snapshot(root: Path) -> dict:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


NEW = {"manifest.json": json.dumps({"generation": "new"}).encode(),
       **{f"weights/{i}.bin": bytes([i]) * 8192 for i in range(3)}}


def run_writer(dest: Path, point: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(dest), point],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[1],
                            preexec_fn=sigint_as_at_a_terminal)
    line = proc.stdout.readline().strip()
    assert line == point, (line, proc.stderr.read() if proc.poll() is not None else "")
    return proc


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("point", POINTS)
def test_interrupted_write_leaves_the_old_package_or_the_new_one_whole(tmp_path, sig, point):
    dest = tmp_path / "pkg"
    before = old_package(dest)
    proc = run_writer(dest, point)
    proc.send_signal(sig)
    rc = proc.wait(timeout=30)
    after = snapshot(dest)
    if point in ("commit", "after"):  # the commit had begun: it completes, whole
        assert after == NEW
    else:
        assert rc != 0 and after == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pkg"]  # no partial folder left


@pytest.mark.parametrize("point", ["file 0", "manifest"])
def test_killed_writer_is_cleaned_up_by_the_next_write(tmp_path, point):
    dest = tmp_path / "pkg"
    before = old_package(dest)
    proc = run_writer(dest, point)
    proc.kill()  # SIGKILL: no cleanup can run
    proc.wait(timeout=30)
    assert snapshot(dest) == before
    left = [p.name for p in tmp_path.iterdir() if p.name != "pkg"]
    assert len(left) == 1 and left[0].endswith(".partial")  # hidden, beside the destination
    with pytest.raises(RuntimeError), atomic_directory(dest):
        raise RuntimeError("the next write fails too")
    assert snapshot(dest) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pkg"]


def test_full_disk_is_a_clear_error_and_changes_nothing(tmp_path):
    dest = tmp_path / "pkg"
    before = old_package(dest)
    with pytest.raises(PackageWriteError, match=r"No space left on device \[ENOSPC\].*nothing "
                       r"was written and any earlier package there is untouched"):
        with atomic_directory(dest) as tmp:
            (tmp / "a.bin").write_bytes(b"x")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp / "b.bin"))
    assert snapshot(dest) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pkg"]


def test_destination_inside_a_file_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(PackageWriteError, match=r"cannot write the package.*\[E"):
        with atomic_directory(blocker / "pkg"):
            pass


def test_unwritable_destination_is_a_clear_error(tmp_path, monkeypatch):
    import tempfile

    def refuse(*a, **k):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), k.get("dir"))

    monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    with pytest.raises(PackageWriteError, match=r"Permission denied \[EACCES\]"):
        with atomic_directory(tmp_path / "pkg"):
            pass


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through folder permissions")
def test_read_only_folder_is_a_clear_error(tmp_path):
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o555)
    try:
        with pytest.raises(PackageWriteError, match=r"\[EACCES\]"):
            with atomic_directory(parent / "pkg"):
                pass
    finally:
        parent.chmod(0o755)


# --- the exporter and the command ------------------------------------------------------------

@pytest.fixture
def small_export(pipeline, monkeypatch):
    """`edge export` on the shipped model with only one small block (the transformer's
    epilogue) exported and no end to end check: the command's own path, in seconds."""
    import edge.commands.common as common
    import edge.exporters.onnx.package as onnx

    monkeypatch.setattr(common, "load_reference_pipeline", lambda weights: pipeline)
    real = onnx.export_onnx

    def one_block(pipe, dest, components=None, validate_end_to_end=None, **kw):
        last = {"transformer": components["transformer"][-1:]}
        manifest = real(pipe, dest, components=last, validate_end_to_end=None, **kw)
        return manifest | {"validation": {"psnr_db": None}}  # what the command prints

    monkeypatch.setattr(onnx, "export_onnx", one_block)


def test_replacing_a_package_needs_force(exported_package, tmp_path, monkeypatch):
    import edge.families as families

    dest = tmp_path / "pkg"
    shutil.copytree(exported_package[0], dest)
    before = snapshot(dest)
    monkeypatch.setattr(families, "load_model",
                        lambda *a, **k: pytest.fail("checked after loading"))
    res = runner.invoke(app, ["export", "-o", str(dest)])
    assert res.exit_code == 2 and "pass --force to replace it" in res.output
    assert snapshot(dest) == before


@pytest.mark.parametrize("make, message", [
    (lambda p: (p.mkdir(), (p / "notes.txt").write_text("mine")),
     "holds files but no edge manifest (manifest.json is missing)"),
    (lambda p: p.write_text("a file"), "exists and is a file, not a folder edge wrote"),
])
def test_force_never_replaces_something_that_is_not_a_package(tmp_path, make, message):
    dest = tmp_path / "dest"
    make(dest)
    res = runner.invoke(app, ["export", "-o", str(dest), "--force"])
    assert res.exit_code == 2 and message in res.output
    assert dest.exists()


def test_force_replaces_a_package(exported_package, tmp_path, small_export):
    dest = tmp_path / "pkg"
    shutil.copytree(exported_package[0], dest)
    res = runner.invoke(app, ["export", "-o", str(dest), "--force"])
    assert res.exit_code == 0, res.output
    manifest = json.loads((dest / MANIFEST).read_text())
    assert [b["name"] for c in manifest["components"] for b in c["blocks"]] == ["epilogue"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pkg"]


def test_full_disk_during_export_is_a_clear_error(exported_package, tmp_path, small_export,
                                                  monkeypatch):
    import edge.exporters.onnx.package as onnx

    def no_space(block, root, validated=None):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(root / "weights"))

    monkeypatch.setattr(onnx, "export_block", no_space)
    dest = tmp_path / "pkg"
    shutil.copytree(exported_package[0], dest)
    before = snapshot(dest)
    res = runner.invoke(app, ["export", "-o", str(dest), "--force"])
    assert res.exit_code == 2, res.output
    assert "No space left on device [ENOSPC]" in res.output and "untouched" in res.output
    assert snapshot(dest) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pkg"]


def test_sigterm_during_a_real_export_keeps_the_old_package(exported_package, tmp_path):
    """`edge export --force` in its own process, stopped once the first block's graph is
    written: the package at the destination is the earlier one, nothing else is left, and
    the command says it was stopped (it exited without a word, item 26)."""
    dest = tmp_path / "pkg"
    shutil.copytree(exported_package[0], dest)
    before = snapshot(dest)
    proc = subprocess.Popen([sys.executable, "-c", "from edge.commands import main; main()",
                             "export", "-o", str(dest), "--force"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            cwd=Path(__file__).resolve().parents[1],
                            preexec_fn=sigint_as_at_a_terminal)
    try:
        deadline = time.monotonic() + 240
        while not list(tmp_path.glob(".pkg.*.partial/graphs/*/*.onnx")):
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the export wrote no graph in time"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        code, err = proc.wait(timeout=60), proc.stderr.read().decode()
        assert code == 143, err[-3000:]  # the shell's status for SIGTERM, and a line
        assert "stopped by SIGTERM before it finished" in err
    finally:
        proc.kill()
        proc.wait()
    assert snapshot(dest) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pkg"]


# --- the second probe: what --force may delete, mount points, leftovers of killed writers ----

@pytest.mark.parametrize("name", ["__MACOSX/thesis.txt", ".Trashes/notes.txt",
                                  "._important.csv", "desktop.ini", "Thumbs.db",
                                  "weights/.directory"])
def test_replacing_keeps_every_file_a_person_could_have_written(tmp_path, name):
    """Files that look like operating-system noise may hold someone's work: a folder holding
    one is not replaced (the refusal names it); only a .DS_Store may go with the package."""
    dest = tmp_path / "pkg"
    old_package(dest)
    (dest / name).parent.mkdir(parents=True, exist_ok=True)
    (dest / name).write_text("mine")
    before = snapshot(dest)
    with pytest.raises(PackageWriteError, match=re.escape(f"does not list ({name})")):
        with atomic_directory(dest) as tmp:
            (tmp / "new.bin").write_bytes(b"new")
    assert snapshot(dest) == before


def test_a_desktop_folder_cache_goes_with_the_package(tmp_path):
    dest = tmp_path / "pkg"
    old_package(dest)
    (dest / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    with atomic_directory(dest) as tmp:
        (tmp / "new.bin").write_bytes(b"new")
    assert snapshot(dest) == {"new.bin": b"new"}


def test_a_mount_point_is_refused_before_any_work(tmp_path, monkeypatch):
    """Nothing can be renamed onto a mount point (EBUSY): a package is not written there at
    all, and the refusal says to write into a folder inside it."""
    dest = tmp_path / "mnt"
    dest.mkdir()
    real = os.path.ismount
    monkeypatch.setattr(os.path, "ismount", lambda p: Path(p) == dest or real(p))
    started = []
    with pytest.raises(PackageWriteError, match=r"is a mount point.*write to a folder inside "
                                                r"it, e\.g\. .*mnt/package"):
        with atomic_directory(dest):
            started.append(True)
    assert not started and sorted(p.name for p in tmp_path.iterdir()) == ["mnt"]


def test_leftovers_of_killed_writers_are_cleaned_and_named(tmp_path):
    """A writer killed outright leaves its hidden partial folder; the next write anywhere in
    that folder removes it and says so, even when the dead writer's PID now belongs to a
    running process (the writer's lock, not its PID, tells)."""
    alive = run_writer(tmp_path / "busy", "file 0")  # a writer still at work: left alone
    try:
        proc = run_writer(tmp_path / "other", "file 0")
        proc.kill()
        proc.wait(timeout=30)
        (left,) = tmp_path.glob(".other.*.partial")
        reused = left.with_name(f".other.{os.getpid()}.{left.name.split('.')[-2]}.partial")
        left.rename(reused)  # as if the PID were reused: this very process is alive
        with pytest.warns(EdgeNotice, match=re.escape(f"removed {reused}, left by an earlier "
                                                      "write that was killed")):
            with atomic_directory(tmp_path / "pkg") as tmp:
                (tmp / "a.bin").write_bytes(b"a")
        names = sorted(p.name for p in tmp_path.iterdir())
        assert "pkg" in names and reused.name not in names
        assert any(n.startswith(".busy.") and n.endswith(".partial") for n in names)
    finally:
        alive.kill()
        alive.wait(timeout=30)


@pytest.mark.parametrize("wrapped", [
    shutil.Error([("a", "b", "[Errno 28] No space left on device")]),      # copytree (iphone)
    RuntimeError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, '
                 'message: "No space left on device" })'),                    # safetensors
], ids=["shutil", "safetensors"])
def test_a_full_disk_is_the_clean_error_whichever_library_wrote(tmp_path, wrapped):
    """Libraries wrap the system's error in their own (a list of failed copies, a Rust io
    error): a full disk is still named as one, nothing left behind."""
    dest = tmp_path / "pkg"
    before = old_package(dest)
    with pytest.raises(PackageWriteError, match=r"No space left on device \[ENOSPC\]"):
        with atomic_directory(dest) as tmp:
            (tmp / "a.bin").write_bytes(b"x")
            raise wrapped
    assert snapshot(dest) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pkg"]


@pytest.fixture
def tiny_temporary_folder(tmp_path):
    """A 64 KiB tmpfs, as a full TMPDIR; skipped where this process cannot mount one."""
    with small_disk(tmp_path / "tmpfs", 64) as folder:
        yield folder


def test_a_full_temporary_folder_is_not_blamed_on_the_model(tiny_temporary_folder, tmp_path,
                                                             monkeypatch):
    """coremltools writes each program's weights under TMPDIR first: a full one is named as
    the folder and its free space, not as "CoreML cannot take" the model; nothing written."""
    import tempfile

    pytest.importorskip("coremltools", reason="the iphone target's converter (test extras)")
    monkeypatch.setattr(tempfile, "tempdir", str(tiny_temporary_folder))
    dest = tmp_path / "pkg"
    res = CliRunner().invoke(app, ["export", "--target", "iphone", "-o", str(dest)])
    assert res.exit_code != 0
    assert (f"{tiny_temporary_folder}: coremltools could not write block text_encoder/"
            "embeddings's temporary model files there" in res.output), res.output
    assert "point TMPDIR at a folder with room" in res.output
    assert "cannot take it" not in res.output
    assert not dest.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["tmpfs"]
