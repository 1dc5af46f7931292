"""Helpers for the "PyTorch in depth" course.

Importing this package has no side effects; each concern lives in its own module
(`device`, `data`, `exercises`, `doctor`, `notebook`, and one module per chapter topic).
"""

from pathlib import Path

__version__ = "0.1.0"

#: The repository root (the folder that holds `notebooks/`, `data/` and `requirements.txt`).
ROOT = Path(__file__).resolve().parent.parent


