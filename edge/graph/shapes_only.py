"""Shapes without values: a model cut for a plan, at any video size, in seconds.

A family's cut makes each block's example inputs by running the blocks before it at the
export's size (edge/families/): at Wan's 480x832x81 that is a full transformer forward pass,
tens of minutes on a CPU, only to learn shapes a `--dry-run` prints. Within `shapes_only()`,
PyTorch's fake tensors (torch._subclasses.fake_tensor, the tracing machinery torch.export
itself runs on) carry shapes and dtypes through the same code and compute nothing, and
weights kept in storage (edge/graph/lazy_weights.py) are not read. Nothing made within holds
values: for plans, never for exports.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

_ACTIVE: ContextVar[bool] = ContextVar("shapes_only", default=False)


@contextlib.contextmanager
def shapes_only() -> Iterator[None]:
    # a private module, but the one torch.export and torch.compile trace with
    from torch._subclasses.fake_tensor import FakeTensorMode

    if active():  # one fake mode: tensors of two cannot meet
        yield
        return
    token = _ACTIVE.set(True)
    try:
        # real tensors made before (the model's weights) enter as constants
        with FakeTensorMode(allow_non_fake_inputs=True):
            yield
    finally:
        _ACTIVE.reset(token)


def active() -> bool:
    """Whether tensors are shapes only here (`shapes_only`)."""
    return _ACTIVE.get()
