"""What the runtime asks of the process's memory and storage: the bytes it read (Linux's
/proc), its peak resident set, and glibc's allocator told to give freed buffers back."""

from __future__ import annotations

import ctypes
import ctypes.util
import resource
from pathlib import Path


def io_read_bytes() -> int | None:
    """Bytes this process caused to be read from storage (Linux /proc/self/io)."""
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


# glibc's mallopt parameter: allocations at least this large are mapped on their own
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 128 << 10


def return_freed_activations_to_the_system() -> bool:
    """Fix glibc's mmap threshold at its default (128 KiB), so every activation buffer
    onnxruntime and NumPy free goes back to the system at once. Left alone, glibc raises the
    threshold to the size of each large buffer freed (up to 32 MiB), after which such
    buffers come from the heap, whose freed middle the process keeps: measured on Wan at
    17x128x128, 0.84 GB more RSS between generations than the loader held, 0.19 GB with the
    threshold fixed (docs/benchmarks.md). Process-wide, as the allocator is; False where the
    C library is not glibc."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    except (OSError, AttributeError):
        return False


def peak_rss_bytes() -> int:
    """The most memory this process has held resident so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB

