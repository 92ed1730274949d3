"""Reports as files: a diagnosis (or a stress test, a postmortem) as Markdown, self-contained HTML or PDF.

The HTML has no script and loads nothing (no JS CDN, no web font): plots are matplotlib figures inlined as
SVG (:mod:`runtime.plots.timeline`: the metric around each finding with its axes and units, the anomaly's
window shaded, events as numbered vertical marks).  PDF (an output path ending in ``.pdf``): a page of the
report's text, then the same plots (:mod:`runtime.plots.pdf`).  Markdown carries the text only.

Which file is written follows the output's suffix (:data:`KINDS`); :func:`write_report` writes any of them
from the report's text lines and plots.  Host-blocking (drawing, writing).
"""
from __future__ import annotations

import html
import time
from pathlib import Path
from typing import Iterable

from .anomaly import Anomaly
from .metrics_store import METRICS, Event

#: output suffix -> the kind of report written there
KINDS = {".html": "html", ".htm": "html", ".md": "md", ".pdf": "pdf"}


def _t(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(ts))


def time_plot(points: list[tuple[float, float]], title: str, unit: str = "", shade: tuple[float, float] | None = None,
              marks: Iterable[tuple[float, str]] = (), clock: str = "utc", target: float | None = None,
              target_label: str = "target", extra: Iterable[tuple[str, list[tuple[float, float]]]] = ()):
    """What to draw for one metric (a :class:`runtime.plots.timeline.TimePlot`): ``points`` ``(t, value)``,
    ``shade`` an interval, ``marks`` ``(t, label)`` events, ``target`` a horizontal line, ``extra`` more
    ``(label, points)`` series on the same axes; ``clock``: ``utc`` (t in wall-clock seconds) or ``s``
    (seconds from the start)."""
    from runtime.plots.timeline import TimePlot

    def pts(ps):
        return tuple((float(t), float(v)) for t, v in ps)
    return TimePlot(pts(points), title, unit, shade, tuple((float(t), str(label)) for t, label in marks), target,
                    target_label, clock, tuple((str(label), pts(ps)) for label, ps in extra))


def plot_html(plot) -> str:
    """A :func:`time_plot` as an inline ``<svg>`` element with axes, labels and units."""
    from runtime.plots.figure import inline_svg
    from runtime.plots.timeline import figure
    return f"<figure>{inline_svg(figure(plot))}</figure>"


def around(points: list[tuple[float, float]], a: Anomaly, before_s: float = 300.0,
           after_s: float = 300.0) -> list[tuple[float, float]]:
    return [p for p in points if a.onset - before_s <= p[0] <= a.end + after_s]


_CSS = ("body{font-family:sans-serif;max-width:60em;margin:2em auto;color:#222}"
        "h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 8px;text-align:left;font-size:.9em}"
        ".advice{background:#eef6ee;padding:.4em .8em}.ev{color:#555;font-size:.9em}")


def html_page(title: str, body: list[str]) -> str:
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1>{''.join(body)}</body></html>")


def _event_marks(events: list[Event]) -> list[tuple[float, str]]:
    return [(e.ts, f"#{e.id} {e.kind}: {e.diagnosis}") for e in events]


def _anomaly_plot(d, a: Anomaly, marks: list[tuple[float, str]]):
    return time_plot(around(d.series.get((a.metric, a.scope), []), a), f"{a.metric} {a.scope}".strip(),
                     METRICS[a.metric][0], (a.onset, a.end), marks)


def diagnosis_plots(d) -> list:
    """The plots of a :class:`~runtime.observe.diagnose.Diagnosis`: each shown symptom, then the anomaly of
    each shown root-cause candidate (:func:`time_plot`)."""
    marks = _event_marks(d.events)
    plots = [_anomaly_plot(d, s, marks) for s in d.symptoms[:5]]
    plots += [_anomaly_plot(d, c.anomaly, marks) for c in d.candidates[:8] if c.anomaly is not None]
    return plots


def diagnosis_html(d) -> str:
    """A :class:`~runtime.observe.diagnose.Diagnosis` as one self-contained HTML page."""
    from .diagnose import describe, summary_lines
    body = [f"<p>{html.escape(ln)}</p>" for ln in summary_lines(d)[:2]]
    marks = _event_marks(d.events)
    if d.symptoms:
        body.append("<h2>Symptoms</h2>")
        for s in d.symptoms[:5]:
            body.append(f"<p>{html.escape(describe(s))}</p>")
            body.append(plot_html(_anomaly_plot(d, s, marks)))
    body.append("<h2>Root-cause candidates</h2>" if d.candidates else "<h2>No root-cause candidate</h2>")
    for i, c in enumerate(d.candidates[:8], 1):
        where = f" on {c.scope}" if c.scope else ""
        body.append(f"<h3>#{i} {html.escape(c.cause + where)} &mdash; confidence {c.score:.2f} ({c.confidence})"
                    f"</h3><ul>")
        body += [f"<li>{html.escape(ev)}</li>" for ev in c.evidence[:6]]
        body.append("</ul>")
        if c.anomaly is not None:
            body.append(plot_html(_anomaly_plot(d, c.anomaly, marks)))
        if c.advice:
            body.append(f"<p class='advice'>Advice: {html.escape(c.advice)}</p>")
    if d.over_limit:
        body.append("<h2>Over a limit, no symptom to explain</h2><ul>")
        body += [f"<li>{html.escape(describe(a))}</li>" for a in d.over_limit[:20]]
        body.append("</ul>")
    found = {(a.metric, a.scope, a.kind, a.onset) for a in [*d.symptoms, *d.over_limit]}
    rest = [a for a in d.anomalies if (a.metric, a.scope, a.kind, a.onset) not in found
            and not any(c.anomaly is not None and (c.anomaly.metric, c.anomaly.scope, c.anomaly.onset)
                        == (a.metric, a.scope, a.onset) for c in d.candidates)]
    if rest:
        body.append("<h2>Statistical anomalies within every limit (not findings)</h2><ul>")
        body += [f"<li>{html.escape(describe(a))}</li>" for a in rest[:20]]
        body.append("</ul>")
    if d.events:
        body.append("<h2>Events</h2><table><tr><th>#</th><th>time</th><th>kind</th><th>source</th>"
                    "<th>diagnosis</th><th>result</th></tr>")
        body += [f"<tr><td>{e.id}</td><td>{_t(e.ts)}</td><td>{html.escape(e.kind)}</td>"
                 f"<td>{html.escape(e.source)}</td><td>{html.escape(e.diagnosis)}</td>"
                 f"<td>{html.escape(e.result)}</td></tr>" for e in d.events[-50:]]
        body.append("</table>")
    return html_page("vnpu diagnose", body)


def diagnosis_markdown(d) -> str:
    from .diagnose import summary_lines
    return "# vnpu diagnose\n\n" + "\n".join(
        (f"- {ln.strip()[2:]}" if ln.strip().startswith("- ") else f"\n{ln}\n" if ln.startswith("#") else ln)
        for ln in summary_lines(d, top=8)) + "\n"


def lines_html(title: str, lines: list[str], plots: Iterable[str] = ()) -> str:
    """A plain report page: lines as paragraphs, then plots (HTML elements: :func:`plot_html`)."""
    return html_page(title, [f"<p>{html.escape(ln)}</p>" for ln in lines] + list(plots))


def kind_of(path: str) -> str | None:
    """The kind of report (``html``, ``md``, ``pdf``) written to ``path``, by its suffix (None: no kind)."""
    low = str(path).lower()
    return next((kind for suffix, kind in KINDS.items() if low.endswith(suffix)), None)


def write_report(path: str | Path, title: str, lines: list[str], plots: list, page: str | None = None) -> None:
    """Write a report to ``path`` as its suffix says (:data:`KINDS`): HTML (``page`` when given, else
    ``lines`` then ``plots``), PDF (a page of ``lines``, then ``plots``: :mod:`runtime.plots.pdf`) or Markdown
    (``lines`` only).  ``plots``: :func:`time_plot` values."""
    kind = kind_of(str(path))
    if kind == "pdf":
        from runtime.plots import pdf
        pdf.write(str(path), title, lines, plots)
    elif kind == "html":
        write(path, page if page is not None else lines_html(title, lines, [plot_html(p) for p in plots]))
    elif kind == "md":
        write(path, f"# {title}\n\n```\n" + "\n".join(lines) + "\n```\n")
    else:
        raise ValueError(f"{path}: not a report file (use {', '.join(KINDS)})")


def write_diagnosis(path: str | Path, d) -> None:
    """A :class:`~runtime.observe.diagnose.Diagnosis` as HTML, PDF or Markdown (by the suffix)."""
    kind = kind_of(str(path))
    if kind == "md":
        write(path, diagnosis_markdown(d))
        return
    from .diagnose import summary_lines
    write_report(path, "vnpu diagnose", summary_lines(d, top=8), diagnosis_plots(d),
                 page=diagnosis_html(d) if kind == "html" else None)


def postmortem_plots(src, pm: dict) -> list:
    """The plots of a postmortem (``pm``: :func:`runtime.observe.postmortem.analyse`'s dict) from the history
    ``src``: p99 latency per second against the p99 target, requests per second, the server-side error rate
    against the error budget (1 - the availability target), events marked."""
    lo, hi = pm["window"]["since"], pm["window"]["until"]
    marks = [(e["ts"], f"#{e['id']} {e['kind']}: {e['diagnosis'] or e['source']}") for e in pm["timeline"]]
    tg = pm["target"]
    return [time_plot(src.samples("p99_latency_ms", lo, hi), "p99_latency_ms", "ms", marks=marks,
                      target=tg["p99_ms"], target_label="p99 target"),
            time_plot(src.samples("qps", lo, hi), "qps", METRICS["qps"][0], marks=marks),
            time_plot(src.samples("error_rate", lo, hi), "error_rate", METRICS["error_rate"][0], marks=marks,
                      target=1.0 - tg["availability"], target_label="error budget")]


def write(path: str | Path, text: str) -> None:
    Path(path).write_text(text)
