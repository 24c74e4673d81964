"""This process's resident memory as Linux counts it, for the benchmarks that measure a
call's peak: the resident set now (VmRSS), its peak (VmHWM), and the peak set back to now,
so a call's peak is not hidden by what came before it (imports, loading a session)."""

from __future__ import annotations

from pathlib import Path


def status_bytes(field: str) -> int:
    """`field` of /proc/self/status ("VmRSS", "VmHWM"), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak_rss() -> int:
    """Set the peak (VmHWM) back to the resident set now, which it returns: writing 5 to
    clear_refs does that."""
    Path("/proc/self/clear_refs").write_text("5")
    return status_bytes("VmRSS")
