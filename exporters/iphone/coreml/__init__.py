"""The iphone target's Core ML layout: one ML Program (`.mlpackage`) per block (`package.py`),
its stored weights read back (`weights.py`) and checked on Linux (`check.py`), and
`--quantize auto`'s recipe chosen by measurement (`recipe.py`)."""
