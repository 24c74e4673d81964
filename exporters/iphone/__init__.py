"""`--target iphone`: the registered target (`target.py`) over two layouts, Core ML programs
(`coreml/`, iOS 17 and 18) and Core AI models (`coreai/`, `--min-ios 27`), and the `--quantize`
settings both take (`compression.py`)."""
