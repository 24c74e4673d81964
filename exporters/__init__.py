"""Per-target exporters (ONNX, CoreML, WebGPU). None is implemented yet: see README.md."""
