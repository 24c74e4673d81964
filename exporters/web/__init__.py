"""`--target web`: the registered target (`target.py`) and the static site it writes
(`package.py`): TVM WebGPU kernels with launch plans (`tvm_plan.py`, `tvm_passes.py`), wasm
graphs for onnxruntime-web (`ort_web.py`), the stored weight forms (`storage.py`), the inputs
both paths take (`inputs.py`) and the end-to-end check of the stored form (`check.py`)."""
