"""The block loader: owns the memory that block weights occupy, under a hard byte budget.

- Pins what fits (blocks used every denoising step first), streams the rest: a streamed block
  is read from storage when needed and freed right after it ran; a block that recurs in a
  schedule run with `keep_recurring` (a chunked component's, once per piece) is kept until
  its last use there where the budget has room.
- Prefetch: a background thread reads the next blocks of the schedule while the current one
  computes, as far as the budget allows (a read waits for bytes to be freed, never exceeds).
- Reads are one large read per block file into an aligned buffer; with `cold_reads` the page
  cache is bypassed (O_DIRECT where the file system allows it, else posix_fadvise DONTNEED
  after each read) so the figures measure storage, not memory.
- Buffers are recycled (`BufferPool`): made and faulted in once, reused by later reads of a
  block of the same size, and counted against the budget whether in use or free. Blocks are
  handed out as NumPy views of their buffer (no copy); a buffer returns to the pool only
  when the last view of it is gone.
- Counts bytes read, read time, time compute waited, and the most bytes it ever held.
- A block whose program holds its own weights (a Core AI model) is planned with its bytes,
  so a budget under it is refused as for any block, but never read.
"""

from __future__ import annotations

import errno
import mmap
import os
import stat
import threading
import time
import weakref
from collections import Counter
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edge.core.budget import check_budget, fill_budget, plan_pins
from edge.core.manifest_schema import fed_as
from edge.core.package import FileIdentity, PackageError, check_unchanged

PAGE = 4096


@dataclass(frozen=True)
class BlockWeights:
    """Where one block's weights live: a file and the tensors inside it."""

    key: str                  # "component/block"
    path: Path
    nbytes: int               # file size (page-padded)
    tensors: tuple[dict, ...]  # {"name", "dtype", "shape", "offset", "bytes"}
    identity: FileIdentity | None = None  # the file as verified; a read of another is refused
    # a web package's weights file split in pieces (`weights.shards`): each (path, bytes,
    # identity), read back to back into one buffer (`path` is the first); () for one file
    shards: tuple[tuple[Path, int, FileIdentity | None], ...] = ()
    # the block's program holds its weights (a Core AI model maps its own): planned with its
    # bytes like any block, never read (reading it would hold a copy nothing uses)
    held_by_program: bool = False

    @classmethod
    def of_block(cls, key: str, path: Path, block: dict,
                 identity: FileIdentity | None = None,
                 shards: tuple[tuple[Path, int, FileIdentity | None], ...] = (),
                 held_by_program: bool = False) -> BlockWeights:
        """The weights a manifest block record lists, in the file at `path` (resolved by the
        caller inside its package), or in `shards` (resolved likewise) where it is split."""
        size = sum(n for _, n, _ in shards) if shards else path.stat().st_size
        return cls(key, path, size, tuple(block["weights"]["tensors"]), identity, shards,
                   held_by_program)

    def pieces(self) -> tuple[tuple[Path, int, FileIdentity | None], ...]:
        return self.shards or ((self.path, self.nbytes, self.identity),)


@dataclass
class LoaderStats:
    bytes_read: int = 0
    reads: int = 0
    read_s: float = 0.0            # time spent inside reads (any thread)
    wait_s: float = 0.0            # time compute waited for a block
    peak_held_bytes: int = 0       # most bytes of buffers held at once (in use or free)
    buffers_made: int = 0          # aligned buffers allocated (and faulted in)
    buffers_reused: int = 0        # reads into a recycled buffer
    buffers_abandoned: int = 0     # kept by a consumer past their block: no longer counted

    def as_dict(self) -> dict:
        return {"bytes_read": self.bytes_read, "reads": self.reads,
                "buffers_made": self.buffers_made, "buffers_reused": self.buffers_reused,
                "read_s": round(self.read_s, 4), "io_wait_s": round(self.wait_s, 4),
                "peak_held_bytes": self.peak_held_bytes,
                "read_bandwidth_bytes_per_s": (self.bytes_read / self.read_s
                                               if self.read_s else None)}


def _page_round(nbytes: int) -> int:
    return max(PAGE, (nbytes + PAGE - 1) // PAGE * PAGE)


def _aligned_buffer(nbytes: int) -> mmap.mmap:
    """Page-aligned, page-sized writable memory (anonymous mmap, as O_DIRECT requires), faulted
    in now: the kernel zeroes a buffer once, when it is made, not during the reads that run
    beside compute. Huge pages where the kernel offers them (fewer faults and TLB misses)."""
    size = _page_round(nbytes)
    buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(buf, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
        buf.madvise(mmap.MADV_HUGEPAGE)
    np.frombuffer(buf, np.uint8)[::PAGE] = 0  # touch every page
    return buf


@dataclass
class _Lent:
    buffer: mmap.mmap
    views: weakref.ref          # the array every view of the buffer derives from
    retired: bool = False       # the loader has let go of the block
    abandoned: bool = False     # no longer counted: returns to the garbage collector


class BufferPool:
    """Recycles aligned, pre-faulted buffers between block reads under a byte limit that
    counts every buffer it keeps, in use or free, so the limit bounds the memory it holds.

    A buffer handed out is lent against one NumPy array (`lend`): it comes back to the pool
    when that array and every view of it are gone, never earlier, so a recycled buffer is
    never overwritten under a reader. A buffer is reused only for a block of exactly its
    (page-rounded) size, so a pinned block never sits in a larger buffer; streamed blocks of
    one size (a model's pairs) cycle through the same few buffers. When a new size does not
    fit, free buffers are unmapped first; when only buffers in use remain, `acquire` waits."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.kept = 0       # bytes of every buffer the pool counts (in use + free)
        self.in_use = 0     # bytes of buffers handed out
        self.peak = 0       # high-water mark of `kept`
        self.made = self.reused = self.unmapped = self.abandoned = 0
        self.waiting = 0    # threads inside `acquire` waiting for bytes
        self._free: list[mmap.mmap] = []
        self._lent: dict[int, _Lent] = {}
        self._cv = threading.Condition()

    def acquire(self, nbytes: int) -> mmap.mmap:
        size = _page_round(nbytes)
        with self._cv:
            while True:
                for i, buf in enumerate(self._free):
                    if len(buf) == size:
                        self.in_use += size
                        self.reused += 1
                        return self._free.pop(i)
                while self._free and not self._fits(size):
                    self._unmap(self._free.pop(0))
                if self._fits(size):
                    self.kept += size
                    self.in_use += size
                    self.peak = max(self.peak, self.kept)
                    self.made += 1
                    break
                self.waiting += 1
                self._cv.wait()
                self.waiting -= 1
        try:  # faulting the pages in takes a while: outside the lock
            return _aligned_buffer(size)
        except BaseException:
            self._uncount(size)
            raise

    def lend(self, buf: mmap.mmap, views: np.ndarray) -> None:
        """`buf` comes back to the pool when `views` (and so every view of it) is gone."""
        key = id(buf)
        with self._cv:
            self._lent[key] = _Lent(buf, weakref.ref(views, lambda _: self._views_gone(key)))

    def retire(self, buf: mmap.mmap) -> None:
        """The loader has let go of `buf`'s block; the consumer may still hold views."""
        with self._cv:
            if id(buf) in self._lent:
                self._lent[id(buf)].retired = True

    def abandon_retired(self) -> int:
        """Stop counting buffers whose blocks the loader let go but whose views someone still
        holds: that someone is waiting on this pool, so they would never come back. They are
        left to the garbage collector; returns how many."""
        with self._cv:
            stuck = [lent for lent in self._lent.values() if lent.retired and not lent.abandoned]
            for lent in stuck:
                lent.abandoned = True
                self.abandoned += 1
                self.kept -= len(lent.buffer)
                self.in_use -= len(lent.buffer)
            if stuck:
                self._cv.notify_all()
            return len(stuck)

    def give_back(self, buf: mmap.mmap) -> None:
        """Return a buffer that was never lent (e.g. its read failed)."""
        with self._cv:
            self.in_use -= len(buf)
            self._free.append(buf)
            self._cv.notify_all()

    def clear(self) -> None:
        """Unmap every free buffer."""
        with self._cv:
            while self._free:
                self._unmap(self._free.pop())
            self._cv.notify_all()

    def _views_gone(self, key: int) -> None:
        with self._cv:
            lent = self._lent.pop(key, None)
            if lent is None or lent.abandoned:
                return
            self.in_use -= len(lent.buffer)
            self._free.append(lent.buffer)
            self._cv.notify_all()

    def _fits(self, size: int) -> bool:
        return self.limit is None or self.kept + size <= self.limit

    def _unmap(self, buf: mmap.mmap) -> None:
        self.kept -= len(buf)
        self.unmapped += 1
        try:
            buf.close()
        except BufferError:  # a view is being torn down right now: the collector unmaps it
            pass

    def _uncount(self, size: int) -> None:
        with self._cv:
            self.kept -= size
            self.in_use -= size
            self._cv.notify_all()


def _open_verified(path: Path, cold: bool, identity: FileIdentity | None) -> tuple[int, bool]:
    """An open descriptor of `path` (O_DIRECT where the file system takes it, for a cold
    read) and whether it is direct, once the file is seen to be the regular file verified:
    a FIFO would block the read for ever, and a file moved, truncated or replaced since the
    package was verified is refused (PackageError naming it) before a byte is read."""
    flags = os.O_RDONLY | os.O_NONBLOCK  # opening a FIFO must not wait for a writer
    direct = cold and hasattr(os, "O_DIRECT")
    try:
        try:
            fd = os.open(path, flags | (os.O_DIRECT if direct else 0))
        except OSError as err:
            if not direct or err.errno != errno.EINVAL:
                raise
            direct = False  # file system without O_DIRECT (tmpfs): fall back to fadvise
            fd = os.open(path, flags)
    except FileNotFoundError:
        raise PackageError(f"{path}: gone since the package was verified (moved or deleted); "
                           "load the package again") from None
    except OSError as err:
        raise PackageError(f"{path}: cannot be opened any more ({err.strerror}); load the "
                           "package again") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise PackageError(f"{path}: is {kind} now, not the file the package verified; load "
                           "the package again")
    try:
        check_unchanged(path, st, identity)  # truncated or replaced: before reading
    except PackageError:
        os.close(fd)
        raise
    os.set_blocking(fd, True)
    return fd, direct


def read_file(path: Path, nbytes: int, cold: bool,
              into: mmap.mmap | memoryview | None = None,
              identity: FileIdentity | None = None) -> memoryview:
    """One block file into aligned memory (`into`, else a fresh buffer; a view into a larger
    one for a shard), in one large read; refused (PackageError) if the file is no longer the
    one verified (`identity`)."""
    buf = memoryview(into if into is not None else _aligned_buffer(nbytes))
    fd, direct = _open_verified(path, cold, identity)
    try:
        done, end = 0, _page_round(nbytes)
        while done < nbytes:
            n = os.readv(fd, [buf[done:end]])
            if n == 0:
                raise PackageError(f"{path}: ended after {done} of {nbytes} bytes (truncated "
                                   "since the package was verified); load the package again")
            done += n
        if cold and not direct and hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        check_unchanged(path, os.fstat(fd), identity)  # after the read: covers it too
    finally:
        os.close(fd)
    return buf


def _views(buf: memoryview | mmap.mmap, spec: BlockWeights) -> tuple[np.ndarray,
                                                                     dict[str, np.ndarray]]:
    """One flat array over `buf` and each tensor as a view of it (no copy), as it is fed
    (an int4 tensor as its packed bytes)."""
    flat = np.frombuffer(buf, np.uint8)
    views = {}
    for t in spec.tensors:
        dtype, shape = fed_as(t)
        views[t["name"]] = flat[t["offset"]:t["offset"] + t["bytes"]].view(dtype).reshape(shape)
    return flat, views


def tensors_from(buf: memoryview | mmap.mmap, spec: BlockWeights) -> dict[str, np.ndarray]:
    """NumPy views of a block's tensors inside `buf` (no copy)."""
    return _views(buf, spec)[1]


@dataclass
class _Loaded:
    weights: dict[str, np.ndarray]
    buffer: mmap.mmap | None  # None: a block whose program holds its weights
    pinned: bool

    def release_to(self, pool: BufferPool) -> None:
        """Drop the loader's views; the buffer returns once the consumer's are gone too."""
        self.weights = {}
        if self.buffer is not None:
            pool.retire(self.buffer)


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
        self.buffers = BufferPool(self.budget)  # every byte of block weights lives in these
        self._resident: dict[str, _Loaded] = {}
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edge-prefetch")

    def plan_pins(self) -> set[str]:
        sizes = {k: b.nbytes for k, b in self.blocks.items()}
        if not self.pin:
            check_budget(sizes, self.budget)
            return set()
        return plan_pins(sizes, self.budget, self.every_step, self.prefetch)

    def _load(self, key: str) -> _Loaded:
        spec = self.blocks[key]
        if spec.held_by_program:  # nothing to feed: the program maps its weights itself
            return _Loaded({}, None, key in self.pinned)
        buffer = self.buffers.acquire(spec.nbytes)
        try:
            started = time.perf_counter()
            view = memoryview(buffer)
            at = 0
            for path, nbytes, identity in spec.pieces():  # shards end page-aligned but the last
                with view[at:] as piece:
                    read_file(path, nbytes, self.cold_reads, into=piece,
                              identity=identity).release()
                at += nbytes
            self.stats.read_s += time.perf_counter() - started
            flat, weights = _views(view, spec)
            view.release()
        except BaseException:
            self.buffers.give_back(buffer)
            raise
        self.buffers.lend(buffer, flat)
        self.stats.bytes_read += spec.nbytes
        self.stats.reads += 1
        return _Loaded(weights, buffer, key in self.pinned)

    def kept_for_run(self, schedule: list[str]) -> set[str]:
        """Streamed blocks that recur in `schedule` and are kept from their first use to
        their last (read once, not once per use): chosen in order of first use while the
        pinned blocks, the kept ones and room to stream the largest other block plus one
        read ahead stay within the budget, as `plan_pins` reserves it."""
        if not self.pin or self.budget is None:
            return set()
        uses = Counter(schedule)  # keys in first-use order
        # every pinned block counts, whether this schedule runs it or not
        sizes = {k: self.blocks[k].nbytes for k in [*uses, *self.pinned]}
        recurring = [k for k, n in uses.items() if n > 1 and k not in self.pinned]
        return fill_budget(sizes, self.budget, recurring, self.prefetch, held=self.pinned)

    def run(self, schedule: Iterable[str], keep_recurring: bool = False
            ) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
        """Yield (key, weights) for each key in `schedule`, in order. A streamed block's
        weights are valid until the consumer asks for the next block: its buffer then goes
        back to the pool for a later read. `keep_recurring`: blocks `kept_for_run` are read
        once and let go after their last use (a chunked component, once per piece; the
        denoising loop does not ask, so its streaming stays what the plan says)."""
        schedule = list(schedule)
        first_use, last_use = {}, {}
        for i, key in enumerate(schedule):
            first_use.setdefault(key, i)
            last_use[key] = i
        kept = self.kept_for_run(schedule) if keep_recurring else set()
        kept_loaded: dict[str, _Loaded] = {}
        futures: dict[int, Future] = {}

        def needs_read(i: int) -> bool:
            key = schedule[i]
            # a pinned or kept block is read once, at its first use, and stays resident
            return key not in self._resident and (
                (key not in self.pinned and key not in kept) or first_use[key] == i)

        def ensure_submitted(i: int) -> None:
            if i < len(schedule) and i not in futures and needs_read(i):
                futures[i] = self._reader.submit(self._load, schedule[i])

        scanned = 0  # schedule positions before this one are read or being read if need be

        def read_ahead(i: int) -> None:
            """Keep `prefetch` reads in flight beyond position i, counting reads, not
            positions: a read is started behind resident blocks too (e.g. the next step's
            first pair while this step's pinned epilogue and prologue compute)."""
            nonlocal scanned
            scanned = max(scanned, i + 1)
            in_flight = sum(1 for j in futures if j > i)
            while in_flight < self.prefetch and scanned < len(schedule):
                if needs_read(scanned):
                    ensure_submitted(scanned)
                    in_flight += 1
                scanned += 1

        held: _Loaded | None = None  # the streamed block the consumer is using
        try:
            for i, key in enumerate(schedule):
                ensure_submitted(i)
                read_ahead(i)  # overlap reads with compute
                if i in futures:
                    started = time.perf_counter()
                    loaded = self._result(futures.pop(i))
                    self.stats.wait_s += time.perf_counter() - started
                    if loaded.pinned:
                        self._resident[key] = loaded
                    elif key in kept:
                        kept_loaded[key] = loaded
                else:
                    loaded = self._resident.get(key) or kept_loaded[key]
                self.stats.peak_held_bytes = max(self.stats.peak_held_bytes, self.buffers.peak)
                if loaded.pinned:
                    held = None
                elif key in kept:
                    held = kept_loaded.pop(key) if last_use[key] == i else None
                else:
                    held = loaded
                yield key, loaded.weights
                del loaded
                if held is not None:
                    held.release_to(self.buffers)
                    held = None
        finally:  # the consumer stopped early: give back what it held and what was read ahead
            if held is not None:
                held.release_to(self.buffers)
            for loaded in kept_loaded.values():
                loaded.release_to(self.buffers)
            for f in futures.values():
                if f.exception() is None:
                    f.result().release_to(self.buffers)
            self.stats.buffers_made = self.buffers.made
            self.stats.buffers_reused = self.buffers.reused

    def release_pinned(self, keep: Iterable[str] = ()) -> int:
        """Let go of the resident pinned blocks, bar `keep`, and unmap the pool's free
        buffers, so what runs next (a decoder's activations) has their memory; they are read
        again at their next use. Returns the bytes let go."""
        keep, gone = set(keep), 0
        for key in [k for k in self._resident if k not in keep]:
            self._resident.pop(key).release_to(self.buffers)
            gone += 0 if self.blocks[key].held_by_program else self.blocks[key].nbytes
        self.buffers.clear()
        return gone

    def _result(self, future: Future) -> _Loaded:
        """Wait for a read. A read that waits for bytes while this thread waits for it is
        stuck if the only bytes to wait for are in blocks this thread's consumer moved past
        but still holds views of (e.g. `list(loader.run(...))`): those are abandoned."""
        while True:
            try:
                return future.result(timeout=0.05)
            except FutureTimeout:
                if self.buffers.waiting and self.buffers.abandon_retired():
                    self.stats.buffers_abandoned = self.buffers.abandoned

    def close(self) -> None:
        self._reader.shutdown(wait=True)
        for loaded in self._resident.values():
            loaded.release_to(self.buffers)
        self._resident.clear()
        self.buffers.clear()
