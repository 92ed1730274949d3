"""A report as a PDF: a first page of text (the report's summary lines, monospaced, continued on more
pages when long), then the plots, two to a page.  Written with matplotlib's PdfPages (no other PDF
library).  Host-blocking."""
from __future__ import annotations

import textwrap

from matplotlib.backends.backend_pdf import PdfPages
from matplotlib.figure import Figure

from .timeline import TimePlot, draw

#: A4 portrait, inches
PAGE = (8.27, 11.69)
LINES_PER_PAGE = 62
WRAP = 100
PLOTS_PER_PAGE = 2


def _wrap(lines: list[str]) -> list[str]:
    out: list[str] = []
    for ln in lines:
        out += textwrap.wrap(ln.rstrip(), WRAP, subsequent_indent="    ") or [""]
    return out


def _text_pages(title: str, lines: list[str]) -> list[Figure]:
    wrapped = _wrap(lines)
    pages = []
    for start in range(0, max(1, len(wrapped)), LINES_PER_PAGE):
        fig = Figure(figsize=PAGE)
        fig.text(0.06, 0.965, title if start == 0 else f"{title} (continued)", fontsize=14, weight="bold", va="top")
        fig.text(0.06, 0.93, "\n".join(wrapped[start:start + LINES_PER_PAGE]), family="monospace", fontsize=7.5,
                 va="top", linespacing=1.35)
        pages.append(fig)
    return pages


def _plot_pages(plots: list[TimePlot]) -> list[Figure]:
    pages = []
    for start in range(0, len(plots), PLOTS_PER_PAGE):
        fig = Figure(figsize=PAGE, layout="constrained")
        chunk = plots[start:start + PLOTS_PER_PAGE]
        axes = fig.subplots(PLOTS_PER_PAGE, 1, squeeze=False)[:, 0]
        for ax, plot in zip(axes, chunk):
            ax.grid(True, alpha=0.35)
            draw(ax, plot)
        for ax in axes[len(chunk):]:
            ax.set_visible(False)
        pages.append(fig)
    return pages


def page_count(lines: list[str], plots: list[TimePlot]) -> int:
    """How many pages :func:`write` makes of ``lines`` and ``plots``."""
    return max(1, -(-len(_wrap(lines)) // LINES_PER_PAGE)) + -(-len(plots) // PLOTS_PER_PAGE)


def write(path: str, title: str, lines: list[str], plots: list[TimePlot]) -> int:
    """Write the report to ``path`` (text pages, then plot pages); returns the number of pages."""
    pages = _text_pages(title, lines) + _plot_pages(plots)
    with PdfPages(path, metadata={"Title": title, "Creator": "vnpu"}) as pdf:
        for fig in pages:
            pdf.savefig(fig)
    return len(pages)


__all__ = ["write", "page_count", "PAGE"]
