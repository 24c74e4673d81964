"""Nothing lost at the last moment (the third probe's data-loss class): a video ffmpeg cannot
finish on a really full disk, a writer killed mid-write, a name too long for the file system,
and a package destination that changes while the package is written (a folder made there,
a second writer). docs/reliability.md, "The third probe", lists these tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from small_disk import fill, small_disk
from typer.testing import CliRunner

from edge.commands import app
from edge.core.files import OutputError, atomic_file
from edge.core.package import DestinationChanged, PackageWriteError, atomic_directory
from edge.core.video import write_video

runner = CliRunner()


def noise_video(frames: int, side: int) -> np.ndarray:
    """Random frames: every codec's worst case, so a few KiB of disk cannot hold them."""
    return np.random.default_rng(frames).integers(0, 255, (frames, side, side, 3), np.uint8)


@pytest.mark.parametrize("suffix", [".mp4", ".gif"])
def test_a_video_that_does_not_fit_the_disk_keeps_the_earlier_one(tmp_path, suffix):
    """ffmpeg fails at the MP4 trailer without imageio raising: the file is read back before
    it replaces anything, so the earlier video stays, byte for byte, and nothing is left."""
    with small_disk(tmp_path / "disk", 1024) as disk:
        path = write_video(disk / f"v{suffix}", noise_video(1, 16), scale=1)
        before = path.read_bytes()
        fill(disk, leave_kib=24)
        with pytest.raises(OutputError, match=rf"v\{suffix}: cannot write \(.*(No space left|"
                           r"does not read back).*nothing was written and an earlier file "
                           "there is untouched"):
            write_video(path, noise_video(16, 64), scale=4)
        assert path.read_bytes() == before
        assert sorted(p.name for p in disk.iterdir()) == ["filler", f"v{suffix}"]


def test_generate_on_a_full_disk_says_so_and_keeps_the_earlier_video(tmp_path):
    with small_disk(tmp_path / "disk", 2048) as disk:
        out = disk / "out.mp4"
        args = ["generate", "a red circle", "--steps", "1", "-o", str(out)]
        assert runner.invoke(app, args).exit_code == 0
        before = out.read_bytes()
        fill(disk, leave_kib=8)
        res = runner.invoke(app, [*args[:-2], "--seed", "7", "-o", str(out)])
        assert res.exit_code == 2 and "Traceback" not in res.output, res.output
        assert f"{out}: cannot write" in res.output and "wrote" not in res.output
        assert out.read_bytes() == before
        assert sorted(p.name for p in disk.iterdir()) == ["filler", "out.mp4"]


WRITER = textwrap.dedent("""
    import sys, time
    from edge.core.files import atomic_file
    with atomic_file(sys.argv[1]) as tmp:
        tmp.write_bytes(b"half a video")
        print(tmp, flush=True)
        time.sleep(120)
""")


def start_writer(path: Path) -> tuple[subprocess.Popen, Path]:
    """A process inside atomic_file(path), its temporary file written: (process, that file)."""
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE,
                            text=True)
    return proc, Path(proc.stdout.readline().strip())


def test_a_writer_killed_outright_leaves_nothing_the_next_write_keeps(tmp_path):
    """SIGKILL runs no cleanup: the temporary file stays until the next write to the same
    name removes it. One a live writer holds is left alone."""
    path = tmp_path / "v.gif"
    alive, held = start_writer(path)
    try:
        killed, left = start_writer(path)
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        assert left.is_file() and held.is_file() and left != held
        with atomic_file(path) as tmp:
            tmp.write_bytes(b"a whole video")
        assert not left.exists() and held.is_file()
        assert path.read_bytes() == b"a whole video"
    finally:
        alive.kill()
        alive.wait()


def test_a_name_too_long_for_the_file_system_is_refused_before_any_work(tmp_path):
    most = os.pathconf(tmp_path, "PC_NAME_MAX")
    long = tmp_path / ("v" * (most - 3) + ".gif")
    res = runner.invoke(app, ["generate", "a red circle", "-o", str(long)])
    assert res.exit_code == 2 and f"allows at most {most}" in res.output, res.output
    assert "Traceback" not in res.output and list(tmp_path.iterdir()) == []
    fits = tmp_path / ("v" * (most - 4) + ".gif")  # its temporary file's name is cut to fit
    with atomic_file(fits) as tmp:
        tmp.write_bytes(b"GIF89a")
    assert [p.name for p in tmp_path.iterdir()] == [fits.name]


def made_by_us(folder: Path) -> str:
    """An `identify` for atomic_directory: folders holding only `made-here` are ours."""
    if [p.name for p in folder.iterdir()] != ["made-here"]:
        raise PackageWriteError(f"{folder}: holds {sorted(p.name for p in folder.iterdir())}")
    return "a folder made here"


def test_a_folder_made_at_the_destination_meanwhile_is_kept_and_so_is_the_result(tmp_path):
    dest = tmp_path / "pkg"
    with pytest.raises(DestinationChanged, match=rf"{dest}: a folder appeared there while "
                       rf"this write ran; it was left as it is, and what this write made is "
                       rf"at {dest}-2"):
        with atomic_directory(dest) as tmp:
            (tmp / "weights.bin").write_bytes(b"hours of work")
            dest.mkdir()
            (dest / "notes.txt").write_text("mine")
    assert (dest / "notes.txt").read_text() == "mine" and len(list(dest.iterdir())) == 1
    assert (tmp_path / "pkg-2" / "weights.bin").read_bytes() == b"hours of work"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pkg", "pkg-2"]


def test_a_folder_edge_wrote_that_changed_meanwhile_is_kept(tmp_path):
    dest = tmp_path / "pkg"
    dest.mkdir()
    (dest / "made-here").write_text("")
    with pytest.raises(DestinationChanged, match=r"what is there changed .*notes\.txt"):
        with atomic_directory(dest, identify=made_by_us) as tmp:
            (tmp / "weights.bin").write_bytes(b"new")
            (dest / "notes.txt").write_text("mine")
    assert sorted(p.name for p in dest.iterdir()) == ["made-here", "notes.txt"]
    assert (tmp_path / "pkg-2" / "weights.bin").read_bytes() == b"new"
    with atomic_directory(dest / "inner", identify=made_by_us) as tmp:  # unchanged: replaced
        (tmp / "made-here").write_text("")
    with atomic_directory(dest / "inner", identify=made_by_us) as tmp:
        (tmp / "made-here").write_text("again")
    assert (dest / "inner" / "made-here").read_text() == "again"


def test_an_empty_folder_made_meanwhile_is_replaced(tmp_path):
    dest = tmp_path / "pkg"
    with atomic_directory(dest) as tmp:
        (tmp / "weights.bin").write_bytes(b"new")
        dest.mkdir()
    assert (dest / "weights.bin").read_bytes() == b"new"
    assert [p.name for p in tmp_path.iterdir()] == ["pkg"]


SECOND_WRITER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from edge.core.package import atomic_directory
    with atomic_directory(sys.argv[1]) as tmp:
        (tmp / "who").write_text("first")
        print("writing", flush=True)
        sys.stdin.readline()
""")


def test_a_second_writer_to_the_same_destination_is_refused_up_front(tmp_path):
    """Two writers to one `-o`: the second is refused before its work, the first's result
    lands whole; nothing vanishes."""
    dest = tmp_path / "pkg"
    first = subprocess.Popen([sys.executable, "-c", SECOND_WRITER, str(dest)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "writing"
        with pytest.raises(PackageWriteError, match=rf"{dest}: another edge process \(pid "
                           rf"{first.pid}\) is writing there.*nothing was changed"):
            with atomic_directory(dest) as tmp:
                pytest.fail(f"the second writer was let in ({tmp})")
        first.stdin.write("\n")
        first.stdin.flush()
        assert first.wait(timeout=60) == 0
    finally:
        first.kill()
    assert (dest / "who").read_text() == "first"
    assert [p.name for p in tmp_path.iterdir()] == ["pkg"]
