"""TVM's C++ warnings that say nothing to a user, kept off the terminal.

TVM's C++ code logs warnings (LOG(WARNING)) straight to file descriptor 2, past Python's
`warnings` filters and `logging` levels, and it has no setting to quiet them. While a
block's relax module is lowered, descriptor 2 is pointed at a temporary file; afterwards
every line is written back to stderr except those in HARMLESS. Nothing else is dropped:
an error, a warning not listed, or a progress bar's output in that span reaches the
terminal, only later.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator

HARMLESS = (
    # topi's `take` in its default "fast" mode reads unchecked indices: edge's takes are
    # embedding lookups of token ids, which every runtime checks against the vocabulary
    # before the text encoder runs (check_vocabulary in runtimes/python/package_checks.py,
    # checkVocabulary in runtimes/web/tokenizer.js, the Swift runtime's CaptionTokenizer)
    "Warning: Fast mode segfaults when there are out-of-bounds indices",
)


@contextlib.contextmanager
def harmless_tvm_warnings_dropped() -> Iterator[None]:
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            kept = [line for line in caught.read().decode(errors="replace").splitlines(True)
                    if not any(h in line for h in HARMLESS)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()
