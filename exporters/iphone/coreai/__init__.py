"""The iphone target's Core AI layout (`--min-ios 27`, `layout.py`): one `.aimodel` per block
(`package.py`), converted and executed in child processes side by side (`pool.py`,
`worker.py`), compressed weights simulated in PyTorch (`simulated.py`) and `--quantize auto`
(`recipe.py`)."""
