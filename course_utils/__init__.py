"""Helpers for the "PyTorch in depth" course.

Importing this package has no side effects; each concern lives in its own module
(`device`, `data`, `exercises`, `doctor`, `notebook`, and one module per chapter topic).
"""

from pathlib import Path

__version__ = "0.1.0"

#: The repository root (the folder that holds `notebooks/`, `data/` and `requirements.txt`).
ROOT = Path(__file__).resolve().parent.parent


def show_figure(fig) -> None:
    """Display a matplotlib figure now, in the current output (a widget's Output included), and close it.

    Widget callbacks use this instead of ``plt.show()``: ipykernel runs the inline backend's end-of-cell
    hook after every widget message too, and in JupyterLab that drew a figure left open a second time,
    blank, in place of the real one. A closed figure is never drawn again.
    """
    import matplotlib.pyplot as plt
    from IPython.display import display

    plt.close(fig)
    display(fig)
