"""A metric over time, as the diagnose, stress-test and postmortem reports draw it: the samples as a line,
an anomaly's window shaded, events as dashed vertical marks (numbered, listed under the time axis), an SLO target
as a horizontal line.  Axes are labelled with their units: the time axis in UTC clock time (``clock="utc"``,
samples stamped with wall-clock seconds) or in seconds from the start (``clock="s"``, a stress test's
windows); the value axis as ``name (unit)``.

:class:`TimePlot` holds what to draw (plain data); :func:`draw` draws it into an axes, :func:`figure` into a
figure of its own.  Host-blocking.
"""
from __future__ import annotations

import datetime as _dt
import textwrap
from dataclasses import dataclass

import matplotlib.dates as mdates
from matplotlib.figure import Figure

from .figure import new_figure

CLOCKS = ("utc", "s")
#: characters of the events' list under a plot (more are cut with " ...")
MARKS_TEXT = 330


@dataclass(frozen=True)
class TimePlot:
    """One metric over time.  ``points``: ``(t, value)``; ``unit``: the value's unit (``ms``, ``1/s``,
    ``ratio``; "" for none); ``shade``: a ``(t0, t1)`` window; ``marks``: ``(t, label)`` events; ``target``:
    a horizontal line at that value (``target_label`` names it); ``clock``: ``utc`` (t in wall-clock
    seconds) or ``s`` (t in seconds from the start); ``extra``: more labelled series, drawn dashed."""
    points: tuple[tuple[float, float], ...]
    title: str
    unit: str = ""
    shade: tuple[float, float] | None = None
    marks: tuple[tuple[float, str], ...] = ()
    target: float | None = None
    target_label: str = "target"
    clock: str = "utc"
    #: more series on the same axes, each ``(label, points)`` (dashed): what the main one is read against
    extra: tuple[tuple[str, tuple[tuple[float, float], ...]], ...] = ()

    def __post_init__(self):
        if self.clock not in CLOCKS:
            raise ValueError(f"clock {self.clock!r} is not one of {CLOCKS}")

    @property
    def ylabel(self) -> str:
        return f"{self.title} ({self.unit})" if self.unit else self.title


def _x(plot: TimePlot, t: float):
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc) if plot.clock == "utc" else t


def draw(ax, plot: TimePlot) -> None:
    """Draw ``plot`` into ``ax``."""
    ax.set_title(plot.title, fontsize="medium", loc="left")
    ax.set_ylabel(plot.ylabel)
    ax.set_xlabel("time (UTC)" if plot.clock == "utc" else "time since start (s)")
    if plot.clock == "utc":
        loc = mdates.AutoDateLocator(tz=_dt.timezone.utc, minticks=3, maxticks=7)
        ax.xaxis.set_major_locator(loc)
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S", tz=_dt.timezone.utc))
    if not plot.points:
        ax.text(0.5, 0.5, "no samples", transform=ax.transAxes, ha="center", va="center", color="0.4")
        ax.set_yticks([])
        return
    ts = [t for t, _ in plot.points]
    xs = [_x(plot, t) for t in ts]
    ax.plot(xs, [v for _, v in plot.points], "-", color="C0", lw=1.2, label=plot.title,
            marker="." if len(xs) < 40 else None)
    for i, (label, pts) in enumerate(plot.extra, 2):
        ax.plot([_x(plot, t) for t, _ in pts], [v for _, v in pts], "--", color=f"C{i}", lw=1.2, label=label)
    lo, hi = ts[0], ts[-1]
    if plot.shade is not None:
        a, b = max(plot.shade[0], lo), min(plot.shade[1], hi)
        if b >= a:                              # at least 1 % of the axis wide: a one-sample anomaly shows
            pad = max(0.0, 0.005 * (hi - lo) - (b - a) / 2)
            ax.axvspan(_x(plot, a - pad), _x(plot, b + pad), color="C3", alpha=0.15, lw=0, label="anomaly window")
    shown = [(t, label) for t, label in plot.marks if lo <= t <= hi]
    for i, (t, _label) in enumerate(shown, 1):
        ax.axvline(_x(plot, t), color="C1", ls="--", lw=1.0)
        ax.annotate(str(i), (_x(plot, t), 1.0), xycoords=("data", "axes fraction"), xytext=(2, -10),
                    textcoords="offset points", color="C1", fontsize="small")
    if plot.target is not None:
        ax.axhline(plot.target, color="C3", ls=":", lw=1.4, label=f"{plot.target_label} {plot.target:g} {plot.unit}")
    if shown:                                   # the marks' legend under the time axis's label
        listed = "; ".join(f"{i}: {label}" for i, (_t, label) in enumerate(shown, 1))
        listed = textwrap.shorten(listed, MARKS_TEXT, placeholder=" ...")
        ax.set_xlabel(ax.get_xlabel() + "\n" + "\n".join(textwrap.wrap(listed, 110)), fontsize="small")
    if plot.shade is not None or plot.target is not None or plot.extra:
        ax.legend(fontsize="x-small", loc="upper left")


def figure(plot: TimePlot, width: float = 7.0, height: float = 2.6) -> Figure:
    """``plot`` in a figure of its own (a report's page embeds one per metric)."""
    fig, (ax,) = new_figure(width=width, height=height + (0.35 if plot.marks else 0.0))
    draw(ax, plot)
    return fig


__all__ = ["TimePlot", "CLOCKS", "draw", "figure"]
