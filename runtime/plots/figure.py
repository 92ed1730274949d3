"""Figures: the formats a plot is written in, chosen by the output file's suffix, and a figure embedded
in an HTML page.

- :data:`SUFFIXES` (``.png``, ``.svg``, ``.pdf``): :func:`save` writes a figure in the format its path's
  suffix names; another suffix is a :class:`PlotFormatError` (the command line checks the suffix before any
  work: :func:`runtime.cliargs.suffixed_file`);
- :func:`inline_svg`: a figure as an ``<svg>`` element (text kept as text, so the axis labels are
  searchable and the page loads nothing);
- :func:`new_figure`: a figure of the house size and style;
- :func:`series_of`: the numbers a figure's lines hold, by axes and label.  :func:`save` also writes them
  into the file (PNG: the ``Description`` text chunk; SVG: the ``Description`` metadata; PDF: the
  ``Subject`` entry), so the numbers behind a picture travel with it (:func:`read_png_series`).

Figures are :class:`matplotlib.figure.Figure` objects made without pyplot: no global figure registry, no
GUI backend, nothing to close (a figure is freed with its last reference); PNG is rendered by Agg.
Host-blocking.
"""
from __future__ import annotations

import io
import json
import os
import re
from datetime import datetime

import matplotlib
from matplotlib.figure import Figure

from . import FORMATS, SUFFIXES


class PlotFormatError(ValueError):
    """A plot path whose suffix names no format this module writes."""


def format_of(path: str) -> str:
    """The format ``path``'s suffix names (``png``, ``svg``, ``pdf``; case-insensitive)."""
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in FORMATS:
        raise PlotFormatError(f"{path}: unknown plot format {suffix or '(no suffix)'!r} "
                              f"(use {', '.join(SUFFIXES)})")
    return FORMATS[suffix]


def new_figure(rows: int = 1, cols: int = 1, width: float = 7.0, height: float = 3.6) -> tuple[Figure, list]:
    """A figure and its axes (a flat list, ``rows x cols``), grids on, constrained layout."""
    fig = Figure(figsize=(width, height * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat:
        ax.grid(True, which="major", alpha=0.35)
        ax.grid(True, which="minor", alpha=0.12)
    return fig, flat


def _number(v) -> float:
    """A plotted coordinate as a number (a datetime as its POSIX seconds)."""
    return v.timestamp() if isinstance(v, datetime) else float(v)


def series_of(fig: Figure) -> dict[str, dict[str, dict[str, list[float]]]]:
    """``{axes: {line label: {"x": [...], "y": [...]}}}`` of every labelled line of ``fig`` (an axes is named
    by its y label, or its title when it has none; times as POSIX seconds)."""
    out: dict[str, dict[str, dict[str, list[float]]]] = {}
    for ax in fig.axes:
        lines = {}
        for ln in ax.get_lines():
            label = ln.get_label()
            if label and not label.startswith("_"):
                lines[label] = {"x": [_number(v) for v in ln.get_xdata()], "y": [_number(v) for v in ln.get_ydata()]}
        if lines:
            out[ax.get_ylabel() or ax.get_title()] = lines
    return out


_DATA_KEY = {"png": "Description", "svg": "Description", "pdf": "Subject"}


def save(fig: Figure, path: str, dpi: int = 110) -> str:
    """Write ``fig`` to ``path`` in the format of its suffix, with the numbers of its lines
    (:func:`series_of`) in the file's metadata; returns the format."""
    fmt = format_of(path)
    meta = {"Creator": "vnpu"} if fmt in ("pdf", "svg") else {"Software": "vnpu"}
    meta[_DATA_KEY[fmt]] = json.dumps(series_of(fig), separators=(",", ":"))
    fig.savefig(path, format=fmt, dpi=dpi, metadata=meta)
    return fmt


def read_png_series(path: str) -> dict:
    """The numbers :func:`save` wrote into a PNG (:func:`series_of` of the figure it drew)."""
    from PIL import Image
    with Image.open(path) as im:
        return json.loads(im.text["Description"])


def inline_svg(fig: Figure) -> str:
    """``fig`` as one ``<svg>...</svg>`` element for an HTML page (its text as ``<text>``, not paths)."""
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": "vnpu"})
    text = buf.getvalue()
    text = text[text.index("<svg"):]
    # in an HTML page: no RDF metadata block, no namespace declarations beyond svg's own (the HTML parser
    # puts xlink:href in its namespace), and the picture shrinks with the page
    text = re.sub(r"<metadata>.*?</metadata>\s*", "", text, count=1, flags=re.S)
    text = text.replace(' xmlns:xlink="http://www.w3.org/1999/xlink"', "", 1)
    return text.replace("<svg ", '<svg style="max-width:100%;height:auto" ', 1)


__all__ = ["FORMATS", "SUFFIXES", "PlotFormatError", "format_of", "new_figure", "series_of", "save", "read_png_series",
           "inline_svg"]
