"""Figures: how the course shows matplotlib figures, in cells and in widget callbacks."""

from __future__ import annotations


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
