"""The block loader: owns the memory that block weights occupy, under a hard byte budget.

- Pins what fits (blocks used every denoising step first), streams the rest: a streamed block
  is read from storage when needed and freed right after it ran.
- Prefetch: a background thread reads the next blocks of the schedule while the current one
  computes, as far as the budget allows (a read waits for bytes to be freed, never exceeds).
- Reads are one large read per block file into an aligned buffer; with `cold_reads` the page
  cache is bypassed (O_DIRECT where the file system allows it, else posix_fadvise DONTNEED
  after each read) so the figures measure storage, not memory.
- Counts bytes read, read time, time compute waited, and the most bytes it ever held.
"""

from __future__ import annotations

import mmap
import os
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

PAGE = 4096


@dataclass(frozen=True)
class BlockWeights:
    """Where one block's weights live: a file and the tensors inside it."""

    key: str                  # "component/block"
    path: Path
    nbytes: int               # file size (page-padded)
    tensors: tuple[dict, ...]  # {"name", "dtype", "shape", "offset", "bytes"}


@dataclass
class LoaderStats:
    bytes_read: int = 0
    reads: int = 0
    read_s: float = 0.0            # time spent inside reads (any thread)
    wait_s: float = 0.0            # time compute waited for a block
    peak_held_bytes: int = 0

    def as_dict(self) -> dict:
        return {"bytes_read": self.bytes_read, "reads": self.reads,
                "read_s": round(self.read_s, 4), "io_wait_s": round(self.wait_s, 4),
                "peak_held_bytes": self.peak_held_bytes,
                "read_bandwidth_bytes_per_s": (self.bytes_read / self.read_s
                                               if self.read_s else None)}


class BudgetError(ValueError):
    pass


def parse_size(text: str | int | None) -> int | None:
    """'64MB', '1.5GiB', '512k', 1000 -> bytes (powers of 1024 for every unit)."""
    if text is None or isinstance(text, int):
        return text
    s = text.strip().upper().removesuffix("B").removesuffix("I")
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    factor = units.get(s[-1:], 1)
    number = s[:-1] if s[-1:] in units else s
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"memory size {text!r} not understood; use e.g. 64MB or 1.5GB") from None
    if value <= 0:
        raise ValueError(f"memory size {text!r} must be positive")
    return int(value * factor)


def format_size(n: int) -> str:
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f:
            return f"{n / f:.1f} {unit}"
    return f"{n} B"


def check_budget(sizes: dict[str, int], budget: int | None) -> None:
    """Refuse, before anything runs, a budget that cannot hold the largest block."""
    key = max(sizes, key=sizes.get)
    if budget is not None and budget < sizes[key]:
        raise BudgetError(
            f"memory budget {format_size(budget)} is smaller than block {key} "
            f"({format_size(sizes[key])}); the smallest budget that works is "
            f"{format_size(sizes[key])} ({sizes[key]} bytes)")


def plan_pins(sizes: dict[str, int], budget: int | None, every_step: tuple[str, ...] = (),
              prefetch: int = 1) -> set[str]:
    """The blocks kept in memory once loaded. Pinning must leave room to stream the largest
    remaining block plus one prefetched block; blocks run every step are considered first,
    in execution order, then the rest."""
    check_budget(sizes, budget)
    if budget is None:
        return set(sizes)
    order = list(every_step) + [k for k in sizes if k not in every_step]
    pinned: set[str] = set()
    for key in order:
        trial = pinned | {key}
        streamed = sorted((n for k, n in sizes.items() if k not in trial), reverse=True)
        reserve = sum(streamed[:1 + min(prefetch, 1)])
        if sum(sizes[k] for k in trial) + reserve <= budget:
            pinned = trial
    return pinned


class _ByteBudget:
    """A counting semaphore in bytes: acquire blocks until the bytes fit."""

    def __init__(self, limit: int | None) -> None:
        self.limit, self.held, self.peak = limit, 0, 0
        self._cv = threading.Condition()

    def acquire(self, n: int) -> None:
        with self._cv:
            while self.limit is not None and self.held + n > self.limit:
                self._cv.wait()
            self.held += n
            self.peak = max(self.peak, self.held)

    def release(self, n: int) -> None:
        with self._cv:
            self.held -= n
            self._cv.notify_all()


def _aligned_buffer(nbytes: int) -> memoryview:
    """Page-aligned, page-sized writable memory (anonymous mmap), as O_DIRECT requires."""
    return memoryview(mmap.mmap(-1, max(PAGE, (nbytes + PAGE - 1) // PAGE * PAGE)))


def read_file(path: Path, nbytes: int, cold: bool) -> memoryview:
    """One block file into fresh aligned memory, in a few large reads."""
    buf = _aligned_buffer(nbytes)
    flags = os.O_RDONLY
    direct = cold and hasattr(os, "O_DIRECT")
    try:
        fd = os.open(path, flags | (os.O_DIRECT if direct else 0))
    except OSError:  # file system without O_DIRECT (tmpfs): fall back to fadvise
        direct = False
        fd = os.open(path, flags)
    try:
        done = 0
        while done < nbytes:
            n = os.readv(fd, [buf[done:]])
            if n == 0:
                raise OSError(f"{path}: ended after {done} of {nbytes} bytes")
            done += n
        if cold and not direct and hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return buf


def tensors_from(buf: memoryview, spec: BlockWeights) -> dict[str, np.ndarray]:
    return {t["name"]: np.frombuffer(buf, dtype=t["dtype"], count=int(np.prod(t["shape"])),
                                     offset=t["offset"]).reshape(t["shape"])
            for t in spec.tensors}


@dataclass
class _Loaded:
    weights: dict[str, np.ndarray]
    nbytes: int
    pinned: bool


@dataclass
class BlockLoader:
    blocks: dict[str, BlockWeights]
    budget: int | None = None          # bytes; None: no limit (everything pinned)
    every_step: tuple[str, ...] = ()   # keys run every denoising step: pinned first
    prefetch: int = 1                  # blocks read ahead of the one computing (0: naive)
    cold_reads: bool = False
    pin: bool = True                   # False: stream every block, pin nothing (naive)
    stats: LoaderStats = field(default_factory=LoaderStats)

    def __post_init__(self) -> None:
        self.pinned = self.plan_pins()
        self._budget = _ByteBudget(self.budget)
        self._resident: dict[str, _Loaded] = {}
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edge-prefetch")

    def plan_pins(self) -> set[str]:
        sizes = {k: b.nbytes for k, b in self.blocks.items()}
        if not self.pin:
            check_budget(sizes, self.budget)
            return set()
        return plan_pins(sizes, self.budget, self.every_step, self.prefetch)

    def _load(self, key: str) -> _Loaded:
        spec = self.blocks[key]
        self._budget.acquire(spec.nbytes)
        started = time.perf_counter()
        buf = read_file(spec.path, spec.nbytes, self.cold_reads)
        self.stats.read_s += time.perf_counter() - started
        self.stats.bytes_read += spec.nbytes
        self.stats.reads += 1
        return _Loaded(tensors_from(buf, spec), spec.nbytes, key in self.pinned)

    def run(self, schedule: Iterable[str]) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
        """Yield (key, weights) for each key in `schedule`, in order. Streamed blocks are
        freed when the consumer asks for the next one."""
        schedule = list(schedule)
        first_use = {}
        for i, key in enumerate(schedule):
            first_use.setdefault(key, i)
        futures: dict[int, Future] = {}

        def needs_read(i: int) -> bool:
            key = schedule[i]
            # a pinned block is read once, at its first use, and stays resident
            return key not in self._resident and (key not in self.pinned or first_use[key] == i)

        def ensure_submitted(i: int) -> None:
            if i < len(schedule) and i not in futures and needs_read(i):
                futures[i] = self._pool.submit(self._load, schedule[i])

        held: _Loaded | None = None  # the streamed block the consumer is using
        try:
            for i, key in enumerate(schedule):
                ensure_submitted(i)
                for ahead in range(1, self.prefetch + 1):  # overlap reads with compute
                    ensure_submitted(i + ahead)
                if i in futures:
                    started = time.perf_counter()
                    loaded = futures.pop(i).result()
                    self.stats.wait_s += time.perf_counter() - started
                    if loaded.pinned:
                        self._resident[key] = loaded
                else:
                    loaded = self._resident[key]
                self.stats.peak_held_bytes = max(self.stats.peak_held_bytes, self._budget.peak)
                held = None if loaded.pinned else loaded
                yield key, loaded.weights
                del loaded
                if held is not None:
                    self._budget.release(held.nbytes)
                    held = None
        finally:  # the consumer stopped early: give back what it held and what was read ahead
            if held is not None:
                self._budget.release(held.nbytes)
            for f in futures.values():
                self._budget.release(f.result().nbytes)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for loaded in self._resident.values():
            self._budget.release(loaded.nbytes)
        self._resident.clear()
