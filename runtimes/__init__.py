"""Embeddable runtimes of edge packages: python/ (onnxruntime + NumPy), web/ (JavaScript:
WebGPU kernels or onnxruntime-web's wasm), swift/ (a Swift package over CoreML; built and
tested on Linux through a replay backend). They read the manifest and know no family."""
