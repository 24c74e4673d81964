"""A real small file system for tests of a full disk: a tmpfs of a few KiB mounted on a
test's folder. Mounting needs root with CAP_SYS_ADMIN; where this process has neither the
test is skipped, saying so."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def small_disk(folder: Path, kib: int) -> Iterator[Path]:
    folder.mkdir(exist_ok=True)
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs",
                                  str(folder)], capture_output=True, text=True)
    except FileNotFoundError:
        pytest.skip("a full disk is a small tmpfs, and this machine has no `mount` command")
    if mounted.returncode != 0:
        pytest.skip(f"a full disk is a {kib} KiB tmpfs, and mounting one needs root with "
                    f"CAP_SYS_ADMIN; mount said: {mounted.stderr.strip()[:200]}")
    try:
        yield folder
    finally:  # lazily: a library may hold a file there until collected
        subprocess.run(["umount", "--lazy", str(folder)], capture_output=True)


def fill(folder: Path, leave_kib: int) -> None:
    """Fill `folder`'s file system up to `leave_kib` KiB of free space."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as out:  # unbuffered: nothing left to flush
        try:
            while True:
                out.write(b"\0" * 4096)
        except OSError as err:
            assert err.errno == errno.ENOSPC, err
    stats = os.statvfs(folder)
    free = stats.f_bavail * stats.f_frsize
    os.truncate(filler, max(0, filler.stat().st_size + free - leave_kib * 1024))
