"""Plots (matplotlib, Agg backend: no display, no GUI toolkit): one module per kind of picture.

- :mod:`.figure`: the formats a plot is saved in (by the file's suffix: PNG, SVG, PDF), saving, and
  embedding a figure in an HTML page (inline SVG);
- :mod:`.bandwidth`: bandwidth vs size (``vnpu bench memcpy``, ``vnpu bench hccl``) with the machine's bound;
- :mod:`.serving`: output tokens/s and p99 latencies vs concurrency (``vnpu bench serve``);
- :mod:`.scaling`: start time (and memory) vs devices (``vnpu bench scale``);
- :mod:`.bench`: which of those draws a benchmark's ``--json`` document;
- :mod:`.timeline`: a metric over time with an anomaly's window shaded and events marked (the diagnose,
  stress-test and postmortem reports);
- :mod:`.pdf`: a report as a PDF (a page of text, then the plots).

Every plot is drawn from plain data (a benchmark's JSON document, a list of samples): the figure's lines
hold exactly those numbers.  Nothing here blocks on a device; drawing and saving block the calling thread.
matplotlib is imported by these modules only: import them where a picture is made, not at start-up.
"""

#: output suffix -> the format a plot is written in (the one table; importing this package loads no matplotlib)
FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}
SUFFIXES = tuple(FORMATS)
