"""Per-target exporters: onnx is built; CoreML and WebGPU are not yet (see README.md)."""
