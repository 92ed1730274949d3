"""A stress test's HTML report: the summary lines, then plots (inline SVG, no script): intended vs achieved
arrival rate and p99 latency per window, faults marked."""
from __future__ import annotations

from runtime.observe.report import lines_html, svg_plot


def stress_html(rep: dict, lines: list[str]) -> str:
    w = rep["windows"]
    marks = [(f["at_s"], f"{f['kind']} on npu:{f['device']}") for f in rep["faults"]]
    plots = [svg_plot([(x["start_s"], x["intended_rate"]) for x in w], "intended rate (req/s)", "1/s", marks=marks),
             svg_plot([(x["start_s"], x["achieved_rate"]) for x in w], "achieved rate (req/s)", "1/s", marks=marks),
             svg_plot([(x["start_s"], x["p99_ms"]) for x in w if x["p99_ms"] is not None], "p99 latency (ms)", "ms",
                      marks=marks),
             svg_plot([(x["start_s"], x["shed"]) for x in w], "shed share", "", marks=marks)]
    return lines_html("vnpu stress-test", lines, plots)
