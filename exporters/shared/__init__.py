"""What every target shares, below the target folders: a block's ONNX graph and its check
(`onnx_graph.py`, also the web's wasm graphs), the package run by the Python runtime for an
end-to-end check (`package_run.py`), output errors (`validation.py`), the manifest's head
(`package_head.py`), a model run with other weights (`weights_in_place.py`), and the ONNX
converter's caches (`graph_reuse.py`, `onnx_registry.py`, `onnx_rewrites.py`)."""
