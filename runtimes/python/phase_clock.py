"""The one recorder of a generation's walls: each phase timed as it runs, in order."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator


class PhaseClock:
    """Wall seconds of a generation's phases, by name in the order they ran, and the whole
    (`total`, from the clock's making to `finish`): `last_run["wall_s"]`."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.wall_s: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        began = time.perf_counter()
        try:
            yield
        finally:
            self.wall_s[name] = time.perf_counter() - began

    def finish(self) -> dict[str, float]:
        self.wall_s["total"] = time.perf_counter() - self.started
        return self.wall_s
