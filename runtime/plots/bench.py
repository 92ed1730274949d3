"""Which picture draws which benchmark's ``--json`` document (``vnpu bench <name> --plot FILE``), by name:
one table, no if-chain."""
from __future__ import annotations

from matplotlib.figure import Figure

from . import bandwidth, scaling, serving
from .figure import save

#: benchmark -> the function that draws its ``--json`` document
FIGURES = {"memcpy": bandwidth.memcpy_figure, "hccl": bandwidth.hccl_figure, "serve": serving.figure,
           "scale": scaling.figure}


def figure(bench: str, doc: dict) -> Figure:
    """The figure of ``bench``'s ``--json`` document."""
    return FIGURES[bench](doc)


def write(bench: str, doc: dict, path: str) -> None:
    """Draw ``bench``'s document and write it to ``path`` (format by suffix, :func:`runtime.plots.figure.save`)."""
    save(figure(bench, doc), path)


__all__ = ["FIGURES", "figure", "write"]
