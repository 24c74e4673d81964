"""What a command keeps from its user: third-party warnings about the libraries' own code
(torch's pytree deprecations, TVM's C++ notes), and nothing else."""

from __future__ import annotations

import os
import warnings

import pytest

from edge.commands.common import notices_as_notes


def test_a_command_drops_the_listed_warnings_and_shows_the_rest():
    @notices_as_notes
    def command():
        with warnings.catch_warnings(record=True) as seen:  # under the command's filters
            warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated, use `isinstance("
                          "treespec, TreeSpec) and treespec.is_leaf()` instead.",
                          FutureWarning, stacklevel=1)
            warnings.warn("a model's weights are float16", UserWarning, stacklevel=1)
        return [str(w.message) for w in seen]

    assert command() == ["a model's weights are float16"]


def test_tvms_harmless_c_warnings_are_dropped_and_others_kept(capfd):
    """TVM logs from C++ straight to descriptor 2: what reaches it in the span is written
    back, less the harmless lines."""
    pytest.importorskip("tvm", reason="apache-tvm (web extra) is not installed")
    from edge.exporters.web.tvm_log import HARMLESS, harmless_tvm_warnings_dropped

    with harmless_tvm_warnings_dropped():
        os.write(2, f"[12:00:00] transform.h:1261: {HARMLESS[0]}. Make sure input indices "
                    "are in bound\n".encode())
        os.write(2, b"[12:00:00] pass.cc:10: Warning: something the user should read\n")
    err = capfd.readouterr().err
    assert HARMLESS[0] not in err and "something the user should read" in err
    os.write(2, b"after\n")   # the descriptor is stderr again
    assert capfd.readouterr().err == "after\n"
