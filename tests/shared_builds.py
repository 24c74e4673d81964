"""Session builds made once a run, not once per pytest-xdist worker.

A session-scoped fixture runs in every worker that has a test asking for it, and the README's
test command runs two: each export the tests share (a family's ONNX, iPhone package) was
built twice whenever its tests landed on both workers. `built_once` keeps such a build in the
run's temp folder that both workers share, behind a file lock: the first worker to ask builds
it, the other waits on the lock (the build then has the machine's cores to itself) and reads
what was built. Only what is on disk is shared: each worker still loads its own models.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock

from edge.core.package import read_manifest

DONE = ".built"  # written last: a folder without it is a build that failed part way


def shared_root(tmp_path_factory) -> Path:
    """The temp folder every worker of this run sees: a worker's basetemp is a child of it
    (`popen-gwN`); without xdist the basetemp itself."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def built_once(tmp_path_factory, name: str, build: Callable[[Path], object]) -> Path:
    """`shared_root/name`, made by `build(folder)` in the first worker that asks."""
    folder = shared_root(tmp_path_factory) / "shared" / name
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):
        if not (folder / DONE).is_file():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            (folder / DONE).touch()
    return folder


def package_once(tmp_path_factory, name: str, export: Callable[[Path], object]):
    """A package `export(root)` writes, built once a run: (root, manifest as written)."""
    root = built_once(tmp_path_factory, name, lambda folder: export(folder / "pkg")) / "pkg"
    return root, read_manifest(root)
