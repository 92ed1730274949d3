"""A stress test's report: the summary lines, then plots (matplotlib, inline SVG in HTML, pages in a PDF):
achieved arrival rate against the intended one, p99 latency (against the target, when the run had one) and the shed
share per window, over seconds from the start, faults marked."""
from __future__ import annotations

from runtime.observe.report import lines_html, plot_html, time_plot, write_report


def stress_plots(rep: dict) -> list:
    """The report's plots (:func:`runtime.observe.report.time_plot`), x in seconds from the start."""
    w = rep["windows"]
    marks = [(f["at_s"], f"{f['kind']} on npu:{f['device']}") for f in rep["faults"]]
    target = rep.get("target_p99_ms")
    return [time_plot([(x["start_s"], x["achieved_rate"]) for x in w], "achieved rate", "req/s", marks=marks, clock="s",
                      extra=[("intended rate", [(x["start_s"], x["intended_rate"]) for x in w])]),
            time_plot([(x["start_s"], x["p99_ms"]) for x in w if x["p99_ms"] is not None], "p99 latency", "ms",
                      marks=marks, clock="s", target=target if isinstance(target, (int, float)) else None,
                      target_label="p99 target"),
            time_plot([(x["start_s"], x["shed"]) for x in w], "shed share", "ratio", marks=marks, clock="s")]


def stress_html(rep: dict, lines: list[str]) -> str:
    return lines_html("vnpu stress-test", lines, [plot_html(p) for p in stress_plots(rep)])


def write_stress(path: str, rep: dict, lines: list[str]) -> None:
    """The report as HTML or PDF, by ``path``'s suffix."""
    write_report(path, "vnpu stress-test", lines, stress_plots(rep))
