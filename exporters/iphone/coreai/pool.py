"""The Core AI exporter's child processes (exporters/iphone/coreai/worker.py), side by side.

Core AI's converter and runtime are beta native code that can end their process, so the
exporter runs them in workers; its interpreter runs a program on one core, so it runs one
worker a CPU, as memory allows (`worker_count`). Every worker gets the whole list of jobs
and takes the next one none has claimed (the worker's `claimed`): the long blocks do not
hold up the short ones behind them. The first job to fail, or the one a crashed worker held,
is named in an ExportValidationError; the other workers are stopped.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import psutil

from edge.core.files import EdgeNotice
from edge.exporters import ExportValidationError

WORKER_SECONDS = 3600   # one block's conversion and execution; a hang ends as an error
WORKER = Path(__file__).with_name("worker.py")
WORKER_PYTHON: str | None = None   # the interpreter the worker runs in (default: this one)
WORKERS: int | None = None   # workers side by side (default: `worker_count`'s choice)
WORKER_MEMORY_FACTOR, WORKER_BASE_BYTES = 5, 256 << 20   # a worker's memory, by its graphs
CRASH_RETRIES = 1   # tries more for the jobs a crashed worker left (run_worker)


def _crash_text(code: int) -> str:
    if code < 0:
        try:
            return f"ended by {signal.Signals(-code).name}"
        except ValueError:
            return f"ended by signal {-code}"
    return f"exited with status {code}"


def _die_with_parent(parent: int) -> None:
    """In the worker, before it starts: the system ends it (SIGKILL) when the exporter ends
    however it ends; an exporter killed outright (SIGKILL) left its workers converting for
    an hour. Linux's PR_SET_PDEATHSIG; elsewhere the worker watches its parent itself
    (worker.py `exit_with_parent`)."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGKILL)
        if os.getppid() != parent:  # the exporter ended before the request was made
            os._exit(1)


def worker_count(jobs: list[Path]) -> int:
    """How many workers run side by side: one a CPU (Core AI's interpreter runs on one),
    no more than the jobs, and as many as memory holds at WORKER_MEMORY_FACTOR times the
    largest job's saved graphs each (a Wan 1.3B transformer block's worker peaked at 1.6
    GiB: 4.3x its graphs' 372 MB)."""
    if WORKERS is not None:
        return WORKERS
    largest = max(sum(Path(f["program"]).stat().st_size for f in
                      json.loads(job.read_text())["functions"]) for job in jobs)
    by_memory = (psutil.virtual_memory().available
                 // (WORKER_MEMORY_FACTOR * largest + WORKER_BASE_BYTES))
    return max(1, min(len(jobs), len(os.sched_getaffinity(0)), by_memory))


def run_worker(jobs: list[Path], keys: list[str],
               on_done: Callable[[int], None] | None = None) -> list[dict]:
    """Convert and execute the blocks' jobs in child processes (`worker_count` side by side,
    each taking the next job none has claimed); the results of each, or an
    ExportValidationError naming the first block that failed and how (the converter's or
    runtime's message, or the crash). `on_done(i)`: job i has its results (in any order).
    Jobs left undone by a worker a signal ended are run once more (CRASH_RETRIES): the beta
    interpreter has aborted on a block it then ran (Wan 2.2's `vae_decoder/up_3`, SIGABRT,
    "C++ exception handling detected..."); a crash on the retry is the error."""
    found: list[dict | None] = [None] * len(jobs)
    for attempt in range(CRASH_RETRIES + 1):
        todo = [i for i, done in enumerate(found) if done is None]
        for i in todo:   # a crashed try's claims would keep the jobs from every worker
            jobs[i].with_name("claim").unlink(missing_ok=True)
        reported = on_done and functools.partial(_report_as, todo, on_done)
        try:
            for i, done in zip(todo, _run_workers([jobs[i] for i in todo],
                                                  [keys[i] for i in todo], reported),
                               strict=True):
                found[i] = done
            return found
        except _Crashed as crash:
            for i, done in zip(todo, crash.found, strict=True):
                found[i] = done
            if attempt == CRASH_RETRIES:
                raise crash.error from None
            warnings.warn(EdgeNotice(f"{crash.error}; running the blocks not done again"),
                          stacklevel=2)
    raise AssertionError("unreachable")


def _report_as(todo: list[int], on_done: Callable[[int], None], j: int) -> None:
    """A retry's job j done, reported by its place in the whole list."""
    on_done(todo[j])


class _Crashed(Exception):
    """A worker ended by a signal without writing its job's results (`error` says which
    job and how); `found`: the results the try did write."""

    def __init__(self, error: ExportValidationError, found: list[dict | None]) -> None:
        super().__init__(str(error))
        self.error, self.found = error, found


def _run_workers(jobs: list[Path], keys: list[str],
                 on_done: Callable[[int], None] | None) -> list[dict]:
    """One try of `run_worker`: _Crashed where a worker a signal ended left jobs undone."""
    # the worker is a script of its own (it imports nothing of the toolkit); -P: its folder
    # is not put on sys.path, where this module's name would hide Core AI's `coreai`
    results = [job.with_name("results.json") for job in jobs]
    with contextlib.ExitStack() as stack:
        stderrs = [stack.enter_context(tempfile.TemporaryFile(mode="w+"))
                   for _ in range(worker_count(jobs))]
        children = [subprocess.Popen([WORKER_PYTHON or sys.executable, "-P", str(WORKER),
                                      *map(str, jobs)], stdout=subprocess.DEVNULL,
                                     stderr=stderr,
                                     preexec_fn=functools.partial(_die_with_parent,
                                                                  os.getpid()))
                    for stderr in stderrs]
        try:
            _wait_for(children, results, keys, on_done)
        finally:
            for child in children:   # a failure or a crash ends the others' work
                if child.poll() is None:
                    child.kill()
                    child.wait()
        found = [json.loads(p.read_text()) if p.is_file() else None for p in results]
        failed = next((i for i, done in enumerate(found) if done and not done["ok"]), None)
        if failed is not None:
            done = found[failed]
            what = "cannot convert it" if done["stage"] == "convert" else "failed to run it"
            raise ExportValidationError(f"block {keys[failed]}: Core AI {what}: "
                                        f"{done['error']}")
        if None in found:
            error, signalled = _crash(children, stderrs, jobs, found, keys)
            if signalled:
                raise _Crashed(error, found)
            raise error
    return found


def _wait_for(children: list[subprocess.Popen], results: list[Path], keys: list[str],
              on_done: Callable[[int], None] | None) -> None:
    """Until every worker has ended, one has failed a job or crashed, or the time is up;
    `on_done(i)` as each job's results appear."""
    reported, started = set(), time.monotonic()
    while True:
        codes = [child.poll() for child in children]   # before the results: none missed
        failed = False
        for i, path in enumerate(results):
            if i not in reported and path.is_file():
                reported.add(i)
                failed = failed or not json.loads(path.read_text())["ok"]
                if on_done:
                    on_done(i)
        if failed or any(code not in (None, 0) for code in codes) or None not in codes:
            return
        if time.monotonic() - started > WORKER_SECONDS * len(results):
            block = keys[min(set(range(len(results))) - reported)]
            raise ExportValidationError(f"block {block}: Core AI's conversion and execution "
                                        f"ran past {WORKER_SECONDS} s a block")
        time.sleep(0.2)


def _crash(children: list[subprocess.Popen], stderrs: list, jobs: list[Path],
           found: list[dict | None], keys: list[str]) -> tuple[ExportValidationError, bool]:
    """The error for a worker that ended without writing a job's results: the job it had
    claimed (else the first without results), how it ended and its last words; and whether
    a signal ended it (a crash of native code, not an exit of its own)."""
    missing = [i for i, done in enumerate(found) if done is None]
    crashed = next((c for c in children if c.returncode not in (0, None, -signal.SIGKILL)),
                   children[0])
    index = next((i for i in missing if _claimant(jobs[i]) == crashed.pid), missing[0])
    stderr = stderrs[children.index(crashed)]
    stderr.seek(0)
    tail = " | ".join(stderr.read().strip().splitlines()[-3:])
    return (ExportValidationError(f"block {keys[index]}: Core AI's converter or runtime "
                                  f"{_crash_text(crashed.returncode)} (nothing written): "
                                  f"{tail}"), crashed.returncode < 0)


def _claimant(job: Path) -> int | None:
    """The pid of the worker that claimed `job` (exporters/iphone/coreai/worker.py `claimed`)."""
    try:
        return int(job.with_name("claim").read_text())
    except (OSError, ValueError):
        return None
