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

    Widget callbacks use this instead of ``plt.show()``: the kernel's comm layer runs IPython's
    ``post_execute`` hooks after every widget message (``comm.base_comm.BaseComm.handle_msg``), so the
    inline backend's end-of-cell hook showed the figure left open there, and in JupyterLab that image
    was blank, in place of the real one. A closed figure is not shown again.
    """
    import matplotlib.pyplot as plt
    from IPython.display import display

    plt.close(fig)
    display(fig)
