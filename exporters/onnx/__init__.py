"""`--target onnx`: the registered target (`target.py`) and the package it writes (`package.py`:
one ONNX graph per block, weights in flash-laid-out files, the end-to-end check)."""
