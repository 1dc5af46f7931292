"""Helpers for the "PyTorch in depth" course.

Importing this package has no side effects. One module per chapter, named after its notebook
(`ch01_autograd`, ...), and shared modules for what several chapters use (`device`, `data`, `models`,
`memory`, `dist`, `launch`, `figures`); the map is in CONTRIBUTING.md.
"""

from pathlib import Path

__version__ = "0.1.0"

#: The repository root (the folder that holds `notebooks/`, `data/` and `requirements.txt`).
ROOT = Path(__file__).resolve().parent.parent


