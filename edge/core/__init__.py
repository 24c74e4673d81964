"""The torch-free core: the package format and its manifest, the sampler and its schedulers,
options, noise, the memory budget, the tokenizer, tiles, files, video and the package server.
The base install (NumPy and onnxruntime) imports all of it; nothing here imports a layer
above (tests/test_layers.py)."""
