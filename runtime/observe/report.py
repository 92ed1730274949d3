"""Reports as files: a diagnosis (or a stress test, a postmortem) as Markdown or self-contained HTML.

The HTML has no script and loads nothing (no JS CDN, no web font): plots are inline SVG drawn here --
the metric around each finding, the anomaly's window shaded, events as vertical marks.  Markdown carries
the same text with a small table per finding (no plots).
"""
from __future__ import annotations

import html
import time
from pathlib import Path
from typing import Iterable

from .anomaly import Anomaly
from .metrics_store import METRICS, Event


def _t(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(ts))


def svg_plot(points: list[tuple[float, float]], title: str, unit: str = "", shade: tuple[float, float] | None = None,
             marks: Iterable[tuple[float, str]] = (), width: int = 640, height: int = 180) -> str:
    """An inline SVG line plot of ``points`` with ``shade`` (a ts interval) and ``marks`` ((ts, label)
    vertical lines).  Empty series: a box saying so."""
    pad_l, pad_r, pad_t, pad_b = 60, 10, 22, 24
    w, h = width - pad_l - pad_r, height - pad_t - pad_b
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="{html.escape(title)}">',
           f'<rect x="0" y="0" width="{width}" height="{height}" fill="#fff" stroke="#ccc"/>',
           f'<text x="{pad_l}" y="15" font-size="12" font-family="sans-serif">{html.escape(title)}</text>']
    if not points:
        out.append(f'<text x="{pad_l}" y="{pad_t + h / 2}" font-size="12">no samples</text></svg>')
        return "".join(out)
    t0, t1 = points[0][0], points[-1][0]
    vs = [v for _, v in points]
    lo, hi = min(vs), max(vs)
    if hi == lo:
        lo, hi = lo - 1.0, hi + 1.0
    span = max(t1 - t0, 1e-9)

    def x(t: float) -> float:
        return pad_l + (t - t0) / span * w

    def y(v: float) -> float:
        return pad_t + (1.0 - (v - lo) / (hi - lo)) * h

    if shade is not None:
        a, b = max(shade[0], t0), min(shade[1], t1)
        if b >= a:
            out.append(f'<rect x="{x(a):.1f}" y="{pad_t}" width="{max(2.0, x(b) - x(a)):.1f}" height="{h}" '
                       f'fill="#f6c" fill-opacity="0.25"/>')
    for ts, label in marks:
        if t0 <= ts <= t1:
            out.append(f'<line x1="{x(ts):.1f}" x2="{x(ts):.1f}" y1="{pad_t}" y2="{pad_t + h}" stroke="#c60" '
                       f'stroke-dasharray="3,2"><title>{html.escape(label)}</title></line>')
    path = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in points)
    out.append(f'<polyline points="{path}" fill="none" stroke="#036" stroke-width="1.2"/>')
    for v in (lo, hi):
        out.append(f'<text x="{pad_l - 4}" y="{y(v) + 4:.1f}" font-size="10" text-anchor="end" '
                   f'font-family="sans-serif">{v:.4g}{html.escape(" " + unit if unit else "")}</text>')
    out.append(f'<text x="{pad_l}" y="{height - 6}" font-size="10" font-family="sans-serif">{_t(t0)}</text>'
               f'<text x="{pad_l + w}" y="{height - 6}" font-size="10" text-anchor="end" '
               f'font-family="sans-serif">{_t(t1)} UTC</text></svg>')
    return "".join(out)


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


def diagnosis_html(d) -> str:
    """A :class:`~runtime.observe.diagnose.Diagnosis` as one self-contained HTML page."""
    from .diagnose import describe, summary_lines
    body = [f"<p>{html.escape(ln)}</p>" for ln in summary_lines(d)[:2]]
    marks = _event_marks(d.events)
    if d.symptoms:
        body.append("<h2>Symptoms</h2>")
        for s in d.symptoms[:5]:
            body.append(f"<p>{html.escape(describe(s))}</p>")
            body.append(svg_plot(around(d.series.get((s.metric, s.scope), []), s), f"{s.metric} {s.scope}".strip(),
                                 METRICS[s.metric][0], (s.onset, s.end), marks))
    body.append("<h2>Root-cause candidates</h2>" if d.candidates else "<h2>No root-cause candidate</h2>")
    for i, c in enumerate(d.candidates[:8], 1):
        where = f" on {c.scope}" if c.scope else ""
        body.append(f"<h3>#{i} {html.escape(c.cause + where)} &mdash; confidence {c.score:.2f} ({c.confidence})"
                    f"</h3><ul>")
        body += [f"<li>{html.escape(ev)}</li>" for ev in c.evidence[:6]]
        body.append("</ul>")
        if c.anomaly is not None:
            a = c.anomaly
            body.append(svg_plot(around(d.series.get((a.metric, a.scope), []), a), f"{a.metric} {a.scope}".strip(),
                                 METRICS[a.metric][0], (a.onset, a.end), marks))
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
    """A plain report page: lines as paragraphs, then plots."""
    return html_page(title, [f"<p>{html.escape(ln)}</p>" for ln in lines] + list(plots))


def write(path: str | Path, text: str) -> None:
    Path(path).write_text(text)
